//! Two `serve` replicas over one store, each with its own connection (as
//! two processes have), ingesting one member's batch stream at once: the
//! worst case of a member failing over, where every batch reaches both.
//! Each batch is accepted exactly once (the other replica finds it
//! recorded: a duplicate), no gap or replay is seen where there is none,
//! and a forged batch is refused alike by either.

use std::sync::Arc;

use talos_control_stub::batches::{accept, BatchVerdict};
use talos_control_stub::Store;

mod common;

/// Batches in the stream, records in each.
const BATCHES: u64 = 120;
const RECORDS: usize = 3;

fn record(seq: u64, i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "gateway_id": "gw-a", "instance": "i-1", "conn": seq * 10 + i as u64,
        "session_id": "sbx-none", "attempt": 1, "source": "10.1.0.2:40000",
        "verdict": "allowed", "opened_at": "2026-12-04T00:00:00.000Z",
        "closed_at": "2026-12-04T00:00:01.000Z", "request_count": 0,
    }))
    .unwrap()
}

#[test]
fn two_replicas_ingesting_one_stream_accept_each_batch_once() {
    let dir = tempfile::tempdir().unwrap();
    // A SQLite file both open, or one PostgreSQL database (common::test_db).
    let db = common::test_db(dir.path());
    let key = Arc::new(talos_certs::GatewayKey::generate().unwrap());
    Store::open(&db)
        .unwrap()
        .register_gateway("gw-a", &hex::encode(key.public_key()))
        .unwrap();
    let mut writer = talos_certs::BatchWriter::new(Arc::clone(&key), "gw-a");
    let stream: Vec<talos_certs::Signed> = (1..=BATCHES)
        .map(|seq| {
            let records: Vec<Vec<u8>> = (0..RECORDS).map(|i| record(seq, i)).collect();
            writer.seal("2026-12-04T00:00:00.000Z", &records).unwrap()
        })
        .collect();
    let stream = Arc::new(stream);
    let replicas: Vec<_> = (0..2)
        .map(|_| {
            let (db, stream) = (db.clone(), Arc::clone(&stream));
            std::thread::spawn(move || {
                let mut store = Store::open(&db).unwrap();
                stream
                    .iter()
                    .map(|b| accept(&mut store, b).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let verdicts: Vec<Vec<BatchVerdict>> =
        replicas.into_iter().map(|t| t.join().unwrap()).collect();
    for seq in 1..=BATCHES {
        let i = usize::try_from(seq - 1).unwrap();
        let pair = (&verdicts[0][i], &verdicts[1][i]);
        let accepted = [pair.0, pair.1]
            .iter()
            .filter(|v| matches!(v, BatchVerdict::Accepted { .. }))
            .count();
        let duplicate = [pair.0, pair.1]
            .iter()
            .filter(|v| matches!(v, BatchVerdict::Duplicate { .. }))
            .count();
        assert_eq!((accepted, duplicate), (1, 1), "batch {seq}: {pair:?}");
    }
    let store = Store::open(&db).unwrap();
    let position = store
        .gateways()
        .unwrap()
        .into_iter()
        .find(|g| g.id == "gw-a")
        .unwrap();
    assert_eq!(position.chain_last_seq, BATCHES);
    let counted: i64 = store
        .test_i64(
            "SELECT (SELECT count(*) FROM batches) * 1000000
                  + (SELECT count(*) FROM connection_records) * 1000
                  + (SELECT count(*) FROM batch_rejections)",
        )
        .unwrap();
    let want = i64::try_from(BATCHES).unwrap() * 1_000_000
        + i64::try_from(BATCHES).unwrap() * RECORDS as i64 * 1000;
    assert_eq!(counted, want, "each batch and record once, no rejection");

    // A forged next batch (another key under gw-a's id) is refused alike
    // by either replica; the chain does not move.
    let other = Arc::new(talos_certs::GatewayKey::generate().unwrap());
    let mut forger = talos_certs::BatchWriter::restore(
        other,
        "gw-a",
        BATCHES,
        position.chain_last_digest.unwrap(),
    );
    let forged = forger
        .seal("2026-12-04T00:00:00.000Z", &[record(BATCHES + 1, 0)])
        .unwrap();
    for _ in 0..2 {
        let mut store = Store::open(&db).unwrap();
        match accept(&mut store, &forged).unwrap() {
            BatchVerdict::Rejected { reason, .. } => assert_eq!(reason, "bad_signature"),
            v => panic!("a forged batch was taken: {v:?}"),
        }
    }
    let last = Store::open(&db)
        .unwrap()
        .gateways()
        .unwrap()
        .into_iter()
        .find(|g| g.id == "gw-a")
        .unwrap()
        .chain_last_seq;
    assert_eq!(last, BATCHES);
}
