//! How much a held request costs the gateway: `benches/held/run.sh` runs
//! this. It starts the peers (a DNS server, a TLS origin, a test control
//! plane whose relay never decides) and the gateway binary, opens one
//! session whose Lock holds every request, opens `CONNS` HTTP/2
//! connections, reads the gateway's resident memory (VmRSS), then sends
//! `COUNT` requests spread over those connections and waits until the relay
//! has every proposal — all `COUNT` held at once — and reads it again.
//! Then it closes the session: every held request must answer
//! `approval_withdrawn`. Prints one JSON line with the figures.
//!
//! Bounded: every wait has a deadline, and the whole run stops after
//! `LIMIT_SECS`.
//!
//! Usage: hold-load DIR [COUNT [CONNS]]   (defaults 10000 and 50; the
//! gateway binary from `TALOS_GATEWAY_BIN`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use talos_e2e::clients::http;
use talos_e2e::control::{gateway_client, ControlPki};
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::origin::LoopbackOrigin;
use talos_e2e::relay::Relay;
use talos_gateway::pb;

const API: &str = "api.test";
const LIMIT_SECS: u64 = 240;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: hold-load DIR [COUNT [CONNS]]");
        std::process::exit(2);
    };
    let count: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let conns: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let run = tokio::time::timeout(Duration::from_secs(LIMIT_SECS), measure(dir, count, conns));
    match run.await {
        Ok(line) => println!("{line}"),
        Err(_) => {
            eprintln!("hold-load: over {LIMIT_SECS} s; stopped");
            std::process::exit(1);
        }
    }
}

async fn measure(dir: PathBuf, count: usize, conns: usize) -> serde_json::Value {
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
        // One session holds them all: its share must allow that many held
        // requests and cards (the defaults bound a session at 32 and 30 a
        // minute).
        limits: format!(
            "session_held_requests = {count}\nsession_proposal_burst = {count}\nsession_proposals_per_minute = {count}\n"
        ),
        ..peers.config()
    };
    let gateway = Gateway::start(&dir, &config.toml(&dir));
    let mut client = gateway_client(
        gateway.control.expect("control"),
        &pki.ca.cert_pem,
        Some(pki.client_identity()),
    );
    let opened = client
        .open_session(pb::OpenSessionRequest {
            session_id: "sbx-hold".into(),
            attempt: 1,
            tenant: "bench".into(),
            sources: vec!["127.0.0.2".into()],
            allowlist: vec![API.into()],
            cause: "launch".into(),
            lock: vec![pb::LockRule {
                id: "hold-all".into(),
                destination: "*".into(),
                mode: "every_request".into(),
                approvers: vec!["nobody-decides".into()],
                ..Default::default()
            }],
            relay_public_key: relay.key.public_key().to_vec(),
            passthrough: Vec::new(),
            ..Default::default()
        })
        .await
        .expect("open")
        .into_inner();
    let ca_path = dir.join("session-ca.pem");
    std::fs::write(&ca_path, opened.ca_pem).expect("write CA");

    let mut senders = Vec::with_capacity(conns);
    for _ in 0..conns {
        let http::Sender::H2(s) =
            http::connect("127.0.0.2", gateway.data, API, &ca_path, true).await
        else {
            unreachable!("h2 asked")
        };
        senders.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = gateway.pid();
    let idle_kib = rss_kib(pid);

    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let mut s = http::Sender::H2(senders[i % conns].clone());
        tasks.push(tokio::spawn(async move {
            let req = hyper::Request::post(format!("https://{API}/held/{i}"))
                .body(http::empty())
                .expect("request");
            match s.send(req).await {
                Ok(resp) => resp
                    .headers()
                    .get("hangar-refusal")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned(),
                Err(e) => format!("error: {e}"),
            }
        }));
    }
    let held = relay.wait_proposals(count, 120).await.len();
    let all_held_after = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held_kib = rss_kib(pid);

    let closed = client
        .close_session(pb::CloseSessionRequest {
            session_id: "sbx-hold".into(),
            attempt: 1,
            reason: "pause".into(),
        })
        .await
        .expect("close")
        .into_inner();
    let mut withdrawn = 0;
    let mut other = HashMap::<String, usize>::new();
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(30), t).await {
            Ok(Ok(r)) if r == "approval_withdrawn" => withdrawn += 1,
            Ok(Ok(r)) => *other.entry(r).or_default() += 1,
            _ => *other.entry("no answer".into()).or_default() += 1,
        }
    }
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    drop(peers);
    serde_json::json!({
        "held": held,
        "connections": conns,
        "seconds_to_hold_all": all_held_after.as_secs_f64(),
        "rss_idle_connections_kib": idle_kib,
        "rss_all_held_kib": held_kib,
        "bytes_per_held_request": (held_kib.saturating_sub(idle_kib) * 1024) / (held.max(1) as u64),
        "gateway_threads": threads,
        "approvals_withdrawn": closed.approvals_withdrawn,
        "answered_approval_withdrawn": withdrawn,
        "answered_otherwise": other,
    })
}
