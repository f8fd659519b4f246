//! A passthrough connection's bytes moved between its two TCP sockets
//! inside the kernel: `splice(2)` from one socket into a pipe, and from the
//! pipe into the other socket, each direction with a pipe of its own. No
//! byte is copied into the process, none is seen by it.
//!
//! Both ends must be plain TCP sockets (a connection that came over the
//! member link arrives inside the link's TLS, and goes through
//! [`crate::io::relay`] instead).
//!
//! The readiness of each socket is tokio's: a splice that finds nothing to
//! read (or no room to write) clears that readiness and waits for the next
//! event, as a read would. A direction's end (EOF) shuts the other
//! socket's writing half and the other direction goes on (half-close); an
//! error on either side ends both. No byte either way for `idle` ends the
//! relay too ([`Relayed::Idle`]).
//!
//! # Memory usage
//!
//! Two pipes per connection, their buffers the kernel's (at most
//! [`PIPE_BYTES`] each, pages it takes only while bytes are in flight), and
//! the state below: nothing in the process grows with the bytes moved.

use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::io::counted::WireBytes;

/// The most bytes one splice moves, and so the most a direction holds in
/// its pipe at once: a Linux pipe's default capacity (16 pages), which is
/// also what one read of the copy relay takes
/// ([`crate::conn`]'s `RELAY_BUFFER`).
pub const PIPE_BYTES: usize = 64 * 1024;

/// How a relay ended without an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relayed {
    /// Both directions ended (each side sent its EOF, passed on).
    Ended,
    /// No byte moved either way for the idle time.
    Idle,
}

/// Move bytes between `a` and `b`, both ways, until both directions have
/// ended, either side fails, or nothing moves for `idle`. `counts` is
/// `a`'s: bytes read from it (`read`) and written to it (`written`),
/// counted as they move, so that a relay cut part-way has counted what
/// crossed.
pub async fn relay(
    a: &TcpStream,
    b: &TcpStream,
    counts: &WireBytes,
    idle: Duration,
) -> io::Result<Relayed> {
    let mut there = Direction::new()?;
    let mut back = Direction::new()?;
    let mut timer: Pin<Box<Sleep>> = Box::pin(tokio::time::sleep(idle));
    poll_fn(|cx| {
        let mut moved = false;
        let a_to_b = there.poll(cx, a, b, &counts.read, &mut moved)?;
        let b_to_a = back.poll(cx, b, a, &counts.written, &mut moved)?;
        if a_to_b.is_ready() && b_to_a.is_ready() {
            return Poll::Ready(Ok(Relayed::Ended));
        }
        if moved {
            timer.as_mut().reset(Instant::now() + idle);
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Ok(Relayed::Idle)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// One direction: a socket, a pipe, the other socket.
struct Direction {
    /// The pipe's ends: spliced into at `w`, out of at `r`.
    r: OwnedFd,
    w: OwnedFd,
    /// Bytes in the pipe not yet written on.
    // invariant: 0 whenever the reading socket is spliced from, so an
    // EAGAIN there is the socket's (nothing to read), never the pipe's.
    in_pipe: usize,
    /// The reading socket has ended.
    eof: bool,
    /// The writing socket's writing half is shut: this direction is over.
    done: bool,
}

impl Direction {
    fn new() -> io::Result<Direction> {
        let (r, w) = pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)?;
        Ok(Direction {
            r,
            w,
            in_pipe: 0,
            eof: false,
            done: false,
        })
    }

    /// Move what can be moved now. `count` grows by the bytes read from
    /// `from`; `moved` is set when any byte moved.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        from: &TcpStream,
        to: &TcpStream,
        count: &AtomicU64,
        moved: &mut bool,
    ) -> Poll<io::Result<()>> {
        let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if self.in_pipe > 0 {
                ready!(to.poll_write_ready(cx))?;
                let out = to.try_io(Interest::WRITABLE, || {
                    Ok(splice(&self.r, None, to, None, self.in_pipe, flags)?)
                });
                match out {
                    Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        self.in_pipe -= n;
                        *moved = true;
                    }
                    // Readiness cleared: the next poll waits for room.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
                continue;
            }
            if self.eof {
                socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write)?;
                self.done = true;
                continue;
            }
            ready!(from.poll_read_ready(cx))?;
            let into = from.try_io(Interest::READABLE, || {
                Ok(splice(from, None, &self.w, None, PIPE_BYTES, flags)?)
            });
            match into {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.in_pipe = n;
                    count.fetch_add(n as u64, Ordering::Relaxed);
                    *moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Two connected pairs of sockets on loopback: (client, a) and (b, far).
    async fn pairs() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (a, _) = listener.accept().await.unwrap();
        let b = TcpStream::connect(addr).await.unwrap();
        let (far, _) = listener.accept().await.unwrap();
        (client, a, b, far)
    }

    fn spawn_relay(
        a: TcpStream,
        b: TcpStream,
        idle: Duration,
    ) -> (Arc<WireBytes>, tokio::task::JoinHandle<io::Result<Relayed>>) {
        let counts = Arc::new(WireBytes::default());
        let c = Arc::clone(&counts);
        let task = tokio::spawn(async move { relay(&a, &b, &c, idle).await });
        (counts, task)
    }

    #[tokio::test]
    async fn bytes_pass_both_ways_and_each_end_passes_on() {
        let (mut client, a, b, mut far) = pairs().await;
        let (counts, relayed) = spawn_relay(a, b, Duration::from_secs(60));
        client.write_all(b"hello there").await.unwrap();
        let mut got = [0; 11];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello there");
        far.write_all(b"and back").await.unwrap();
        let mut back = [0; 8];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"and back");
        // Half-close: the client's end reaches the far side, which can
        // still answer.
        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        far.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the client's EOF came through");
        far.write_all(b"after your end").await.unwrap();
        far.shutdown().await.unwrap();
        let mut tail = Vec::new();
        client.read_to_end(&mut tail).await.unwrap();
        assert_eq!(tail, b"after your end");
        assert_eq!(relayed.await.unwrap().unwrap(), Relayed::Ended);
        assert_eq!(counts.read.load(Ordering::Relaxed), 11);
        assert_eq!(counts.written.load(Ordering::Relaxed), 8 + 14);
    }

    #[tokio::test]
    async fn a_large_transfer_both_ways_at_once_arrives_whole_and_in_order() {
        const LEN: usize = 32 * 1024 * 1024 + 12_345;
        let (client, a, b, far) = pairs().await;
        let (counts, relayed) = spawn_relay(a, b, Duration::from_secs(60));
        let pattern = |seed: u8| -> Vec<u8> {
            (0..LEN)
                .map(|i| (i % 251) as u8 ^ seed)
                .collect::<Vec<u8>>()
        };
        // Each side writes all it has while it reads all the other sends:
        // neither direction may wait for the other.
        let exchange = |s: TcpStream, seed: u8| async move {
            let (mut r, mut w) = s.into_split();
            let sent = pattern(seed);
            let writer = tokio::spawn(async move {
                w.write_all(&sent).await.unwrap();
                w.shutdown().await.unwrap();
            });
            let mut got = Vec::with_capacity(LEN);
            r.read_to_end(&mut got).await.unwrap();
            writer.await.unwrap();
            got
        };
        let (at_far, at_client) = tokio::join!(exchange(far, 2), exchange(client, 1));
        assert!(at_far == pattern(1), "client to far: every byte, in order");
        assert!(
            at_client == pattern(2),
            "far to client: every byte, in order"
        );
        assert_eq!(relayed.await.unwrap().unwrap(), Relayed::Ended);
        assert_eq!(counts.read.load(Ordering::Relaxed), LEN as u64);
        assert_eq!(counts.written.load(Ordering::Relaxed), LEN as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn a_relay_with_nothing_moving_ends_idle_and_traffic_defers_it() {
        let (mut client, a, b, mut far) = pairs().await;
        let start = Instant::now();
        let (_, relayed) = spawn_relay(a, b, Duration::from_secs(300));
        // Traffic at 200 s moves the idle end to 500 s.
        tokio::time::sleep(Duration::from_secs(200)).await;
        client.write_all(b"x").await.unwrap();
        let mut one = [0; 1];
        far.read_exact(&mut one).await.unwrap();
        let moved_at = Instant::now();
        assert_eq!(relayed.await.unwrap().unwrap(), Relayed::Idle);
        let ended = start.elapsed();
        assert!(
            ended >= moved_at.duration_since(start) + Duration::from_secs(300),
            "idle is counted from the last byte: ended at {ended:?}"
        );
        assert!(ended < Duration::from_secs(501), "ended at {ended:?}");
    }

    #[tokio::test]
    async fn a_reset_on_one_side_ends_the_relay_with_an_error() {
        let (client, a, b, _far) = pairs().await;
        let (_, relayed) = spawn_relay(a, b, Duration::from_secs(60));
        // Linger 0: the close sends RST instead of FIN.
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(client);
        let e = relayed.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    }
}
