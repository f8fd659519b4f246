//! How long a card takes to reach a person's open page:
//! `benches/cards/run.sh` runs this. It starts the end-to-end tests' rig
//! (a gateway pair, `control-stub serve --web-listen`, an origin), an
//! approver with a software passkey signed in to the web app, a session
//! and a Lock rule naming her, and opens the live card stream
//! (`GET /api/events`, server-sent events over HTTPS, as the cards page
//! does). Then, one at a time, `COUNT` proposals (agent tool calls, each
//! its own card) are sent to `serve` over the control channel as a member
//! sends them (`ControlPlane.Propose`, mutual TLS, member gw-a's
//! identity), and for each one the time is taken from just before the
//! proposal is sent to the moment the stream's event listing that card
//! has been read whole by the client. Prints one JSON line: p50, p90,
//! p99 and max in milliseconds, and the same from the Propose answer
//! (the relay has stored the card) to the event.
//!
//! Bounded: each card is waited for at most `CARD_WAIT`, the whole run at
//! most `LIMIT_SECS`; every process started is stopped by its id when the
//! rig is dropped.
//!
//! Usage: card-latency [COUNT]   (default and at most 100: the cards page
//! lists at most 100 cards; the binaries from `TALOS_GATEWAY_BIN` and
//! `TALOS_CONTROL_STUB_BIN`).

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use talos_certs::proposal_msg_of;
use talos_e2e::clients::SESSION_SOURCE;
use talos_e2e::people::{control_plane_client, RP_ID};
use talos_e2e::rig::{Pair, SessionSpec};

const API: &str = "api.test";
const CARD_WAIT: Duration = Duration::from_secs(10);
const LIMIT_SECS: u64 = 240;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let count: usize = match std::env::args().nth(1) {
        None => 100,
        Some(a) => match a.parse() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => {
                eprintln!("usage: card-latency [COUNT]   (1 to 100)");
                std::process::exit(2);
            }
        },
    };
    // The whole run is bounded; the rig is dropped (its processes stopped
    // by their ids) whichever way `run` ends. Its waits block for at most
    // `CARD_WAIT` each, so the limit is noticed that late at most.
    match tokio::time::timeout(Duration::from_secs(LIMIT_SECS), run(count)).await {
        Err(_) => {
            eprintln!("card-latency: not done after {LIMIT_SECS} s");
            std::process::exit(1);
        }
        Ok(Ok(line)) => println!("{line}"),
        Ok(Err(e)) => {
            eprintln!("card-latency: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(count: usize) -> Result<serde_json::Value, String> {
    let rig = Pair::builder()
        .egress(&[API])
        .secret("API_TOKEN", "card-latency-secret")
        .start_loopback(&[API])
        .await;
    let passkey = rig.stub.approver("alice");
    let rule = rig.lock_rule(API, "POST", "/merge", &["alice"], "every_request");
    let rule = rule["id"].as_str().ok_or("no rule id")?.to_owned();
    let session = rig.start_session(
        &SessionSpec::from(SESSION_SOURCE)
            .allow(API)
            .attach("API_TOKEN=api.test:authorization:Bearer")
            .mode("commands"),
    );
    let mut web = rig.stub.web_client();
    let signed_in = talos_e2e::rig::blocking(|| web.sign_in(&passkey));
    if signed_in.status != 200 {
        return Err(format!("sign-in answered {}", signed_in.status));
    }
    let cookie = web.cookie.clone().ok_or("no session cookie")?;

    // The live stream, read on a thread of its own: each card id the
    // first time an event lists it, with the instant it was read.
    let (tx, rx) = mpsc::channel::<(String, Instant)>();
    let stream = open_stream(&rig, &cookie)?;
    std::thread::spawn(move || read_events(stream, &tx));

    let serve = rig.stub.serve_addr.ok_or("the rig has no serve")?;
    let mut client = control_plane_client(&rig.stub.control_dir, "gw-a", serve);
    // The control channel's connection made before the first card is
    // timed: a proposal for no session, refused.
    let mut warm = proposal(&session, &rule, 0);
    warm.session_id = "sbx-none".into();
    let _ = client.propose(proposal_msg_of(&warm)).await;

    let mut from_send = Vec::with_capacity(count);
    let mut from_answer = Vec::with_capacity(count);
    for i in 1..=count {
        let p = proposal(&session, &rule, i);
        let sent = Instant::now();
        client
            .propose(proposal_msg_of(&p))
            .await
            .map_err(|e| format!("card {i}: the relay refused it: {e}"))?;
        let answered = Instant::now();
        let deadline = sent + CARD_WAIT;
        let seen = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((id, at)) if id == p.proposal_id => break at,
                Ok(_) => continue,
                Err(_) => return Err(format!("card {i}: no event listed it within {CARD_WAIT:?}")),
            }
        };
        from_send.push(seen.saturating_duration_since(sent));
        from_answer.push(seen.saturating_duration_since(answered));
    }
    Ok(serde_json::json!({
        "cards": count,
        "from_propose_sent_ms": figures(&mut from_send),
        "from_propose_answered_ms": figures(&mut from_answer),
    }))
}

/// Card `i`: an agent's tool call in `session`, held by `rule` for alice.
fn proposal(session: &str, rule: &str, i: usize) -> talos_certs::Proposal {
    let mut p = talos_e2e::people::agent_card(
        &format!("gw-a-latency-{i}"),
        session,
        rule,
        &format!("deploy-{i}"),
    );
    p.call_digest = format!("{i:096x}");
    p
}

type Stream = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// `GET /api/events` with the session's cookie, its answer's head read.
fn open_stream(rig: &Pair, cookie: &str) -> Result<Stream, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut rig.stub.web_cert.ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(RP_ID).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect_timeout(&rig.stub.web_addr, Duration::from_secs(10))
        .map_err(|e| format!("connect to the web app: {e}"))?;
    // Longer than the stream's keep-alive comment (15 s): a read that
    // waits past it means the stream died.
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let host = rig.stub.web_origin.trim_start_matches("https://");
    write!(
        tls,
        "GET /api/events HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\nCookie: __Host-talos_session={cookie}\r\n\r\n"
    )
    .map_err(|e| format!("write the request: {e}"))?;
    tls.flush().map_err(|e| e.to_string())?;
    Ok(tls)
}

/// Read the stream's chunked body, event by event, until it ends: each
/// card id the first time a `cards` event lists it.
fn read_events(stream: Stream, tx: &mpsc::Sender<(String, Instant)>) {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    // The head.
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line == "\r\n" => break,
            Ok(_) if line.starts_with("HTTP/1.1 ") && !line.starts_with("HTTP/1.1 200") => {
                eprintln!("card-latency: the stream answered {}", line.trim());
                return;
            }
            Ok(_) => {}
        }
    }
    let mut seen = HashSet::new();
    let mut pending = String::new();
    loop {
        // One chunk: its size in hex, the bytes, CRLF.
        line.clear();
        if !matches!(r.read_line(&mut line), Ok(n) if n > 0) {
            return;
        }
        let Ok(size) = usize::from_str_radix(line.trim(), 16) else {
            return;
        };
        if size == 0 {
            return;
        }
        let mut chunk = vec![0; size + 2];
        if r.read_exact(&mut chunk).is_err() {
            return;
        }
        let at = Instant::now();
        pending.push_str(&String::from_utf8_lossy(&chunk[..size]));
        while let Some(end) = pending.find("\n\n") {
            let ev: String = pending.drain(..end + 2).collect();
            let Some(data) = ev.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
                continue;
            };
            for c in v["cards"].as_array().into_iter().flatten() {
                if let Some(id) = c["id"].as_str() {
                    if seen.insert(id.to_owned()) && tx.send((id.to_owned(), at)).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// p50, p90, p99 and max of `d`, in milliseconds (nearest rank).
fn figures(d: &mut [Duration]) -> serde_json::Value {
    d.sort();
    let rank = |q: f64| {
        let i = ((q * d.len() as f64).ceil() as usize).clamp(1, d.len()) - 1;
        (d[i].as_secs_f64() * 1000.0 * 100.0).round() / 100.0
    };
    serde_json::json!({"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": rank(1.0)})
}
