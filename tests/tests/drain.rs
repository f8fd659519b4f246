//! The drain, as the clients of a member see it: on SIGTERM and on an
//! upgrade's `go`, every open session connection is told at once and
//! finishes gracefully. HTTP/1.1: a keep-alive connection waiting between
//! requests is closed (cleanly: TLS close_notify, never a reset), the
//! request in flight gets its whole answer with `Connection: close`, and a
//! connection opened before the drain gets its first request answered the
//! same way. HTTP/2: GOAWAY at once, and the streams already open are
//! answered. What still runs at the grace — a download the client reads
//! too slowly — is cut, and its record says `cut: true` (the request's
//! entry and the connection, whose cause is `cut_at_grace`).
//!
//! Real `gateway` processes (a member followed across its handover, on
//! the shared rig: [`Single`] with a [`Member`]), real signals, a TLS
//! origin holding requests until the test lets them go, and clients that
//! see every frame: hyper's HTTP/1.1 client and a raw HTTP/2 one.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use talos_e2e::clients::http;
use talos_e2e::member::{alive, signal, Member};
use talos_e2e::rig::Single;
use talos_e2e::wait;

const NAME: &str = "origin.test";
/// Long enough that anything the tests see before it comes from the
/// drain's announcement, not from its end.
const LONG_GRACE_MS: u64 = 20_000;

/// A member (its process socket in the rig's folder, for `gateway
/// upgrade`) with one static session from the rig's session source to
/// [`NAME`], the origin behind it, and this grace.
type Rig = Single<Member>;

async fn rig(grace_ms: u64) -> Rig {
    Single::builder()
        .session(&[NAME])
        .session_id("sess-drain")
        .limits(&format!("shutdown_grace_ms = {grace_ms}\n"))
        .start_loopback(&[NAME])
        .await
}

/// What the origin answers for `/PATH` (and `/hold/NAME/PATH`).
fn answered(path: &str) -> String {
    let path = match path.strip_prefix("/hold/").and_then(|r| r.split_once('/')) {
        Some((_, rest)) => format!("/{rest}"),
        None => path.to_owned(),
    };
    format!(" GET {path}\n")
}

/// An HTTP/1.1 keep-alive connection through the gateway, hyper's client.
struct H1 {
    send: http1::SendRequest<http::Body>,
    /// The connection's own task: `Ok` when it ended cleanly (the server
    /// closed it with TLS close_notify), an error for a reset or a close
    /// without close_notify.
    driver: JoinHandle<hyper::Result<()>>,
}

/// A whole answer: status, `Connection` header, body.
#[derive(Debug)]
struct Got {
    status: u16,
    connection: Option<String>,
    body: Bytes,
}

impl H1 {
    async fn open(rig: &Rig) -> H1 {
        let tls = rig.tls(NAME, false).await;
        let (send, conn) = http1::handshake(TokioIo::new(tls))
            .await
            .expect("HTTP/1.1 handshake");
        H1 {
            send,
            driver: tokio::spawn(conn),
        }
    }

    /// One GET, its whole answer (or what went wrong).
    async fn get(&mut self, path: &str) -> Result<Got, String> {
        self.send.ready().await.map_err(|e| e.to_string())?;
        let req = hyper::Request::get(path)
            .header("host", NAME)
            .body(http::empty())
            .expect("request");
        let resp = self
            .send
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status().as_u16();
        let connection = resp
            .headers()
            .get(hyper::header::CONNECTION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok(Got {
            status,
            connection,
            body,
        })
    }

    /// Wait (at most the deadline) for the gateway to end the connection;
    /// whether it ended it cleanly. The sender is kept meanwhile: dropped,
    /// it would have the client close the connection itself.
    async fn closed(self) -> Result<(), String> {
        let H1 { send, driver } = self;
        let ended = tokio::time::timeout(wait::DEADLINE, driver).await;
        drop(send);
        match ended {
            Err(_) => Err("still open at the deadline".into()),
            Ok(Err(e)) => Err(format!("task: {e}")),
            Ok(Ok(Err(e))) => Err(format!("ended with an error: {e:?}")),
            Ok(Ok(Ok(()))) => Ok(()),
        }
    }
}

/// A GET on `conn` in a task of its own: in flight until the origin
/// releases it.
fn in_flight(mut conn: H1, path: &str) -> JoinHandle<(H1, Result<Got, String>)> {
    let path = path.to_owned();
    tokio::spawn(async move {
        let got = conn.get(&path).await;
        (conn, got)
    })
}

/// An answer in flight across the drain: whole, 200, with
/// `Connection: close`; then the gateway closes the connection cleanly.
async fn answered_and_closed(task: JoinHandle<(H1, Result<Got, String>)>, path: &str) {
    let (conn, got) = task.await.expect("request task");
    let got = got.unwrap_or_else(|e| panic!("{path} in flight across the drain: {e}"));
    assert_eq!(got.status, 200, "{path}: {got:?}");
    assert!(
        got.body.ends_with(answered(path).as_bytes()),
        "{path}: the whole answer: {got:?}"
    );
    assert_eq!(
        got.connection.as_deref(),
        Some("close"),
        "{path}: an answer during the drain says Connection: close"
    );
    assert_eq!(
        conn.closed().await,
        Ok(()),
        "{path}: closed cleanly after its answer"
    );
}

/// A raw HTTP/2 client: the test writes each frame and sees every frame
/// the gateway sends (GOAWAY among them); SETTINGS and PING are
/// acknowledged as they come. It never sends WINDOW_UPDATE: a reply
/// longer than the initial window stalls, as with a client that stopped
/// reading.
struct H2 {
    tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    /// GOAWAY frames received: (last stream id, error code).
    goaways: Vec<(u32, u32)>,
    /// Per stream: the first byte of its response header block, the data
    /// so far, whether it has ended.
    streams: std::collections::BTreeMap<u32, Stream>,
}

#[derive(Debug, Default)]
struct Stream {
    status_byte: Option<u8>,
    data: Vec<u8>,
    ended: bool,
    reset: Option<u32>,
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
/// HPACK: `:status: 200`, static table entry 8, indexed.
const STATUS_200: u8 = 0x88;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("small frame");
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

impl H2 {
    async fn open(rig: &Rig) -> H2 {
        let mut tls = rig.tls(NAME, true).await;
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        tls.write_all(&hello).await.expect("preface");
        H2 {
            tls,
            goaways: Vec::new(),
            streams: Default::default(),
        }
    }

    /// Open stream `id`: GET `path`, no body.
    async fn get(&mut self, id: u32, path: &str) {
        // HPACK, no Huffman: :method GET (2), :scheme https (7), then
        // :path (4) and :authority (1) as literals without indexing.
        let mut block = vec![0x82, 0x87];
        for (index, value) in [(0x04u8, path), (0x01, NAME)] {
            block.push(index);
            block.push(u8::try_from(value.len()).expect("short value"));
            block.extend(value.as_bytes());
        }
        let f = frame(HEADERS, 0x4 | END_STREAM, id, &block);
        self.tls.write_all(&f).await.expect("HEADERS");
        self.streams.insert(id, Stream::default());
    }

    /// Read one frame and take it in; `false` once the connection ended
    /// (cleanly or not).
    async fn step(&mut self) -> bool {
        let mut head = [0u8; 9];
        if self.tls.read_exact(&mut head).await.is_err() {
            return false;
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        if self.tls.read_exact(&mut payload).await.is_err() {
            return false;
        }
        let word = |at: usize| {
            u32::from_be_bytes([
                payload[at],
                payload[at + 1],
                payload[at + 2],
                payload[at + 3],
            ])
        };
        match kind {
            SETTINGS if flags & ACK == 0 => {
                let ack = frame(SETTINGS, ACK, 0, &[]);
                let _ = self.tls.write_all(&ack).await;
            }
            PING if flags & ACK == 0 => {
                let pong = frame(PING, ACK, 0, &payload);
                let _ = self.tls.write_all(&pong).await;
            }
            GOAWAY => self.goaways.push((word(0) & 0x7fff_ffff, word(4))),
            HEADERS | DATA | RST_STREAM => {
                let s = self.streams.entry(id).or_default();
                match kind {
                    HEADERS => {
                        s.status_byte
                            .get_or_insert(payload.first().copied().unwrap_or(0));
                    }
                    DATA => s.data.extend(&payload),
                    _ => s.reset = Some(word(0)),
                }
                if kind != RST_STREAM && flags & END_STREAM != 0 {
                    s.ended = true;
                }
            }
            _ => {}
        }
        true
    }

    /// Read frames until `done` holds (or the connection ends: `false`),
    /// within the deadline.
    async fn until(&mut self, what: &str, done: impl Fn(&H2) -> bool) -> bool {
        let read = async {
            loop {
                if done(self) {
                    return true;
                }
                if !self.step().await {
                    return done(self);
                }
            }
        };
        tokio::time::timeout(wait::DEADLINE, read)
            .await
            .unwrap_or_else(|_| panic!("waited {} s for {what}", wait::DEADLINE.as_secs()))
    }

    /// Stream `id` answered 200 and whole, as the origin answers `path`.
    fn assert_answered(&self, id: u32, path: &str) {
        let s = &self.streams[&id];
        assert!(s.ended && s.reset.is_none(), "stream {id} ({path}): {s:?}");
        assert_eq!(s.status_byte, Some(STATUS_200), "stream {id} ({path})");
        assert!(
            s.data.ends_with(answered(path).as_bytes()),
            "stream {id} ({path}): {:?}",
            String::from_utf8_lossy(&s.data)
        );
    }
}

/// Wait for the member's process `pid` to exit.
async fn exited(pid: u32) {
    wait::until_async(&format!("process {pid} to exit"), || {
        wait::check(alive(pid), |a| !a)
    })
    .await;
}

/// (a) HTTP/1.1 across SIGTERM: the idle keep-alive connections close at
/// once (cleanly), while requests are in flight; each of those gets its
/// whole answer with `Connection: close`, as does the first request of a
/// connection opened before the drain; then the process exits without
/// waiting out the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_closes_idle_keep_alive_connections_and_answers_requests_in_flight() {
    let rig = rig(LONG_GRACE_MS).await;
    let pid = rig.gateway.pids[0];

    // Every connection has served one request first: keep-alive
    // connections, as a client's pool holds them. The first one's is a
    // download streamed in several frames, read whole (its record must
    // not say cut).
    let mut idle = Vec::new();
    let mut busy = Vec::new();
    for i in 0..5 {
        let mut c = H1::open(&rig).await;
        let path = if i == 0 {
            "/download/300000".to_owned()
        } else {
            format!("/first/{i}")
        };
        let got = c.get(&path).await.expect("first request");
        assert_eq!(got.status, 200);
        if i == 0 {
            assert_eq!(got.body.len(), 300_000);
        }
        assert_eq!(
            got.connection, None,
            "no Connection: close before the drain"
        );
        if i < 2 {
            idle.push(c);
        } else {
            busy.push(c);
        }
    }
    let mut held = Vec::new();
    for (i, c) in busy.into_iter().enumerate() {
        let path = format!("/hold/h1-{i}/across/{i}");
        held.push((format!("h1-{i}"), path.clone(), in_flight(c, &path)));
    }
    for (name, _, _) in &held {
        rig.peers.origin.wait_held(name).await;
    }
    // Opened, its TLS up, no request yet.
    let fresh_tls = rig.tls(NAME, false).await;

    signal(pid, "TERM");
    // The idle connections close while the requests are still held.
    for c in idle {
        assert_eq!(
            c.closed().await,
            Ok(()),
            "an idle keep-alive connection is closed cleanly at the drain's start"
        );
    }
    // The fresh connection's first request comes during the drain.
    wait::until_async("the drain to begin", || {
        wait::check(rig.gateway.log(), |l| l.contains("draining open="))
    })
    .await;
    let (send, conn) = http1::handshake(TokioIo::new(fresh_tls))
        .await
        .expect("handshake");
    let fresh = H1 {
        send,
        driver: tokio::spawn(conn),
    };
    let fresh = in_flight(fresh, "/during/the/drain");

    for (name, _, _) in &held {
        rig.peers.origin.release(name);
    }
    for (_, path, task) in held {
        answered_and_closed(task, &path).await;
    }
    answered_and_closed(fresh, "/during/the/drain").await;
    exited(pid).await;
    assert!(
        !rig.gateway.log().contains("grace over"),
        "nothing was left to cut: {}",
        rig.gateway.log()
    );
    // Every request is on the record, whole.
    let requests: Vec<serde_json::Value> = rig
        .records()
        .iter()
        .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(requests.len(), 9, "{requests:?}");
    assert!(
        requests
            .iter()
            .all(|r| r["status"] == 200 && r.get("cut").is_none()),
        "{requests:?}"
    );
}

/// (b) HTTP/2 across SIGTERM: GOAWAY (NO_ERROR) at once, while streams
/// are open; those streams are answered whole, then the gateway closes
/// the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_sends_goaway_and_answers_the_open_streams() {
    let rig = rig(LONG_GRACE_MS).await;
    let pid = rig.gateway.pids[0];
    let mut h2 = H2::open(&rig).await;
    h2.get(1, "/before").await;
    assert!(h2.until("stream 1's answer", |h| h.streams[&1].ended).await);
    h2.assert_answered(1, "/before");
    h2.get(3, "/hold/h2-a/open/a").await;
    h2.get(5, "/hold/h2-b/open/b").await;
    rig.peers.origin.wait_held("h2-a").await;
    rig.peers.origin.wait_held("h2-b").await;

    signal(pid, "TERM");
    let told = h2.until("GOAWAY", |h| !h.goaways.is_empty()).await;
    assert!(told, "the connection ended without a GOAWAY");
    assert_eq!(h2.goaways[0].1, 0, "GOAWAY with NO_ERROR: {:?}", h2.goaways);
    assert!(
        !h2.streams[&3].ended && !h2.streams[&5].ended,
        "GOAWAY came while the streams were open"
    );
    rig.peers.origin.release("h2-a");
    rig.peers.origin.release("h2-b");
    let done = |h: &H2| h.streams[&3].ended && h.streams[&5].ended;
    assert!(h2.until("the open streams' answers", done).await);
    h2.assert_answered(3, "/hold/h2-a/open/a");
    h2.assert_answered(5, "/hold/h2-b/open/b");
    // The gateway then closes the connection: its last GOAWAY covers the
    // streams it answered.
    assert!(!h2.until("the connection's close", |_| false).await);
    let last = h2.goaways.last().expect("a GOAWAY");
    assert!(last.0 >= 5 && last.1 == 0, "{:?}", h2.goaways);
    exited(pid).await;
    assert!(
        !rig.gateway.log().contains("grace over"),
        "{}",
        rig.gateway.log()
    );
    let requests: Vec<serde_json::Value> = rig
        .records()
        .iter()
        .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(
        requests
            .iter()
            .all(|r| r["status"] == 200 && r.get("cut").is_none()),
        "every stream answered whole: {requests:?}"
    );
}

/// (c) The same across an upgrade's `go`: the successor takes the
/// listeners and serves what the clients open next; the old process tells
/// its own connections at once — an idle HTTP/1.1 one closed, GOAWAY on
/// HTTP/2 — and answers what they have in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgrade_drains_the_old_process_connections_gracefully() {
    let mut rig = rig(LONG_GRACE_MS).await;
    let old = rig.gateway.pids[0];

    let mut idle = H1::open(&rig).await;
    assert_eq!(idle.get("/first").await.expect("first").status, 200);
    let mut busy = H1::open(&rig).await;
    assert_eq!(busy.get("/first").await.expect("first").status, 200);
    let h1_path = "/hold/up-h1/across/h1";
    let busy = in_flight(busy, h1_path);
    let mut h2 = H2::open(&rig).await;
    h2.get(1, "/hold/up-h2/across/h2").await;
    rig.peers.origin.wait_held("up-h1").await;
    rig.peers.origin.wait_held("up-h2").await;

    let (ok, out, err) = tokio::task::block_in_place(|| rig.gateway.command("upgrade"));
    assert!(ok, "upgrade: {out} {err}\n{}", rig.gateway.log());
    let second = tokio::task::block_in_place(|| rig.gateway.wait_ready(2));
    assert_ne!(second["pid"].as_u64(), Some(u64::from(old)));

    assert_eq!(
        idle.closed().await,
        Ok(()),
        "the old process closes its idle connection at `go`"
    );
    let told = h2
        .until("GOAWAY from the old process", |h| !h.goaways.is_empty())
        .await;
    assert!(told, "the old process's connection ended without a GOAWAY");
    // The successor serves a new connection meanwhile.
    let mut next = H1::open(&rig).await;
    let got = next.get("/on/the/successor").await.expect("successor");
    assert_eq!(got.status, 200);
    assert_eq!(got.connection, None);
    assert!(alive(old), "the old process still drains");

    rig.peers.origin.release("up-h1");
    rig.peers.origin.release("up-h2");
    answered_and_closed(busy, h1_path).await;
    assert!(
        h2.until("the open stream's answer", |h| h.streams[&1].ended)
            .await
    );
    h2.assert_answered(1, "/hold/up-h2/across/h2");
    exited(old).await;
    assert!(
        !rig.gateway.log().contains("grace over"),
        "{}",
        rig.gateway.log()
    );
}

/// (d) A download the client reads too slowly to finish within the grace
/// (it stopped reading): cut at the grace, on HTTP/1.1 and HTTP/2 alike,
/// and each one's record lists its request with the status sent and
/// `cut: true`, and says the connection was cut (`cut: true`, cause
/// `cut_at_grace`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_download_still_streaming_at_the_grace_is_cut_and_recorded_cut() {
    let rig = rig(1500).await;
    let pid = rig.gateway.pids[0];
    const H1_PATH: &str = "/download/1073741824";
    const H2_PATH: &str = "/download/1073741825";

    // HTTP/1.1: the head is read, the body never.
    let mut h1 = H1::open(&rig).await;
    h1.send.ready().await.expect("ready");
    let req = hyper::Request::get(H1_PATH)
        .header("host", NAME)
        .body(http::empty())
        .expect("request");
    let resp = h1
        .send
        .send_request(req)
        .await
        .expect("the download's head");
    assert_eq!(resp.status(), 200);
    // HTTP/2: the head and the first window of data, then no
    // WINDOW_UPDATE: the stream stalls.
    let mut h2 = H2::open(&rig).await;
    h2.get(1, H2_PATH).await;
    assert!(
        h2.until("the download's first bytes", |h| h.streams[&1].data.len()
            >= 16 * 1024)
            .await
    );

    signal(pid, "TERM");
    exited(pid).await;
    assert!(
        rig.gateway
            .log()
            .contains("grace over; cutting open connections"),
        "{}",
        rig.gateway.log()
    );
    assert!(
        !h2.streams[&1].ended,
        "the download did not end: it was cut"
    );
    drop(resp);
    let records = rig.records();
    for path in [H1_PATH, H2_PATH] {
        let record = records
            .iter()
            .find(|r| {
                r["requests"]
                    .as_array()
                    .is_some_and(|q| q.iter().any(|e| e["path"] == path))
            })
            .unwrap_or_else(|| panic!("no record lists {path}: {records:?}"));
        let entry = record["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["path"] == path)
            .expect("the entry");
        assert_eq!(entry["status"], 200, "{path}: {entry}");
        assert_eq!(entry["cut"], true, "{path}: the download was cut: {entry}");
        // The connection too, as every connection cut at the grace is.
        assert_eq!(record["verdict"], "allowed", "{record}");
        assert_eq!(record["cut"], true, "{path}: {record}");
        assert_eq!(record["cause"], "cut_at_grace", "{path}: {record}");
    }
}
