//! The bytes the gate already read (the ClientHello) put back in front of
//! the socket, so rustls sees the connection from its start.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
}
