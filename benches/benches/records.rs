//! The gateway's whole record path, in records per second: connections
//! closing hand their records to the writer (`RecordSink::close`), which
//! writes them as JSON lines, seals them into signed batches of 1,000
//! (`Sealer`: canonical payload, SHA-384 chain link, Ed25519 signature)
//! and writes each batch to the spool (synced file, renamed, `chain.json`
//! synced too) — everything but shipping.
//!
//! Target: at least 50,000 connection records per second on one core.
//! The runtime here has one thread, as a gateway with `WORKERS=1`; sealing
//! and the synced writes run on tokio's blocking pool, as in the gateway.
//!
//! Run: `cargo bench -p talos-benches --bench records -- --warm-up-time 1
//! --measurement-time 5`.
//!
//! Measured 2026-11-29 on the shared 2-core development machine, ext4 on
//! a virtual disk, with other builds and load tests running
//! (`--warm-up-time 1 --measurement-time 5`): 86 ms per 10,000 records
//! [78, 106], so about **116,000 records/s** [95k, 129k] — over twice the
//! target. The writer waits for each batch's sealing and two syncs, so at
//! most one core works at a time. Before `chain.json` was written only when
//! the spool empties (three syncs per batch instead of two) it was 165 ms,
//! 61,000 records/s: the syncs dominate, then the Ed25519 and SHA-384
//! passes over each ~450 KB payload.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use talos_gateway::records::record::{Record, RecordSink, RequestRecord};
use talos_gateway::records::spool::{Sealer, Spool, SpoolLimits};

const RECORDS: u64 = 10_000;

fn record(gateway: &Arc<str>, session: &Arc<str>, n: u64) -> Record {
    let source = SocketAddr::from(([10, 20, 30, 40], 10_000 + (n % 50_000) as u16));
    let mut r = Record::open(Arc::clone(gateway), source);
    r.session_id = Some(Arc::clone(session));
    r.attempt = Some(1);
    r.tenant = Some(Arc::from("acme"));
    r.sni = Some("api.github.com".into());
    r.resolved = Some(SocketAddr::from(([140, 82, 112, 6], 443)));
    r.tls_version = Some("TLSv1.3");
    r.alpn_session = Some("h2");
    r.alpn_upstream = Some("h2");
    r.request_count = 1;
    let mut q = RequestRecord::new(&hyper::Method::GET, "/repos/acme/widgets");
    q.status = 200;
    r.requests.push(q);
    r.attachments_used.push("GITHUB_TOKEN".into());
    r.bytes_from_session = 812;
    r.bytes_to_session = 2_406;
    r
}

fn records(c: &mut Criterion) {
    let mut group = c.benchmark_group("records");
    group.throughput(Throughput::Elements(RECORDS));
    group.sample_size(10);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let key = Arc::new(talos_certs::GatewayKey::generate().expect("key"));
    let gateway: Arc<str> = Arc::from("gw-a");
    let session: Arc<str> = Arc::from("sbx-5e1f0c2a9b7d");
    group.bench_function("write_seal_spool_10000", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().expect("tempdir");
                let (spool, position) = Spool::open(
                    &dir.path().join("spool"),
                    SpoolLimits {
                        max_batches: 1000,
                        max_bytes: 1 << 30,
                    },
                )
                .expect("spool");
                let spool = Arc::new(spool);
                let sealer = Sealer::new(
                    Arc::clone(&key),
                    "gw-a",
                    position,
                    Arc::clone(&spool),
                    1000,
                    Duration::from_secs(60),
                );
                let (sink, writer) =
                    RecordSink::open_file(&dir.path().join("records.jsonl")).expect("records");
                let writer = writer.with_sealer(sealer);
                let prepared: Vec<Record> = (0..RECORDS)
                    .map(|n| record(&gateway, &session, n))
                    .collect();
                let start = Instant::now();
                runtime.block_on(async {
                    let task = tokio::spawn(writer.run());
                    for r in prepared {
                        sink.close(r).await;
                    }
                    drop(sink);
                    task.await.expect("writer");
                });
                total += start.elapsed();
                assert_eq!(black_box(spool.len().0), (RECORDS / 1000) as usize);
            }
            total
        });
    });
    group.finish();
}

criterion_group!(benches, records);
criterion_main!(benches);
