//! What one session at every bound of its share costs another session:
//! `benches/share/run.sh` runs this. It starts the peers (a DNS server, a
//! TLS origin, a test control plane whose relay never decides) and the
//! gateway binary (one runtime worker, as the benchmarks run it), opens
//! session A (127.0.0.2) and session B (127.0.0.3), then measures B's
//! latency in rounds of three phases: alone, beside A holding every bound
//! at once, and beside A holding them and pushing at each:
//!
//! - B: `COUNT` requests one after another on an HTTP/1.1 keep-alive
//!   connection (1 KiB replies), and `COUNT / 10` requests each on a new TLS
//!   connection; the latency of each, p50 and p99 per round;
//! - A, before the first loaded round: every connection it may open
//!   (`session_connections`, 256), of which `session_handshakes` (64) are
//!   half-sent hellos, every request it may hold (32) and every proposal
//!   it may have waiting (8), with every card spent; in the third phase it
//!   also keeps pushing at each bound as fast as the answers come (a new
//!   connection, a held request, a proposal: each refused at once).
//!
//! Prints one JSON line: per round, B's p50 and p99 in microseconds, and
//! the medians. Bounded: every wait has a deadline and the whole run stops
//! after `LIMIT_SECS`.
//!
//! Usage: share-load DIR [COUNT [ROUNDS]]   (defaults 2000 and 3; the
//! gateway binary from `TALOS_GATEWAY_BIN`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use talos_e2e::clients::{connect_from, http};
use talos_e2e::control::{gateway_client, ControlPki};
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::origin::LoopbackOrigin;
use talos_e2e::relay::Relay;
use talos_gateway::pb;
use tokio::io::AsyncWriteExt;

const API: &str = "api.test";
const APPROVALS: &str = "approvals.hangar.internal";
const A: &str = "127.0.0.2";
const B: &str = "127.0.0.3";
const LIMIT_SECS: u64 = 600;
/// The share's defaults, but for the card burst: with the default 10, the
/// rate alone keeps A from ever holding its 32 requests and 8 proposals at
/// once; 40 lets A reach every bound together.
const CONNECTIONS: usize = 256;
const HANDSHAKES: usize = 64;
const HELD: usize = 32;
const PROPOSALS: usize = 8;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: share-load DIR [COUNT [ROUNDS]]");
        std::process::exit(2);
    };
    let count: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let run = tokio::time::timeout(Duration::from_secs(LIMIT_SECS), measure(dir, count, rounds));
    match run.await {
        Ok(line) => println!("{line}"),
        Err(_) => {
            eprintln!("share-load: over {LIMIT_SECS} s; stopped");
            std::process::exit(1);
        }
    }
}

fn rules() -> Vec<pb::LockRule> {
    let rule = |id: &str, destination: &str, path: &str| pb::LockRule {
        id: id.into(),
        destination: destination.into(),
        method: "POST".into(),
        path_prefix: path.into(),
        mode: "every_request".into(),
        approvers: vec!["nobody-decides".into()],
        ..Default::default()
    };
    vec![
        rule("hold-deploy", API, "/deploy"),
        rule("hold-agent", APPROVALS, "/v1/proposals"),
    ]
}

/// p50 and p99 of `samples`, in microseconds.
fn percentiles(mut samples: Vec<Duration>) -> (u64, u64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        u64::try_from(samples[i].as_micros()).unwrap_or(u64::MAX)
    };
    (at(0.50), at(0.99))
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// B's round: `count` keep-alive requests, then `count / 10` on new
/// connections. (keep-alive p50, p99, new-connection p50, p99).
async fn b_round(gw: std::net::SocketAddr, ca: &Path, count: usize) -> [u64; 4] {
    let mut s = http::connect(B, gw, API, ca, false).await;
    let mut keep = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let got = get(&mut s, "/bytes/1024").await;
        keep.push(started.elapsed());
        assert_eq!(got, 200, "B served");
    }
    let mut fresh = Vec::with_capacity(count / 10);
    for _ in 0..(count / 10).max(1) {
        let started = Instant::now();
        let mut s = http::connect(B, gw, API, ca, false).await;
        let got = get(&mut s, "/bytes/1024").await;
        fresh.push(started.elapsed());
        assert_eq!(got, 200, "B served on a new connection");
    }
    let (k50, k99) = percentiles(keep);
    let (f50, f99) = percentiles(fresh);
    [k50, k99, f50, f99]
}

async fn get(s: &mut http::Sender, path: &str) -> u16 {
    use http_body_util::BodyExt;
    let req = hyper::Request::get(format!("https://{API}{path}"))
        .body(http::empty())
        .expect("request");
    let resp = s.send(req).await.expect("answer");
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

async fn post(s: &mut http::Sender, name: &str, path: &str, body: &str) -> u16 {
    use http_body_util::BodyExt;
    let req = hyper::Request::post(format!("https://{name}{path}"))
        .header("content-type", "application/json")
        .body(
            http_body_util::Full::new(bytes::Bytes::from(body.to_owned()))
                .map_err(|never| match never {})
                .boxed(),
        )
        .expect("request");
    match s.send(req).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let _ = resp.into_body().collect().await;
            status
        }
        Err(_) => 0,
    }
}

async fn measure(dir: PathBuf, count: usize, rounds: usize) -> serde_json::Value {
    let peers = LoopbackOrigin::start(&dir, API).await;
    let pki = ControlPki::new(&dir);
    let relay = Relay::start(&pki).await;
    let mut control = pki.files.clone();
    control.extra = format!(
        "plane = \"{}\"\nspool_dir = {:?}\n",
        relay.addr,
        dir.join("spool").display().to_string()
    );
    let config = TestConfig {
        control: Some(control),
        workers: Some(1),
        connect_timeout_ms: None,
        hello_timeout_ms: Some(600_000),
        limits: format!("session_proposal_burst = {}\n", HELD + PROPOSALS),
        ..peers.config()
    };
    let gateway = Gateway::start(&dir, &config.toml(&dir));
    let mut client = gateway_client(
        gateway.control.expect("control"),
        &pki.ca.cert_pem,
        Some(pki.client_identity()),
    );
    let ca_a = open(&mut client, &relay, &dir, "sbx-a", A).await;
    let ca_b = open(&mut client, &relay, &dir, "sbx-b", B).await;
    let gw = gateway.data;
    // Warm up B: its leaf, the destination connection.
    b_round(gw, &ca_b, 50).await;

    // Per round: B alone (A's session idle, or not yet filled), B beside A
    // holding every bound, B beside A holding them and pushing at each.
    let mut alone = Vec::new();
    let mut holding = Vec::new();
    let mut pushing = Vec::new();
    let mut a_ready = None;
    let pushed = Arc::new(AtomicU64::new(0));
    for round in 0..rounds {
        alone.push(b_round(gw, &ca_b, count).await);
        if a_ready.is_none() {
            a_ready = Some(fill_a(gw, &ca_a, &relay).await);
        }
        let a = a_ready.as_ref().expect("A at its bounds");
        holding.push(b_round(gw, &ca_b, count).await);
        let stop = Arc::new(AtomicBool::new(false));
        let pushers = push_a(gw, a, Arc::clone(&stop), Arc::clone(&pushed));
        pushing.push(b_round(gw, &ca_b, count).await);
        stop.store(true, Ordering::Relaxed);
        for task in pushers {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        eprintln!(
            "share-load: round {}: alone {:?}, beside A holding {:?}, beside A pushing {:?}",
            round + 1,
            alone[round],
            holding[round],
            pushing[round]
        );
    }
    let col = |v: &[[u64; 4]], i: usize| median(v.iter().map(|r| r[i]).collect());
    let rows = |v: &[[u64; 4]]| {
        v.iter()
            .map(|r| serde_json::json!({"keepalive_p50": r[0], "keepalive_p99": r[1], "newconn_p50": r[2], "newconn_p99": r[3]}))
            .collect::<Vec<_>>()
    };
    let ratio = |v: &[[u64; 4]], i: usize| col(v, i) as f64 / col(&alone, i).max(1) as f64;
    let figures = serde_json::json!({
        "count": count,
        "rounds": rounds,
        "a_bounds": {"connections": CONNECTIONS, "handshakes": HANDSHAKES, "held_requests": HELD, "pending_proposals": PROPOSALS},
        "a_refused_while_b_measured": pushed.load(Ordering::Relaxed),
        "alone_us": rows(&alone),
        "holding_us": rows(&holding),
        "pushing_us": rows(&pushing),
        "median_keepalive_p99_alone_us": col(&alone, 1),
        "median_keepalive_p99_holding_us": col(&holding, 1),
        "median_keepalive_p99_pushing_us": col(&pushing, 1),
        "keepalive_p99_ratio_holding": ratio(&holding, 1),
        "keepalive_p99_ratio_pushing": ratio(&pushing, 1),
        "median_newconn_p99_alone_us": col(&alone, 3),
        "median_newconn_p99_holding_us": col(&holding, 3),
        "median_newconn_p99_pushing_us": col(&pushing, 3),
        "newconn_p99_ratio_holding": ratio(&holding, 3),
        "newconn_p99_ratio_pushing": ratio(&pushing, 3),
    });
    drop(a_ready);
    drop(gateway);
    drop(peers);
    figures
}

/// Open session `id` from `source`; returns the path of its CA.
async fn open(
    client: &mut pb::gateway_client::GatewayClient<tonic::transport::Channel>,
    relay: &Relay,
    dir: &Path,
    id: &str,
    source: &str,
) -> PathBuf {
    let opened = client
        .open_session(pb::OpenSessionRequest {
            session_id: id.into(),
            attempt: 1,
            tenant: "bench".into(),
            sources: vec![source.into()],
            allowlist: vec![API.into()],
            cause: "launch".into(),
            lock: rules(),
            relay_public_key: relay.key.public_key().to_vec(),
            passthrough: Vec::new(),
            ..Default::default()
        })
        .await
        .expect("open")
        .into_inner();
    let path = dir.join(format!("{id}.pem"));
    std::fs::write(&path, opened.ca_pem).expect("write CA");
    path
}

/// What session A holds while at its bounds.
struct AtBounds {
    held: http::Sender,
    agent: http::Sender,
    _idle: Vec<http::Sender>,
    _halves: Vec<tokio::net::TcpStream>,
    _waiting: Vec<tokio::task::JoinHandle<u16>>,
    hello: Vec<u8>,
}

/// Bring A to every bound of its share at once.
async fn fill_a(gw: std::net::SocketAddr, ca: &Path, relay: &Relay) -> AtBounds {
    let proposals_before = relay.proposals().len();
    let held = http::connect(A, gw, API, ca, true).await;
    let agent = http::connect(A, gw, APPROVALS, ca, true).await;
    let mut waiting = Vec::new();
    for i in 0..HELD {
        let mut s = clone_h2(&held);
        waiting.push(tokio::spawn(async move {
            post(&mut s, API, &format!("/deploy/{i}"), "").await
        }));
    }
    let body = format!(
        "{{\"tool\": \"deploy\", \"digest\": \"{}\"}}",
        "ab".repeat(48)
    );
    for _ in 0..PROPOSALS {
        let mut s = clone_h2(&agent);
        let body = body.clone();
        waiting.push(tokio::spawn(async move {
            post(&mut s, APPROVALS, "/v1/proposals", &body).await
        }));
    }
    let want = proposals_before + HELD + PROPOSALS;
    assert!(
        relay.wait_proposals(want, 60).await.len() >= want,
        "A's requests and proposals held"
    );
    let mut idle = Vec::new();
    for _ in 0..CONNECTIONS - HANDSHAKES - 2 {
        let mut s = http::connect(A, gw, API, ca, false).await;
        // The gateway has finished this handshake once it has answered.
        assert_eq!(get(&mut s, "/bytes/16").await, 200);
        idle.push(s);
    }
    let hello = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../gateway/testdata/hellos/curl-http1.1.bin"
    ))
    .expect("a captured hello");
    let mut halves = Vec::new();
    for _ in 0..HANDSHAKES {
        let mut tcp = connect_from(A, gw).await;
        tcp.write_all(&hello[..20]).await.expect("half a hello");
        halves.push(tcp);
    }
    AtBounds {
        held,
        agent,
        _idle: idle,
        _halves: halves,
        _waiting: waiting,
        hello,
    }
}

fn clone_h2(s: &http::Sender) -> http::Sender {
    match s {
        http::Sender::H2(s) => http::Sender::H2(s.clone()),
        http::Sender::H1(_) => unreachable!("h2 asked"),
    }
}

/// A pushing at each bound until `stop`: new connections, held requests,
/// proposals, each refused at once; counts the refusals in `pushed`.
fn push_a(
    gw: std::net::SocketAddr,
    a: &AtBounds,
    stop: Arc<AtomicBool>,
    pushed: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    {
        let (stop, pushed, hello) = (Arc::clone(&stop), Arc::clone(&pushed), a.hello.clone());
        tasks.push(tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            while !stop.load(Ordering::Relaxed) {
                let mut tcp = connect_from(A, gw).await;
                let _ = tcp.write_all(&hello).await;
                let mut sink = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut sink)).await;
                pushed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for (mut s, name, path, body) in [
        (clone_h2(&a.held), API, "/deploy/more", String::new()),
        (
            clone_h2(&a.agent),
            APPROVALS,
            "/v1/proposals",
            format!("{{\"tool\": \"x\", \"digest\": \"{}\"}}", "cd".repeat(48)),
        ),
    ] {
        let (stop, pushed) = (Arc::clone(&stop), Arc::clone(&pushed));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                // 429 at the bound; anything else is counted too, and
                // shows as B's figures would not.
                let _status = post(&mut s, name, path, &body).await;
                pushed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tasks
}
