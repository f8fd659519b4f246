//! An HTTP/2 connection's writes gathered, so replies ready together leave
//! together.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
