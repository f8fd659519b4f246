//! A connection's bytes passed on both ways, as they are: a forwarded
//! connection between the session's socket and its stream on the member
//! link.
//!
//! `tokio::io::copy_bidirectional_with_sizes` does the same, but zeroes
//! each direction's buffer when it makes it: 128 KiB written per forwarded
//! connection before its first byte moves, a measurable part of what a
//! short forwarded connection costs. Here each buffer is a `BytesMut`
//! read into through its spare capacity ([`tokio_util::io::poll_read_buf`]),
//! which is never zeroed.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

/// Pass bytes from `a` to `b` and from `b` to `a` until both have ended,
/// each direction in reads of up to `size` bytes. A direction's end (EOF)
/// shuts down the other side's writing half, and the other direction goes
/// on; an error on either side ends both and is returned.
pub async fn relay<A, B>(a: &mut A, b: &mut B, size: usize) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut a_to_b = OneWay::new(size);
    let mut b_to_a = OneWay::new(size);
    poll_fn(|cx| {
        let there = a_to_b.poll(cx, Pin::new(&mut *a), Pin::new(&mut *b))?;
        let back = b_to_a.poll(cx, Pin::new(&mut *b), Pin::new(&mut *a))?;
        if there.is_ready() && back.is_ready() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// One direction of a relay.
struct OneWay {
    /// Read and not yet written.
    buf: BytesMut,
    size: usize,
    /// The reader has ended.
    read_done: bool,
    /// Written since the writer was last flushed.
    need_flush: bool,
    /// The writer has been shut down: this direction is over.
    done: bool,
}

impl OneWay {
    fn new(size: usize) -> OneWay {
        OneWay {
            buf: BytesMut::new(),
            size,
            read_done: false,
            need_flush: false,
            done: false,
        }
    }

    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            if self.buf.has_remaining() {
                match writer.as_mut().poll_write(cx, &self.buf)? {
                    Poll::Ready(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(n) => {
                        self.buf.advance(n);
                        self.need_flush = true;
                        continue;
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
            if self.read_done {
                ready!(writer.as_mut().poll_flush(cx))?;
                ready!(writer.as_mut().poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            // Empty: the whole buffer is free again (no copy, no zeroing).
            self.buf.clear();
            self.buf.reserve(self.size);
            match tokio_util::io::poll_read_buf(reader.as_mut(), cx, &mut self.buf)? {
                Poll::Ready(0) => self.read_done = true,
                Poll::Ready(_) => {}
                Poll::Pending => {
                    // Nothing to read now: what was written goes out.
                    if self.need_flush {
                        ready!(writer.as_mut().poll_flush(cx))?;
                        self.need_flush = false;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_pass_both_ways_and_an_end_passes_on() {
        let (mut client, mut a) = tokio::io::duplex(4096);
        let (mut b, mut holder) = tokio::io::duplex(4096);
        let relayed = tokio::spawn(async move { relay(&mut a, &mut b, 1024).await });
        let big: Vec<u8> = (0..300_000).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.unwrap();
            back
        });
        let mut got = Vec::new();
        holder.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, big, "every byte in order, then the client's end");
        // The other direction still runs after the first one ended.
        holder.write_all(b"and back").await.unwrap();
        holder.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), b"and back");
        relayed.await.unwrap().expect("both ends were clean");
    }

    /// A stream whose reads fail.
    struct Broken;

    impl AsyncRead for Broken {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()))
        }
    }

    impl AsyncWrite for Broken {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn an_error_on_either_side_ends_the_relay_with_it() {
        let (_client, mut a) = tokio::io::duplex(64);
        let e = relay(&mut a, &mut Broken, 1024).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    }

    #[tokio::test]
    async fn a_writer_that_takes_nothing_is_an_error() {
        struct Full;
        impl AsyncWrite for Full {
            fn poll_write(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &[u8],
            ) -> Poll<io::Result<usize>> {
                Poll::Ready(Ok(0))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
        }
        impl AsyncRead for Full {
            fn poll_read(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &mut tokio::io::ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                Poll::Pending
            }
        }
        let (mut client, mut a) = tokio::io::duplex(64);
        client.write_all(b"x").await.unwrap();
        let e = relay(&mut a, &mut Full, 1024).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);
    }
}
