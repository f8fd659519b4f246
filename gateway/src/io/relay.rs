//! A connection's bytes passed on both ways, as they are: a forwarded
//! connection between the session's socket and its stream on the member
//! link.
//!
//! `tokio::io::copy_bidirectional_with_sizes` does the same, but zeroes
//! each direction's buffer when it makes it (128 KiB written per forwarded
//! connection before its first byte moves), and copies every byte once
//! more into or out of the link's frames. Here the link's side is
//! [`Chunked`]: what it receives comes as the chunks it was decoded in and
//! is written from them; what the session sends is read into a `BytesMut`
//! through its spare capacity ([`tokio_util::io::poll_read_buf`], never
//! zeroed) and handed over as a shared chunk. Each byte is copied only by
//! the kernel and by the link's TLS.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

/// A stream that gives and takes bytes as shared chunks.
pub trait Chunked {
    /// The next chunk received; `None` once the other side has ended.
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>>;
    /// Send the front of `chunk` (at least one byte of it), taking what
    /// was sent off it.
    fn poll_send(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>>;
    /// End this side's direction, once what was sent has gone.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// Room for a read of about `size` bytes in `buf`: its own spare capacity
/// while there is a good part of it left, else a fresh allocation (the
/// chunks split off earlier may still be in flight), never zeroed.
fn reserve(buf: &mut BytesMut, size: usize) {
    if buf.capacity() < size / 4 {
        buf.reserve(size);
    }
}

/// Pass bytes from `a` to `b` and from `b` to `a` until both have ended,
/// reading `a` up to `size` bytes at a time. A direction's end (EOF) ends
/// the other side's writing half, and the other direction goes on; an
/// error on either side ends both and is returned.
pub async fn relay<A, B>(a: &mut A, b: &mut B, size: usize) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: Chunked + ?Sized,
{
    let mut up = Up {
        buf: BytesMut::new(),
        chunk: Bytes::new(),
        size,
        read_done: false,
        done: false,
    };
    let mut down = Down {
        chunk: Bytes::new(),
        ended: false,
        need_flush: false,
        done: false,
    };
    poll_fn(|cx| {
        let there = up.poll(cx, Pin::new(&mut *a), b)?;
        let back = down.poll(cx, b, Pin::new(&mut *a))?;
        if there.is_ready() && back.is_ready() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// From the byte stream to the chunked one.
struct Up {
    /// Where reads go; each read is split off as a chunk.
    buf: BytesMut,
    /// Read and not yet sent.
    chunk: Bytes,
    size: usize,
    /// The reader has ended.
    read_done: bool,
    /// The chunked side's direction has been ended: this one is over.
    done: bool,
}

impl Up {
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        writer: &mut W,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + ?Sized,
        W: Chunked + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !self.chunk.is_empty() {
                ready!(writer.poll_send(cx, &mut self.chunk))?;
                continue;
            }
            if self.read_done {
                ready!(writer.poll_end(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            reserve(&mut self.buf, self.size);
            match ready!(tokio_util::io::poll_read_buf(
                reader.as_mut(),
                cx,
                &mut self.buf
            ))? {
                0 => self.read_done = true,
                _ => self.chunk = self.buf.split().freeze(),
            }
        }
    }
}

/// From the chunked stream to the byte stream.
struct Down {
    /// Received and not yet written.
    chunk: Bytes,
    /// The chunked side has ended.
    ended: bool,
    /// Written since the writer was last flushed.
    need_flush: bool,
    /// The writer has been shut down: this direction is over.
    done: bool,
}

impl Down {
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut R,
        mut writer: Pin<&mut W>,
    ) -> Poll<io::Result<()>>
    where
        R: Chunked + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !self.chunk.is_empty() {
                match ready!(writer.as_mut().poll_write(cx, &self.chunk))? {
                    0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    n => {
                        self.chunk.advance(n);
                        self.need_flush = true;
                        continue;
                    }
                }
            }
            if self.ended {
                ready!(writer.as_mut().poll_flush(cx))?;
                ready!(writer.as_mut().poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            match reader.poll_chunk(cx)? {
                Poll::Ready(None) => self.ended = true,
                Poll::Ready(Some(chunk)) => self.chunk = chunk,
                Poll::Pending => {
                    // Nothing more now: what was written goes out.
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

/// Any byte stream as [`Chunked`], reading up to `size` bytes at a time:
/// the far side of a relay that is a plain socket (a passthrough
/// connection's destination when its session's side is no plain socket).
#[derive(Debug)]
pub struct Plain<T> {
    inner: T,
    buf: BytesMut,
    size: usize,
}

impl<T> Plain<T> {
    pub fn new(inner: T, size: usize) -> Plain<T> {
        Plain {
            inner,
            buf: BytesMut::new(),
            size,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Chunked for Plain<T> {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        reserve(&mut self.buf, self.size);
        match ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.inner),
            cx,
            &mut self.buf
        ))? {
            0 => Poll::Ready(Ok(None)),
            _ => Poll::Ready(Ok(Some(self.buf.split().freeze()))),
        }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.inner).poll_write(cx, chunk))? {
            0 => Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            n => {
                chunk.advance(n);
                Poll::Ready(Ok(()))
            }
        }
    }

    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_pass_both_ways_and_an_end_passes_on() {
        let (mut client, mut a) = tokio::io::duplex(4096);
        let (b, mut holder) = tokio::io::duplex(4096);
        let relayed =
            tokio::spawn(async move { relay(&mut a, &mut Plain::new(b, 1024), 1024).await });
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
        let e = relay(&mut a, &mut Plain::new(Broken, 1024), 1024)
            .await
            .unwrap_err();
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
        let e = relay(&mut a, &mut Plain::new(Full, 1024), 1024)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);
    }
}
