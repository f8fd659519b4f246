//! The ClientHello parser over every captured hello.
//!
//! - `hello/one_record/<capture>`: the hello as the client sent it (one
//!   record each, read in place).
//! - `hello/100b_records/<capture>`: the same message re-split into 100-byte
//!   records, put back together in the scratch buffer.
//! - `hello/first_byte/plain_http`: refusing plain text.
//!
//! Target: a typical hello under 1 µs on one core. Measured 2026-11-29 on
//! the shared 2-core development machine (`--warm-up-time 1
//! --measurement-time 3`, median):
//!
//! | capture | one record | 100-byte records |
//! | --- | --- | --- |
//! | curl-http2 (517 B) | 104 ns | 125 ns |
//! | curl-tls1.2 (223 B) | 65 ns | 77 ns |
//! | openssl-noservername (297 B, refused) | 58 ns | 69 ns |
//! | java-jsse (479 B) | 112 ns | 131 ns |
//! | rustls-x25519 (267 B) | 92 ns | 105 ns |
//! | rustls-x25519mlkem768 (1,487 B) | 93 ns | 158 ns |
//! | crafted-curl-http2-ech (707 B, refused) | 111 ns | 141 ns |
//! | plain HTTP, refused on its first byte | 5.5 ns | |
//!
//! So about 10× under the target; the large post-quantum key share costs
//! nothing in one record (it is skipped, not read) and one 1.5 KB copy when
//! split.
//!
//! Run: `cargo bench -p talos-benches --bench hello -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use talos_gateway::gate::hello::{parse, HelloLimits};

const HELLOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../gateway/testdata/hellos");

fn captures() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(HELLOS)
        .expect("gateway/testdata/hellos")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .map(|p| {
            let name = p
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(Path::new(&p)).expect("capture");
            (name, bytes)
        })
        .collect();
    out.sort();
    out
}

/// The handshake message of a capture re-split into `size`-byte records.
fn refragment(capture: &[u8], size: usize) -> Vec<u8> {
    let mut msg = Vec::new();
    let mut rest = capture;
    while let [_, _, _, hi, lo, tail @ ..] = rest {
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        msg.extend_from_slice(&tail[..len]);
        rest = &tail[len..];
    }
    let mut out = Vec::new();
    for frag in msg.chunks(size) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(frag.len() as u16).to_be_bytes());
        out.extend_from_slice(frag);
    }
    out
}

fn bench_hello(c: &mut Criterion) {
    let limits = HelloLimits::default();
    let mut scratch = limits.scratch();
    let captures = captures();

    let mut group = c.benchmark_group("hello/one_record");
    for (name, bytes) in captures.iter().filter(|(n, _)| !n.contains("records")) {
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(name.as_str(), |b| {
            b.iter(|| parse(black_box(bytes), &mut scratch, &limits).refusal())
        });
    }
    group.finish();

    let mut group = c.benchmark_group("hello/100b_records");
    for (name, bytes) in &captures {
        if name.contains("records") {
            continue;
        }
        let split = refragment(bytes, 100);
        group.throughput(Throughput::Bytes(split.len() as u64));
        group.bench_function(name.as_str(), |b| {
            b.iter(|| parse(black_box(&split), &mut scratch, &limits).refusal())
        });
    }
    group.finish();

    c.bench_function("hello/first_byte/plain_http", |b| {
        b.iter(|| parse(black_box(b"GET / HTTP/1.1\r\n"), &mut scratch, &limits).refusal())
    });
}

criterion_group!(benches, bench_hello);
criterion_main!(benches);
