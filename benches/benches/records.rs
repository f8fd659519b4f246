//! The gateway's whole record path, in records per second: 10,000
//! connections at once each journal their opening and their gate line
//! (`RecordSink::open`, `gate`) and close their record (`close`, which
//! returns once the record is synced in the journal); the journal's writer
//! writes the JSON lines, hands segments of 1,000 to the sealer, which
//! seals each into a signed batch (`Sealer`: canonical payload, SHA-384
//! chain link, Ed25519 signature) and writes it to the spool (synced file,
//! renamed, `chain.json` synced too) — everything but shipping.
//!
//! Target: at least 50,000 connection records per second on one core.
//! The runtime here has one thread, as a gateway with `WORKERS=1`; sealing
//! and the synced writes run on tokio's blocking pool, as in the gateway.
//!
//! Run: `cargo bench -p talos-benches --bench records -- --warm-up-time 1
//! --measurement-time 5`.
//!
//! Measured 2026-12-02 on the shared 2-core development machine, ext4 on
//! a virtual disk (`--warm-up-time 1 --measurement-time 5`, two runs):
//! 147 ms [138, 158] and 141 ms [136, 148] per 10,000 connections, so
//! about **68,000–71,000 records/s** — over the target. The same machine,
//! the same hour, the bench as it was before the journal (records handed
//! to the writer at close only: no opening or gate line, no sync before a
//! connection counts as closed; commit 143a13b): 95 ms [89, 103] and 87 ms
//! [82, 94], 105,000–115,000 records/s. So putting every accepted
//! connection on disk before it counts as closed costs about 5 µs of
//! wall time per connection here, on the writer thread and the disk, not
//! on a connection's task; per request nothing (`benches/load/gateway-ab.sh`,
//! docs/records.md "Records outlive crashes"). The syncs dominate, then
//! the Ed25519 and SHA-384 passes over each ~450 KB batch.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use talos_gateway::records::journal::{self, JournalSetup, WriterConfig};
use talos_gateway::records::record::{Record, RequestRecord};
use talos_gateway::records::spool::{Sealer, Spool, SpoolLimits};

const RECORDS: u64 = 10_000;

/// A connection's record as the gate leaves it, from `record` (made by the
/// sink at accept), and what its requests add.
fn fill(r: &mut Record, session: &Arc<str>) {
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
}

fn source(n: u64) -> SocketAddr {
    SocketAddr::from(([10, 20, 30, 40], 10_000 + (n % 50_000) as u16))
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
                    position.clone(),
                    Arc::clone(&spool),
                    1000,
                    Duration::from_secs(60),
                );
                let instance: Arc<str> = Arc::from("00000000000000aa");
                let journal_dir = dir.path().join("spool").join(journal::JOURNAL_DIR);
                let recovered =
                    journal::recover(&journal_dir, position.last_seq, &gateway, &instance)
                        .expect("journal");
                let start = Instant::now();
                runtime.block_on(async {
                    let (segments_tx, segments_rx) = tokio::sync::mpsc::channel(8);
                    let sealing = tokio::spawn(sealer.run(segments_rx));
                    let (sink, writer) = journal::start(WriterConfig {
                        records_path: dir.path().join("records.jsonl"),
                        journal: Some(JournalSetup {
                            dir: journal_dir,
                            recovered,
                            sealer: segments_tx,
                            max_records: 1000,
                            interval: Duration::from_secs(60),
                            sync: journal::DataSync::disk(),
                        }),
                        gateway_id: Arc::clone(&gateway),
                        instance,
                        first_conn: 1,
                    })
                    .expect("records");
                    // Every connection at once, as connections closing
                    // together share the journal's syncs.
                    let mut tasks = tokio::task::JoinSet::new();
                    for n in 0..RECORDS {
                        let sink = sink.clone();
                        let session = Arc::clone(&session);
                        tasks.spawn(async move {
                            let mut r = sink.open(source(n)).await;
                            fill(&mut r, &session);
                            sink.let_through(&r).await.wait().await;
                            sink.close(r).await;
                        });
                    }
                    while tasks.join_next().await.is_some() {}
                    drop(sink);
                    writer.stop().await;
                    sealing.await.expect("sealer");
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
