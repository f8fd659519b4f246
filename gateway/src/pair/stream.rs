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
pub const STREAM_WINDOW: u32 = 1024 * 1024;

/// The largest DATA frame either member takes: a write of several TLS
/// records goes as one frame, not one per record.
pub const MAX_FRAME: u32 = 256 * 1024;

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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client and a server stream of one in-memory HTTP/2 connection.
    async fn pair() -> (LinkStream, LinkStream) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::Builder::new()
                .initial_window_size(STREAM_WINDOW)
                .handshake::<_, Bytes>(b)
                .await
                .unwrap();
            let (req, mut respond) = conn.accept().await.unwrap().unwrap();
            let send = respond
                .send_response(http::Response::new(()), false)
                .unwrap();
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            LinkStream::new(Some(send), req.into_body())
        });
        let (client, conn) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .handshake::<_, Bytes>(a)
            .await
            .unwrap();
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
}
