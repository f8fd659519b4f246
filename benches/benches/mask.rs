//! How fast the masker passes reply bodies that hold no secret.
//!
//! 64 KiB chunks of JSON-like text with no occurrence, pushed through one
//! [`Masker`] with `push` (the chunk is copied to the output):
//!
//! - `mask/1_value`: one 40-character token, with every encoding the mask
//!   set derives from it;
//! - `mask/32_values`: 32 such tokens;
//! - `mask/32_values_and_a_3_byte_value`: the same and a 3-byte value,
//!   whose 3-byte pattern turns the gram filter off: every byte is walked
//!   through the automaton, the masker's slowest steady state.
//!
//! What `benches/load/quick.sh` sends through its masking gateway: four
//! values `load-secret-N-<32 hex digits>` (48 patterns) and the bytes
//! 0, 1, …, 250 repeated, in 16 KiB chunks (the HTTP/2 DATA frames the
//! gateway's upstream leg reads):
//!
//! - `mask_load/4_values_push`: copied to the output, as above;
//! - `mask_load/4_values_push_bytes`: passed on uncopied, as the gateway's
//!   reply path does ([`Masker::push_bytes`]).
//!
//! Throughput is in bytes, so criterion reports GiB/s.
//!
//! `mask_set/new_32_values` is the cost of building the set for 32 tokens,
//! paid when a session opens or resumes.
//!
//! Run: `cargo bench -p talos-benches --bench mask`.
//!
//! Measured on a shared 2-core build machine (`-- --warm-up-time 1
//! --measurement-time 3`), other builds running:
//!
//! | bench | before | after |
//! |---|---:|---:|
//! | `mask/1_value` (12 patterns, 19 KiB) | 5.6 GiB/s | 19 GiB/s |
//! | `mask/32_values` (364 patterns, 324 KiB) | 4.1 GiB/s | 7.5 GiB/s |
//! | `mask/32_values_and_a_3_byte_value` | 0.8 GiB/s | 1.0 GiB/s |
//! | `mask_load/4_values_push` | 4.6 GiB/s | 19 GiB/s |
//! | `mask_load/4_values_push_bytes` | (none) | 26 GiB/s |
//! | `mask_set/new_32_values` | 2.1 ms | 2.2 ms |
//!
//! "Before": the gram filter checked one position in 8 whatever the
//! patterns, and every chunk was copied. "After": the stride grows with
//! the shortest pattern while the gram table stays sparse (37 for one
//! token, 43 for the four load values, 11 for 32 tokens), the start state's
//! moves are a table lookup, and `push_bytes` passes a chunk with no
//! occurrence on as it is. For scale: walking every byte through the
//! automaton (no gram filter) ran at 0.30 GiB/s (1 value) and 0.24 GiB/s
//! (32 values).

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use talos_gateway::secrets::mask::{MaskSet, Masker};

/// The size of one body chunk.
const CHUNK: usize = 64 * 1024;
/// The size of one HTTP/2 DATA frame, as the gateway's upstream leg reads
/// them.
const LOAD_CHUNK: usize = 16 * 1024;

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A small deterministic generator: the same text and tokens every run.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `n` tokens of 40 characters from the alphabet API keys use.
fn tokens(n: usize) -> Vec<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = XorShift(0x5eed_cafe);
    (0..n)
        .map(|_| {
            (0..40)
                .map(|_| ALPHABET[rng.below(ALPHABET.len())])
                .collect()
        })
        .collect()
}

/// A chunk of an API's JSON reply: keys, numbers, words, URLs, dates.
fn body() -> Vec<u8> {
    const PIECES: [&str; 16] = [
        "{\"id\":",
        "1234567",
        ",\"name\":\"",
        "quarterly report",
        "\",\"url\":\"https://api.example.com/v1/items/",
        "\",\"created_at\":\"2026-05-01T12:00:00Z\"",
        ",\"tags\":[\"alpha\",\"beta\"]",
        ",\"enabled\":true",
        ",\"owner\":null",
        "},\n",
        " the quick brown fox jumps over the lazy dog",
        ",\"description\":\"",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit",
        ",\"size\":",
        "98.6",
        ",\"sha\":\"9fceb02d0ae598e95dc970b74767f19372d61af8\"",
    ];
    let mut rng = XorShift(0x00b0_d1e5);
    let mut out = Vec::with_capacity(CHUNK + 128);
    while out.len() < CHUNK {
        out.extend_from_slice(PIECES[rng.below(PIECES.len())].as_bytes());
    }
    out.truncate(CHUNK);
    out
}

fn mask(c: &mut Criterion) {
    let body = body();
    let mut group = c.benchmark_group("mask");
    group.throughput(Throughput::Bytes(CHUNK as u64));
    for (label, n, short) in [
        ("1_value", 1, false),
        ("32_values", 32, false),
        ("32_values_and_a_3_byte_value", 32, true),
    ] {
        let mut tokens = tokens(n);
        if short {
            tokens.push(b"q7#".to_vec());
        }
        let names: Vec<String> = (0..tokens.len()).map(|i| format!("TOKEN_{i}")).collect();
        let secrets: Vec<(&str, &[u8])> = names
            .iter()
            .zip(&tokens)
            .map(|(name, token)| (name.as_str(), token.as_slice()))
            .collect();
        let set = Arc::new(MaskSet::new(&secrets).unwrap());
        let mut masker = Masker::new(set.clone());
        let mut out = Vec::with_capacity(2 * CHUNK);
        // No occurrence, so nothing is masked: the output is the input.
        masker.push(&body, &mut out);
        masker.finish(&mut out);
        assert_eq!(out, body, "the bench text must hold no occurrence");
        eprintln!(
            "mask/{label}: {} patterns, longest {} bytes, {} KiB",
            set.pattern_count(),
            set.max_pattern_len(),
            set.memory_usage() / 1024
        );
        group.bench_function(label, |b| {
            b.iter(|| {
                out.clear();
                masker.push(black_box(&body), &mut out);
                black_box(out.len())
            })
        });
    }
    group.finish();

    // What `benches/load/quick.sh` sends through its masking gateway: four
    // values like `load-secret-1-<32 hex digits>` and 1 MiB replies of the
    // bytes 0, 1, …, 250 repeated, arriving as 16 KiB HTTP/2 DATA frames.
    let mut group = c.benchmark_group("mask_load");
    group.throughput(Throughput::Bytes(LOAD_CHUNK as u64));
    let values: Vec<Vec<u8>> = (1..=4)
        .map(|i| format!("load-secret-{i}-{}", hex(&tokens(4)[i - 1][..16])).into_bytes())
        .collect();
    let names: Vec<String> = (1..=4).map(|i| format!("KEY{i}")).collect();
    let secrets: Vec<(&str, &[u8])> = names
        .iter()
        .zip(&values)
        .map(|(name, value)| (name.as_str(), value.as_slice()))
        .collect();
    let set = Arc::new(MaskSet::new(&secrets).unwrap());
    // 64 chunks, each starting where the last ended in the cycle of 251.
    let stream: Vec<u8> = (0..64 * LOAD_CHUNK).map(|i| (i % 251) as u8).collect();
    eprintln!(
        "mask_load: {} patterns, longest {} bytes",
        set.pattern_count(),
        set.max_pattern_len()
    );
    let mut masker = Masker::new(set.clone());
    let mut out = Vec::with_capacity(LOAD_CHUNK + set.max_pattern_len());
    let mut next = stream.chunks(LOAD_CHUNK).cycle();
    group.bench_function("4_values_push", |b| {
        b.iter(|| {
            out.clear();
            masker.push(black_box(next.next().unwrap()), &mut out);
            black_box(out.len())
        })
    });
    // The gateway's data path: the chunk is passed on uncopied (slices of
    // one shared buffer, as the HTTP/2 reader hands them out).
    let shared = Bytes::from(stream);
    let chunks: Vec<Bytes> = (0..64)
        .map(|k| shared.slice(k * LOAD_CHUNK..(k + 1) * LOAD_CHUNK))
        .collect();
    let mut next = chunks.iter().cycle();
    let mut masker = Masker::new(set.clone());
    group.bench_function("4_values_push_bytes", |b| {
        b.iter(|| {
            let mut len = 0;
            masker.push_bytes(black_box(next.next().unwrap().clone()), |piece| {
                len += piece.len();
            });
            black_box(len)
        })
    });
    group.finish();

    // Paid once per session open (and resume), not per reply.
    let tokens = tokens(32);
    let names: Vec<String> = (0..32).map(|i| format!("TOKEN_{i}")).collect();
    let secrets: Vec<(&str, &[u8])> = names
        .iter()
        .zip(&tokens)
        .map(|(name, token)| (name.as_str(), token.as_slice()))
        .collect();
    c.bench_function("mask_set/new_32_values", |b| {
        b.iter(|| MaskSet::new(black_box(&secrets)).unwrap())
    });
}

criterion_group!(benches, mask);
criterion_main!(benches);
