//! A rolling upgrade of a pair with a session running throughout: both
//! members upgraded in place, one after the other (`gateway upgrade`),
//! while a bounded load of connections goes through both. The session
//! notices nothing: no request fails, its trust bundle never changes, each
//! member's batch chain goes on without a gap or a rejection, and the
//! certificate issued at the end holds exactly the requests the clients
//! saw succeed.
//!
//! Real processes throughout: two `gateway` members (each followed across
//! its handovers), `control-stub serve` renewing leases short enough
//! (3 s) that a handover losing one would show, the `control-stub` CLI, a
//! TLS origin and a DNS server on loopback, and a rustls/hyper client as
//! the session.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use talos_e2e::clients::client_tls;
use talos_e2e::member::{alive, Member};
use talos_e2e::rig::pair::IDS;
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::wait;

const API: &str = "api.test";
const SOURCE: &str = "127.0.0.2";
const LEASE_MS: u64 = 3000;
/// The most requests the load makes (it stops sooner once both upgrades
/// are done and it has made some after each).
const MAX_REQUESTS: usize = 3000;

/// The pair, `serve` given both members; the egress list holds
/// `api.test`.
async fn pair() -> Pair<Member> {
    Pair::builder()
        .lease(Duration::from_millis(LEASE_MS))
        .renewing()
        .egress(&[API])
        .start_loopback(&[API])
        .await
}

/// Start a session from SOURCE allowed to reach API; its id.
fn start_session(pair: &Pair<Member>) -> String {
    pair.start(&SessionSpec::from(SOURCE).allow(API)).0
}

/// The session's trust bundle, written to `file`; and its CAs'
/// digests, sorted.
fn trust(pair: &Pair<Member>, id: &str, file: &str) -> (PathBuf, Vec<String>) {
    let (path, mut digests) = pair.trust(id, file);
    digests.sort();
    (path, digests)
}

/// One connection from the session's source through `gateway`, one GET
/// `path`: `Ok` only when the whole reply arrived (the origin's greeting
/// names the path).
async fn one_request(
    gateway: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<(), String> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .bind(format!("{SOURCE}:0").parse().expect("addr"))
        .map_err(|e| e.to_string())?;
    let (status, body) = talos_e2e::clients::get_once(socket, gateway, tls, API, path).await?;
    // A held request is answered as the path after `/hold/NAME`.
    let answered = match path.strip_prefix("/hold/").and_then(|r| r.split_once('/')) {
        Some((_, rest)) => format!(" GET /{rest}\n"),
        None => format!(" GET {path}\n"),
    };
    if status == 200 && body.ends_with(answered.as_bytes()) {
        Ok(())
    } else {
        Err(format!("status {status}, {} bytes", body.len()))
    }
}

/// What the load saw.
#[derive(Default)]
struct Seen {
    ok: Vec<String>,
    failed: Vec<(String, String)>,
}

/// Upgrade member `i` in place (`gateway upgrade`, which returns once the
/// successor has taken over); returns the old process's pid, draining.
fn start_upgrade(pair: &mut Pair<Member>, i: usize) -> u32 {
    let member = &mut pair.members[i];
    let old = member.pid();
    let (ok, out, err) = member.command("upgrade");
    assert!(ok, "{} upgrade: {out} {err}\n{}", IDS[i], member.log());
    let line = member.wait_ready(2);
    let new = u32::try_from(line["pid"].as_u64().expect("pid")).expect("pid");
    assert_ne!(new, old);
    old
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_upgrade_of_the_pair_keeps_the_session_whole() {
    let mut pair = pair().await;
    let id = start_session(&pair);
    let (bundle, digests) = trust(&pair, &id, "trust.pem");
    assert_eq!(digests.len(), 2, "one CA per member");
    let tls = client_tls(&bundle);

    // The load: one connection after another, alternating members, until
    // told to stop (or the bound).
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let made = Arc::new(AtomicUsize::new(0));
    let targets: Vec<SocketAddr> = pair.members.iter().map(Member::data).collect();
    let load = {
        let (stop, seen, made, tls) = (
            Arc::clone(&stop),
            Arc::clone(&seen),
            Arc::clone(&made),
            Arc::clone(&tls),
        );
        tokio::spawn(async move {
            for n in 0..MAX_REQUESTS {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let member = n % targets.len();
                let path = format!("/load/m{member}/{n}");
                let result = one_request(targets[member], Arc::clone(&tls), &path).await;
                let mut s = seen.lock().expect("seen");
                match result {
                    Ok(()) => s.ok.push(path),
                    Err(e) => s.failed.push((path, e)),
                }
                made.store(n + 1, Ordering::Relaxed);
            }
        })
    };
    let wait_for_more = |at_least: usize| {
        let made = Arc::clone(&made);
        async move {
            wait::until_async(&format!("{at_least} requests made"), || {
                let n = made.load(Ordering::Relaxed);
                wait::check(n, |n| *n >= at_least)
            })
            .await
        }
    };
    wait_for_more(20).await;

    // gw-a, then gw-b, each once the load has gone on through the one
    // before (the command waits for the successor: on this worker, while
    // the runtime's other workers carry the load).
    // A request in flight on the old process across each handover (the
    // origin holds it until told): the old process drains it, and it
    // succeeds.
    let mut in_flight = Vec::new();
    for (i, id) in IDS.iter().enumerate() {
        let before = made.load(Ordering::Relaxed);
        let name = format!("across-{i}");
        let path = format!("/hold/{name}/load/held/m{i}");
        let held = tokio::spawn({
            let (tls, target, path) = (Arc::clone(&tls), pair.members[i].data(), path.clone());
            async move { one_request(target, tls, &path).await }
        });
        pair.peers.origin.wait_held(&name).await;
        let old = tokio::task::block_in_place(|| start_upgrade(&mut pair, i));
        pair.peers.origin.release(&name);
        let result = held.await.expect("held request's task");
        assert_eq!(
            result,
            Ok(()),
            "{path}, in flight across {}'s handover",
            IDS[i]
        );
        in_flight.push(path);
        let metrics = tokio::task::block_in_place(|| {
            wait::until(&format!("{id}'s old process to exit"), || {
                wait::check(alive(old), |a| !a)
            });
            pair.members[i].metrics()
        });
        // The successor, which an operator scrapes once the old process
        // is gone, counts the handover; one config is in force.
        assert!(
            metrics.contains("gateway_handover_total{result=\"ok\"} 1"),
            "{id}: {metrics}"
        );
        let info = metrics
            .lines()
            .filter(|l| l.starts_with("gateway_config_info{"))
            .count();
        assert_eq!(info, 1, "{id}: {metrics}");
        wait_for_more(before + 40).await;
    }
    // The load goes on past a whole lease after the last handover: the
    // successors renew (or the sessions would lapse and requests fail).
    let upgraded = std::time::Instant::now();
    wait::past(upgraded, Duration::from_millis(LEASE_MS + 1000)).await;
    seen.lock().expect("seen").ok.extend(in_flight);

    stop.store(true, Ordering::Relaxed);
    load.await.expect("load");
    let seen = std::mem::take(&mut *seen.lock().expect("seen"));
    assert!(
        seen.failed.is_empty(),
        "requests failed across the upgrades: {:?}",
        seen.failed
    );
    assert!(seen.ok.len() >= 100, "{} requests", seen.ok.len());

    // The session trusts the same CAs it trusted at its start.
    let (_, after) = trust(&pair, &id, "trust-after.pem");
    assert_eq!(after, digests, "the trust bundle changed");

    // The end: the certificate is issued, with every request the clients
    // saw succeed, once, and no gap or rejection in either chain.
    let t = pair.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    let cert = pair.wait_issued(&id);
    assert_eq!(cert["gaps"], Value::Array(Vec::new()), "{cert}");
    assert_eq!(cert["batch_rejections"], Value::Array(Vec::new()), "{cert}");
    let mut on_cert: Vec<String> = cert["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .flat_map(|c| c["requests"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["status"] == 200)
        .filter_map(|r| r["path"].as_str().map(str::to_owned))
        .collect();
    let mut wanted = seen.ok.clone();
    on_cert.sort();
    wanted.sort();
    assert_eq!(
        on_cert.len(),
        wanted.len(),
        "the certificate holds {} requests, the clients saw {} succeed",
        on_cert.len(),
        wanted.len()
    );
    assert_eq!(on_cert, wanted);
}

/// The old process SIGKILLed while it drains after an upgrade, a request
/// of its still in flight: the successor, which holds the authority,
/// seals what the old process left (its connection cut by the crash) ahead
/// of its own records, and the certificate at the end holds it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_old_process_killed_while_it_drains_loses_nothing() {
    let mut pair = pair().await;
    let id = start_session(&pair);
    let (bundle, _) = trust(&pair, &id, "trust.pem");
    let tls = client_tls(&bundle);
    let a = pair.members[0].data();
    assert_eq!(
        one_request(a, Arc::clone(&tls), "/load/before").await,
        Ok(())
    );
    let held = tokio::spawn({
        let tls = Arc::clone(&tls);
        async move { one_request(a, tls, "/hold/killed/load/held").await }
    });
    pair.peers.origin.wait_held("killed").await;
    let old = tokio::task::block_in_place(|| start_upgrade(&mut pair, 0));
    talos_e2e::member::signal(old, "KILL");
    tokio::task::block_in_place(|| {
        wait::until("the killed process to be gone", || {
            wait::check(alive(old), |a| !a)
        })
    });
    pair.peers.origin.release("killed");
    assert!(
        held.await.expect("task").is_err(),
        "its connection died with it"
    );
    // The successor serves on.
    assert_eq!(
        one_request(a, Arc::clone(&tls), "/load/after").await,
        Ok(())
    );

    let t = pair.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    let cert = pair.wait_issued(&id);
    assert_eq!(cert["gaps"], Value::Array(Vec::new()), "{cert}");
    assert_eq!(cert["batch_rejections"], Value::Array(Vec::new()), "{cert}");
    let of_a: Vec<&Value> = cert["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter(|c| c["gateway_id"] == "gw-a")
        .collect();
    let cut: Vec<&&Value> = of_a
        .iter()
        .filter(|c| c["cause"] == "cut_by_crash")
        .collect();
    assert_eq!(
        cut.len(),
        1,
        "the held connection, cut by the crash: {cert:#}"
    );
    let paths: Vec<&str> = of_a
        .iter()
        .flat_map(|c| c["requests"].as_array().into_iter().flatten())
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"/load/before") && paths.contains(&"/load/after"),
        "{paths:?}"
    );
    // One instance throughout: no start report was made.
    let instances: std::collections::BTreeSet<&str> =
        of_a.iter().filter_map(|c| c["instance"].as_str()).collect();
    assert_eq!(instances.len(), 1, "{instances:?}");
}
