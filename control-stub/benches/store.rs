//! What the control plane's store costs, on SQLite or PostgreSQL
//! (`benches/store/run.sh` runs it on both, side by side):
//!
//! - **batch ingest**: one member's batch stream (verified, chained, each
//!   record stored) taken by one replica, and by two replicas at once that
//!   both receive every batch (a member failing over between them, the
//!   worst case): records accepted per second;
//! - **sessions at scale**: opening `--sessions` sessions (decide, commit,
//!   open on a two-member pair, record: the members are in-process
//!   stand-ins, so what is timed is the store's part), one lease renewal
//!   round over all of them (the store read that lists what each member
//!   holds), and closing every one (stop: commit, close, reset, record):
//!   each per second.
//!
//! `cargo bench -p talos-control-stub --bench store -- --db PATH|URL
//! [--sessions N] [--batches N] [--records N]`; one line of JSON per
//! figure. In the test command it runs once, small, as a smoke test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use talos_control_stub::batches::{accept, BatchVerdict};
use talos_control_stub::store::Db;
use talos_control_stub::upkeep::Upkeep;
use talos_control_stub::{FakeLink, FakeVerifier, Lifecycle, Mode, StartRequest, Store};

const ACCEPT: FakeVerifier = FakeVerifier::accepting();

struct Opts {
    db: Option<String>,
    sessions: usize,
    batches: u64,
    records: usize,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts {
        db: None,
        sessions: 10_000,
        batches: 200,
        records: 50,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--db" => o.db = Some(value()?),
            "--sessions" => {
                o.sessions = value()?.parse().map_err(|e| format!("--sessions: {e}"))?
            }
            "--batches" => o.batches = value()?.parse().map_err(|e| format!("--batches: {e}"))?,
            "--records" => o.records = value()?.parse().map_err(|e| format!("--records: {e}"))?,
            // What cargo passes to every bench target.
            "--bench" | "--test" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

fn main() {
    let o = match opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("store bench: {e}");
            std::process::exit(2);
        }
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let (db, small) = match &o.db {
        Some(d) => (Db::parse(d), false),
        // As a smoke test (`cargo test --benches`): SQLite, small.
        None => (Db::File(tmp.path().join("bench.db")), true),
    };
    let o = if small {
        Opts {
            sessions: 20,
            batches: 5,
            records: 5,
            ..o
        }
    } else {
        o
    };
    ingest(&db, &o, 1);
    ingest(&db, &o, 2);
    sessions(&db, &o);
}

fn record(seq: u64, i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "gateway_id": "gw-bench", "instance": "i-bench", "conn": seq * 1000 + i as u64,
        "session_id": "sbx-none", "attempt": 1, "source": "10.1.0.2:40000",
        "sni": "api.example.com", "resolved": "93.184.216.34:443",
        "verdict": "allowed", "opened_at": "2026-12-06T00:00:00.000Z",
        "closed_at": "2026-12-06T00:00:01.000Z", "request_count": 1,
        "bytes_up": 812, "bytes_down": 2048,
        "requests": [{"method": "GET", "path": "/v1/items", "status": 200}],
    }))
    .expect("record")
}

/// One member's stream of `o.batches` batches taken by `replicas` stores
/// at once (each its own connection, every batch to each).
fn ingest(db: &Db, o: &Opts, replicas: usize) {
    let gateway = format!("gw-ingest-{replicas}");
    let key = Arc::new(talos_certs::GatewayKey::generate().expect("key"));
    Store::open(db)
        .expect("store")
        .register_gateway(&gateway, &hex::encode(key.public_key()))
        .expect("register");
    let mut writer = talos_certs::BatchWriter::new(Arc::clone(&key), &gateway);
    let stream: Vec<talos_certs::Signed> = (1..=o.batches)
        .map(|seq| {
            let records: Vec<Vec<u8>> = (0..o.records).map(|i| record(seq, i)).collect();
            writer
                .seal("2026-12-06T00:00:00.000Z", &records)
                .expect("seal")
        })
        .collect();
    let stream = Arc::new(stream);
    let started = Instant::now();
    let threads: Vec<_> = (0..replicas)
        .map(|_| {
            let (db, stream) = (db.clone(), Arc::clone(&stream));
            std::thread::spawn(move || {
                let mut store = Store::open(&db).expect("store");
                let mut accepted = 0usize;
                for b in stream.iter() {
                    match accept(&mut store, b).expect("accept") {
                        BatchVerdict::Accepted { .. } => accepted += 1,
                        BatchVerdict::Duplicate { .. } => {}
                        v => panic!("batch refused: {v:?}"),
                    }
                }
                accepted
            })
        })
        .collect();
    let accepted: usize = threads
        .into_iter()
        .map(|t| t.join().expect("replica"))
        .sum();
    let took = started.elapsed();
    assert_eq!(accepted as u64, o.batches, "each batch accepted once");
    let records = o.batches as f64 * o.records as f64;
    println!(
        "{}",
        serde_json::json!({
            "figure": "batch_ingest", "db": db.kind(), "replicas": replicas,
            "batches": o.batches, "records": records,
            "seconds": took.as_secs_f64(), "records_per_s": records / took.as_secs_f64(),
        })
    );
}

/// Open, renew and close `o.sessions` sessions on a two-member pair of
/// in-process stand-ins.
fn sessions(db: &Db, o: &Opts) {
    let mut store = Store::open(db).expect("store");
    store.egress_add("api.example.com").expect("egress");
    store
        .secret_set("bench", "API_TOKEN", b"bench-value-0123456789")
        .expect("secret");
    let link = FakeLink::default();
    let mut ids = Vec::with_capacity(o.sessions);
    let started = Instant::now();
    for i in 0..o.sessions {
        // One source address each: 10.(i/65536).(i/256).(i%256)+1.
        let source = format!("10.{}.{}.{}", 100 + i / 65_536, (i / 256) % 256, i % 256);
        let req = StartRequest::new(
            "bench",
            vec![source],
            vec!["api.example.com".into()],
            vec!["API_TOKEN=api.example.com:authorization:Bearer".into()],
            Mode::Agent,
        );
        let t = Lifecycle::new(&mut store, &link, &ACCEPT)
            .start(&req)
            .expect("start");
        ids.push(t.session_id);
    }
    report("open", db, o.sessions, started.elapsed());

    let started = Instant::now();
    let rounds = 3;
    for _ in 0..rounds {
        let mut upkeep = Upkeep {
            store: &mut store,
            link: &link,
            verifier: &ACCEPT,
            plane_key: None,
            relay_key: None,
        };
        let r = upkeep.keep_members().expect("renew");
        assert_eq!(r.renewed, o.sessions * 2, "every lease on both members");
    }
    let per_round = started.elapsed() / rounds;
    println!(
        "{}",
        serde_json::json!({
            "figure": "renewal_round", "db": db.kind(), "sessions": o.sessions,
            "seconds": per_round.as_secs_f64(),
        })
    );

    let started = Instant::now();
    for id in &ids {
        let t = Lifecycle::new(&mut store, &link, &ACCEPT)
            .stop(id)
            .expect("stop");
        assert!(matches!(t.state, talos_control_stub::State::Ended), "{t:?}");
    }
    report("close", db, o.sessions, started.elapsed());
}

fn report(figure: &str, db: &Db, n: usize, took: Duration) {
    println!(
        "{}",
        serde_json::json!({
            "figure": figure, "db": db.kind(), "sessions": n,
            "seconds": took.as_secs_f64(), "per_s": n as f64 / took.as_secs_f64(),
        })
    );
}
