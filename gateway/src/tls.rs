//! TLS on both sides: TLS 1.3 only, through rustls with the aws-lc-rs
//! provider.
//!
//! - Toward the session, a [`rustls::ServerConfig`] per session whose
//!   certificate resolver mints (once) a leaf for the hello's name under the
//!   session's own CA.
//! - Toward destinations, a [`rustls::ClientConfig`] per session that checks
//!   certificates against the public roots (webpki-roots) plus only those
//!   extra anchors the config names explicitly. One per session so that not
//!   even TLS resumption state is shared between sessions.
//! - [`Replay`]: the bytes the gate already read (the ClientHello) put back
//!   in front of the socket, so rustls sees the connection from its start.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use talos_certs::LeafCache;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// ALPN offered to sessions and to destinations, in preference order.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The server side for one session: TLS 1.3, ALPN h2 and http/1.1, the
/// certificate chosen by SNI through `leaves`.
pub fn server_config(leaves: Arc<dyn ResolvesServerCert>) -> Arc<rustls::ServerConfig> {
    // TLS 1.3 is supported by the provider; building cannot fail.
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("the aws-lc-rs provider supports TLS 1.3")
        .with_no_client_auth()
        .with_cert_resolver(leaves);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    // No 0-RTT: early data could be replayed, and requests are checked
    // before they go on.
    config.max_early_data_size = 0;
    Arc::new(config)
}

/// The client side for one session: TLS 1.3, public roots plus `extra`.
pub fn client_config(extra: &[CertificateDer<'static>]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for anchor in extra {
        // Anchors were parsed and checked when the config was loaded.
        let _ = roots.add(anchor.clone());
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("the aws-lc-rs provider supports TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A certificate resolver over a session's leaf cache: a leaf of the
/// session's own CA for the hello's name, minted on first use. A name the
/// CA does not permit gets no certificate, and rustls ends the handshake.
#[derive(Debug)]
pub struct LeafResolver {
    leaves: Arc<LeafCache>,
}

impl LeafResolver {
    /// Resolve names through `leaves`.
    pub fn new(leaves: Arc<LeafCache>) -> LeafResolver {
        LeafResolver { leaves }
    }
}

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // rustls gives the name already lower-cased and without the dot.
        let name = hello.server_name()?;
        match self.leaves.get_or_mint(name) {
            Ok(key) => Some(key),
            Err(e) => {
                tracing::debug!(error = %e, "no leaf for this name");
                None
            }
        }
    }
}

/// A stream that first yields `prefix`, then reads from `inner`; writes go
/// straight to `inner`.
#[derive(Debug)]
pub struct Replay<S> {
    prefix: Vec<u8>,
    // invariant: pos <= prefix.len()
    pos: usize,
    inner: S,
}

impl<S> Replay<S> {
    /// Put `prefix` back in front of `inner`.
    pub fn new(prefix: Vec<u8>, inner: S) -> Replay<S> {
        Replay {
            prefix,
            pos: 0,
            inner,
        }
    }

    /// The inner stream, once all of the prefix has been read: until then
    /// its readiness says nothing about whether a read would wait.
    pub fn inner_once_replayed(&self) -> Option<&S> {
        (self.pos == self.prefix.len()).then_some(&self.inner)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                // The prefix is spent: give its memory back.
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// Writes that go straight to the inner stream: for wrappers that only
/// change how it is read.
macro_rules! writes_pass_through {
    ($wrapper:ident) => {
        impl<S: AsyncWrite + Unpin> AsyncWrite for $wrapper<S> {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_shutdown(cx)
            }
        }
    };
}

writes_pass_through!(Replay);

/// A multiplexed (HTTP/2) connection's writes, gathered: the first write
/// of each flush waits one turn of the scheduler, so the streams that are
/// ready run first and their frames leave together.
///
/// Without it each stream's reply went out in a `writev` (and a TLS
/// record, and a segment, and a wake-up of the peer) of its own: a stream's
/// task queues its frames and wakes the connection's task, which tokio
/// runs next (its "LIFO slot"), and the connection writes what it has —
/// one reply. Here that first write answers `Pending` once, having woken
/// its own task, which tokio then puts at the back of its run queue (a
/// task woken while it runs is re-queued as a yield); when it is polled
/// again every stream that was ready has queued its frames, and they go
/// out in one write. The wait ends when the write that follows it is
/// flushed, so a flush of many writes (a large body) waits once.
///
/// It takes h2 as patched in `third_party/h2` to gather small replies:
/// released h2 writes out every DATA payload of 256 bytes or more before it
/// buffers the next frame (`gateway/tests/h2_writes.rs` checks the pair:
/// 32 replies answered at once, 3 writes; 32 without this).
///
/// Only for HTTP/2: an HTTP/1.1 connection has one reply in flight, with
/// nothing to gather, and would pay the extra turn for nothing. Under no
/// load the turn is immediate (the task is the only one ready).
#[derive(Debug)]
pub struct Gathered<S> {
    inner: S,
    waited: bool,
}

impl<S> Gathered<S> {
    /// Gather `inner`'s writes.
    pub fn new(inner: S) -> Gathered<S> {
        Gathered {
            inner,
            waited: false,
        }
    }

    /// Wait one turn before the first write of a flush: `Pending` (with
    /// the task woken) once, then the write goes on.
    fn wait_once(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.waited {
            return Poll::Ready(());
        }
        self.waited = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Gathered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gathered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.wait_once(cx));
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.wait_once(cx));
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if flushed.is_ready() {
            self.waited = false;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How many bytes of unsent TLS a session connection may hold: what one
/// write hands rustls is encrypted and leaves in one `writev` as long as
/// it fits. rustls's default, 64 KiB, is exactly one large HTTP/1.1 reply
/// chunk without its framing (`10000\r\n` before, `\r\n` after), so each
/// such chunk went out as two writes, the second a 9-byte record of its
/// own: twice the system calls, segments and client wake-ups for a
/// download. Still a bound: a client that does not read holds at most
/// this much here before the writer waits.
pub const SESSION_SEND_LIMIT: usize = 128 * 1024;

/// Byte counters for one connection's wire traffic, shared with the record.
#[derive(Debug, Default)]
pub struct WireBytes {
    /// Bytes read from the peer.
    pub read: std::sync::atomic::AtomicU64,
    /// Bytes written to the peer.
    pub written: std::sync::atomic::AtomicU64,
}

/// A stream that counts the bytes that cross it.
#[derive(Debug)]
pub struct Counted<S> {
    inner: S,
    bytes: Arc<WireBytes>,
}

impl<S> Counted<S> {
    /// Count `inner`'s traffic into `bytes`.
    pub fn new(inner: S, bytes: Arc<WireBytes>) -> Counted<S> {
        Counted { inner, bytes }
    }

    /// The stream being counted.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.bytes
            .read
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.bytes
                .written
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            self.bytes
                .written
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn replay_yields_the_prefix_then_the_stream() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(b" world").await.unwrap();
        drop(a);
        let mut r = Replay::new(b"hello".to_vec(), b);
        let mut got = String::new();
        r.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "hello world");
    }

    /// A waker that counts its wake-ups.
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn gathered_writes_wait_one_turn_per_flush() {
        let wakes = Arc::new(Wakes(Default::default()));
        let waker = std::task::Waker::from(Arc::clone(&wakes));
        let cx = &mut Context::from_waker(&waker);
        let woken = || wakes.0.load(std::sync::atomic::Ordering::SeqCst);
        let mut g = Gathered::new(Vec::<u8>::new());
        let mut w = |g: &mut Gathered<Vec<u8>>, bytes: &[u8]| Pin::new(g).poll_write(cx, bytes);

        // The first write of a flush: not taken, and the task woken to come back.
        assert!(w(&mut g, b"one").is_pending());
        assert_eq!(woken(), 1);
        assert!(g.inner.is_empty());
        // Polled again: taken, and so is every write up to the flush.
        assert!(matches!(w(&mut g, b"one"), Poll::Ready(Ok(3))));
        assert!(matches!(w(&mut g, b"two"), Poll::Ready(Ok(3))));
        assert_eq!(woken(), 1);
        let cx = &mut Context::from_waker(&waker);
        assert!(Pin::new(&mut g).poll_flush(cx).is_ready());
        // After the flush the next write waits again, vectored ones too.
        let bufs = [io::IoSlice::new(b"thr"), io::IoSlice::new(b"ee")];
        assert!(Pin::new(&mut g).poll_write_vectored(cx, &bufs).is_pending());
        assert_eq!(woken(), 2);
        assert!(matches!(
            Pin::new(&mut g).poll_write_vectored(cx, &bufs),
            Poll::Ready(Ok(5))
        ));
        assert_eq!(g.inner, b"onetwothree");
    }
}
