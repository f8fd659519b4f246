//! Signals to both binaries, end to end: SIGHUP to the members and to
//! `control-stub serve` while a session runs (logged, nothing changes),
//! and SIGHUP or SIGTERM the instant a ready line is read (the process
//! lives, or drains and exits 0, every time).
//!
//! The rig and what the fault tests share: [`faults`].
//!
//! The first test stands on that rig (a pair under `serve`). The others
//! start their one process by hand (a [`Gateway`] with the default
//! config, or `serve` over a [`Stub`]'s identities), on purpose: what they
//! test is the instant after a ready line, [`STARTS`] times over in one
//! folder, and nothing the process would serve. The shared rig builds, for
//! each start, what comes after it (an origin, a DNS server and a session
//! behind a gateway; for `serve`, the members as well, which a `Pair`
//! starts with it and cannot leave out), which would only lengthen each
//! start without changing what is checked.

mod faults;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use faults::*;
use talos_e2e::clients::curl_status;
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::rig::pair::IDS;
use talos_e2e::signals::{self, Signal};
use talos_e2e::stub::Stub;
use talos_e2e::wait;

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
