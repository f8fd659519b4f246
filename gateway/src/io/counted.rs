//! Byte counts of a connection's wire traffic, for its record.

use std::sync::Arc;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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

    /// The counts, for bytes that cross the stream past this wrapper (a
    /// relay that moves them inside the kernel counts them there).
    pub fn bytes(&self) -> &WireBytes {
        &self.bytes
    }

    /// The counts, shared: to read them while the stream is lent out.
    pub fn shared_bytes(&self) -> Arc<WireBytes> {
        Arc::clone(&self.bytes)
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
