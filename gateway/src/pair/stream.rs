//! One forwarded session connection on the member link: a stream of the
//! link's HTTP/2 connection to the peer, read and written as bytes.
//!
//! The link carries each forwarded connection as one HTTP/2 stream of a
//! long-lived TLS connection between the two members, so that forwarding
//! a connection costs a stream, not a TCP connect and a TLS handshake. A
//! stream's request body carries, first, the PROXY v2 header
//! ([`super::proxy`]), then the session's bytes as the session sent them;
//! its response body carries the bytes back. Ending a direction ends the
//! stream's side (END_STREAM); dropping a [`LinkStream`] with its sides
//! open resets the stream, so the other member's end sees an error, not a
//! clean close.
//!
//! HTTP/2's flow control bounds what is in flight on each stream
//! ([`STREAM_WINDOW`]) and on the connection ([`CONNECTION_WINDOW`]): a
//! peer that does not read stops the writer, as TCP would.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one stream may have in flight each way.
pub const STREAM_WINDOW: u32 = 256 * 1024;

/// What the whole link connection may have in flight each way.
pub const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// The most forwarded connections one link connection carries at once.
pub const MAX_STREAMS: u32 = 100_000;

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
}

impl LinkStream {
    pub fn new(send: Option<SendStream<Bytes>>, recv: RecvStream) -> LinkStream {
        LinkStream {
            send,
            recv,
            pending: Bytes::new(),
            ended: false,
        }
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

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(send) = this.send.as_mut() else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the stream is not answered yet",
            )));
        };
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        send.reserve_capacity(buf.len());
        loop {
            match ready!(send.poll_capacity(cx)) {
                Some(Ok(0)) => {
                    // Capacity came and went: the next poll waits for
                    // more (h2 wakes this task when some is assigned).
                    continue;
                }
                Some(Ok(n)) => {
                    let n = n.min(buf.len());
                    send.send_data(Bytes::copy_from_slice(&buf[..n]), false)
                        .map_err(h2_error)?;
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

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.ended {
            this.ended = true;
            if let Some(send) = this.send.as_mut() {
                send.send_data(Bytes::new(), true).map_err(h2_error)?;
            }
        }
        Poll::Ready(Ok(()))
    }
}
