//! The gateway pair under crashes around what is recorded, end to end:
//! a member SIGKILLed under load (five times over), the instant its
//! close's reply is in, and a request in flight when the session ends.
//! Every connection whose client got its full response is on the
//! certificate exactly once; what reached the destination is on the
//! record.
//!
//! The rig and what the fault tests share: [`faults`].

mod faults;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use faults::*;
use serde_json::Value;
use talos_e2e::clients::{client_tls, curl_status};
use talos_e2e::rig::pair::{matrix, IDS};
use talos_e2e::stub::{cert_records, reports_from};
use talos_e2e::wait;

/// SIGKILL a member under load, five times over (each round: four
/// clients, two on each member, making one connection after another;
/// gw-a killed once it has completed some; it starts again, the session
/// is paused and resumed onto it): every connection whose client got its
/// full response is on the certificate exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_load_five_times_loses_and_doubles_no_completed_connection() {
    /// Connections each client makes at most per round, and the longest a
    /// round's load runs.
    const PER_CLIENT: usize = 150;
    const ROUND_BOUND: Duration = Duration::from_secs(30);
    /// gw-a is killed once it has completed this many in the round.
    const KILL_AFTER: usize = 12;

    let mut rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let ports = Arc::new(Ports::new());
    let source: IpAddr = SOURCE.parse().unwrap();
    // (member, port) of every completed connection.
    let completed: Arc<Mutex<Vec<(usize, u16)>>> = Arc::default();
    // Failures while both members were up: none is due.
    let unexpected: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut failed_total = 0;
    for round in 0..5 {
        let (bundle, _) = rig.trust(&id, &format!("trust-{round}.pem"));
        let tls = client_tls(&bundle);
        let stop = Arc::new(AtomicBool::new(false));
        let killed = Arc::new(AtomicBool::new(false));
        let done_a = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut clients = Vec::new();
        for c in 0..4 {
            let member = c % 2;
            let gateway = rig.members[member].data;
            let (tls, ports, completed, stop, killed, done_a, failed, unexpected) = (
                tls.clone(),
                ports.clone(),
                completed.clone(),
                stop.clone(),
                killed.clone(),
                done_a.clone(),
                failed.clone(),
                unexpected.clone(),
            );
            clients.push(tokio::spawn(async move {
                for i in 0..PER_CLIENT {
                    if stop.load(Ordering::Relaxed) || started.elapsed() > ROUND_BOUND {
                        break;
                    }
                    let (socket, port) = ports.bind(source);
                    let path = format!("/bytes/{LOAD_REPLY}?r={round}&c={c}&i={i}");
                    match one_connection(socket, gateway, tls.clone(), &path).await {
                        Ok(()) => {
                            completed.lock().unwrap().push((member, port));
                            if member == 0 {
                                done_a.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            if !killed.load(Ordering::Relaxed) {
                                // The pair was healthy: no failure is due.
                                unexpected
                                    .lock()
                                    .unwrap()
                                    .push(format!("round {round}, {}: {e}", IDS[member]));
                            } else if member == 0 {
                                // Its member is gone.
                                break;
                            }
                        }
                    }
                }
            }));
        }
        wait::until_async(
            &format!("round {round}: {KILL_AFTER} completed on gw-a"),
            || wait::check(done_a.load(Ordering::Relaxed), |n| *n >= KILL_AFTER),
        )
        .await;
        killed.store(true, Ordering::Relaxed);
        rig.members[0].kill();
        // The load goes on a moment against the dead member and the live one.
        let after_kill = completed.lock().unwrap().len();
        wait::until_async(
            &format!("round {round}: more completed on gw-b after the kill"),
            || wait::check(completed.lock().unwrap().len(), |n| *n >= after_kill + 4),
        )
        .await;
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.await.expect("client task");
        }
        failed_total += failed.load(Ordering::Relaxed);
        rig.restart(0);
        if round % 2 == 1 {
            // A crash again as soon as it is up, its journal just
            // recovered: nothing recovered may be lost or sealed twice.
            rig.members[0].kill();
            rig.restart(0);
        }
        let t = rig.cli(&["sandbox", "pause", &id]).json();
        assert_eq!(t["state"], "paused", "round {round}: {t}");
        let t = rig.cli(&["sandbox", "resume", &id]).json();
        assert_eq!(t["state"], "running", "round {round}: {t}");
        assert_eq!(
            t["ca"].as_array().map(Vec::len),
            Some(2),
            "round {round}: {t}"
        );
        matrix(
            "SIGKILL gw-a under load",
            &format!("round {round}: pause, resume"),
            &format!(
                "{} completed so far, {} failed this round",
                completed.lock().unwrap().len(),
                failed.load(Ordering::Relaxed)
            ),
            started.elapsed(),
        );
    }
    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    let cert = rig.wait_issued(&id);
    let completed = completed.lock().unwrap().clone();
    // On the certificate, each member's records by source port.
    let mut on_cert: HashMap<(usize, u16), Vec<&Value>> = HashMap::new();
    for (member, gw) in IDS.iter().enumerate() {
        for r in cert_records(&cert, gw) {
            let port = r["source"]
                .as_str()
                .and_then(|s| s.parse::<SocketAddr>().ok())
                .map(|a| a.port())
                .expect("a record's source");
            on_cert.entry((member, port)).or_default().push(r);
        }
    }
    let mut missing = Vec::new();
    let mut twice = Vec::new();
    for key in &completed {
        match on_cert.get(key).map(Vec::len) {
            None | Some(0) => missing.push(*key),
            Some(1) => {}
            Some(_) => twice.push(on_cert[key].clone()),
        }
    }
    let cut = on_cert
        .values()
        .flatten()
        .filter(|r| r["cause"] == "cut_by_crash")
        .count();
    eprintln!(
        "load: {} completed, {failed_total} failed, {} records on the certificate, {cut} cut by a crash",
        completed.len(),
        on_cert.values().map(Vec::len).sum::<usize>()
    );
    let unexpected = unexpected.lock().unwrap().clone();
    assert!(
        unexpected.is_empty(),
        "failed with both members up: {unexpected:?}"
    );
    let completed_cut = completed
        .iter()
        .filter(|k| {
            on_cert
                .get(k)
                .is_some_and(|v| v.iter().any(|r| r["cause"] == "cut_by_crash"))
        })
        .count();
    eprintln!("load: {completed_cut} completed connections are on the certificate cut by a crash (their records were not yet written)");
    assert!(
        missing.is_empty(),
        "completed but not on the certificate: {missing:?}"
    );
    assert!(
        twice.is_empty(),
        "on the certificate more than once: {twice:?}"
    );
    // No record of any connection twice, completed or not.
    let doubled: Vec<_> = on_cert.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(doubled.is_empty(), "{doubled:?}");
}

/// Source ports for the load clients, handed out once each so a
/// connection is named by its source port alone (the record's `source`):
/// below the kernel's ephemeral range (32768 and up), so no other socket
/// is given one of them; a port some other process holds is skipped.
struct Ports(AtomicUsize);

impl Ports {
    fn new() -> Ports {
        // Spread concurrent test processes apart.
        Ports(AtomicUsize::new(
            10_000 + (std::process::id() as usize * 7919) % 12_000,
        ))
    }

    /// A TCP socket bound to `source` and a port not handed out before.
    fn bind(&self, source: IpAddr) -> (tokio::net::TcpSocket, u16) {
        loop {
            let port = self.0.fetch_add(1, Ordering::Relaxed);
            let port = u16::try_from(port).expect("ports below 32768");
            assert!(port < 32_768, "ran out of source ports");
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            if socket.bind(SocketAddr::new(source, port)).is_ok() {
                return (socket, port);
            }
        }
    }
}

/// The reply size the load asks for (`/bytes/N`).
const LOAD_REPLY: usize = 4096;

/// One connection from `source`:`port` through `gateway`: TLS trusting
/// `tls`'s roots, one GET `path` for [`LOAD_REPLY`] bytes. `Ok` only when
/// the whole reply arrived: the client got its full response.
async fn one_connection(
    socket: tokio::net::TcpSocket,
    gateway: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<(), String> {
    let (status, body) = talos_e2e::clients::get_once(socket, gateway, tls, API, path).await?;
    if status == 200 && body.len() == LOAD_REPLY {
        Ok(())
    } else {
        Err(format!("status {status}, {} bytes", body.len()))
    }
}

/// No fault at all: a request held at the destination (forwarded, its
/// credential attached) when the session is stopped is cut with its
/// connection; it reached the destination, so the record and the
/// certificate list it, and the connection's request count counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_in_flight_when_the_session_ends_is_on_the_certificate() {
    let rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let a = rig.members[0].data;
    let in_flight = {
        let bundle = bundle.clone();
        tokio::task::spawn_blocking(move || {
            curl_status(SOURCE, a, &bundle, API, "/hold/in-flight/echo")
        })
    };
    rig.peers.origin.wait_held("in-flight").await;
    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    assert_eq!(
        in_flight.await.unwrap(),
        0,
        "the request is cut with its connection"
    );
    rig.peers.origin.release("in-flight");
    let cert = rig.wait_issued(&id);
    let record = cert_records(&cert, "gw-a")
        .into_iter()
        .find(|r| {
            r["attachments_used"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        })
        .expect("the connection that carried the credential")
        .clone();
    let paths: Vec<&str> = record["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        ["/hold/in-flight/echo"],
        "the request that reached the destination is on the record: {record:#}"
    );
    assert_eq!(record["request_count"], 1, "{record:#}");
    let request = &record["requests"][0];
    assert_eq!(request["cut"], true, "{record:#}");
    assert_eq!(request["status"], 0, "{record:#}");
}

/// SIGKILL a member the instant its close's reply is in (`stop` has
/// returned): the drop report it signed is in its journal, so the next
/// process seals it into the chain and the certificate, which waits for
/// it, is issued; the certificate holds the session's records from that
/// member once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_right_after_the_close_reply_loses_no_report() {
    let mut rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    traffic(&rig, SOURCE, &bundle, "before", 4);
    // Hold back the chain: the report must come from the journal, not
    // from a batch shipped before the kill.
    rig.stub.kill_serve();
    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "both replies confirm: {t}");
    rig.members[0].kill();
    rig.restart(0);
    rig.stub.start_serve();
    let start = Instant::now();
    let cert = rig.wait_issued(&id);
    matrix(
        "serve down, stop, SIGKILL gw-a at once, restart both",
        "certificate",
        "issued",
        start.elapsed(),
    );
    let from_a: Vec<&Value> = cert_records(&cert, "gw-a");
    assert_eq!(
        from_a.iter().filter(|r| r["verdict"] == "allowed").count(),
        2,
        "{from_a:?}"
    );
    let status = rig.status(&id);
    assert!(
        reports_from(&status, "gw-a", 1)
            .iter()
            .any(|r| r["via"] == "chain" && r["reason"] == "end"),
        "gw-a's report came through its chain: {status}"
    );
}
