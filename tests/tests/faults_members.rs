//! The gateway pair under faults of a member, end to end: a member
//! SIGKILLed, SIGSTOPped (hung past its lease, or woken inside it) or
//! restarted while sessions run, and every transition with one down. When
//! a session ends its authority is gone everywhere, the other member goes
//! on serving, and the certificate says exactly what happened, once.
//!
//! The rig and what the fault tests share: [`faults`].

mod faults;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use faults::*;
use serde_json::Value;
use talos_e2e::clients::{curl_status, run_bounded, Curl, Kept};
use talos_e2e::gateway::Gateway;
use talos_e2e::rig::pair::{matrix, IDS};
use talos_e2e::signals::{self, Signal};
use talos_e2e::stub::{cert_records, closes_of, reports_from};
use talos_e2e::wait;

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

    let (stop, took) = rig.timed(&["--operator", "alice", "sandbox", "stop", &stopped]);
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
        // Steps 4 and 5 were confirmed late: the first outcome, naming
        // gw-a, stays beside the confirmation, in the status and on the
        // certificate.
        for shown in [&status, &cert] {
            for step in &shown["reset"].as_array().unwrap()[3..] {
                let first = &step["earlier"][0];
                assert_eq!(first["confirmed"], false, "{step}");
                assert!(
                    first["error"].as_str().is_some_and(|e| e.contains("gw-a")),
                    "{step}"
                );
            }
        }
        // Who asked, in the status and on the certificate.
        let (end, by) = if id == &stopped {
            ("stop", "alice")
        } else {
            ("revoke_all", talos_e2e::stub::E2E_OPERATOR)
        };
        for shown in [&status, &cert] {
            let asked: Vec<(&str, &str, &str)> = shown["commands"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["event"].as_str().unwrap(),
                        c["requester"].as_str().unwrap(),
                        c["requested_by"].as_str().unwrap(),
                    )
                })
                .collect();
            assert_eq!(
                asked,
                [
                    ("start", "operator", talos_e2e::stub::E2E_OPERATOR),
                    (end, "operator", by)
                ],
                "{shown}"
            );
        }
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

/// SIGSTOP one member, `stop` (its close fails: it is hung), keep it
/// stopped a while, SIGCONT it well inside its lease (20 s here), with
/// `serve` stopped too so that no retried close can reach it first: the
/// woken member serves not one request of the ended session — it finds it
/// was frozen and suspends its leased authorities until the control plane
/// renews them, which it never does for an ended session — and says why on
/// the record (`suspended_after_freeze`). Once `serve` runs again its
/// retried close lands and the certificate is issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_woken_inside_its_lease_serves_nothing_of_a_session_ended_meanwhile() {
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
    // Hung for a quarter of the lease, then woken with `serve` stopped:
    // only gw-a's own judgement stands between the ended session and a
    // request.
    wait::past(stopped_at, lease / 4).await;
    let serve = rig.stub.serve_pid().expect("serve runs");
    signals::send(serve, Signal::Stop);
    rig.members[0].signal(Signal::Cont);
    for i in 0..3 {
        let code = curl_status(SOURCE, a, &bundle, API, &format!("/woken/{i}"));
        assert_ne!(
            code,
            200,
            "request {i} of the ended session served by the woken gw-a\n{}",
            rig.members[0].log()
        );
    }
    assert!(
        stopped_at.elapsed() < lease,
        "the lease, not the freeze, ended it: the test waited too long"
    );
    wait::until("gw-a to count its freeze", || {
        wait::check(rig.members[0].metric("gateway_freezes_total"), |n| {
            *n == Some(1.0)
        })
    });
    assert!(
        rig.members[0].log().contains("the process was frozen"),
        "{}",
        rig.members[0].log()
    );
    assert_eq!(
        rig.peers.origin.paths_starting("/woken"),
        Vec::<String>::new()
    );
    signals::send(serve, Signal::Cont);
    let cert = rig.wait_issued(&id);
    let suspended = cert["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["verdict"] == "session_ended" && c["cause"] == "suspended_after_freeze")
        .count();
    assert_eq!(suspended, 3, "{cert}");
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

/// Steps 4 and 5 of a transition's reset.
fn gateway_steps(t: &Value) -> Vec<&Value> {
    t["reset"]
        .as_array()
        .expect("reset steps")
        .iter()
        .filter(|s| s["step"] == 4 || s["step"] == 5)
        .collect()
}
