//! One forwarded session connection on the member link: a stream of a
//! link connection's HTTP/2 framing, read and written as bytes.
//!
//! The link carries each forwarded connection as one HTTP/2 stream of a
//! long-lived TLS connection between the two members, so that forwarding
//! a connection costs a stream, not a TCP connect and a TLS handshake. A
//! stream's request body carries, first, the PROXY v2 header
//! ([`crate::pair::proxy`]), then the session's bytes as the session sent them;
//! its response body carries the bytes back. Ending a direction ends the
//! stream's side (END_STREAM); dropping a [`LinkStream`] with its sides
//! open resets the stream, so the other member's end sees an error, not a
//! clean close.
//!
//! # Flow control: nothing one session leaves unread holds another back
//!
//! HTTP/2 bounds what is in flight on each stream ([`STREAM_WINDOW`]) and
//! on the whole connection ([`CONNECTION_WINDOW`]), and a receiver gives a
//! stream's window back only as its reader takes the bytes. A forwarded
//! download the session never reads keeps its stream's window, and that
//! much of the connection's, for as long as it is open (an upload the
//! destination does not take, the same on the holder's side). Were the
//! connection's window smaller than what its streams may hold, a few such
//! streams would stop every other stream of the connection: with one
//! connection per peer, every other session's forwarded connections
//! (issue 40: 16 MiB shared by streams of 1 MiB, stalled by 17 unread
//! downloads of one session). So:
//!
//! - **The connection's window never binds.** A link connection carries
//!   at most [`MAX_STREAMS`] streams at once, counted on each side by
//!   [`Slots`] for as long as a [`LinkStream`] lives (not only while
//!   HTTP/2 counts the stream open: a stream whose peer has ended it can
//!   still hold unread bytes), and its window is [`MAX_STREAMS`] ×
//!   [`STREAM_WINDOW`]: every stream at once can hold its whole window
//!   unread and the connection still has room. A stream that finds its
//!   connection full goes on another one ([`super::link`]); the holder
//!   refuses a stream past the bound (`streams_at_bound`) rather than let
//!   the window bind.
//! - **One link connection per session** (and per peer): what HTTP/2
//!   shares within a connection beyond the windows — its DATA-frame
//!   budget, its reset-stream counts, the TCP connection under it — is
//!   shared only by one session's own streams. A session's streams can
//!   end its own link connection (HTTP/2's guards against a peer that
//!   sends too many small frames apply to it as to any), never another
//!   session's.
//! - **A sender waits for capacity, never buffers ahead of it**: a write
//!   reserves capacity on its stream and sends what HTTP/2 assigns
//!   (`reserve_capacity`/`poll_capacity`), so a stream whose reader is
//!   gone holds at most its window, and waiting for it blocks nothing
//!   but that stream's own task.
//!
//! # Memory usage
//!
//! What a link connection may hold unread is bounded by its windows:
//! on each side, at most [`STREAM_WINDOW`] (1 MiB) per stream a
//! [`LinkStream`] holds, beside one received DATA frame (at most
//! [`MAX_FRAME`], 256 KiB) the forwarder's relay has taken and not yet
//! written. Per session that is at most `[pair]
//! max_forwarded_per_session` streams of its connections (256 by
//! default: 256 MiB) plus its DNS queries waiting on a holder (64: 64
//! MiB, each a few hundred bytes in practice); overall, at most one
//! stream window per forwarded connection, and those are bounded by the
//! connection cap (`[limits] max_connections` on the forwarder, its
//! forwarded connections and streams held there on the holder). That is
//! the same order as what the kernel buffers for a direct connection
//! whose session does not read (its socket buffers, up to the sysctl
//! `tcp_wmem` and `tcp_rmem` maxima, several MiB each). Small frames
//! held unread cost HTTP/2 bookkeeping beyond their bytes; their
//! overhead on one connection is bounded by [`DATA_FRAME_BUDGET`], past
//! which HTTP/2 ends that (one session's) connection.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one stream may have in flight each way: 1 MiB, so that one
/// forwarded download or upload keeps a link between two machines busy
/// (a 1 MiB window covers 1 ms at 8 Gbit/s) without a window update
/// every frame.
pub const STREAM_WINDOW: u32 = 1024 * 1024;

/// The largest DATA frame either member takes: a write of several TLS
/// records goes as one frame, not one per record.
pub const MAX_FRAME: u32 = 256 * 1024;

/// The most streams one link connection carries at once, each side
/// counting every [`LinkStream`] it holds ([`Slots`]). One session's
/// connection carries the session's forwarded connections (at most
/// `[pair] max_forwarded_per_session`, 256 by default) and its DNS
/// queries waiting on a holder (at most 64): a session at the default
/// bound fits in one link connection with room to spare, and one that
/// needs more gets another.
pub const MAX_STREAMS: u32 = 1024;

/// What the whole link connection may have in flight each way: every
/// stream's whole window at once, so that the connection's window never
/// binds (see the module docs). 1 GiB, under HTTP/2's largest window
/// (2^31 - 1): a credit, not memory; what is held is bounded per stream.
pub const CONNECTION_WINDOW: u32 = MAX_STREAMS * STREAM_WINDOW;

const _: () = assert!(
    CONNECTION_WINDOW as u64 >= MAX_STREAMS as u64 * STREAM_WINDOW as u64
        && (CONNECTION_WINDOW as u64) < (1 << 31),
    "the connection's window holds every stream's and is a valid HTTP/2 window"
);

/// HTTP/2's budget for the overhead of small DATA frames held unread on
/// one link connection (h2 counts up to 256 bytes for each frame shorter
/// than that, gives it back when the frame is read, and ends the
/// connection past the budget): 8 MiB, what h2 gave the link's earlier
/// 16 MiB connection window by default (half of it). h2's default scales
/// with the window (half of it, 512 MiB here), which would let 2 million
/// small frames wait unread, each pinning its share of a read buffer.
pub const DATA_FRAME_BUDGET: usize = 8 * 1024 * 1024;

/// The streams of one link connection, counted by the side that holds
/// them: a place is taken before a stream is opened (the forwarder) or
/// served (the holder), and given back when its [`LinkStream`] (or the
/// task serving it) is gone, however the stream ended.
#[derive(Debug)]
pub struct Slots {
    // invariant: at most MAX_STREAMS, each a live `Slot`.
    live: AtomicUsize,
    /// When the last stream was given back: how long the connection has
    /// been idle, when it is.
    idle_since: std::sync::Mutex<Instant>,
}

impl Default for Slots {
    fn default() -> Slots {
        Slots {
            live: AtomicUsize::new(0),
            idle_since: std::sync::Mutex::new(Instant::now()),
        }
    }
}

impl Slots {
    /// A place for one more stream, unless the connection carries
    /// [`MAX_STREAMS`] already.
    pub fn take(self: &Arc<Self>) -> Option<Slot> {
        let mut n = self.live.load(Ordering::Relaxed);
        loop {
            if n >= MAX_STREAMS as usize {
                return None;
            }
            match self
                .live
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(Slot(Arc::clone(self))),
                Err(now) => n = now,
            }
        }
    }

    /// The streams held now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// How long the connection has carried no stream at `now`, if it
    /// carries none.
    pub fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.live() > 0 {
            return None;
        }
        let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        Some(now.saturating_duration_since(since))
    }
}

/// One stream's place in its connection's [`Slots`]; given back on drop.
#[derive(Debug)]
pub struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        if self.0.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
}

/// How the holder's side of a link connection is framed.
pub fn server_builder() -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(MAX_STREAMS)
        .data_frame_budget(DATA_FRAME_BUDGET)
        // The peer is an authenticated member, and a session connection
        // that ends with its other direction still open (a refusal, a cut,
        // a client gone) ends its stream with a reset: HTTP/2's guards
        // against a client resetting streams to load a server would end
        // the link under ordinary traffic.
        .max_local_error_reset_streams(None)
        .max_pending_accept_reset_streams(MAX_STREAMS as usize);
    b
}

/// How the forwarder's side of a link connection is framed.
pub fn client_builder() -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .data_frame_budget(DATA_FRAME_BUDGET)
        // As on the holder's side: resets are ordinary here.
        .max_local_error_reset_streams(None)
        .max_pending_accept_reset_streams(MAX_STREAMS as usize);
    b
}

/// A stream of the member link as a byte stream.
#[derive(Debug)]
pub struct LinkStream {
    /// The side this member writes; none until the holder has answered.
    send: Option<SendStream<Bytes>>,
    recv: RecvStream,
    /// Received, not yet read.
    pending: Bytes,
    /// This side has ended (END_STREAM sent).
    ended: bool,
    /// Its place among its connection's streams, given back when it goes.
    slot: Option<Slot>,
}

impl LinkStream {
    pub fn new(send: Option<SendStream<Bytes>>, recv: RecvStream) -> LinkStream {
        LinkStream {
            send,
            recv,
            pending: Bytes::new(),
            ended: false,
            slot: None,
        }
    }

    /// Hold `slot` for as long as this stream lives.
    pub fn hold(&mut self, slot: Slot) {
        self.slot = Some(slot);
    }

    /// The side to write on, once the holder has answered the stream.
    pub fn answer(&mut self, send: SendStream<Bytes>) {
        self.send = Some(send);
    }
}

fn h2_error(e: h2::Error) -> io::Error {
    if e.is_io() {
        e.into_io()
            .unwrap_or_else(|| io::Error::other("link I/O error"))
    } else {
        io::Error::new(io::ErrorKind::ConnectionReset, e)
    }
}

impl AsyncRead for LinkStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_empty() {
            match ready!(this.recv.poll_data(cx)) {
                // The other side ended its direction.
                None => return Poll::Ready(Ok(())),
                Some(Ok(data)) => {
                    // Read now, or held here: either way the window
                    // opens again as it is taken off the stream.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    this.pending = data;
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_error(e))),
            }
        }
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending[..n]);
        this.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl LinkStream {
    /// Send the first `len` bytes, or as many of them as the stream's
    /// window takes now, as one DATA frame: `take(n)` gives the frame's
    /// `n` bytes.
    fn poll_send_with(
        &mut self,
        cx: &mut Context<'_>,
        len: usize,
        take: impl FnOnce(usize) -> Bytes,
    ) -> Poll<io::Result<usize>> {
        let Some(send) = self.send.as_mut() else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the stream is not answered yet",
            )));
        };
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        send.reserve_capacity(len);
        loop {
            match ready!(send.poll_capacity(cx)) {
                Some(Ok(0)) => {
                    // Capacity came and went: the next poll waits for
                    // more (h2 wakes this task when some is assigned).
                    continue;
                }
                Some(Ok(n)) => {
                    let n = n.min(len);
                    send.send_data(take(n), false).map_err(h2_error)?;
                    return Poll::Ready(Ok(n));
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_error(e))),
                None => {
                    return match ready!(send.poll_reset(cx)) {
                        Ok(reason) => Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::BrokenPipe,
                            format!("the peer reset the stream: {reason:?}"),
                        ))),
                        Err(e) => Poll::Ready(Err(h2_error(e))),
                    };
                }
            }
        }
    }

    fn poll_end(&mut self) -> io::Result<()> {
        if !self.ended {
            self.ended = true;
            if let Some(send) = self.send.as_mut() {
                send.send_data(Bytes::new(), true).map_err(h2_error)?;
            }
        }
        Ok(())
    }
}

/// A forwarded connection's relay takes received DATA frames as they were
/// decoded and sends what the session sent as the chunks it was read in:
/// no copy of its own either way.
impl crate::io::relay::Chunked for LinkStream {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        if !self.pending.is_empty() {
            return Poll::Ready(Ok(Some(std::mem::take(&mut self.pending))));
        }
        match ready!(self.recv.poll_data(cx)) {
            None => Poll::Ready(Ok(None)),
            Some(Ok(data)) => {
                let _ = self.recv.flow_control().release_capacity(data.len());
                Poll::Ready(Ok(Some(data)))
            }
            Some(Err(e)) => Poll::Ready(Err(h2_error(e))),
        }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        ready!(self.poll_send_with(cx, chunk.len(), |n| chunk.split_to(n)))?;
        Poll::Ready(Ok(()))
    }

    fn poll_end(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(LinkStream::poll_end(self))
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_send_with(cx, buf.len(), |n| Bytes::copy_from_slice(&buf[..n]))
    }

    /// The session's TLS writes several records at once: they go as one
    /// DATA frame (as much as the stream's capacity takes), one copy.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if bufs.len() <= 1 || total <= 1 {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.poll_write(cx, first);
        }
        let mut joined = Vec::with_capacity(total.min(MAX_FRAME as usize));
        for b in bufs {
            let room = (MAX_FRAME as usize).saturating_sub(joined.len());
            if room == 0 {
                break;
            }
            joined.extend_from_slice(&b[..b.len().min(room)]);
        }
        self.poll_write(cx, &joined)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().poll_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client and a server stream of one in-memory HTTP/2 connection.
    async fn pair() -> (LinkStream, LinkStream) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut conn = server_builder().handshake::<_, Bytes>(b).await.unwrap();
            let (req, mut respond) = conn.accept().await.unwrap().unwrap();
            let send = respond
                .send_response(http::Response::new(()), false)
                .unwrap();
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            LinkStream::new(Some(send), req.into_body())
        });
        let (client, conn) = client_builder().handshake::<_, Bytes>(a).await.unwrap();
        tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let (response, send) = client
            .send_request(
                http::Request::post("https://link/").body(()).unwrap(),
                false,
            )
            .unwrap();
        let server = server.await.unwrap();
        let response = response.await.unwrap();
        (LinkStream::new(Some(send), response.into_body()), server)
    }

    #[tokio::test]
    async fn bytes_pass_both_ways_past_the_window_and_an_end_is_an_eof() {
        let (mut client, mut server) = pair().await;
        let big: Vec<u8> = (0..(4 * STREAM_WINDOW as usize))
            .map(|i| (i % 251) as u8)
            .collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.unwrap();
            back
        });
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, big, "every byte, in order, then the end");
        server.write_all(b"and back").await.unwrap();
        server.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), b"and back");
    }

    /// The forwarder's relay between a session's socket and its stream:
    /// every byte both ways past the stream's window, each end passed on.
    #[tokio::test]
    async fn a_relay_over_a_stream_passes_every_byte_and_each_end() {
        let (mut stream, mut holder) = pair().await;
        let (mut session, mut socket) = tokio::io::duplex(8 * 1024);
        let relayed =
            tokio::spawn(
                async move { crate::io::relay::relay(&mut socket, &mut stream, 4096).await },
            );
        let up: Vec<u8> = (0..(3 * STREAM_WINDOW as usize))
            .map(|i| (i % 251) as u8)
            .collect();
        let down: Vec<u8> = up.iter().rev().copied().collect();
        let sent = up.clone();
        let session_side = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(&mut session);
            let ((), back) = tokio::join!(
                async {
                    w.write_all(&sent).await.unwrap();
                    w.shutdown().await.unwrap();
                },
                async {
                    let mut back = Vec::new();
                    r.read_to_end(&mut back).await.unwrap();
                    back
                }
            );
            back
        });
        let (mut hr, mut hw) = tokio::io::split(&mut holder);
        let (got, ()) = tokio::join!(
            async {
                let mut got = Vec::new();
                hr.read_to_end(&mut got).await.unwrap();
                got
            },
            async {
                hw.write_all(&down).await.unwrap();
                hw.shutdown().await.unwrap();
            }
        );
        assert_eq!(got, up, "the session's bytes, in order, then its end");
        assert_eq!(session_side.await.unwrap(), down, "the holder's, the same");
        relayed.await.unwrap().expect("both ends were clean");
    }

    #[test]
    fn slots_bound_a_connections_streams_and_say_when_it_is_idle() {
        let slots = Arc::new(Slots::default());
        let held: Vec<Slot> = (0..MAX_STREAMS).map(|_| slots.take().unwrap()).collect();
        assert!(slots.take().is_none(), "no place past MAX_STREAMS");
        assert_eq!(slots.live(), MAX_STREAMS as usize);
        assert_eq!(slots.idle_for(Instant::now()), None);
        let mut held = held.into_iter();
        drop(held.next());
        let again = slots.take().expect("a place given back is taken again");
        drop(again);
        drop(held);
        let idle = slots.idle_for(Instant::now() + Duration::from_secs(5));
        assert!(
            idle.is_some_and(|d| d >= Duration::from_secs(5)),
            "{idle:?}"
        );
    }

    /// Streams whose reader never reads, each holding its whole window
    /// unread, more of them than the connection's window held before
    /// (16 MiB, issue 40): another stream of the same connection still
    /// carries its bytes both ways, and so does a new one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unread_streams_do_not_hold_back_the_connections_others() {
        const UNREAD: usize = 40;
        let (a, b) = tokio::io::duplex(256 * 1024);
        let (full_tx, mut full_rx) = tokio::sync::mpsc::unbounded_channel();
        let holder = tokio::spawn(async move {
            let mut conn = server_builder().handshake::<_, Bytes>(b).await.unwrap();
            while let Some(next) = conn.accept().await {
                let Ok((req, mut respond)) = next else { return };
                let send = respond
                    .send_response(http::Response::new(()), false)
                    .unwrap();
                let mut stream = LinkStream::new(Some(send), req.into_body());
                let full = full_tx.clone();
                tokio::spawn(async move {
                    let mut first = [0u8; 1];
                    if stream.read_exact(&mut first).await.is_err() {
                        return;
                    }
                    if first[0] == b'd' {
                        // A download nobody reads: its whole window, then
                        // a byte more, which waits for ever.
                        let window = vec![7u8; STREAM_WINDOW as usize];
                        if stream.write_all(&window).await.is_ok() {
                            let _ = full.send(());
                            let _ = stream.write_all(b"x").await;
                        }
                    } else {
                        // An echo, until the forwarder's end.
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if stream.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                        let _ = stream.shutdown().await;
                    }
                });
            }
        });
        let (client, conn) = client_builder().handshake::<_, Bytes>(a).await.unwrap();
        tokio::spawn(conn);
        let open = |client: &h2::client::SendRequest<Bytes>| {
            let client = client.clone();
            async move {
                let mut client = client.ready().await.unwrap();
                let (response, send) = client
                    .send_request(
                        http::Request::post("https://link/").body(()).unwrap(),
                        false,
                    )
                    .unwrap();
                LinkStream::new(Some(send), response.await.unwrap().into_body())
            }
        };
        let mut unread = Vec::new();
        for _ in 0..UNREAD {
            let mut s = open(&client).await;
            s.write_all(b"d").await.unwrap();
            unread.push(s);
        }
        for i in 0..UNREAD {
            tokio::time::timeout(Duration::from_secs(20), full_rx.recv())
                .await
                .unwrap_or_else(|_| panic!("only {i} of {UNREAD} unread windows filled"))
                .unwrap();
        }
        let echo = |mut s: LinkStream| async move {
            let sent: Vec<u8> = (0..(4 * STREAM_WINDOW as usize))
                .map(|i| (i % 253) as u8)
                .collect();
            let (mut r, mut w) = tokio::io::split(&mut s);
            let expected = sent.clone();
            let ((), back) = tokio::join!(
                async {
                    w.write_all(&sent).await.unwrap();
                    w.shutdown().await.unwrap();
                },
                async {
                    let mut back = Vec::new();
                    r.read_to_end(&mut back).await.unwrap();
                    back
                }
            );
            assert!(back == expected, "every byte back, in order");
        };
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut s = open(&client).await;
            s.write_all(b"e").await.unwrap();
            echo(s).await;
            let mut s = open(&client).await;
            s.write_all(b"e").await.unwrap();
            echo(s).await;
        })
        .await
        .expect("the other streams carry their bytes beside the unread ones");
        drop(unread);
        drop(client);
        holder.abort();
    }

    #[tokio::test]
    async fn a_side_dropped_open_is_an_error_not_an_end() {
        let (mut client, server) = pair().await;
        drop(server);
        let mut buf = [0u8; 16];
        let read = client.read(&mut buf).await;
        assert!(read.is_err(), "a reset, not a clean close: {read:?}");
    }

    #[tokio::test]
    async fn writing_before_the_answer_is_refused() {
        // A holder's stream before it has answered has no side to write.
        let (client, server) = pair().await;
        drop(client);
        let LinkStream { recv, .. } = server;
        let mut unanswered = LinkStream::new(None, recv);
        let e = unanswered.write(b"x").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotConnected);
    }

    /// Far more streams than HTTP/2's guards allow end in resets, from
    /// either side (a refusal, a cut, a client gone), and the connection
    /// still carries the next stream.
    #[tokio::test]
    async fn thousands_of_reset_streams_leave_the_connection_up() {
        const RESETS: usize = 3000;
        const AT_ONCE: usize = 100;
        let (a, b) = tokio::io::duplex(64 * 1024);
        let holder = tokio::spawn(async move {
            let mut conn = server_builder().handshake::<_, Bytes>(b).await.unwrap();
            while let Some(next) = conn.accept().await {
                let (req, mut respond) = next.expect("the connection stays up");
                let send = respond
                    .send_response(http::Response::new(()), false)
                    .unwrap();
                let mut stream = LinkStream::new(Some(send), req.into_body());
                tokio::spawn(async move {
                    let mut first = [0u8; 1];
                    if stream.read_exact(&mut first).await.is_err() {
                        return;
                    }
                    match first[0] {
                        b'e' => {
                            let _ = stream.write_all(b"echo").await;
                            let _ = stream.shutdown().await;
                        }
                        // Bytes toward a forwarder that drops the stream.
                        b'w' => {
                            let _ = stream.write_all(&[0u8; 32 * 1024]).await;
                        }
                        // Dropped with both directions open and the
                        // forwarder's bytes still coming: a reset.
                        _ => {}
                    }
                });
            }
        });
        let (client, conn) = client_builder().handshake::<_, Bytes>(a).await.unwrap();
        let driven = tokio::spawn(conn);
        let open = |client: &h2::client::SendRequest<Bytes>| {
            let client = client.clone();
            async move {
                let mut client = client.ready().await.expect("the connection stays up");
                let (response, send) = client
                    .send_request(
                        http::Request::post("https://link/").body(()).unwrap(),
                        false,
                    )
                    .unwrap();
                let response = response.await.expect("an answer");
                LinkStream::new(Some(send), response.into_body())
            }
        };
        // Many at once, as under load: more streams in their reset's
        // aftermath than HTTP/2 remembers (frames for a forgotten one are a
        // protocol error, and each such reset counts toward the guard).
        for batch in 0..RESETS / AT_ONCE {
            let mut tasks = Vec::new();
            for j in 0..AT_ONCE {
                let stream = open(&client);
                tasks.push(tokio::spawn(async move {
                    let mut stream = stream.await;
                    if j % 2 == 0 {
                        // The holder resets it while bytes keep coming.
                        stream.write_all(b"r").await.unwrap();
                        for _ in 0..16 {
                            if stream.write_all(&[0u8; 16 * 1024]).await.is_err() {
                                break;
                            }
                            tokio::task::yield_now().await;
                        }
                    } else {
                        // The forwarder drops it open while the holder
                        // writes: a reset the other way (or it meets the
                        // holder's own).
                        stream.write_all(b"w").await.unwrap();
                        let mut buf = [0u8; 1];
                        let _ = stream.read(&mut buf).await;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap_or_else(|e| panic!("batch {batch}: {e}"));
            }
        }
        let mut last = open(&client).await;
        last.write_all(b"e").await.unwrap();
        last.shutdown().await.unwrap();
        let mut back = Vec::new();
        last.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"echo");
        drop(last);
        drop(client);
        driven.await.unwrap().expect("the connection ended cleanly");
        holder.await.unwrap();
    }
}
