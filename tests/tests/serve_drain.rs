//! `control-stub serve`'s drain, end to end, with the real binaries: both
//! members of a pair ship batches continuously (every connection from an
//! address that is no session's is refused `unknown_source`, and recorded),
//! and `serve` gets SIGTERM while a batch of each member is in its intake —
//! held there by a writer of the test's own on the SQLite store, so that
//! the moment is an event the test sees (`stub_batches_in_intake` at 2),
//! not a guess about timing.
//!
//! Twice: once the writer lets go within the grace (both batches are
//! answered during the drain, and the members see them acknowledged), once
//! only after the grace cut the members' connections (both batches are
//! committed by the intake's last step, unacknowledged: the members send
//! them again to the next `serve` and are answered `DUPLICATE`). Each
//! time the drain's steps come in their documented order, `serve` exits 0
//! by itself, and every batch a member saw acknowledged is in the store;
//! at the end each member's chain in the store is whole (every sequence
//! number from 1, none refused) up to what the member last sealed, and no
//! process the test started is left.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use talos_e2e::clients::{admin_get, metric_value};
use talos_e2e::rig::pair::{matrix, IDS};
use talos_e2e::rig::Pair;
use talos_e2e::signals::{self, Signal};
use talos_e2e::stub::StoreWriteLock;
use talos_e2e::wait;

const API: &str = "api.example.test";

/// The drain's steps as `serve` logs them (`{"drain": N, "part": …}`),
/// in the order `control-stub/src/server/mod.rs` documents.
const STEPS: [&str; 8] = [
    "people listener",
    "control listener",
    "people listener",
    "control listener",
    "batch intake",
    "upkeep loops",
    "metrics endpoint",
    "signals",
];

/// Connections each load thread makes at most, and for how long: far more
/// than the test needs, so the members seal batches until it is done.
const LOAD_MAX: usize = 200_000;
const LOAD_FOR: Duration = Duration::from_secs(300);

/// Between two connections of one load thread: enough batches (one per
/// member every 50 ms) without the load taking the machine's cores.
const LOAD_PACE: Duration = Duration::from_millis(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_during_batch_intake_loses_no_acknowledged_batch() {
    let mut rig: Pair = Pair::builder().start_loopback(&[API]).await;
    let db = PathBuf::from(&rig.stub.db);
    let spools: Vec<(String, PathBuf)> = IDS
        .iter()
        .map(|id| ((*id).to_owned(), rig.dir.join(id).join("spool")))
        .collect();
    let metrics = talos_e2e::ports::reserve();
    let mut pids = vec![rig.stub.serve_pid().expect("serve runs")];
    pids.extend(rig.members.iter().map(|g| g.pid()));

    // `serve` with its metrics endpoint and a grace no machine runs out.
    assert!(rig.stub.stop_serve(), "serve drains and exits 0");
    rig.stub.serve_args = serve_args(metrics, 30_000);
    rig.stub.start_serve();
    pids.extend(rig.stub.serve_pid());
    let load = Load::start(rig.members.iter().map(|g| g.data).collect());
    let before = talos_e2e::rig::blocking(|| wait_shipping(&db, &BTreeMap::new()));

    // 1. SIGTERM with a batch of each member in the intake; the writer
    //    lets go once both listeners are closed: the drain answers them.
    let taken = talos_e2e::rig::blocking(|| sigterm_in_intake(&mut rig, &db, metrics, 2));
    assert_eq!(
        taken.status.code(),
        Some(0),
        "serve exits 0 after its drain"
    );
    assert_eq!(taken.step(4)["stopped"]["cut"], 0, "{:?}", taken.steps);
    assert_eq!(taken.step(5)["under_way"], 0, "{:?}", taken.steps);
    for (id, spool) in &spools {
        let held = taken.held[id.as_str()];
        assert!(held >= before[id.as_str()], "{id} shipped before the fault");
        // The answer came before `serve` exited; the member writes what it
        // acknowledged right after it (and nothing more: no `serve` runs).
        let acked = wait::until_async(&format!("{id} to record the answer"), || {
            wait::check(acknowledged(spool), |a| *a > held)
        })
        .await;
        assert_eq!(
            acked,
            held + 1,
            "{id}: the batch in the intake at the SIGTERM was answered during the drain"
        );
        assert_stored_through(&db, id, held + 1);
    }
    matrix(
        "serve SIGTERMed, a batch of each member in its intake",
        "drain (store let go within the grace)",
        "both answered ACCEPTED during the drain",
        taken.took,
    );

    // 2. Again with a grace of 300 ms, the writer letting go only once the
    //    grace has cut the members' connections: both batches are
    //    committed by the intake's step, their answers lost.
    rig.stub.serve_args = serve_args(metrics, 300);
    rig.stub.start_serve();
    pids.extend(rig.stub.serve_pid());
    let now = talos_e2e::rig::blocking(|| wait_shipping(&db, &taken.held));
    let cut = talos_e2e::rig::blocking(|| sigterm_in_intake(&mut rig, &db, metrics, 4));
    assert_eq!(cut.status.code(), Some(0), "serve exits 0 after its drain");
    assert_eq!(
        cut.step(4)["stopped"]["cut"],
        2,
        "both members' calls were cut at the grace: {:?}",
        cut.steps
    );
    assert_eq!(
        cut.step(5)["under_way"],
        2,
        "the intake decided both batches after their connections were cut: {:?}",
        cut.steps
    );
    for (id, spool) in &spools {
        let held = cut.held[id.as_str()];
        assert!(held >= now[id.as_str()], "{id} shipped since");
        assert_eq!(
            acknowledged(spool),
            held,
            "{id}: its batch's answer was lost with the connection"
        );
        assert_stored_through(&db, id, held + 1);
    }
    matrix(
        "serve SIGTERMed, a batch of each member in its intake",
        "drain (store let go after the 300 ms grace)",
        "both cut unanswered, committed at the intake's step",
        cut.took,
    );

    // 3. The next `serve`: each member sends its unacknowledged batch
    //    again (answered DUPLICATE) and goes on; then the load stops and
    //    every member's spool empties into a whole chain.
    rig.stub.serve_args = serve_args(metrics, 30_000);
    rig.stub.start_serve();
    let started = Instant::now();
    pids.extend(rig.stub.serve_pid());
    for (g, (id, spool)) in rig.members.iter().zip(&spools) {
        let admin = g.admin;
        let held = cut.held[id.as_str()];
        wait::until_async(&format!("{id} to ship past its lost answer"), || {
            let duplicates = metric_value(
                &admin_get(admin, "/metrics").1,
                "gateway_batches_shipped_total{status=\"duplicate\"}",
            );
            let acked = acknowledged(spool);
            if acked > held && duplicates >= Some(1.0) {
                Ok(())
            } else {
                Err((acked, duplicates))
            }
        })
        .await;
    }
    matrix(
        "serve started again",
        "the batches whose answers were lost",
        "sent again, answered DUPLICATE",
        started.elapsed(),
    );
    let made = load.stop();
    assert!(made.iter().all(|n| *n > 0), "connections made: {made:?}");
    for (id, spool) in &spools {
        let last = wait::until_async(&format!("{id}'s spool to empty"), || {
            let waiting = waiting_batches(spool);
            let acked = acknowledged(spool);
            let stored = stored(&db, id);
            if waiting == 0 && stored.last() == Some(&acked) {
                Ok(acked)
            } else {
                Err((waiting, acked, stored.last().copied()))
            }
        })
        .await;
        let seqs = stored(&db, id);
        assert_eq!(
            seqs,
            (1..=last).collect::<Vec<u64>>(),
            "{id}'s chain in the store is whole"
        );
    }
    assert_eq!(
        rejections(&db),
        Vec::<String>::new(),
        "no batch was refused but a member's first before the rig stored it"
    );

    assert!(rig.stub.stop_serve(), "serve drains and exits 0");
    drop(rig);
    for pid in pids {
        assert!(
            !runs_our_binary(pid),
            "process {pid} is still running after the test"
        );
    }
}

/// `serve`'s arguments: the metrics endpoint on `metrics`, a grace of
/// `grace_ms`.
fn serve_args(metrics: SocketAddr, grace_ms: u64) -> Vec<String> {
    vec![
        "--metrics-listen".into(),
        metrics.to_string(),
        "--grace-ms".into(),
        grace_ms.to_string(),
    ]
}

/// What one SIGTERM in the middle of the intake left.
struct Drained {
    /// Each member's last batch in the store when the writer took the
    /// lock (the batch after it was the one in the intake).
    held: BTreeMap<String, u64>,
    /// The drain's log lines, in order.
    steps: Vec<Value>,
    status: std::process::ExitStatus,
    /// From the SIGTERM to `serve`'s exit.
    took: Duration,
}

impl Drained {
    /// Step `n`'s line.
    fn step(&self, n: u64) -> &Value {
        self.steps
            .iter()
            .find(|s| s["drain"] == n)
            .unwrap_or_else(|| panic!("no step {n}: {:?}", self.steps))
    }
}

/// Hold the store's write lock until a batch of each member is in
/// `serve`'s intake (`stub_batches_in_intake` 2 on `metrics`), SIGTERM
/// `serve`, let go once the drain has logged step `release_after`, and
/// wait for `serve` to exit. The drain's steps must come in the documented
/// order, then `{"stopped": true}`.
fn sigterm_in_intake(
    rig: &mut Pair,
    db: &Path,
    metrics: SocketAddr,
    release_after: u64,
) -> Drained {
    let writer = StoreWriteLock::hold(db);
    wait::until("a batch of each member in serve's intake", || {
        let (_, text) = admin_get(metrics, "/metrics");
        wait::check(metric_value(&text, "stub_batches_in_intake"), |n| {
            *n == Some(2.0)
        })
    });
    let held: BTreeMap<String, u64> = IDS
        .iter()
        .map(|id| {
            (
                (*id).to_owned(),
                stored(db, id).last().copied().unwrap_or(0),
            )
        })
        .collect();
    let from = rig.stub.serve_log().len();
    let sent = Instant::now();
    signals::send(rig.stub.serve_pid().expect("serve runs"), Signal::Term);
    wait::until(
        &format!("serve's drain to log step {release_after}"),
        || {
            let steps = drain_steps(&rig.stub.serve_log(), from);
            wait::check(steps, |s| s.iter().any(|l| l["drain"] == release_after))
        },
    );
    writer.release();
    let status = rig.stub.wait_serve_exit();
    let took = sent.elapsed();
    let log = rig.stub.serve_log();
    let steps = drain_steps(&log, from);
    let order: Vec<(u64, &str)> = steps
        .iter()
        .map(|s| {
            (
                s["drain"].as_u64().unwrap_or(0),
                s["part"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let want: Vec<(u64, &str)> = (1..).zip(STEPS).collect();
    assert_eq!(order, want, "the drain's steps, in order");
    let last = log[from..].lines().last().unwrap_or("");
    assert_eq!(last, r#"{"stopped":true}"#, "the drain's last line");
    eprintln!(
        "released after step {release_after}; in the store at the SIGTERM: {held:?}; the drain:"
    );
    for s in &steps {
        eprintln!("  {s}");
    }
    Drained {
        held,
        steps,
        status,
        took,
    }
}

/// The drain's lines (`{"drain": N, …}`) of `serve`'s log after byte
/// `from`.
fn drain_steps(log: &str, from: usize) -> Vec<Value> {
    log.get(from..)
        .unwrap_or("")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("drain").is_some())
        .collect()
}

/// Member `id`'s batches in the store, by sequence number.
fn stored(db: &Path, id: &str) -> Vec<u64> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open the store");
    let mut stmt = conn
        .prepare("SELECT seq FROM batches WHERE gateway_id = ?1 ORDER BY seq")
        .expect("query");
    stmt.query_map([id], |r| r.get::<_, i64>(0))
        .expect("batches")
        .map(|s| u64::try_from(s.expect("seq")).expect("positive"))
        .collect()
}

/// Batches the store refused (`gateway:seq:reason`), but a member's
/// first batch refused `unknown_gateway`: the rig stores each member
/// (`gateway add`) once it has started, and its first batch may come
/// before; it is sent again and accepted.
fn rejections(db: &Path) -> Vec<String> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open the store");
    let mut stmt = conn
        .prepare(
            "SELECT gateway_id || ':' || seq || ':' || reason FROM batch_rejections
             WHERE NOT (reason = 'unknown_gateway' AND seq = 1)",
        )
        .expect("query");
    stmt.query_map([], |r| r.get(0))
        .expect("rejections")
        .map(|r| r.expect("row"))
        .collect()
}

/// Every batch through `seq` of member `id` is in the store.
fn assert_stored_through(db: &Path, id: &str, seq: u64) {
    let seqs = stored(db, id);
    let missing: Vec<u64> = (1..=seq).filter(|s| !seqs.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "{id}: batches missing from the store: {missing:?}"
    );
}

/// Wait until each member has shipped two batches past `since` (none: any
/// two); each member's last batch in the store then.
fn wait_shipping(db: &Path, since: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    wait::until("both members to ship batches", || {
        let now: BTreeMap<String, u64> = IDS
            .iter()
            .map(|id| {
                (
                    (*id).to_owned(),
                    stored(db, id).last().copied().unwrap_or(0),
                )
            })
            .collect();
        wait::check(now, |n| {
            n.iter()
                .all(|(id, last)| *last >= since.get(id).copied().unwrap_or(0) + 2)
        })
    })
}

/// The last batch the member saw acknowledged: its spool's `chain.json`
/// (0 before the first).
fn acknowledged(spool: &Path) -> u64 {
    std::fs::read(spool.join("chain.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v["last_seq"].as_u64())
        .unwrap_or(0)
}

/// Batches waiting in the member's spool.
fn waiting_batches(spool: &Path) -> usize {
    std::fs::read_dir(spool).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".batch"))
            .count()
    })
}

/// Whether process `pid` is alive and runs a binary of this checkout (a
/// pid the kernel gave to another program since is not ours). Read from
/// its command line: the processes under test are not dumpable, so their
/// `/proc/PID/exe` may not be readable.
fn runs_our_binary(pid: u32) -> bool {
    if matches!(signals::state(pid), None | Some('Z')) {
        return false;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let ours = talos_e2e::gateway::workspace_bin("gateway");
    Path::new(&*String::from_utf8_lossy(argv0)).parent() == ours.parent()
}

/// Connections to each member's data listener from 127.0.0.1, which is no
/// session's source: each is refused `unknown_source` and recorded, so
/// each member seals a batch every 50 ms while the load runs.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<usize>>,
}

impl Load {
    fn start(datas: Vec<SocketAddr>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = datas
            .into_iter()
            .map(|data| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let started = Instant::now();
                    let mut made = 0;
                    while !stop.load(Ordering::Relaxed)
                        && made < LOAD_MAX
                        && started.elapsed() < LOAD_FOR
                    {
                        if let Ok(mut c) = TcpStream::connect_timeout(&data, Duration::from_secs(2))
                        {
                            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                            // Until the gateway closes it, refused.
                            let _ = c.read_to_end(&mut Vec::new());
                            made += 1;
                        }
                        std::thread::sleep(LOAD_PACE);
                    }
                    made
                })
            })
            .collect();
        Load { stop, threads }
    }

    /// Stop, and how many connections each thread made.
    fn stop(self) -> Vec<usize> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().unwrap_or(0))
            .collect()
    }
}
