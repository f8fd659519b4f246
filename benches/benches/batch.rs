//! What signing and checking record batches cost, in records per second.
//!
//! Each batch holds 1,000 typical connection records of about 430 bytes of
//! JSON each (an allowed HTTP/2 connection with one listed request and one
//! attachment), so a payload of about 430 KB.
//!
//! - `batch/seal_1000`: `BatchWriter::seal` on the gateway: checks each
//!   record is one JSON object, writes the payload, SHA-384 of it for the
//!   chain, Ed25519 signature over it.
//! - `batch/accept_1000`: `ChainVerifier::accept` of that batch as the next
//!   of its chain on the control plane: parse, signature check, canonical
//!   re-encoding check, SHA-384, chain checks, records copied out.
//! - `batch/verify_signature_1000`: `talos_certs::verify` alone, the
//!   signature part of both.
//!
//! Target: the gateway keeps up with 50,000 records/s on one core.
//!
//! Run: `cargo bench -p talos-benches --bench batch -- --warm-up-time 1
//! --measurement-time 3`.
//!
//! Measured 2026-11-29 on the shared 2-core development machine, under
//! load from other builds (`--warm-up-time 1 --measurement-time 3`, median
//! of the first of two runs; the second was within 8%; 1,000 records of
//! 429 bytes on average, a 431 KB payload):
//!
//! | bench | time per batch | records/s |
//! | --- | --- | --- |
//! | `seal_1000` | 2.51 ms | 398,000 |
//! | `accept_1000` | 1.87 ms | 536,000 |
//! | `verify_signature_1000` | 0.89 ms | 1,130,000 |
//!
//! So sealing keeps up with about 8× the target on one core, and one
//! control-plane core checks the batches of several busy gateways. Both
//! are dominated by hashing the ~430 KB payload: Ed25519 hashes the whole
//! message with SHA-512 twice to sign (nonce, then challenge) but once to
//! verify, which is why sealing costs more than accepting. The rest is one
//! SHA-384 pass for the chain and the JSON checks and encoding.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use talos_certs::{verify, Accepted, BatchWriter, ChainState, ChainVerifier, GatewayKey};

const RECORDS: usize = 1000;
const GW: &str = "gw-a";
const AT: &str = "2026-11-29T10:00:00.000Z";

/// One connection record as the gateway serialises it, about 400 bytes.
fn record(n: usize) -> Vec<u8> {
    format!(
        concat!(
            r#"{{"gateway_id":"gw-a","session_id":"sess-7f3a","attempt":1,"#,
            r#""source":"10.20.30.{}:{}","sni":"api.github.com","resolved":"140.82.112.6:443","#,
            r#""alpn_session":"h2","request_count":1,"requests":[{{"method":"GET","#,
            r#""path":"/repos/acme/widgets","status":200}}],"attachments_used":["github"],"#,
            r#""verdict":"allowed","opened_at":"2026-11-29T10:00:00.{:03}Z","#,
            r#""closed_at":"2026-11-29T10:00:01.{:03}Z","bytes_from_session":{},"#,
            r#""bytes_to_session":{}}}"#
        ),
        n % 250,
        40000 + n % 20000,
        n % 1000,
        (n * 7) % 1000,
        1200 + n * 13 % 5000,
        8000 + n * 31 % 90000,
    )
    .into_bytes()
}

fn batch(c: &mut Criterion) {
    let records: Vec<Vec<u8>> = (0..RECORDS).map(record).collect();
    let average = records.iter().map(Vec::len).sum::<usize>() / RECORDS;
    assert!((350..=450).contains(&average), "record size {average}");

    let key = Arc::new(GatewayKey::generate().unwrap());
    let public = key.public_key();

    let mut group = c.benchmark_group("batch");
    group.throughput(Throughput::Elements(RECORDS as u64));

    group.bench_function("seal_1000", |b| {
        let mut writer = BatchWriter::new(Arc::clone(&key), GW);
        b.iter(|| writer.seal(AT, black_box(&records)).unwrap());
    });

    let signed = BatchWriter::new(Arc::clone(&key), GW)
        .seal(AT, &records)
        .unwrap();
    let fresh = || {
        let mut verifier = ChainVerifier::new();
        verifier.register(GW, public, ChainState::genesis());
        verifier
    };
    assert!(matches!(
        fresh().accept(&signed),
        Ok(Accepted::New { ref records, .. }) if records.len() == RECORDS
    ));

    group.bench_function("accept_1000", |b| {
        b.iter_batched_ref(
            fresh,
            |verifier| verifier.accept(black_box(&signed)).unwrap(),
            BatchSize::SmallInput,
        );
    });

    group.bench_function("verify_signature_1000", |b| {
        b.iter(|| verify(&public, black_box(&signed)).unwrap());
    });

    group.finish();
}

criterion_group!(benches, batch);
criterion_main!(benches);
