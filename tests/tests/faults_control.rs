//! The gateway pair under faults of the control side, end to end:
//! `control-stub serve` (the batch consumer and upkeep) killed, hung past
//! the lease or restarted, and the CLI killed in the middle of a command
//! or given one member only. What the members confirmed stands, `serve`
//! finishes what the CLI began, and the certificate is issued once, final.
//!
//! The rig and what the fault tests share: [`faults`].

mod faults;

use std::time::{Duration, Instant};

use faults::*;
use serde_json::Value;
use talos_e2e::clients::{curl_status, Kept};
use talos_e2e::rig::pair::{matrix, IDS};
use talos_e2e::signals::{self, Signal};
use talos_e2e::stub::{closes_of, reports_from, StoreWriteLock};
use talos_e2e::wait;

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

/// The records as a sorted list of their JSON texts (a multiset).
fn multiset<'r>(records: impl IntoIterator<Item = &'r Value>) -> Vec<String> {
    let mut v: Vec<String> = records.into_iter().map(Value::to_string).collect();
    v.sort();
    v
}

/// `stop` that reaches only one member (the CLI told another address for
/// gw-a, where nothing listens: `--gateway` overrides the store's): the
/// end commits, the member reached closes at once, and `serve` (which
/// reaches both) closes the other; the session then ends and its
/// certificate is issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_naming_one_member_is_finished_by_serve_on_the_other() {
    let rig = pair().await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let nowhere = talos_e2e::ports::reserve();
    let only_b = vec![
        ("gw-a".to_owned(), nowhere),
        ("gw-b".to_owned(), rig.controls[1]),
    ];
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

/// The control plane hung (SIGSTOP of `serve`) past the lease: both
/// members end the session's authority by themselves (fail closed, each
/// with its `lease_expired` report); woken, `serve` takes the reports,
/// sees that nothing serves the session any more, interrupts it (the
/// lease as the cause) and recovers it at once as a new attempt on both
/// (mode commands): it never shows `running` with nothing serving it.
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
    let status = wait::until("the lapse seen and the session recovered", || {
        wait::check(rig.status(&id), |s| {
            IDS.iter().all(|g| {
                reports_from(s, g, 1)
                    .iter()
                    .any(|r| r["reason"] == "lease_expired")
            }) && s["attempts"].as_array().map(Vec::len) == Some(2)
                && s["state"] == "running"
        })
    });
    let first = &status["attempts"][0];
    assert_eq!(first["end_cause"], "interrupted", "{status}");
    let second = &status["attempts"][1];
    assert_eq!(second["cause"], "recovery", "{status}");
    assert_eq!(second["ca"].as_array().map(Vec::len), Some(2), "{status}");
    let asked: Vec<(&str, &str)> = status["commands"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .map(|c| {
            (
                c["event"].as_str().unwrap(),
                c["requested_by"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        asked,
        [("interrupt", "lease_expired"), ("recover", "lease_expired")],
        "{status}"
    );
    let (bundle, listed) = rig.trust(&id, "trust-2.pem");
    assert_eq!(listed.len(), 2, "the new attempt's CAs: {listed:?}");
    for g in &rig.members {
        assert_eq!(curl_status(SOURCE, g.data, &bundle, API, "/recovered"), 200);
    }
    assert_eq!(
        rig.peers.origin.paths_starting("/after-lapse"),
        Vec::<String>::new()
    );
    rig.cli(&["sandbox", "stop", &id]).json();
    let cert = rig.wait_issued(&id);
    // The kept connection was cut by the lapse, and its record says so.
    let cut: Vec<&Value> = cert["refusals"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "connection" && r["reason"] == "session_ended")
        .collect();
    assert!(
        cut.iter()
            .any(|r| r["cause"] == "lease_expired" && r["gateway_id"] == IDS[0]),
        "the kept connection, cut by the lapse: {cut:?}"
    );
    assert!(
        cut.iter().all(|r| r["cause"] != "session_closed"),
        "no connection of the first attempt was cut by a close: {cut:?}"
    );
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

/// As an operator deploys: both members stored with their control
/// addresses (`gateway add`) before anything runs, `serve` started from
/// the store alone (no `--gateway`), then the members. Each member's first
/// batch, with its start report, is its first contact: `serve` fetches
/// and registers its key then, and refuses nothing (no `unknown_gateway`
/// on either side). CLI calls reach the members by the store alone;
/// `serve` renews their leases; a stop through the store's list ends the
/// session on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_stored_before_their_first_start_are_registered_by_their_first_batch() {
    let rig: talos_e2e::rig::Pair = talos_e2e::rig::Pair::builder()
        .lease(Duration::from_secs(10))
        .stored()
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await;
    // Each member registered by its first batch, its start report taken.
    let listed = wait::until("both members registered by their first batches", || {
        let list = rig.stub.run(&[], &["gateway", "list"], b"").json();
        wait::check(list, |l| {
            IDS.iter().all(|g| {
                l.as_array().into_iter().flatten().any(|m| {
                    m["id"] == *g
                        && m["public_key_hex"].is_string()
                        && m["chain_last_seq"].as_u64() > Some(0)
                })
            })
        })
    });
    for g in IDS {
        let m = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == g)
            .unwrap();
        let at = rig.controls[IDS.iter().position(|i| *i == g).unwrap()];
        assert_eq!(m["control"], at.to_string(), "{listed}");
    }
    let log = rig.stub.serve_log();
    assert!(
        !log.contains("batch_rejected"),
        "serve refused a batch: {log}"
    );
    assert!(log.contains("\"via\":\"first batch\""), "{log}");
    for g in &rig.members {
        let rejected: f64 = ["unknown_gateway", "bad_signature", "gap", "malformed"]
            .iter()
            .filter_map(|r| g.metric(&format!("gateway_batches_rejected_total{{reason=\"{r}\"}}")))
            .sum();
        assert_eq!(rejected, 0.0, "a member's batch was refused");
    }
    // A session started, reached and stopped with no --gateway anywhere.
    let spec = session(SOURCE).mode("commands");
    let args = spec.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = rig.stub.run(&[], &args, b"").json();
    assert_eq!(t["state"], "running", "{t}");
    assert_eq!(
        t["ca"].as_array().map(Vec::len),
        Some(2),
        "opened on both: {t}"
    );
    let id = t["session_id"].as_str().unwrap().to_owned();
    let (bundle, _) = rig.trust(&id, "trust.pem");
    for g in &rig.members {
        assert_eq!(curl_status(SOURCE, g.data, &bundle, API, "/stored"), 200);
    }
    // serve renews the leases it read from the store: each member's least
    // lease left goes up again (it only falls between renewals).
    for g in &rig.members {
        wait_renewal(g, "a renewal of the member's lease");
    }
    let t = rig.stub.run(&[], &["sandbox", "stop", &id], b"").json();
    assert_eq!(t["state"], "ended", "both confirmed at once: {t}");
    for g in &rig.members {
        assert_eq!(curl_status(SOURCE, g.data, &bundle, API, "/after-stop"), 0);
    }
    // The list changes while serve runs: gw-b removed, then added again,
    // each followed without a restart of serve.
    let b_at = rig.controls[1].to_string();
    rig.stub
        .run(&[], &["gateway", "remove", "gw-b"], b"")
        .json();
    wait::until("serve to drop gw-b", || {
        let log = rig.stub.serve_log();
        wait::check(log.contains("\"member_dropped\":\"gw-b="), |seen| *seen)
    });
    rig.stub
        .run(&[], &["gateway", "add", "gw-b", "--control", &b_at], b"")
        .json();
    let args = session(SOURCE_2).mode("commands").args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = rig.stub.run(&[], &args, b"").json();
    assert_eq!(
        t["ca"].as_array().map(Vec::len),
        Some(2),
        "opened on both: {t}"
    );
    wait_renewal(
        &rig.members[1],
        "a renewal of gw-b's lease after it was added again",
    );
}

/// Two `serve` replicas over one store; both members name both
/// (`control.plane = [first, second]`). The first SIGSTOPped (hung: it
/// accepts connections and answers nothing): each member's batches fail
/// over to the second within seconds (`gateway_plane_failovers_total`),
/// and the records of connections made meanwhile reach the store; the
/// second renews the leases; a stop through the store ends the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_fail_over_to_another_replica_when_one_hangs() {
    let rig: talos_e2e::rig::Pair = talos_e2e::rig::Pair::builder()
        .lease(Duration::from_secs(20))
        .stored()
        .replicas(1)
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await;
    rig.wait_registered();
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let first = rig.stub.serve_pid().expect("the first replica runs");
    // Hung outside a write: the store is one SQLite file, whose write lock
    // a process frozen inside a write transaction keeps until it is woken
    // (docs/runbook.md; PostgreSQL ends such a session, control_replicas).
    // Holding the lock ourselves while the signal lands, the first replica
    // cannot be inside a write; it may be waiting for the lock, which it
    // does not hold.
    let lock = StoreWriteLock::hold(std::path::Path::new(&rig.stub.db));
    signals::send(first, Signal::Stop);
    lock.release();
    let hung_at = Instant::now();
    for (i, g) in rig.members.iter().enumerate() {
        assert_eq!(
            curl_status(SOURCE, g.data, &bundle, API, &format!("/while-hung/{i}")),
            200
        );
    }
    // The records of those connections reach the store through the second
    // replica while the first is still hung.
    let status = wait::until("both members' records in the store", || {
        let cert = rig.stub.run(&[], &["certificate", &id], b"");
        let cert: Value = serde_json::from_str(&cert.stdout).unwrap_or(Value::Null);
        wait::check(cert, |c| {
            let paths: Vec<String> = c["connections"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|r| r["requests"].as_array().cloned().unwrap_or_default())
                .filter_map(|q| q["path"].as_str().map(str::to_owned))
                .collect();
            (0..2).all(|i| paths.contains(&format!("/while-hung/{i}")))
        })
    });
    matrix(
        "serve replica 1 SIGSTOPped",
        "(batches)",
        "accepted by replica 2",
        hung_at.elapsed(),
    );
    assert!(status["connections"].is_array());
    for (g, name) in rig.members.iter().zip(IDS) {
        let failovers = g.metric("gateway_plane_failovers_total").unwrap_or(0.0);
        assert!(failovers >= 1.0, "{name} never failed over");
        assert_eq!(g.metric("gateway_leases_lapsed_total"), Some(0.0));
    }
    let log = rig.members[0].log();
    assert!(
        log.contains("control plane replica did not answer; trying the next"),
        "{log}"
    );
    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    signals::send(first, Signal::Cont);
}
