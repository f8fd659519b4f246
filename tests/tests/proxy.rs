//! Terminate and re-originate, end to end: per-request refusals (host
//! mismatch, protocol upgrades, unreachable or untrustworthy destinations)
//! and streaming bodies with bounded gateway memory. Real curl, a hand-made
//! hyper client for what curl cannot send, and real TLS origins.

use std::collections::HashMap;
use std::net::IpAddr;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;
use talos_e2e::clients::http::{self, Body};
use talos_e2e::dns::{Answer, DnsServer};
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::origin::{pattern_byte, Origin, TestCa};
use talos_e2e::rig::Single;
use tokio::net::TcpListener;

/// Destinations: the good origin on 127.0.0.1; origins with bad
/// certificates on other loopback addresses at the same port (the
/// gateway's upstream port is one for all); nothing at all on 127.0.0.6.
const GOOD: &str = "origin.test";
const WRONG_NAME: &str = "wrong-name.test";
const EXPIRED: &str = "expired.test";
const UNTRUSTED: &str = "untrusted.test";
const DEAD: &str = "dead.test";
const H1_ONLY: &str = "h1.test";
const H2_ONLY: &str = "h2only.test";

/// The origins (at one port, on several loopback addresses) and the DNS
/// server naming them.
#[derive(Debug)]
struct Origins {
    /// The good origin, `origin.test` on 127.0.0.1.
    good: Origin,
    _others: Vec<Origin>,
    _dns: DnsServer,
}

type Rig = Single<Gateway, Origins>;

async fn rig() -> Rig {
    rig_with(talos_e2e::gateway::test_workers(), "").await
}

/// The rig with `runtime.workers` = `workers` (unset: one per CPU) and
/// `limits` added to the `[limits]` table.
async fn rig_with(workers: Option<usize>, limits: &str) -> Rig {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().to_owned();
    let ca = TestCa::new("origin test CA");
    ca.write_pem(&path.join("origin-ca.pem"));
    let stranger = TestCa::new("a CA nobody trusts");

    // One port, several loopback addresses.
    let (origins, port) = loop {
        let first = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = first.local_addr().unwrap().port();
        let mut others = Vec::new();
        for ip in [
            "127.0.0.3",
            "127.0.0.4",
            "127.0.0.5",
            "127.0.0.7",
            "127.0.0.8",
        ] {
            match TcpListener::bind((ip, port)).await {
                Ok(l) => others.push(l),
                Err(_) => break,
            }
        }
        if others.len() < 5 {
            continue;
        }
        let mut it = others.into_iter();
        let h2_h1 = [b"h2".as_slice(), b"http/1.1".as_slice()];
        let (c, k) = ca.leaf(&[GOOD]);
        let good = Origin::serve_cert(first, c, k, &h2_h1);
        let (c, k) = ca.leaf(&["somebody-else.test"]);
        let wrong = Origin::serve_cert(it.next().unwrap(), c, k, &h2_h1);
        let (c, k) = ca.leaf_with(&[EXPIRED], true);
        let expired = Origin::serve_cert(it.next().unwrap(), c, k, &h2_h1);
        let (c, k) = stranger.leaf(&[UNTRUSTED]);
        let untrusted = Origin::serve_cert(it.next().unwrap(), c, k, &h2_h1);
        let (c, k) = ca.leaf(&[H1_ONLY]);
        let h1 = Origin::serve_cert(it.next().unwrap(), c, k, &[b"http/1.1"]);
        let (c, k) = ca.leaf(&[H2_ONLY]);
        let h2 = Origin::serve_cert(it.next().unwrap(), c, k, &[b"h2"]);
        break (vec![good, wrong, expired, untrusted, h1, h2], port);
    };

    let addr = |a: &str| Answer::Addrs(vec![a.parse::<IpAddr>().unwrap()]);
    let dns = DnsServer::start(HashMap::from([
        (GOOD.to_owned(), addr("127.0.0.1")),
        (WRONG_NAME.to_owned(), addr("127.0.0.3")),
        (EXPIRED.to_owned(), addr("127.0.0.4")),
        (UNTRUSTED.to_owned(), addr("127.0.0.5")),
        (DEAD.to_owned(), addr("127.0.0.6")),
        (H1_ONLY.to_owned(), addr("127.0.0.7")),
        (H2_ONLY.to_owned(), addr("127.0.0.8")),
    ]))
    .await;
    let base = TestConfig {
        dns: dns.addr,
        upstream_port: port,
        anchors: vec![path.join("origin-ca.pem")],
        permit_internal: vec![
            "127.0.0.1/32".into(),
            "127.0.0.3/32".into(),
            "127.0.0.4/30".into(),
            "127.0.0.8/32".into(),
        ],
        ..Default::default()
    };
    let mut origins = origins.into_iter();
    let good = origins.next().expect("the good origin");
    let peers = Origins {
        good,
        _others: origins.collect(),
        _dns: dns,
    };
    Single::builder()
        .session(&[GOOD, WRONG_NAME, EXPIRED, UNTRUSTED, DEAD, H1_ONLY, H2_ONLY])
        .workers(workers)
        .limits(limits)
        .start(tmp, peers, base)
        .await
}

/// Every request of the first `n_records` records.
fn all_requests(rig: &Rig, n_records: usize) -> Vec<Value> {
    rig.gateway
        .wait_records(n_records)
        .iter()
        .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn assert_refused(head: &str, body: &str, reason: &str) {
    assert!(
        head.contains(&format!("hangar-refusal: {reason}")),
        "{head}"
    );
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("JSON body: {body:?}"));
    assert_eq!(v["refusal"], reason);
}

#[tokio::test(flavor = "multi_thread")]
async fn host_mismatch_is_refused_over_both_protocols() {
    let rig = rig().await;
    // HTTP/1.1 Host header.
    let (code, head, body) = rig
        .curl(GOOD, "/", &["--http1.1", "-H", "Host: other.test"])
        .into_text();
    assert_eq!(code, 421);
    assert_refused(&head, &body, "host_mismatch");
    // A port other than 443 is another host.
    let (code, _, _) = rig
        .curl(GOOD, "/", &["--http1.1", "-H", "Host: origin.test:8443"])
        .into_text();
    assert_eq!(code, 421);
    // HTTP/1.1 absolute-form target.
    let (code, head, body) = rig
        .curl(
            GOOD,
            "/",
            &["--http1.1", "--request-target", "https://other.test/x"],
        )
        .into_text();
    assert_eq!(code, 421);
    assert_refused(&head, &body, "host_mismatch");
    // HTTP/2 :authority (curl sends the Host option as :authority).
    let (code, head, body) = rig
        .curl(GOOD, "/", &["--http2", "-H", "Host: other.test"])
        .into_text();
    assert_eq!(code, 421);
    assert_refused(&head, &body, "host_mismatch");
    // The right host, any letter case, with or without :443, goes through.
    let (code, _, body) = rig
        .curl(GOOD, "/", &["--http1.1", "-H", "Host: ORIGIN.test:443"])
        .into_text();
    assert_eq!(code, 200, "{body}");
    let (code, _, body) = rig
        .curl(
            GOOD,
            "/",
            &["--http1.1", "--request-target", "https://origin.test/abs"],
        )
        .into_text();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("GET /abs"), "{body}");

    let requests = all_requests(&rig, 6);
    let refused = requests
        .iter()
        .filter(|r| r["refusal"] == "host_mismatch")
        .count();
    assert_eq!(refused, 4, "{requests:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrades_and_connect_are_refused() {
    let rig = rig().await;
    for headers in [
        ["Connection: Upgrade", "Upgrade: websocket"],
        ["Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c"],
    ] {
        let (code, head, body) = rig
            .curl(
                GOOD,
                "/",
                &["--http1.1", "-H", headers[0], "-H", headers[1]],
            )
            .into_text();
        assert_eq!(code, 403, "{head}");
        assert_refused(&head, &body, "upgrade_refused");
    }
    let (code, head, body) = rig
        .curl(
            GOOD,
            "/",
            &[
                "--http1.1",
                "-X",
                "CONNECT",
                "--request-target",
                "origin.test:443",
            ],
        )
        .into_text();
    assert_eq!(code, 403, "{head}");
    assert_refused(&head, &body, "upgrade_refused");

    // HTTP/2 extended CONNECT (RFC 8441, WebSockets over HTTP/2).
    let mut h2 = rig.connect(GOOD, true).await;
    let mut req = hyper::Request::builder()
        .method(hyper::Method::CONNECT)
        .uri("https://origin.test/chat")
        .header("sec-websocket-version", "13")
        .body(http::empty())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let resp = h2.send(req).await.expect("extended CONNECT answered");
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.headers()["hangar-refusal"], "upgrade_refused");

    // The curl connections have closed and are recorded; the HTTP/2 one is
    // still open (its CONNECT stream is the client's to end).
    let requests = all_requests(&rig, 3);
    assert_eq!(
        requests
            .iter()
            .filter(|r| r["refusal"] == "upgrade_refused")
            .count(),
        3,
        "{requests:#?}"
    );
    drop(h2);
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_or_untrustworthy_destinations_are_upstream_failed() {
    let rig = rig().await;
    for (name, cause_hint) in [
        (WRONG_NAME, "certificate for another name"),
        (EXPIRED, "expired certificate"),
        (UNTRUSTED, "certificate from an unknown CA"),
        (DEAD, "nothing listening"),
    ] {
        let (code, head, body) = rig.curl(name, "/", &[]).into_text();
        assert_eq!(code, 502, "{name} ({cause_hint}): {head}");
        assert_refused(&head, &body, "upstream_failed");
    }
    let records = rig.gateway.wait_records(4);
    for r in &records {
        assert_eq!(
            r["verdict"], "allowed",
            "the connection was allowed; its request failed: {r}"
        );
        assert_eq!(r["requests"][0]["refusal"], "upstream_failed", "{r}");
        assert_eq!(r["requests"][0]["status"], 502);
    }
    let log = rig.gateway.log();
    assert!(log.contains("upstream TLS handshake failed"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_session_reaches_an_http1_destination_and_back() {
    let rig = rig().await;
    let (code, _, body) = rig
        .curl(
            H1_ONLY,
            "/echo?x=1",
            &["--http2", "-H", "te: trailers", "-H", "x-end-to-end: yes"],
        )
        .into_text();
    assert_eq!(code, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["version"], "HTTP/1.1");
    assert_eq!(echo["query"], "x=1");
    let headers: HashMap<String, String> = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h[0].as_str().unwrap().to_owned(),
                h[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(headers["host"], "h1.test");
    assert_eq!(headers["x-end-to-end"], "yes");
    // TE is hop-by-hop: only the gateway's own "trailers" (it forwards
    // trailers) may reach the destination.
    assert!(
        headers.get("te").is_none_or(|te| te == "trailers"),
        "{headers:?}"
    );
    let records = rig.gateway.wait_records(1);
    assert_eq!(records[0]["alpn_session"], "h2");
    assert_eq!(records[0]["alpn_upstream"], "http/1.1");
}

/// `runtime.workers`: one thread serving everything (no pool worker at
/// all), a pool of three, or one per CPU; each serves both protocols
/// through to both kinds of destination and writes its records.
#[tokio::test(flavor = "multi_thread")]
async fn the_runtime_serves_with_the_configured_workers() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    for (workers, expect) in [(Some(1), 1), (Some(3), 3), (None, cpus)] {
        let rig = rig_with(workers, "").await;
        assert_eq!(rig.gateway.workers, expect);
        // Tokio names its pool's workers (and its blocking threads, none
        // of which exist before the first record) "tokio-rt-worker"; with
        // one worker the main thread is the runtime.
        // A thread takes its name once it runs, which on a loaded machine
        // may be a while after the ready line: wait for the pool to be all
        // named (with one worker there is none to wait for).
        let threads = || -> Vec<String> {
            std::fs::read_dir(format!("/proc/{}/task", rig.gateway.pid()))
                .unwrap()
                .map(|t| {
                    let comm = t.unwrap().path().join("comm");
                    std::fs::read_to_string(comm)
                        .unwrap_or_default()
                        .trim()
                        .to_owned()
                })
                .collect()
        };
        let pool = |names: &[String]| names.iter().filter(|n| *n == "tokio-rt-worker").count();
        let want_pool = if expect == 1 { 0 } else { expect };
        // The record writer's thread starts under the name of the worker
        // that spawned it and takes its own ("records") a moment later:
        // count once it has.
        let named = talos_e2e::wait::until(&format!("{want_pool} named workers"), || {
            talos_e2e::wait::check(threads(), |t| {
                pool(t) >= want_pool && t.iter().any(|n| n == "records")
            })
        });
        let named = pool(&named);
        assert_eq!(named, want_pool, "workers {workers:?}");
        let mut n = 0;
        for name in [GOOD, H1_ONLY, H2_ONLY] {
            for h2 in [false, true] {
                let flag = if h2 { "--http2" } else { "--http1.1" };
                let (code, _, body) = rig.curl(name, "/echo", &[flag]).into_text();
                assert_eq!(code, 200, "workers {workers:?} {name} {flag}: {body}");
                let echo: Value = serde_json::from_str(&body).unwrap();
                let upstream_h2 = name == H2_ONLY || (name == GOOD && h2);
                let version = if upstream_h2 { "HTTP/2.0" } else { "HTTP/1.1" };
                assert_eq!(echo["version"], version, "{name} {flag}: {body}");
                n += 1;
            }
        }
        assert_eq!(rig.gateway.wait_records(n).len(), n);
    }
}

/// SIGTERM with session connections open — HTTP/1.1 and HTTP/2 kept
/// after a request, HTTP/1.1 before its first — and one request waiting
/// on a slow reply: the request in flight gets its reply within the drain
/// grace, the open connections are cut at its end, the gateway exits 0,
/// and every connection has its record.
///
/// The slow reply is held at the origin: SIGTERM goes once the request is
/// there, and the reply once the gateway says it is draining.
#[tokio::test(flavor = "multi_thread")]
async fn open_connections_are_cut_when_the_drain_grace_ends() {
    let mut rig = rig_with(
        talos_e2e::gateway::test_workers(),
        "shutdown_grace_ms = 3000",
    )
    .await;
    let get = |path: &str| {
        hyper::Request::get(path)
            .header("host", GOOD)
            .body(http::empty())
            .unwrap()
    };
    let mut kept = Vec::new();
    for h2 in [false, true] {
        let mut s = rig.connect(GOOD, h2).await;
        let resp = s.send(get("/")).await.expect("first request");
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("body");
        kept.push(s);
    }
    let mut quiet = rig.tls(GOOD, false).await;
    let mut slow = rig.connect(GOOD, false).await;
    let in_flight = tokio::spawn(async move {
        let resp = slow.send(get("/hold/in-flight/slow/0")).await?;
        let status = resp.status();
        resp.into_body()
            .collect()
            .await
            .map(|b| (status, b.to_bytes()))
    });
    let holds = rig.peers.good.holds();
    holds.wait_held("in-flight").await;
    let log_path = rig.gateway.log_path.clone();
    let stopped = tokio::task::spawn_blocking(move || {
        let clean = rig.gateway.stop();
        (clean, rig)
    });
    talos_e2e::wait::until_async("the gateway's \"draining\" log line", || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        talos_e2e::wait::check(log.contains("draining open="), |d| *d)
    })
    .await;
    holds.release("in-flight");
    let (status, body) = in_flight
        .await
        .unwrap()
        .expect("the reply in flight arrives");
    assert_eq!(status, 200);
    assert!(!body.is_empty());
    let (clean, rig) = stopped.await.unwrap();
    assert!(clean, "the gateway exits 0 after the grace");
    for s in &mut kept {
        assert!(s.send(get("/")).await.is_err(), "a kept connection was cut");
    }
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16];
    assert!(
        matches!(quiet.read(&mut buf).await, Ok(0) | Err(_)),
        "the connection with no request was cut"
    );
    assert_eq!(
        rig.gateway.records().len(),
        4,
        "{:?}",
        rig.gateway.records()
    );
}

/// HTTP/1.1 requests go on as HTTP/1.1, HTTP/2 ones as HTTP/2, to a
/// destination that speaks both; to one that speaks only HTTP/2, an
/// HTTP/1.1 request goes over HTTP/2 (the HTTP/1.1-only handshake is
/// refused, and the pool remembers it).
#[tokio::test(flavor = "multi_thread")]
async fn the_upstream_protocol_follows_the_request() {
    let rig = rig().await;
    let version = |name: &str, flag: &str| {
        let (code, _, body) = rig.curl(name, "/echo", &[flag]).into_text();
        assert_eq!(code, 200, "{name} {flag}: {body}");
        let echo: Value = serde_json::from_str(&body).unwrap();
        echo["version"].as_str().unwrap().to_owned()
    };
    assert_eq!(version(GOOD, "--http1.1"), "HTTP/1.1");
    assert_eq!(version(GOOD, "--http2"), "HTTP/2.0");
    assert_eq!(version(H2_ONLY, "--http1.1"), "HTTP/2.0");
    assert_eq!(version(H2_ONLY, "--http1.1"), "HTTP/2.0");
    assert_eq!(version(GOOD, "--http1.1"), "HTTP/1.1");
    let records = rig.gateway.wait_records(5);
    let seen: Vec<(&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["alpn_session"].as_str().unwrap(),
                r["alpn_upstream"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("http/1.1", "http/1.1"),
            ("h2", "h2"),
            ("http/1.1", "h2"),
            ("http/1.1", "h2"),
            ("http/1.1", "http/1.1"),
        ]
    );
    // Nothing was refused on the way, and the refusal of the
    // HTTP/1.1-only handshake is not logged as a failure.
    assert!(
        records.iter().all(|r| r["refusal"].is_null()),
        "{records:?}"
    );
    assert!(!rig.gateway.log().contains("upstream TLS handshake failed"));
}

/// Bytes to push each way in the streaming test: large enough that any
/// whole-body buffering would show in the gateway's peak memory.
const STREAM_BYTES: u64 = 256 * 1024 * 1024;
/// The most the gateway's peak resident memory may grow while streaming.
const STREAM_RSS_BOUND_KIB: u64 = 48 * 1024;

#[tokio::test(flavor = "multi_thread")]
async fn large_bodies_stream_both_ways_byte_for_byte_with_bounded_memory() {
    use sha2::Digest;
    let rig = rig().await;
    let before = rig.gateway.peak_rss_kib();
    for h2 in [false, true] {
        // Upload: a generated body, hashed as it is sent.
        let mut sender = rig.connect(GOOD, h2).await;
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::io::Error>>(4);
        let producer = tokio::spawn(async move {
            let mut hash = sha2::Sha256::new();
            let block: Vec<u8> = (0..64 * 1024u64).map(|i| (i * 7 % 256) as u8).collect();
            let mut sent = 0;
            while sent < STREAM_BYTES {
                hash.update(&block);
                if tx
                    .send(Ok(hyper::body::Frame::data(Bytes::copy_from_slice(&block))))
                    .await
                    .is_err()
                {
                    break;
                }
                sent += block.len() as u64;
            }
            hex::encode(hash.finalize())
        });
        let body: Body = http_body_util::StreamBody::new(tokio_stream_from(rx)).boxed();
        let req = hyper::Request::post("https://origin.test/upload")
            .header("host", GOOD)
            .body(body)
            .unwrap();
        let resp = sender.send(req).await.expect("upload answered");
        assert_eq!(resp.status(), 200);
        let answer: Value =
            serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        let sent_hash = producer.await.unwrap();
        assert_eq!(answer["len"], STREAM_BYTES, "h2={h2}");
        assert_eq!(
            answer["sha256"], sent_hash,
            "the origin saw exactly the bytes sent (h2={h2})"
        );

        // Download: a pattern, checked byte by byte as it arrives.
        let req = hyper::Request::get(format!("https://origin.test/download/{STREAM_BYTES}"))
            .header("host", GOOD)
            .body(http::empty())
            .unwrap();
        let resp = sender.send(req).await.expect("download answered");
        let mut body = resp.into_body();
        let mut offset = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("download frame");
            if let Some(data) = frame.data_ref() {
                for (i, b) in data.iter().enumerate() {
                    assert_eq!(
                        *b,
                        pattern_byte(offset + i as u64),
                        "byte {} (h2={h2})",
                        offset + i as u64
                    );
                }
                offset += data.len() as u64;
            }
        }
        assert_eq!(offset, STREAM_BYTES, "h2={h2}");

        // The benchmarks' small reply: the pattern's first N bytes in one
        // body with its length, and a clear refusal past 64 KiB.
        for (n, status) in [(1024usize, 200), (65_536, 200), (65_537, 400)] {
            let req = hyper::Request::get(format!("https://origin.test/bytes/{n}"))
                .header("host", GOOD)
                .body(http::empty())
                .unwrap();
            let resp = sender.send(req).await.expect("bytes answered");
            assert_eq!(resp.status(), status, "/bytes/{n} (h2={h2})");
            let length = resp.headers().get("content-length").cloned();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(length, Some(body.len().into()), "/bytes/{n} (h2={h2})");
            if status == 200 {
                let want: Vec<u8> = (0..n as u64).map(pattern_byte).collect();
                assert!(
                    body == want,
                    "/bytes/{n}: the pattern's first bytes (h2={h2})"
                );
            }
        }
    }
    let after = rig.gateway.peak_rss_kib();
    assert!(
        after.saturating_sub(before) < STREAM_RSS_BOUND_KIB,
        "peak RSS grew from {before} KiB to {after} KiB while streaming {} MiB each way, twice",
        STREAM_BYTES >> 20
    );
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<hyper::body::Frame<Bytes>, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<hyper::body::Frame<Bytes>, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// HTTP/1.1 destination connections are driven by the requests that hold
/// them and pooled between requests: one session connection's requests,
/// one after the other, share one; replies without a body give theirs
/// back at once; concurrent requests each get their own, pooled after;
/// one the destination closes is replaced; one whose reply the session
/// stopped reading is closed, not pooled.
///
/// "Concurrent" is made sure of, not hoped for: those requests are held
/// at the origin until all of them have arrived there.
#[tokio::test]
async fn http1_destination_connections_are_reused_closed_and_replaced() {
    let rig = rig().await;
    let origin = &rig.peers.good;
    let accepted = || origin.seen().accepted;
    async fn fetch(s: &mut http::Sender, method: &str, path: &str) -> (u16, Bytes) {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("https://{GOOD}{path}"))
            .header("host", GOOD)
            .body(http::empty())
            .unwrap();
        let resp = s.send(req).await.expect("answered");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, body)
    }
    // Lets the held requests `names` go once every one of them is at the
    // origin, each (HTTP/1.1) on a destination connection of its own.
    let release_together = |names: &'static [&'static str]| async move {
        for name in names {
            origin.wait_held(name).await;
        }
        for name in names {
            origin.release(name);
        }
    };
    let pattern = |n: u64| (0..n).map(pattern_byte).collect::<Vec<u8>>();

    let mut a = rig.connect(GOOD, false).await;
    for (method, path, status, len) in [
        ("GET", "/bytes/1024", 200, 1024),
        ("HEAD", "/bytes/16", 200, 0),
        ("GET", "/none", 204, 0),
        ("GET", "/download/300000", 200, 300_000),
        ("GET", "/bytes/10", 200, 10),
    ] {
        let (code, body) = fetch(&mut a, method, path).await;
        assert_eq!((code, body.len()), (status, len), "{method} {path}");
        if len > 0 {
            assert_eq!(body, pattern(len as u64), "{path}");
        }
    }
    // Every reply came over a connection the origin had counted before it
    // answered: a second one would be counted by now.
    assert_eq!(accepted(), 1, "one destination connection for them all");

    // The destination closes after this reply: the next request gets a
    // new connection.
    assert_eq!(fetch(&mut a, "GET", "/close").await.0, 200);
    assert_eq!(fetch(&mut a, "GET", "/bytes/5").await.1, pattern(5));
    assert_eq!(accepted(), 2, "the closed connection was replaced");
    // The destination gave tickets on the first: the replacement resumed
    // its TLS session (the pool keeps them, in memory, for its session).
    assert_eq!(origin.seen().resumed, 1, "the replacement resumed");

    // Two at once: two connections; then both are pooled.
    let mut b = rig.connect(GOOD, false).await;
    let (ra, rb, ()) = tokio::join!(
        fetch(&mut a, "GET", "/hold/a1/download/2000000"),
        fetch(&mut b, "GET", "/hold/b1/download/2000000"),
        release_together(&["a1", "b1"]),
    );
    assert_eq!(ra.1, pattern(2_000_000));
    assert_eq!(rb.1, pattern(2_000_000));
    assert_eq!(accepted(), 3, "two requests at once, two connections");
    for s in [&mut a, &mut b] {
        assert_eq!(fetch(s, "GET", "/bytes/3").await.1, pattern(3));
    }
    assert_eq!(accepted(), 3, "both were pooled and used again");

    // The session stops reading a reply and goes away: that destination
    // connection is closed, not pooled. The next two at once reuse the
    // one left and open one more.
    drop(a);
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut raw = rig.tls(GOOD, false).await;
        raw.write_all(b"GET /download/50000000 HTTP/1.1\r\nhost: origin.test\r\n\r\n")
            .await
            .unwrap();
        let mut got = vec![0u8; 256 * 1024];
        let mut n = 0;
        while n < got.len() {
            n += raw.read(&mut got[n..]).await.unwrap();
        }
        assert!(got.starts_with(b"HTTP/1.1 200"));
    }
    // Both session connections closed (their records are written); the
    // wait gives the runtime to the client connections meanwhile.
    talos_e2e::wait::until_async("the records of both closed connections", || {
        talos_e2e::wait::check(rig.gateway.records().len(), |n| *n >= 2)
    })
    .await;
    // The one the destination closed, and the one left mid-reply.
    let seen = origin.wait_closed(2).await;
    assert_eq!(
        seen,
        talos_e2e::origin::Seen {
            accepted: 3,
            closed: 2,
            // Every connection after the first resumed.
            resumed: 2,
        }
    );
    let mut c = rig.connect(GOOD, false).await;
    let (rb, rc, ()) = tokio::join!(
        fetch(&mut b, "GET", "/hold/b2/bytes/64"),
        fetch(&mut c, "GET", "/hold/c2/download/100000"),
        release_together(&["b2", "c2"]),
    );
    assert_eq!(rb.1, pattern(64));
    assert_eq!(rc.1, pattern(100_000));
    assert_eq!(
        accepted(),
        4,
        "the pooled connection used again, one more opened"
    );
    // The last two go away too; with the runtime free to close them, each
    // session connection has its record (and the gateway's drain at the
    // rig's end has nothing to wait for).
    drop((b, c));
    let records = talos_e2e::wait::until_async("the records of all four connections", || {
        talos_e2e::wait::check(rig.gateway.records(), |r| r.len() >= 4)
    })
    .await;
    assert_eq!(records.len(), 4, "{records:#?}");
}

/// TLS sessions with destinations are resumed within a session only: a
/// session's pool keeps the tickets its destinations gave, and another
/// session's pool neither sees nor offers them. Each `/close` reply ends
/// its destination connection (HTTP/1.1 all the way), so every request
/// below makes a new one.
#[tokio::test(flavor = "multi_thread")]
async fn destination_tls_sessions_resume_within_their_session_only() {
    const OTHER_SOURCE: &str = "127.0.0.3";
    let rig: Single = Single::builder()
        .session(&[GOOD])
        .also_session("sess-2", OTHER_SOURCE, &[GOOD])
        .start_loopback(&[GOOD])
        .await;
    let origin = &rig.peers.origin;
    let other_ca = rig.dir.join("sess-2-ca.pem");
    let close = |source: &str| {
        let ca = if source == OTHER_SOURCE {
            other_ca.as_path()
        } else {
            rig.trust.as_path()
        };
        // curl blocks: the origin and the DNS server go on on other workers.
        let got = talos_e2e::rig::blocking(|| {
            talos_e2e::clients::Curl::via(rig.gateway.data, ca, GOOD)
                .from(source)
                .args(&["--http1.1"])
                .run("/close")
        });
        assert_eq!(got.status, 200, "{source}: {}", rig.gateway.log());
        origin.seen()
    };
    let seen = close(talos_e2e::clients::SESSION_SOURCE);
    assert_eq!((seen.accepted, seen.resumed), (1, 0), "the first: full");
    // The other session's first connection: a full handshake, although
    // the gateway holds tickets for this destination (the first session's).
    let seen = close(OTHER_SOURCE);
    assert_eq!((seen.accepted, seen.resumed), (2, 0), "another session's");
    let seen = close(talos_e2e::clients::SESSION_SOURCE);
    assert_eq!(
        (seen.accepted, seen.resumed),
        (3, 1),
        "resumed in its session"
    );
    let seen = close(OTHER_SOURCE);
    assert_eq!((seen.accepted, seen.resumed), (4, 2), "and in the other's");
}
