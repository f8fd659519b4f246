//! h2's buffers as the gateway's HTTP/2 connections use them: the patched
//! h2 (third_party/README.md) gives an idle connection's read and write
//! buffers back (16 KiB and 8 KiB, allocated whole when a connection
//! starts), and allocates them again for the next frame.
//!
//! A client and a server connection of h2 over an in-memory pipe, on one
//! thread; `allocation-counter` replaces the global allocator in this test
//! binary only and counts what this thread allocates and frees.

use bytes::Bytes;
use http::{Request, Response};
use tokio::io::DuplexStream;

/// h2's write buffer (`DEFAULT_BUFFER_CAPACITY`) and read buffer
/// (tokio-util's `FramedRead`) as a connection starts.
const WRITE_BUFFER: i64 = 16 * 1024;
const READ_BUFFER: i64 = 8 * 1024;

/// A server answering every request with 1 KiB, on a task of its own.
async fn serve(io: DuplexStream) {
    let mut conn = h2::server::handshake(io).await.expect("server handshake");
    while let Some(accepted) = conn.accept().await {
        let (_req, mut respond) = accepted.expect("request");
        let mut body = respond
            .send_response(Response::new(()), false)
            .expect("response head");
        body.send_data(Bytes::from(vec![b'x'; 1024]), true)
            .expect("response body");
    }
}

/// One request on `client`, its reply read to the end.
async fn exchange(client: &mut h2::client::SendRequest<Bytes>) {
    *client = client.clone().ready().await.expect("client ready");
    let (reply, _) = client
        .send_request(Request::get("https://origin.test/").body(()).unwrap(), true)
        .expect("request");
    let mut body = reply.await.expect("reply").into_body();
    let mut got = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("chunk");
        got += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    assert_eq!(got, 1024);
}

/// Let every task on this thread run until it waits on the other side.
async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

#[test]
fn idle_http2_connections_hold_no_read_or_write_buffer() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // The counter does count on this thread.
    let probe = allocation_counter::measure(|| drop(std::hint::black_box(vec![1u8; 8])));
    assert_eq!(probe.count_total, 1);

    let mut client = None;
    // Both ends made, one request served, both idle: what stays held.
    let held = allocation_counter::measure(|| {
        client = Some(rt.block_on(async {
            let (c, s) = tokio::io::duplex(64 * 1024);
            tokio::spawn(serve(s));
            let (mut client, conn) = h2::client::handshake(c).await.expect("client handshake");
            tokio::spawn(async move {
                let _ = conn.await;
            });
            exchange(&mut client).await;
            settle().await;
            client
        }));
    });
    // Without the release, the two connections hold their four buffers
    // (48 KiB) besides their state; with it, none of them.
    let buffers = 2 * (WRITE_BUFFER + READ_BUFFER);
    assert!(
        held.bytes_current < buffers,
        "two idle connections hold {} bytes: {held:?}",
        held.bytes_current
    );

    // The next request gets them back, and is served as the first was.
    let mut client = client.take().unwrap();
    let again = allocation_counter::measure(|| {
        rt.block_on(async {
            exchange(&mut client).await;
            settle().await;
        })
    });
    // Allocated again for the exchange (the rest of it is a few KiB of
    // frames and stream state), and given back again once idle.
    assert!(
        again.bytes_total as i64 >= buffers,
        "the buffers were not allocated again: {again:?}"
    );
    assert!(
        again.bytes_current <= 0,
        "the second exchange left {} bytes held: {again:?}",
        again.bytes_current
    );
}
