//! The control plane with no single point of failure, end to end: two
//! `control-stub serve` replicas over one PostgreSQL database (a server of
//! the test's own, `scripts/postgres.sh`), a linked pair naming both, and
//! bounded traffic through both members while the replicas and the
//! database fail.
//!
//! - One replica SIGKILLed, then the other SIGSTOPped for three leases
//!   while the first is started again: no lease lapses, no session ends,
//!   no request fails; Stop and Revoke All complete while one replica is
//!   frozen; each certificate is issued once, complete (every connection
//!   the clients completed, exactly once) and never changes.
//! - PostgreSQL stopped during traffic and started again within the
//!   lease: the replicas reconnect; a command while it is down fails with
//!   a clear error and changes nothing; no batch is lost or taken twice.

mod faults;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faults::{session, API, SECRET, SOURCE, SOURCE_2};
use serde_json::Value;
use talos_e2e::clients::curl_status;
use talos_e2e::postgres::Postgres;
use talos_e2e::rig::pair::{matrix, IDS};
use talos_e2e::rig::Pair;
use talos_e2e::signals::{self, Signal};
use talos_e2e::wait;

/// The members' lease: long enough that a replica's restart and the
/// database's own recovery of a frozen replica's transaction (5 s) fit in
/// it several times over, as the production lease (60 s) fits the
/// renewal interval (10 s).
const LEASE: Duration = Duration::from_secs(10);

/// At most this many requests per session in one traffic run.
const MAX_REQUESTS: usize = 600;

/// Two replicas over `pg`'s database, both members naming both.
async fn replicated(pg: &Postgres) -> Pair {
    let rig: Pair = Pair::builder()
        .lease(LEASE)
        .stored()
        .replicas(1)
        .store(&pg.url)
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await;
    rig.wait_registered();
    rig
}

/// Requests through both members, alternating, one connection each, from
/// each session's source with its bundle, until stopped (or
/// [`MAX_REQUESTS`] per session): each answer's status by session and
/// path.
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(String, String, u16)>>,
}

impl Traffic {
    fn start(rig: &Pair, sessions: &[(String, &str, PathBuf)]) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let members: Vec<_> = rig.members.iter().map(|g| g.data).collect();
        let sessions: Vec<(String, String, PathBuf)> = sessions
            .iter()
            .map(|(id, src, b)| (id.clone(), (*src).to_owned(), b.clone()))
            .collect();
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for k in 0..MAX_REQUESTS {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                for (id, source, bundle) in &sessions {
                    let path = format!("/r/{k}");
                    let status =
                        curl_status(source, members[k % members.len()], bundle, API, &path);
                    seen.push((id.clone(), path, status));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            seen
        });
        Traffic { stop, thread }
    }

    fn finish(self) -> Vec<(String, String, u16)> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("traffic thread")
    }
}

/// Every request path the certificate's connections hold, with how often.
fn paths_on(cert: &Value) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in cert["connections"].as_array().into_iter().flatten() {
        for q in r["requests"].as_array().into_iter().flatten() {
            if let Some(p) = q["path"].as_str() {
                *out.entry(p.to_owned()).or_default() += 1;
            }
        }
    }
    out
}

/// The certificate of `id` holds each path the client completed exactly
/// once, and nothing else.
fn holds_exactly(cert: &Value, id: &str, seen: &[(String, String, u16)]) {
    let want: BTreeMap<String, usize> = seen
        .iter()
        .filter(|(s, _, status)| s == id && *status == 200)
        .map(|(_, p, _)| (p.clone(), 1))
        .collect();
    assert!(!want.is_empty(), "no request of {id} was made");
    assert_eq!(paths_on(cert), want, "the certificate of {id}");
}

fn no_lease_lapsed(rig: &Pair) {
    for (g, name) in rig.members.iter().zip(IDS) {
        let lapsed = g.metric("gateway_leases_lapsed_total");
        if lapsed != Some(0.0) {
            // What the members and the replicas said about leases and
            // renewals, so that a lapse says why.
            let about = |log: &str| -> String {
                let lines: Vec<&str> = log
                    .lines()
                    .filter(|l| {
                        ["lease", "renew", "upkeep", "lapse", "PostgreSQL"]
                            .iter()
                            .any(|w| l.contains(w))
                    })
                    .collect();
                lines[lines.len().saturating_sub(40)..].join("\n")
            };
            let mut said = format!("{name}:\n{}\n", about(&g.log()));
            said.push_str(&format!("replica 1:\n{}\n", about(&rig.stub.serve_log())));
            for (i, r) in rig.replicas.iter().enumerate() {
                said.push_str(&format!("replica {}:\n{}\n", i + 2, about(&r.serve_log())));
            }
            panic!("{name} let a lease lapse ({lapsed:?} lapsed)\n{said}");
        }
    }
}

/// Wait until every member's least lease left goes up: a renewal came
/// from some replica.
fn wait_renewals(rig: &Pair, what: &str) {
    for g in &rig.members {
        faults::wait_renewal(g, what);
    }
}

/// Every request the clients made was answered 200.
fn all_answered(seen: &[(String, String, u16)]) {
    let failed: Vec<_> = seen.iter().filter(|(_, _, s)| *s != 200).collect();
    assert!(failed.is_empty(), "requests failed: {failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_replica_killed_and_the_other_frozen_for_three_leases_loses_nothing() {
    let pg = Postgres::start();
    let mut rig = replicated(&pg).await;
    let s1 = rig.start_session(&session(SOURCE));
    let s2 = rig.start_session(&session(SOURCE_2));
    let (b1, _) = rig.trust(&s1, "trust-1.pem");
    let (b2, _) = rig.trust(&s2, "trust-2.pem");
    let traffic = Traffic::start(
        &rig,
        &[(s1.clone(), SOURCE, b1), (s2.clone(), SOURCE_2, b2)],
    );

    // The first replica killed: the second renews alone.
    rig.stub.kill_serve();
    let killed_at = Instant::now();
    wait_renewals(&rig, "a renewal from the second replica");
    matrix(
        "serve replica 1 SIGKILLed",
        "(leases)",
        "renewed by replica 2",
        killed_at.elapsed(),
    );
    // The first started again; once it renews both members itself (its
    // log says so), the second frozen for three leases.
    let renewing = |log: &str| {
        log.lines()
            .filter(|l| l.starts_with("{\"renewing\""))
            .count()
    };
    let before = renewing(&rig.stub.serve_log());
    rig.stub.start_serve();
    wait::until("the restarted replica to renew both members", || {
        wait::check(renewing(&rig.stub.serve_log()), |n| *n >= before + 2)
    });
    let frozen = rig.replicas[0]
        .serve_pid()
        .expect("the second replica runs");
    signals::send(frozen, Signal::Stop);
    let frozen_at = Instant::now();
    while frozen_at.elapsed() < LEASE * 3 {
        wait_renewals(&rig, "a renewal from the first replica, restarted");
        no_lease_lapsed(&rig);
    }
    let seen = traffic.finish();
    matrix(
        "serve replica 1 SIGKILLed and restarted, replica 2 SIGSTOPped 3 leases",
        "(leases, traffic)",
        "renewed, served",
        frozen_at.elapsed(),
    );
    all_answered(&seen);
    assert!(seen.len() >= 40, "too little traffic: {}", seen.len());
    for id in [&s1, &s2] {
        assert_eq!(rig.status(id)["state"], "running", "{id}");
    }

    // Stop and Revoke All while the second replica is still frozen.
    let t = rig.cli(&["sandbox", "stop", &s1]).json();
    assert_eq!(t["state"], "ended", "{t}");
    let t = rig.cli(&["sandbox", "revoke-all", &s2]).json();
    assert_eq!(t["state"], "ended", "{t}");
    signals::send(frozen, Signal::Cont);
    no_lease_lapsed(&rig);

    // Each certificate issued once, complete, and the same afterwards,
    // whichever replica looks again.
    let mut signed = Vec::new();
    for id in [&s1, &s2] {
        let cert = rig.wait_issued(id);
        holds_exactly(&cert, id, &seen);
        signed.push(rig.signed_certificate(id));
    }
    // The frozen replica, woken, works alone: the first killed, a third
    // session's leases are renewed (by it), and the certificates it finds
    // issued stay as they were.
    rig.stub.kill_serve();
    let s3 = rig.start_session(&session(SOURCE));
    wait_renewals(&rig, "a renewal from the replica woken from its freeze");
    for (id, before) in [&s1, &s2].into_iter().zip(&signed) {
        assert_eq!(
            &rig.signed_certificate(id),
            before,
            "{id}'s certificate changed"
        );
    }
    let t = rig.cli(&["sandbox", "stop", &s3]).json();
    assert_eq!(t["state"], "ended", "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_during_traffic_loses_no_batch_and_a_command_meanwhile_changes_nothing()
{
    let pg = Postgres::start();
    let rig = replicated(&pg).await;
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    let traffic = Traffic::start(&rig, &[(id.clone(), SOURCE, bundle)]);
    wait_renewals(&rig, "renewals before the outage");

    pg.stop();
    let down_at = Instant::now();
    // A command while it is down: a clear error, nothing changed.
    let ran = rig.cli(&["sandbox", "pause", &id]);
    assert_eq!(ran.code(), "store_failed", "{}", ran.stderr);
    assert!(ran.stderr.contains("PostgreSQL"), "{}", ran.stderr);
    assert!(
        !ran.stderr.contains(&pg.url),
        "the URL's password shown: {}",
        ran.stderr
    );
    pg.restart();
    matrix(
        "PostgreSQL stopped and started again",
        "sandbox pause (while down)",
        "store_failed",
        down_at.elapsed(),
    );
    // The replicas reconnect: renewals go on, and the session never moved.
    let back_at = Instant::now();
    wait_renewals(&rig, "renewals after the database came back");
    matrix(
        "PostgreSQL started again",
        "(leases)",
        "renewed",
        back_at.elapsed(),
    );
    assert_eq!(rig.status(&id)["state"], "running");
    let seen = traffic.finish();
    all_answered(&seen);
    no_lease_lapsed(&rig);

    let t = rig.cli(&["sandbox", "stop", &id]).json();
    assert_eq!(t["state"], "ended", "{t}");
    let cert = rig.wait_issued(&id);
    holds_exactly(&cert, &id, &seen);
    assert!(
        cert["batch_rejections"]
            .as_array()
            .is_none_or(|r| r.is_empty()),
        "a batch was refused: {cert}"
    );
}
