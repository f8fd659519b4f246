//! The gateway pair under faults, end to end: two `gateway` processes
//! (`gw-a`, `gw-b`), `control-stub serve` given both (it renews leases,
//! asks owed closes again, issues certificates), the `control-stub` CLI,
//! a real TLS origin and DNS server on loopback, and real clients as the
//! session. Each test breaks something an operator meets — a member
//! killed (SIGKILL), hung (SIGSTOP) or restarted, the control plane down,
//! a SIGHUP — and checks the product's promise: when a session ends its
//! authority is gone everywhere, and its certificate says exactly what
//! happened, once.
//!
//! Leases are short here (`lease_ms` 3000, renewed every 500 ms) so a
//! lapse takes seconds. Every wait is bounded ([`wait`]); the one wait on
//! time itself — letting a lease run out — waits for a span measured from
//! the fault, which is not a race. Every process is stopped by its PID.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use talos_e2e::clients::{client_tls, curl_status, run_bounded, Curl, Kept};
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::rig::pair::{matrix, IDS};
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::signals::{self, Signal};
use talos_e2e::stub::{cert_records, closes_of, reports_from, Stub};
use talos_e2e::wait;

const API: &str = "api.test";
const SECRET: &str = "faults-S3CRET-v4lue-0123456789";
/// The session sources the tests use (one live session each).
const SOURCE: &str = "127.0.0.2";
const SOURCE_2: &str = "127.0.0.3";

/// Every authority's lease on the members (`[control] lease_ms`).
const LEASE: Duration = Duration::from_millis(3000);

/// The pair, `serve` given both members; the egress list holds
/// `api.test`; tenant `acme` has secret `API_TOKEN`.
async fn pair() -> Pair {
    pair_with_lease(LEASE).await
}

/// [`pair`] with another lease on the members.
async fn pair_with_lease(lease: Duration) -> Pair {
    Pair::builder()
        .lease(lease)
        .renewing()
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await
}

/// A session from `source` allowed `api.test`, `API_TOKEN` attached.
fn session(source: &str) -> SessionSpec {
    SessionSpec::from(source)
        .allow(API)
        .attach("API_TOKEN=api.test:authorization:Bearer")
}

/// Steps 4 and 5 of a transition's reset.
fn gateway_steps(t: &Value) -> Vec<&Value> {
    t["reset"]
        .as_array()
        .expect("reset steps")
        .iter()
        .filter(|s| s["step"] == 4 || s["step"] == 5)
        .collect()
}

/// SIGKILL one member with a connection open on each, then `stop` one
/// session and `revoke-all` another: both commit at once; the live member
/// cuts and refuses the sessions before the command returns; the killed
/// member, started again, never serves them; its start report confirms
/// its closes; each certificate is issued, with the connection the crash
/// cut on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_one_member_then_stop_and_revoke_all() {
    let mut rig = pair().await;
    let stopped = rig.start_session(&session(SOURCE));
    let revoked = rig.start_session(&session(SOURCE_2));
    let (bundle_1, _) = rig.trust(&stopped, "trust-1.pem");
    let (bundle_2, _) = rig.trust(&revoked, "trust-2.pem");
    let (a, b) = (rig.members[0].data, rig.members[1].data);
    // A connection open on each member, for each session.
    let cut_by_crash = Kept::open(SOURCE, a, API, &bundle_1, "/kept/a/1").await;
    let _cut_by_crash_2 = Kept::open(SOURCE_2, a, API, &bundle_2, "/kept/a/2").await;
    let mut on_b = Kept::open(SOURCE, b, API, &bundle_1, "/kept/b/1").await;
    let mut on_b_2 = Kept::open(SOURCE_2, b, API, &bundle_2, "/kept/b/2").await;

    rig.members[0].kill();

    let (stop, took) = rig.timed(&["sandbox", "stop", &stopped]);
    let t = stop.json();
    matrix(
        "SIGKILL gw-a",
        "sandbox stop",
        t["state"].as_str().unwrap_or("?"),
        took,
    );
    // Committed: over, not yet ended (gw-a has not confirmed).
    assert_eq!(t["state"], "reset_incomplete", "{t}");
    assert_eq!(t["end_reason"], "stop");
    let owed: Vec<&str> = t["closes_owed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["gateway_id"].as_str())
        .collect();
    assert_eq!(owed, ["gw-a"], "{t}");
    for step in gateway_steps(&t) {
        assert_eq!(step["confirmed"], false, "{step}");
        assert!(
            step["error"].as_str().is_some_and(|e| e.contains("gw-a")),
            "the step names the member that did not confirm: {step}"
        );
    }
    // Before the command returned, the live member cut the session's
    // connection and refuses new ones.
    let cut = on_b.get("/after-stop/kept").await;
    assert!(cut.is_err(), "the kept connection on gw-b is cut: {cut:?}");
    assert_eq!(curl_status(SOURCE, b, &bundle_1, API, "/after-stop/new"), 0);

    let (revoke, took) = rig.timed(&["sandbox", "revoke-all", &revoked]);
    let t = revoke.json();
    matrix(
        "SIGKILL gw-a",
        "sandbox revoke-all",
        t["state"].as_str().unwrap_or("?"),
        took,
    );
    assert_eq!(t["state"], "reset_incomplete", "{t}");
    assert_eq!(t["end_reason"], "revoke_all");
    let reasons: Vec<(&str, &str)> = t["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["gateway_id"].as_str().unwrap(),
                r["reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(reasons, [("gw-b", "revoke_all")]);
    assert!(on_b_2.get("/after-revoke/kept").await.is_err());
    assert_eq!(
        curl_status(SOURCE_2, b, &bundle_2, API, "/after-revoke/new"),
        0
    );
    // An ended session stays ended.
    assert_eq!(
        rig.cli(&["sandbox", "resume", &stopped]).code(),
        "sandbox_ended"
    );
    // No certificate while a member's word is missing.
    let cert = rig.cli(&["certificate", &stopped]);
    assert_eq!(cert.code(), "certificate_not_issued");

    // The killed member starts again: it never serves the sessions.
    rig.restart(0);
    let a = rig.members[0].data;
    assert_eq!(curl_status(SOURCE, a, &bundle_1, API, "/restarted/1"), 0);
    assert_eq!(curl_status(SOURCE_2, a, &bundle_2, API, "/restarted/2"), 0);
    wait::until("gw-a to record both sources unknown", || {
        wait::check(rig.members[0].records(), |r| {
            r.iter()
                .filter(|r| r["verdict"] == "unknown_source")
                .count()
                >= 2
        })
    });
    // Its start report confirms the closes owed; the certificates issue.
    for id in [&stopped, &revoked] {
        let cert = rig.wait_issued(id);
        let status = rig.status(id);
        assert_eq!(status["state"], "ended", "{status}");
        let a_closes = closes_of(&status, "gw-a");
        assert_eq!(a_closes.len(), 1, "{status}");
        assert_eq!(a_closes[0]["confirmed_by"], "start_report", "{status}");
        let ca_a = cert["attempts"][0]["ca"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["gateway_id"] == "gw-a")
            .expect("gw-a's CA on the certificate")
            .clone();
        assert_eq!(ca_a["destroy_reason"], "gateway_restarted", "{ca_a}");
        assert!(cert["reset"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["confirmed"] == true));
    }
    // The connection open on gw-a at the kill is on the certificate, cut
    // by the crash, once.
    let cert = rig.wait_issued(&stopped);
    let source = format!("{SOURCE}:{}", cut_by_crash.port);
    let cut: Vec<&Value> = cert_records(&cert, "gw-a")
        .into_iter()
        .filter(|r| r["source"] == source.as_str())
        .collect();
    assert_eq!(cut.len(), 1, "{cert}");
    assert_eq!(cut[0]["cause"], "cut_by_crash", "{}", cut[0]);
    // Nothing after the kill reached the destination.
    assert_eq!(
        rig.peers.origin.paths_starting("/after-"),
        Vec::<String>::new()
    );
    assert_eq!(
        rig.peers.origin.paths_starting("/restarted"),
        Vec::<String>::new()
    );
}

/// How many connections wait in the accept queue of the TCP listener on
/// `addr` (`ss`: a listening socket's Recv-Q): connections the kernel
/// completed that the process has not taken.
fn accept_queue(addr: SocketAddr) -> usize {
    let out = run_bounded(
        "ss",
        &["-Hltn", &format!("sport = :{}", addr.port())],
        None,
        10,
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&addr.to_string()))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        .sum()
}

/// How long after `since` gateway `g` logged that it ended a session's
/// authority (its log's first such line after `since`), if it did.
fn ended_in_log(g: &Gateway, since: std::time::SystemTime) -> Option<Duration> {
    g.log()
        .lines()
        .filter(|l| l.contains("session authority ended"))
        .filter_map(|l| humantime::parse_rfc3339_weak(l.split_whitespace().next()?).ok())
        .filter_map(|t| t.duration_since(since).ok())
        .min()
}

/// SIGSTOP one member with a keep-alive connection open through it and
/// three new connections waiting in its accept queue; `revoke-all`; let
/// its lease run out; SIGCONT: not one request is served through the
/// woken member (the kept connection, the waiting ones, new ones); its
/// `lease_expired` report reaches the stub; the certificate is issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigstop_one_member_revoke_all_and_wake_it_past_the_lease() {
    let rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let (a, b) = (rig.members[0].data, rig.members[1].data);
    let mut kept = Kept::open(SOURCE, a, API, &bundle, "/kept/before").await;

    let pid = rig.members[0].pid();
    rig.members[0].signal(Signal::Stop);
    wait::until("gw-a to be stopped", || {
        wait::check(signals::state(pid), |s| *s == Some('T'))
    });
    // Its last renewal came before this instant.
    let stopped_at = Instant::now();
    let queued_before = accept_queue(a);
    let mut during = Vec::new();
    for i in 0..3 {
        let bundle = bundle.clone();
        during.push(tokio::task::spawn_blocking(move || {
            Curl::via(a, &bundle, API)
                .from(SOURCE)
                .max_time(60)
                .run(&format!("/during-stop/{i}"))
                .status
        }));
    }
    wait::until_async("three connections in gw-a's accept queue", || {
        wait::check(accept_queue(a), |n| *n >= queued_before + 3)
    })
    .await;

    let asked = std::time::SystemTime::now();
    let (ran, took) = rig.timed(&["sandbox", "revoke-all", &id]);
    let t = ran.json();
    matrix(
        "SIGSTOP gw-a",
        "sandbox revoke-all",
        t["state"].as_str().unwrap_or("?"),
        took,
    );
    if let Some(after) = ended_in_log(&rig.members[1], asked) {
        matrix(
            "SIGSTOP gw-a",
            "sandbox revoke-all: gw-b ends the authority",
            "after the command started",
            after,
        );
    }
    assert_eq!(t["state"], "reset_incomplete", "{t}");
    let owed: Vec<&str> = t["closes_owed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["gateway_id"].as_str())
        .collect();
    assert_eq!(owed, ["gw-a"], "{t}");
    assert_eq!(curl_status(SOURCE, b, &bundle, API, "/after-revoke/b"), 0);

    wait::past(stopped_at, LEASE + Duration::from_millis(500)).await;
    rig.members[0].signal(Signal::Cont);
    let woke = kept.get("/after-wake/kept").await;
    if let Ok((status, refusal)) = &woke {
        assert_eq!(
            (*status, refusal.as_deref()),
            (503, Some("session_ended")),
            "a request on the kept connection after the wake is refused"
        );
    }
    assert_eq!(curl_status(SOURCE, a, &bundle, API, "/after-wake/new"), 0);
    for d in during {
        assert_eq!(d.await.unwrap(), 0, "a connection made while stopped");
    }
    assert_eq!(
        rig.peers.origin.paths_starting("/during-stop"),
        Vec::<String>::new()
    );
    assert_eq!(
        rig.peers.origin.paths_starting("/after-"),
        Vec::<String>::new()
    );

    // The lapse is reported, and reaches the stub through the chain.
    let status = wait::until("gw-a's lease_expired report at the stub", || {
        wait::check(rig.status(&id), |s| {
            reports_from(s, "gw-a", 1)
                .iter()
                .any(|r| r["reason"] == "lease_expired" && r["ca_error"].is_null())
        })
    });
    matrix(
        "SIGSTOP gw-a past the lease, SIGCONT",
        "(lease lapse on gw-a)",
        "lease_expired report at the stub",
        stopped_at.elapsed(),
    );
    let a_closes = closes_of(&status, "gw-a");
    assert!(a_closes[0]["confirmed_at"].is_string(), "{status}");
    assert_eq!(
        rig.members[0].metric("gateway_leases_lapsed_total"),
        Some(1.0)
    );
    let cert = rig.wait_issued(&id);
    assert_eq!(cert["end_reason"], "revoke_all");
    // No record on gw-a shows a request answered after the stop.
    for r in rig.members[0].session_records(&id) {
        for req in r["requests"].as_array().into_iter().flatten() {
            let path = req["path"].as_str().unwrap_or("");
            assert!(
                path == "/kept/before" || req["status"] != 200,
                "served after the stop: {r}"
            );
        }
    }
}

/// SIGSTOP one member for two leases while the session runs: the session
/// goes on through the other member all along (its leases renewed on
/// time); the woken member has dropped its authority (`lease_expired`,
/// reported), `sandbox trust` stops listing its CA, and a pause and
/// resume bring it back with a new attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_member_does_not_take_the_session_down_on_the_other() {
    let rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let digests = rig.digests(&id);
    let b = rig.members[1].data;
    let pid = rig.members[0].pid();
    rig.members[0].signal(Signal::Stop);
    wait::until("gw-a to be stopped", || {
        wait::check(signals::state(pid), |s| *s == Some('T'))
    });
    let stopped_at = Instant::now();
    let mut i = 0;
    while stopped_at.elapsed() < 2 * LEASE + Duration::from_secs(1) {
        let code = curl_status(SOURCE, b, &bundle, API, &format!("/through-b/{i}"));
        if code != 200 {
            let lapsed: Vec<String> = rig.members[1]
                .log()
                .lines()
                .filter(|l| l.contains("lease"))
                .map(str::to_owned)
                .collect();
            panic!(
                "request {i} through gw-b, {} ms after gw-a stopped, answered {code}: the healthy member dropped the session.\ngw-b's log on leases:\n{}\nserve's log:\n{}",
                stopped_at.elapsed().as_millis(),
                lapsed.join("\n"),
                rig.stub.serve_log()
            );
        }
        i += 1;
    }
    matrix(
        "SIGSTOP gw-a for 2 leases",
        "requests through gw-b",
        &format!("{i} answered 200"),
        stopped_at.elapsed(),
    );
    rig.members[0].signal(Signal::Cont);
    wait::until("gw-a's lease_expired report at the stub", || {
        wait::check(rig.status(&id), |s| {
            reports_from(s, "gw-a", 1)
                .iter()
                .any(|r| r["reason"] == "lease_expired")
        })
    });
    rig.wait_trust(&id, "trust-live.pem", &[&digests["gw-b"]]);
    let status = rig.status(&id);
    assert_eq!(status["state"], "running");
    assert!(reports_from(&status, "gw-b", 1).is_empty(), "{status}");

    let t = rig.cli(&["sandbox", "pause", &id]).json();
    assert_eq!(t["state"], "paused", "{t}");
    let t = rig.cli(&["sandbox", "resume", &id]).json();
    assert_eq!(t["state"], "running", "{t}");
    assert_eq!(t["ca"].as_array().map(Vec::len), Some(2), "{t}");
    let (bundle, listed) = rig.trust(&id, "trust-2.pem");
    assert_eq!(listed.len(), 2);
    for g in &rig.members {
        assert_eq!(curl_status(SOURCE, g.data, &bundle, API, "/resumed"), 200);
    }
    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    rig.wait_issued(&id);
}

/// How a member is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    /// SIGTERM: the graceful drain (its authorities end `shutdown`).
    Term,
    /// SIGKILL: a crash.
    Kill,
}

/// Restart one member mid-session, then `pause`, `resume` and `stop`:
/// each works; `sandbox trust` lists only live CAs; the restarted member
/// serves the session again from its next attempt; the certificate is
/// issued. With `pause_at_once`, the pause comes right after the restart,
/// before the stub can have learnt of it; otherwise once `sandbox trust`
/// has dropped the dead CA.
async fn restart_mid_session(how: Restart, pause_at_once: bool) {
    let mut rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, listed) = rig.trust(&id, "trust-1.pem");
    assert_eq!(listed.len(), 2);
    let digests = rig.digests(&id);
    for g in &rig.members {
        assert_eq!(curl_status(SOURCE, g.data, &bundle, API, "/before"), 200);
    }
    let fault = match how {
        Restart::Term => {
            assert!(rig.members[0].stop(), "gw-a drains and exits 0");
            "SIGTERM gw-a, start again"
        }
        Restart::Kill => {
            rig.members[0].kill();
            "SIGKILL gw-a, start again"
        }
    };
    rig.restart(0);
    let a = rig.members[0].data;
    assert_eq!(
        curl_status(SOURCE, a, &bundle, API, "/restarted"),
        0,
        "the new process holds no authority of the old"
    );
    if !pause_at_once {
        // The stub learns of the restart (the old process's drop report
        // or the new one's start report): trust lists the live CA only.
        let live = rig.wait_trust(&id, "trust-live.pem", &[&digests["gw-b"]]);
        assert_eq!(
            curl_status(SOURCE, rig.members[1].data, &live, API, "/live-b"),
            200
        );
        assert_eq!(curl_status(SOURCE, a, &live, API, "/live-a"), 0);
    }
    let (ran, took) = rig.timed(&["sandbox", "pause", &id]);
    let t = ran.json();
    matrix(
        fault,
        "sandbox pause",
        t["state"].as_str().unwrap_or("?"),
        took,
    );
    assert_eq!(t["state"], "paused", "{t}");
    assert_eq!(
        rig.cli(&["sandbox", "trust", &id]).code(),
        "sandbox_not_running"
    );

    let (ran, took) = rig.timed(&["sandbox", "resume", &id]);
    let t = ran.json();
    matrix(
        fault,
        "sandbox resume",
        t["state"].as_str().unwrap_or("?"),
        took,
    );
    assert_eq!(t["state"], "running", "{t}");
    assert_eq!(t["attempt"], 2);
    assert_eq!(
        t["ca"].as_array().map(Vec::len),
        Some(2),
        "both members open attempt 2: {t}"
    );
    let new = rig.digests(&id);
    let (bundle, mut listed) = rig.trust(&id, "trust-2.pem");
    listed.sort();
    let mut want: Vec<String> = new.values().cloned().collect();
    want.sort();
    assert_eq!(listed, want, "trust lists the live CAs of attempt 2");
    for (i, g) in rig.members.iter().enumerate() {
        assert_eq!(
            curl_status(SOURCE, g.data, &bundle, API, &format!("/attempt-2/{i}")),
            200,
            "{} serves attempt 2",
            IDS[i]
        );
    }

    let (ran, took) = rig.timed(&["sandbox", "stop", &id]);
    let t = ran.json();
    matrix(
        fault,
        "sandbox stop",
        t["state"].as_str().unwrap_or("?"),
        took,
    );
    assert_eq!(t["end_reason"], "stop");
    let cert = rig.wait_issued(&id);
    // Every CA is accounted for: attempt 1's on gw-a by what ended it.
    let ca_a: Vec<&Value> = cert["attempts"][0]["ca"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["gateway_id"] == "gw-a")
        .collect();
    let want_reason = match how {
        Restart::Term => ["shutdown", "gateway_restarted"].as_slice(),
        Restart::Kill => ["gateway_restarted"].as_slice(),
    };
    assert!(
        want_reason.contains(&ca_a[0]["destroy_reason"].as_str().unwrap_or("")),
        "{}",
        ca_a[0]
    );
    for attempt in cert["attempts"].as_array().unwrap() {
        for ca in attempt["ca"].as_array().unwrap() {
            assert!(ca["destroyed_at"].is_string(), "{ca}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_restart_mid_session_then_pause_at_once_resume_stop() {
    restart_mid_session(Restart::Term, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_restart_mid_session_then_pause_resume_stop() {
    restart_mid_session(Restart::Term, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_restart_mid_session_then_pause_at_once_resume_stop() {
    restart_mid_session(Restart::Kill, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_restart_mid_session_then_pause_resume_stop() {
    restart_mid_session(Restart::Kill, false).await;
}

/// `n` GETs `/{tag}/{i}` alternating between the members, one connection
/// each; all must be answered 200.
fn traffic(rig: &Pair, source: &str, bundle: &Path, tag: &str, n: usize) {
    for i in 0..n {
        let g = &rig.members[i % rig.members.len()];
        assert_eq!(
            curl_status(source, g.data, bundle, API, &format!("/{tag}/{i}")),
            200,
            "{tag} {i}"
        );
    }
}

/// The records as a sorted list of their JSON texts (a multiset).
fn multiset<'r>(records: impl IntoIterator<Item = &'r Value>) -> Vec<String> {
    let mut v: Vec<String> = records.into_iter().map(Value::to_string).collect();
    v.sort();
    v
}

/// `stop` while `serve` (the batch consumer and upkeep) is down: the
/// members confirm in their replies, but the certificate waits; once
/// `serve` is back it is issued once, holding exactly both members'
/// records of the session, and its signed bytes never change afterwards —
/// across later batches, a member's crash and restart, and a restart of
/// `serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_with_serve_down_issues_one_complete_final_certificate() {
    let mut rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    traffic(&rig, SOURCE, &bundle, "up", 6);
    rig.stub.kill_serve();
    traffic(&rig, SOURCE, &bundle, "down", 6);

    let (ran, took) = rig.timed(&["sandbox", "stop", &id]);
    let t = ran.json();
    matrix(
        "serve SIGKILLed",
        "sandbox stop",
        t["state"].as_str().unwrap_or("?"),
        took,
    );
    assert_eq!(
        t["state"], "ended",
        "the members confirmed in their replies: {t}"
    );
    let cert = rig.cli(&["certificate", &id]);
    assert_eq!(cert.code(), "certificate_not_issued", "{}", cert.stdout);
    assert!(
        cert.stderr.contains("batches"),
        "it waits for the members' batches: {}",
        cert.stderr
    );

    rig.stub.start_serve();
    let issued_at = Instant::now();
    let cert = rig.wait_issued(&id);
    matrix(
        "serve SIGKILLed at the stop, started again",
        "certificate",
        "issued",
        issued_at.elapsed(),
    );
    let mut from_members: Vec<Value> = Vec::new();
    for g in &rig.members {
        from_members.extend(g.session_records(&id));
    }
    assert_eq!(
        multiset(cert["connections"].as_array().unwrap()),
        multiset(&from_members),
        "the certificate holds exactly the members' records"
    );
    let allowed = from_members
        .iter()
        .filter(|r| r["verdict"] == "allowed")
        .count();
    assert_eq!(allowed, 12, "every connection made is recorded");
    let signed = rig.signed_certificate(&id);
    let json = rig.cli(&["certificate", &id]).stdout;

    // Later batches: another session's records, then a crash and restart
    // of a member (its journal recovered, its start report), then serve
    // restarted.
    let other = rig.start_session(&session(SOURCE_2));
    let (bundle_2, _) = rig.trust(&other, "trust-2.pem");
    traffic(&rig, SOURCE_2, &bundle_2, "later", 4);
    rig.cli(&["sandbox", "stop", &other]).json();
    rig.wait_issued(&other);
    assert_eq!(
        rig.signed_certificate(&id),
        signed,
        "changed after later batches"
    );
    rig.members[0].kill();
    rig.restart(0);
    assert!(rig.stub.stop_serve(), "serve drains and exits 0");
    rig.stub.start_serve();
    let third = rig.start_session(&session(SOURCE_2));
    let (bundle_3, _) = rig.trust(&third, "trust-3.pem");
    traffic(&rig, SOURCE_2, &bundle_3, "third", 2);
    rig.cli(&["sandbox", "stop", &third]).json();
    rig.wait_issued(&third);
    assert_eq!(
        rig.signed_certificate(&id),
        signed,
        "changed after a member's restart and serve's"
    );
    assert_eq!(rig.cli(&["certificate", &id]).stdout, json);
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

/// SIGHUP to both members and to `serve`, with a session running: each
/// logs it and keeps serving (requests through both members; serve
/// accepts their batches, renews and issues the certificate).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_to_both_binaries_is_logged_and_changes_nothing() {
    let mut rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    for g in &rig.members {
        g.signal(Signal::Hup);
    }
    signals::send(rig.stub.serve_pid().expect("serve runs"), Signal::Hup);
    for g in &rig.members {
        wait::until("the gateway to log the SIGHUP", || {
            wait::check(g.log(), |l| l.contains("SIGHUP"))
        });
    }
    wait::until("serve to log the SIGHUP", || {
        wait::check(rig.stub.serve_log(), |l| l.contains("SIGHUP"))
    });
    for g in &mut rig.members {
        assert!(g.exited().is_none(), "a SIGHUP ended a gateway");
    }
    assert!(rig.stub.serve_exited().is_none(), "a SIGHUP ended serve");
    // Past a lease: serve still renews both members.
    let hup_at = Instant::now();
    wait::past(hup_at, LEASE + Duration::from_millis(500)).await;
    for (i, g) in rig.members.iter().enumerate() {
        assert_eq!(
            curl_status(SOURCE, g.data, &bundle, API, &format!("/after-hup/{i}")),
            200
        );
    }
    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    let cert = rig.wait_issued(&id);
    let paths: BTreeSet<&str> = cert["connections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["requests"].as_array().into_iter().flatten())
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert!(
        paths.contains("/after-hup/0") && paths.contains("/after-hup/1"),
        "{paths:?}"
    );
}

/// Starts of each binary in the signal tests below: enough that a window
/// between the ready line and the signal handlers shows.
const STARTS: usize = 8;

/// SIGHUP the instant the ready line is read (as a service manager that
/// reloads right after start does): the gateway lives and logs it, every
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_right_after_the_ready_line_never_ends_the_gateway() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = TestConfig::default().toml(dir.path());
    for n in 0..STARTS {
        let mut g = Gateway::start(dir.path(), &config);
        g.signal(Signal::Hup);
        let outcome = wait::until("the SIGHUP logged, or the gateway gone", || {
            if g.log().contains("SIGHUP") {
                return Ok("logged");
            }
            match g.exited() {
                Some(status) => Ok(if status.success() {
                    "exited 0"
                } else {
                    "ended by the signal"
                }),
                None => Err("running, nothing logged yet"),
            }
        });
        assert_eq!(
            outcome, "logged",
            "start {n}: SIGHUP right after the ready line"
        );
        assert!(g.stop(), "start {n}: drains and exits 0 after the SIGHUP");
    }
}

/// SIGTERM the instant the ready line is read: the gateway drains and
/// exits 0 (not ended by the signal's default action), every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_right_after_the_ready_line_drains_the_gateway() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = TestConfig::default().toml(dir.path());
    for n in 0..STARTS {
        let mut g = Gateway::start(dir.path(), &config);
        assert!(
            g.stop(),
            "start {n}: SIGTERM right after the ready line: no drain"
        );
    }
}

/// SIGHUP, then SIGTERM, the instant `serve`'s ready line is read: it
/// lives through the first and drains on the second, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signals_right_after_the_ready_line_of_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut stub = Stub::init(dir.path(), &IDS);
    for n in 0..STARTS {
        stub.start_serve();
        signals::send(stub.serve_pid().unwrap(), Signal::Hup);
        let outcome = wait::until("serve to log the SIGHUP, or be gone", || {
            if stub.serve_log().matches("SIGHUP").count() > n {
                return Ok("logged");
            }
            match stub.serve_exited() {
                Some(_) => Ok("ended by the signal"),
                None => Err("running, nothing logged yet"),
            }
        });
        assert_eq!(
            outcome, "logged",
            "start {n}: SIGHUP right after serve's ready line"
        );
        assert!(stub.stop_serve(), "start {n}: serve drains and exits 0");
        stub.start_serve();
        assert!(
            stub.stop_serve(),
            "start {n}: SIGTERM right after serve's ready line: no drain"
        );
    }
}

/// The signed-message prefix docs/records.md states.
const DOMAIN: &[u8] = b"talos-v1\0";

/// The kind byte docs/records.md states for each envelope kind.
fn kind_tag(kind: &str) -> u8 {
    match kind {
        "batch" => 0x01,
        "drop_report" => 0x02,
        "decision" => 0x03,
        "start_report" => 0x04,
        "certificate" => 0x05,
        other => panic!("no such kind {other:?}"),
    }
}

/// `openssl pkeyutl -verify` of `message` and `signature` under the PEM
/// public key `key`, with openssl alone: whether it verified.
fn openssl_verifies(dir: &Path, key: &Path, message: &[u8], signature: &[u8]) -> bool {
    let msg = dir.join("msg.bin");
    let sig = dir.join("sig.bin");
    std::fs::write(&msg, message).unwrap();
    std::fs::write(&sig, signature).unwrap();
    let out = run_bounded(
        "openssl",
        &[
            "pkeyutl",
            "-verify",
            "-pubin",
            "-inkey",
            key.to_str().unwrap(),
            "-rawin",
            "-in",
            msg.to_str().unwrap(),
            "-sigfile",
            sig.to_str().unwrap(),
        ],
        None,
        20,
    );
    let said = String::from_utf8_lossy(&out.stdout);
    let ok = out.status.success() && said.contains("Signature Verified Successfully");
    assert!(
        ok || said.contains("Signature Verification Failure"),
        "openssl neither verified nor refused: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok
}

/// Check one envelope (`{"kind","key_id","payload","signature"}`, bytes
/// in base64) under `key` with openssl, as docs/records.md says to: the
/// message is the prefix, the kind byte and the payload. An altered
/// payload, and the same bytes under another kind byte, must not verify.
fn check_envelope(dir: &Path, key: &Path, envelope: &Value) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let kind = envelope["kind"].as_str().expect("kind");
    let payload = b64.decode(envelope["payload"].as_str().unwrap()).unwrap();
    let signature = b64.decode(envelope["signature"].as_str().unwrap()).unwrap();
    let mut message = DOMAIN.to_vec();
    message.push(kind_tag(kind));
    message.extend_from_slice(&payload);
    assert!(
        openssl_verifies(dir, key, &message, &signature),
        "openssl does not verify the {kind}"
    );
    let mut altered = message.clone();
    *altered.last_mut().unwrap() ^= 1;
    assert!(
        !openssl_verifies(dir, key, &altered, &signature),
        "an altered {kind} verified"
    );
    let mut other_kind = message;
    other_kind[DOMAIN.len()] = if kind == "batch" { 0x02 } else { 0x01 };
    assert!(
        !openssl_verifies(dir, key, &other_kind, &signature),
        "a {kind} verified as another kind"
    );
}

/// A raw 32-byte Ed25519 public key (hex) as a PEM file, made by openssl
/// from its SubjectPublicKeyInfo DER (the fixed 12-byte Ed25519 prefix and
/// the key).
fn raw_key_pem(dir: &Path, name: &str, hex_key: &str) -> PathBuf {
    let mut der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    der.extend(hex::decode(hex_key).expect("hex key"));
    let der_path = dir.join(format!("{name}.der"));
    std::fs::write(&der_path, der).unwrap();
    let pem = dir.join(format!("{name}.pem"));
    let out = run_bounded(
        "openssl",
        &[
            "pkey",
            "-pubin",
            "-inform",
            "DER",
            "-in",
            der_path.to_str().unwrap(),
            "-out",
            pem.to_str().unwrap(),
        ],
        None,
        20,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pem
}

/// Every kind of signature in the system — a batch from a spool, a drop
/// report and a start report from a batch, a decision, the certificate —
/// verifies with openssl alone, over the bytes docs/records.md states,
/// under the key the operator is shown (`gateway list`, `plane-key`, the
/// relay's key file).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_signature_verifies_with_openssl_alone() {
    let mut rig = pair().await;
    rig.cli(&[
        "policy",
        "lock",
        "add",
        "--destination",
        API,
        "--method",
        "POST",
        "--path-prefix",
        "/merge",
        "--mode",
        "every_request",
        "--approver",
        "alice",
    ])
    .json();
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    // A decision: a held POST, approved.
    let data = rig.members[0].data;
    let held = {
        let bundle = bundle.clone();
        tokio::task::spawn_blocking(move || {
            talos_e2e::clients::curl_via(data, &bundle, API, "/merge/1", &["-X", "POST"]).status
        })
    };
    let card = wait::until("a card to approve", || {
        let cards = rig.cli(&["approvals", "list"]).json();
        cards
            .as_array()
            .and_then(|c| c.first().cloned())
            .ok_or(cards)
    });
    let decided = rig
        .cli(&[
            "approvals",
            "approve",
            card["id"].as_str().unwrap(),
            "--as",
            "alice",
        ])
        .json();
    assert_eq!(held.await.unwrap(), 200);
    let decision = decided["signed"].clone();
    assert_eq!(decision["kind"], "decision", "{decided}");

    // With serve down, batches stay in the spools: a pause's drop reports,
    // and a restarted member's start report.
    rig.stub.kill_serve();
    rig.cli(&["sandbox", "pause", &id]).json();
    rig.members[1].kill();
    rig.restart(1);
    let mut envelopes: Vec<(usize, Value)> = Vec::new();
    for (i, id_) in IDS.iter().enumerate() {
        let spool = rig.dir.join(id_).join("spool");
        let mut kinds = BTreeSet::new();
        wait::until(&format!("{id_}'s spool to hold its batches"), || {
            let mut found = Vec::new();
            for e in std::fs::read_dir(&spool).unwrap().flatten() {
                if !e.file_name().to_string_lossy().ends_with(".batch") {
                    continue;
                }
                let Ok(batch) = serde_json::from_slice::<Value>(&std::fs::read(e.path()).unwrap())
                else {
                    continue;
                };
                found.push(batch);
            }
            let mut inner = Vec::new();
            for batch in &found {
                use base64::Engine as _;
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(batch["payload"].as_str().unwrap())
                    .unwrap();
                let payload: Value = serde_json::from_slice(&payload).unwrap();
                for entry in payload["records"].as_array().into_iter().flatten() {
                    if entry.get("report").is_some() {
                        inner.push(entry["report"].clone());
                    }
                }
            }
            let kinds_now: BTreeSet<String> = found
                .iter()
                .chain(&inner)
                .filter_map(|e| e["kind"].as_str().map(str::to_owned))
                .collect();
            let want = if i == 0 {
                ["batch", "drop_report"].as_slice()
            } else {
                ["batch", "drop_report", "start_report"].as_slice()
            };
            if want.iter().all(|k| kinds_now.contains(*k)) {
                kinds = kinds_now;
                envelopes.extend(found.into_iter().chain(inner).map(|e| (i, e)));
                Ok(())
            } else {
                Err(kinds_now)
            }
        });
        eprintln!("{id_}: envelopes of kinds {kinds:?} in the spool");
    }
    rig.stub.start_serve();
    rig.cli(&["sandbox", "stop", &id]).json();
    rig.wait_issued(&id);
    let certificate: Value = serde_json::from_str(&rig.signed_certificate(&id)).unwrap();
    assert_eq!(certificate["kind"], "certificate");

    // The keys, as an operator gets them.
    let keydir = rig.dir.join("keys");
    std::fs::create_dir_all(&keydir).unwrap();
    let listed = rig.cli(&["gateway", "list"]).json();
    let gateway_keys: Vec<PathBuf> = IDS
        .iter()
        .map(|id_| {
            let g = listed
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["id"] == *id_)
                .expect("registered")
                .clone();
            let pem = keydir.join(format!("{id_}.pem"));
            std::fs::write(&pem, g["public_key_pem"].as_str().expect("its PEM")).unwrap();
            // The PEM is the raw key the list also gives, as openssl reads it.
            let raw = raw_key_pem(
                &keydir,
                &format!("{id_}-raw"),
                g["public_key_hex"].as_str().unwrap(),
            );
            assert_eq!(std::fs::read(&raw).unwrap(), std::fs::read(&pem).unwrap());
            pem
        })
        .collect();
    let plane = rig.stub.run(&[], &["plane-key"], b"").json();
    let plane_pem = keydir.join("plane.pem");
    std::fs::write(&plane_pem, plane["public_key_pem"].as_str().unwrap()).unwrap();
    // The relay's public key, as the attempt recorded it (the key file
    // itself is PKCS#8 v2, which OpenSSL 3.0 does not read).
    let status = rig.status(&id);
    let relay_hex = status["attempts"][0]["relay_public_key"]
        .as_str()
        .expect("the relay key the attempt opened with")
        .to_owned();
    let relay_pem = raw_key_pem(&keydir, "relay", &relay_hex);
    let mut checked = BTreeMap::<String, usize>::new();
    for (i, e) in &envelopes {
        check_envelope(&keydir, &gateway_keys[*i], e);
        *checked
            .entry(e["kind"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    check_envelope(&keydir, &relay_pem, &decision);
    check_envelope(&keydir, &plane_pem, &certificate);
    // A member's signature does not verify under the other's key.
    let (i, batch) = envelopes
        .iter()
        .find(|(_, e)| e["kind"] == "batch")
        .unwrap();
    {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut message = DOMAIN.to_vec();
        message.push(0x01);
        message.extend(b64.decode(batch["payload"].as_str().unwrap()).unwrap());
        let sig = b64.decode(batch["signature"].as_str().unwrap()).unwrap();
        assert!(!openssl_verifies(
            &keydir,
            &gateway_keys[1 - i],
            &message,
            &sig
        ));
    }
    eprintln!("verified with openssl: {checked:?}, 1 decision, 1 certificate");

    // The commands docs/records.md gives a reviewer, run as given (with
    // this rig's store and directory), on the certificate and on a batch
    // from gw-a's spool.
    let (_, batch) = envelopes
        .iter()
        .find(|(i, e)| *i == 0 && e["kind"] == "batch")
        .expect("a batch of gw-a");
    std::fs::write(keydir.join("batch.json"), batch.to_string()).unwrap();
    let script = r#"set -eu
cd "$KEYDIR"
"$STUB" --db "$DB" --control-dir "$CONTROL" plane-key | jq -r .public_key_pem > key.pem
"$STUB" --db "$DB" --control-dir "$CONTROL" certificate "$ID" --signed > env.json
printf 'talos-v1\000' > msg
printf '\005' >> msg
jq -r .payload env.json | base64 -d >> msg
jq -r .signature env.json | base64 -d > sig
openssl pkeyutl -verify -pubin -inkey key.pem -rawin -in msg -sigfile sig
"$STUB" --db "$DB" gateway list | jq -r '.[] | select(.id == "gw-a") | .public_key_pem' > key.pem
printf 'talos-v1\000' > msg
printf '\001' >> msg
jq -r .payload batch.json | base64 -d >> msg
jq -r .signature batch.json | base64 -d > sig
openssl pkeyutl -verify -pubin -inkey key.pem -rawin -in msg -sigfile sig
"#;
    let out = std::process::Command::new("timeout")
        .args(["60", "sh", "-c", script])
        .env("KEYDIR", &keydir)
        .env("STUB", talos_e2e::gateway::workspace_bin("control-stub"))
        .env("DB", &rig.stub.db)
        .env("CONTROL", &rig.stub.control_dir)
        .env("ID", &id)
        .output()
        .expect("sh");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.matches("Signature Verified Successfully").count() == 2,
        "the documented commands: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A member that crashed and lost its signing key (started again with a
/// fresh one, which the stub has never registered): `stop` and
/// `revoke-all` still commit the end and close it on the other member;
/// the re-keyed member's word is not trusted, so its close stays owed,
/// saying why, and no certificate is issued on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_that_lost_its_signing_key_does_not_block_stop_or_revoke_all() {
    let mut rig = pair().await;
    let stopped = rig.start_session(&session(SOURCE));
    let revoked = rig.start_session(&session(SOURCE_2));
    let (bundle_1, _) = rig.trust(&stopped, "trust-1.pem");
    let (bundle_2, _) = rig.trust(&revoked, "trust-2.pem");
    rig.members[0].kill();
    std::fs::remove_file(rig.dir.join("gw-a").join("gw-a-signing.key")).expect("the key file");
    rig.restart(0);
    let b = rig.members[1].data;
    for (id, command, source, bundle) in [
        (&stopped, "stop", SOURCE, &bundle_1),
        (&revoked, "revoke-all", SOURCE_2, &bundle_2),
    ] {
        let (ran, took) = rig.timed(&["sandbox", command, id]);
        matrix(
            "gw-a SIGKILLed, restarted with a new signing key",
            &format!("sandbox {command}"),
            &if ran.status == 0 {
                ran.json()["state"].as_str().unwrap_or("?").to_owned()
            } else {
                format!("refused: {}", ran.stderr.trim())
            },
            took,
        );
        let t = ran.json();
        assert!(
            ["stopping", "reset_incomplete"].contains(&t["state"].as_str().unwrap_or("")),
            "{t}"
        );
        assert_eq!(curl_status(source, b, bundle, API, "/after-end"), 0);
        let status = rig.status(id);
        let owed = closes_of(&status, "gw-a");
        assert!(owed[0]["confirmed_at"].is_null(), "{status}");
    }
    assert_eq!(
        rig.peers.origin.paths_starting("/after-end"),
        Vec::<String>::new()
    );
    // A new session opens on gw-b alone: no authority on a member whose
    // word cannot be trusted.
    let t = rig
        .cli(&[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "127.0.0.4",
            "--allow",
            API,
            "--mode",
            "commands",
        ])
        .json();
    assert_eq!(t["state"], "running", "{t}");
    let cas: Vec<&str> = t["ca"]
        .as_array()
        .expect("cas")
        .iter()
        .filter_map(|c| c["gateway_id"].as_str())
        .collect();
    assert_eq!(cas, ["gw-b"], "{t}");
}

/// `stop` given only the reachable member (the other's address left
/// out): the end commits, the member given closes at once, and `serve`
/// (which knows both) closes the other; the session then ends and its
/// certificate is issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_naming_one_member_is_finished_by_serve_on_the_other() {
    let rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let only_b = vec![("gw-b".to_owned(), rig.controls[1])];
    let t = rig.stub.run(&only_b, &["sandbox", "stop", &id], b"").json();
    // Over; `ended` already if serve closed gw-a before the command ran
    // its reset (serve asks owed closes every tick).
    assert!(
        ["reset_incomplete", "ended"].contains(&t["state"].as_str().unwrap_or("")),
        "{t}"
    );
    let given: Vec<&str> = t["reports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["gateway_id"].as_str())
        .collect();
    assert_eq!(given, ["gw-b"], "the command reached gw-b alone: {t}");
    assert_eq!(
        curl_status(SOURCE, rig.members[1].data, &bundle, API, "/after-stop/b"),
        0
    );
    let start = Instant::now();
    let status = wait::until("serve to close the session on gw-a", || {
        wait::check(rig.status(&id), |s| s["state"] == "ended")
    });
    matrix(
        "stop given gw-b only",
        "sandbox stop (serve closes gw-a)",
        "ended",
        start.elapsed(),
    );
    let a = closes_of(&status, "gw-a");
    assert!(a[0]["confirmed_at"].is_string(), "{status}");
    assert_eq!(
        curl_status(SOURCE, rig.members[0].data, &bundle, API, "/after-stop/a"),
        0
    );
    rig.wait_issued(&id);
    assert_eq!(
        rig.peers.origin.paths_starting("/after-stop"),
        Vec::<String>::new()
    );
}

/// SIGSTOP one member, `stop` (its close fails: it is hung), keep it
/// stopped a while, SIGCONT it well inside its lease (20 s here): the
/// woken member may still serve the session until `serve`'s retried close
/// reaches it — the lease bounds that window — and every request it
/// served is on the certificate; once the close lands it refuses the
/// session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_woken_inside_its_lease_is_closed_by_serve_and_what_it_served_is_on_the_certificate(
) {
    let lease = Duration::from_secs(20);
    let rig = pair_with_lease(lease).await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let a = rig.members[0].data;
    let pid = rig.members[0].pid();
    rig.members[0].signal(Signal::Stop);
    wait::until("gw-a to be stopped", || {
        wait::check(signals::state(pid), |s| *s == Some('T'))
    });
    let stopped_at = Instant::now();
    let (ran, took) = rig.timed(&["sandbox", "stop", &id]);
    let t = ran.json();
    matrix(
        "SIGSTOP gw-a (lease 20 s)",
        "sandbox stop",
        t["state"].as_str().unwrap_or("?"),
        took,
    );
    assert_eq!(t["state"], "reset_incomplete", "{t}");
    // Hung for half the lease: serve's retries fail meanwhile.
    wait::past(stopped_at, lease / 2).await;
    rig.members[0].signal(Signal::Cont);
    let woke = Instant::now();
    // Requests through the woken member until it refuses (bounded).
    let mut answered = Vec::new();
    for i in 0..500 {
        let path = format!("/woken/{i}");
        if curl_status(SOURCE, a, &bundle, API, &path) != 200 {
            break;
        }
        answered.push(path);
    }
    let refused_after = woke.elapsed();
    matrix(
        "SIGSTOP gw-a for half its lease, stop, SIGCONT",
        "requests through gw-a after the wake",
        &format!("{} answered 200 before it refused", answered.len()),
        refused_after,
    );
    assert!(
        stopped_at.elapsed() < lease + Duration::from_secs(5),
        "gw-a served the ended session past its lease"
    );
    let status = rig.status(&id);
    let a_close = closes_of(&status, "gw-a");
    eprintln!("gw-a's close: {}", a_close[0]);
    let cert = rig.wait_issued(&id);
    let on_cert: BTreeSet<&str> = cert["connections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["requests"].as_array().into_iter().flatten())
        .filter(|r| r["status"] == 200)
        .filter_map(|r| r["path"].as_str())
        .collect();
    for path in &answered {
        assert!(
            on_cert.contains(path.as_str()),
            "{path} served but not on the certificate"
        );
    }
    // A request that reached the destination and was cut before its
    // answer is on the record too (`cut: true`): checked, without a race,
    // by `a_request_in_flight_when_the_session_ends_is_on_the_certificate`.
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

/// Every transition with one member down (SIGKILLed, not started again):
/// `pause`, `resume`, `interrupt`, `recover` work through the other
/// member; no attempt's authority is live on the dead one; `sandbox
/// trust` lists only the live member's CA. With both down a resume fails
/// `gateway_unreachable`, its attempt ends `start_failed`, and the session
/// stays paused. Started again, the member serves from the next attempt;
/// the certificate is issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_transition_works_with_a_member_down() {
    let mut rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    rig.members[0].kill();
    let b = rig.members[1].data;
    for (command, want) in [
        ("pause", "paused"),
        ("resume", "running"),
        ("interrupt", "interrupted"),
        ("recover", "running"),
    ] {
        let (ran, took) = rig.timed(&["sandbox", command, &id]);
        let t = ran.json();
        matrix(
            "gw-a SIGKILLed (down)",
            &format!("sandbox {command}"),
            t["state"].as_str().unwrap_or("?"),
            took,
        );
        assert_eq!(t["state"], want, "{t}");
        if want == "running" {
            let unreached: Vec<&str> = t["unreached"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|u| u["gateway"].as_str())
                .collect();
            assert_eq!(unreached, ["gw-a"], "{t}");
            let digests = rig.digests(&id);
            assert_eq!(digests.keys().collect::<Vec<_>>(), ["gw-b"], "{digests:?}");
            let (bundle, listed) = rig.trust(&id, &format!("trust-{command}.pem"));
            assert_eq!(listed, [digests["gw-b"].clone()]);
            assert_eq!(
                curl_status(SOURCE, b, &bundle, API, &format!("/{command}")),
                200
            );
        }
    }
    // Both down: a resume opens nothing, and changes nothing but the
    // record of a failed attempt.
    rig.cli(&["sandbox", "pause", &id]).json();
    rig.members[1].kill();
    let (ran, took) = rig.timed(&["sandbox", "resume", &id]);
    matrix(
        "both members SIGKILLed",
        "sandbox resume",
        &format!("refused: {}", ran.code()),
        took,
    );
    assert_eq!(ran.code(), "gateway_unreachable");
    let status = rig.status(&id);
    assert_eq!(status["state"], "paused", "{status}");
    let last = status["attempts"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["end_cause"], "start_failed", "{last}");
    // Both back: the next attempt opens on both.
    rig.restart(0);
    rig.restart(1);
    let t = rig.cli(&["sandbox", "resume", &id]).json();
    assert_eq!(t["state"], "running", "{t}");
    assert_eq!(t["ca"].as_array().map(Vec::len), Some(2), "{t}");
    let (bundle, listed) = rig.trust(&id, "trust-both.pem");
    assert_eq!(listed.len(), 2);
    for g in &rig.members {
        assert_eq!(curl_status(SOURCE, g.data, &bundle, API, "/both-back"), 200);
    }
    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    let cert = rig.wait_issued(&id);
    for attempt in cert["attempts"].as_array().unwrap() {
        for ca in attempt["ca"].as_array().unwrap() {
            assert!(ca["destroyed_at"].is_string(), "{ca}");
        }
    }
}

/// The control plane hung (SIGSTOP of `serve`) past the lease: both
/// members end the session's authority by themselves (fail closed, each
/// with its `lease_expired` report); woken, `serve` takes the reports, and
/// `sandbox trust` lists no CA; a pause and a resume open a new attempt on
/// both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_plane_hung_past_the_lease_ends_authority_on_both_members() {
    let rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let mut kept = Kept::open(SOURCE, rig.members[0].data, API, &bundle, "/kept").await;
    let serve = rig.stub.serve_pid().expect("serve runs");
    signals::send(serve, Signal::Stop);
    let stopped_at = Instant::now();
    for g in &rig.members {
        wait::until("the lease to lapse on each member", || {
            wait::check(g.metric("gateway_leases_lapsed_total"), |n| *n == Some(1.0))
        });
    }
    matrix(
        "serve SIGSTOPped",
        "(leases on both members)",
        "lapsed on both",
        stopped_at.elapsed(),
    );
    assert!(
        kept.get("/after-lapse").await.is_err(),
        "the kept connection is cut"
    );
    for g in &rig.members {
        assert_eq!(curl_status(SOURCE, g.data, &bundle, API, "/after-lapse"), 0);
    }
    signals::send(serve, Signal::Cont);
    let status = wait::until("both lease_expired reports at the stub", || {
        wait::check(rig.status(&id), |s| {
            IDS.iter().all(|g| {
                reports_from(s, g, 1)
                    .iter()
                    .any(|r| r["reason"] == "lease_expired")
            })
        })
    });
    assert_eq!(status["state"], "running", "{status}");
    let (_, listed) = rig.trust(&id, "trust-none.pem");
    assert!(listed.is_empty(), "no live CA is handed out: {listed:?}");
    rig.cli(&["sandbox", "pause", &id]).json();
    let t = rig.cli(&["sandbox", "resume", &id]).json();
    assert_eq!(t["ca"].as_array().map(Vec::len), Some(2), "{t}");
    let (bundle, _) = rig.trust(&id, "trust-2.pem");
    for g in &rig.members {
        assert_eq!(curl_status(SOURCE, g.data, &bundle, API, "/resumed"), 200);
    }
    assert_eq!(
        rig.peers.origin.paths_starting("/after-lapse"),
        Vec::<String>::new()
    );
    rig.cli(&["sandbox", "stop", &id]).json();
    rig.wait_issued(&id);
}

/// The CLI killed in the middle of `stop`, after the end is committed and
/// while a hung member keeps it waiting: the end stands (no command
/// brings the session back), and `serve` finishes it: the other member's
/// report comes through its chain, the woken member's close is asked
/// again; the session ends and its certificate is issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_killed_in_the_middle_of_stop_leaves_serve_to_finish_it() {
    let lease = Duration::from_secs(20);
    let rig = pair_with_lease(lease).await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let pid = rig.members[0].pid();
    rig.members[0].signal(Signal::Stop);
    wait::until("gw-a to be stopped", || {
        wait::check(signals::state(pid), |s| *s == Some('T'))
    });
    let mut cli = std::process::Command::new(talos_e2e::gateway::workspace_bin("control-stub"));
    cli.arg("--db")
        .arg(&rig.stub.db)
        .arg("--control-dir")
        .arg(&rig.stub.control_dir);
    for (g, addr) in rig.links() {
        cli.arg("--gateway").arg(format!("{g}={addr}"));
    }
    let mut cli = cli
        .args(["sandbox", "stop", &id])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("control-stub sandbox stop");
    // Committed: the store says so while the command still waits on gw-a.
    wait::until("the end committed", || {
        wait::check(rig.status(&id)["state"].clone(), |s| s != "running")
    });
    signals::send(cli.id(), Signal::Kill);
    let _ = cli.wait();
    let killed_at = Instant::now();
    assert_eq!(rig.cli(&["sandbox", "resume", &id]).code(), "sandbox_ended");
    // The live member closes the session: asked by the CLI before it died,
    // or by serve's retry (not a lapse: the lease is 20 s).
    let b = rig.members[1].data;
    wait::until("gw-b to refuse the ended session", || {
        wait::check(curl_status(SOURCE, b, &bundle, API, "/after-kill"), |c| {
            *c == 0
        })
    });
    matrix(
        "SIGSTOP gw-a; the stop CLI SIGKILLed after its commit",
        "(gw-b closed by the CLI before it died, or by serve)",
        "gw-b refuses",
        killed_at.elapsed(),
    );
    // Its report (a close's: reason end) reaches the stub, through its
    // chain if the reply died with the CLI.
    wait::until("gw-b's report at the stub", || {
        wait::check(rig.status(&id), |s| {
            reports_from(s, "gw-b", 1)
                .iter()
                .any(|r| r["reason"] == "end")
        })
    });
    rig.members[0].signal(Signal::Cont);
    let status = wait::until("serve to finish the end", || {
        wait::check(rig.status(&id), |s| s["state"] == "ended")
    });
    for g in IDS {
        let c = closes_of(&status, g);
        assert!(c[0]["confirmed_at"].is_string(), "{status}");
    }
    rig.wait_issued(&id);
}

/// Closes owed survive a restart of `serve`: a hung member's close is
/// owed, `serve` is killed and started again, the member wakes inside its
/// lease; the new `serve` asks the close again and the member confirms it
/// in its reply (reason `end`, not a lapse).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_close_owed_survives_a_restart_of_serve() {
    let lease = Duration::from_secs(20);
    let mut rig = pair_with_lease(lease).await;
    let id = rig.start_session(&session(SOURCE));
    let pid = rig.members[0].pid();
    rig.members[0].signal(Signal::Stop);
    wait::until("gw-a to be stopped", || {
        wait::check(signals::state(pid), |s| *s == Some('T'))
    });
    let stopped_at = Instant::now();
    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "reset_incomplete", "{t}");
    rig.stub.kill_serve();
    rig.members[0].signal(Signal::Cont);
    rig.stub.start_serve();
    let status = wait::until("the new serve to confirm gw-a's close", || {
        wait::check(rig.status(&id), |s| {
            closes_of(s, "gw-a")[0]["confirmed_at"].is_string()
        })
    });
    matrix(
        "SIGSTOP gw-a, stop, serve SIGKILLed and started again, SIGCONT",
        "(close owed, asked by the new serve)",
        "confirmed",
        stopped_at.elapsed(),
    );
    // Asked again before the lease ran out: the report is the close's.
    let report = reports_from(&status, "gw-a", 1);
    assert!(report.iter().any(|r| r["reason"] == "end"), "{status}");
    rig.wait_issued(&id);
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
