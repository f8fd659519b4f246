//! How an HTTP/2 connection's replies reach the socket.
//!
//! A multiplexed connection with many streams answered at once should send
//! their replies together, not one write (one TLS record, one segment, one
//! wake-up of the client) per reply. Two things make that so, and this
//! test needs both:
//!
//! - `tls::Gathered` under the connection: the first write of a flush
//!   waits one turn of the scheduler, so every stream task that is ready
//!   queues its reply first;
//! - the patched h2 (third_party/README.md): a small DATA payload is copied
//!   beside the other frames instead of being chained, which made h2 write
//!   it out before buffering the next frame.
//!
//! The connection is hyper's HTTP/2 server, as the gateway's session side
//! runs it, on a multi-threaded runtime with one worker (tokio runs a task
//! woken by the running one next, which is what split the writes), over
//! an in-memory pipe that counts the writes reaching it. The same exchange
//! without `Gathered` is the control: one write per reply.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use talos_gateway::io::gathered::Gathered;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

const STREAMS: usize = 32;
const REPLY: usize = 1024;

/// A pipe end that counts the writes that put bytes into it, and says it
/// takes vectored writes, as the gateway's TLS streams do.
struct Counting {
    inner: DuplexStream,
    writes: Arc<AtomicUsize>,
}

impl AsyncRead for Counting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serve one HTTP/2 connection whose every request is answered at once
/// with REPLY bytes; send STREAMS requests on it together and read every
/// reply. Returns the server's writes during the replies.
async fn replies_written(gathered: bool) -> usize {
    let (server_end, client_end) = tokio::io::duplex(1 << 20);
    let writes = Arc::new(AtomicUsize::new(0));
    let io = Counting {
        inner: server_end,
        writes: Arc::clone(&writes),
    };
    let service = hyper::service::service_fn(|_req| async {
        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from(vec![
            b'r';
            REPLY
        ]))))
    });
    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    let server = if gathered {
        tokio::spawn(builder.serve_connection(TokioIo::new(Gathered::new(io)), service))
    } else {
        tokio::spawn(builder.serve_connection(TokioIo::new(io), service))
    };

    let (sender, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(client_end),
    )
    .await
    .expect("client handshake");
    let client = tokio::spawn(conn);
    // One request first: the settings exchange is over before counting.
    let warm = sender
        .clone()
        .send_request(
            hyper::Request::get("http://origin.test/")
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .expect("first reply");
    warm.into_body().collect().await.expect("first body");

    let before = writes.load(Ordering::SeqCst);
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..STREAMS {
        let mut sender = sender.clone();
        requests.spawn(async move {
            let reply = sender
                .send_request(
                    hyper::Request::get(format!("http://origin.test/{i}"))
                        .body(Empty::new())
                        .unwrap(),
                )
                .await
                .expect("reply");
            assert_eq!(reply.status(), 200);
            reply.into_body().collect().await.expect("body").to_bytes()
        });
    }
    let bodies = requests.join_all().await;
    let during = writes.load(Ordering::SeqCst) - before;
    for body in bodies {
        assert!(body.len() == REPLY && body.iter().all(|&b| b == b'r'));
    }
    drop(sender);
    let _ = client.await;
    let _ = server.await;
    during
}

fn on_one_worker(gathered: bool) -> usize {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // Spawned, so that the connection's tasks run on the worker.
    rt.block_on(async move { tokio::spawn(replies_written(gathered)).await.unwrap() })
}

#[test]
fn replies_to_streams_answered_together_leave_in_a_few_writes() {
    let plain = on_one_worker(false);
    let gathered = on_one_worker(true);
    eprintln!("writes for {STREAMS} replies: {plain} plain, {gathered} gathered");
    // Control: the exchange splits into a write per reply without Gathered.
    assert!(
        plain >= STREAMS / 2,
        "control: {plain} writes for {STREAMS} replies"
    );
    // 32 KiB of replies: h2 flushes each time its 16 KiB buffer has less
    // than 4 KiB free, so three or four writes, not 32.
    assert!(
        gathered <= STREAMS / 4,
        "{gathered} writes for {STREAMS} replies (control: {plain})"
    );
}
