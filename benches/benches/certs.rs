//! What a session's trust material costs.
//!
//! - `certs/ca_new_10_names`: a session CA for ten names none of which lies
//!   under another: a root and one intermediate (two P-256 key
//!   generations, two signatures, the SHA-384 digest). Paid at session
//!   open, resume and recovery.
//! - `certs/ca_new_10_names_nested`: the same for ten names nested two deep
//!   (`example.com` > `api.example.com` > `v2.api.example.com`, and
//!   others one deep): a root and three intermediates. Each further level
//!   adds one key generation and one signature.
//! - `certs/mint_leaf`: one leaf (key generation, one signature by an
//!   intermediate): paid on a name's first TLS accept in a session.
//! - `certs/cache_hit`: `LeafCache::get_or_mint` for a name already minted:
//!   paid on every other TLS accept.
//!
//! Run: `cargo bench -p talos-benches --bench certs`.
//!
//! Measured on a shared 2-core machine (`-- --warm-up-time 1
//! --measurement-time 3`): `ca_new_10_names` 75.3 µs,
//! `ca_new_10_names_nested` 125.3 µs, `mint_leaf` 28.9 µs, `cache_hit`
//! 19.6 ns. Every mint is dominated by aws-lc's P-256 key generation and
//! ECDSA signing: a CA pays them for the root and again for each
//! intermediate (each level beyond the first adds about 25 µs), and the
//! name constraints of ten names add little. A hit is a hash lookup, a `OnceLock` read and an
//! `Arc` clone, about 1/1400 of a mint, which is why leaves are cached per
//! session rather than minted per connection.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use talos_certs::{CaParams, LeafCache, SessionCa};

/// Ten names, none under another: one intermediate.
const NAMES: [&str; 10] = [
    "api.example.com",
    "github.com",
    "objects.githubusercontent.com",
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "index.crates.io",
    "static.crates.io",
    "api.openai.com",
    "proxy.golang.org",
];

/// Ten names nested at most two deep: levels 0, 1 and 2, so three
/// intermediates.
const NESTED_NAMES: [&str; 10] = [
    "example.com",
    "api.example.com",
    "v2.api.example.com",
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    "github.com",
    "api.github.com",
    "pypi.org",
    "files.pythonhosted.org",
];

fn params() -> CaParams {
    CaParams::new("sess-bench", 1, "gw-a", NAMES)
}

fn certs(c: &mut Criterion) {
    let mut group = c.benchmark_group("certs");

    group.bench_function("ca_new_10_names", |b| {
        let params = params();
        b.iter(|| SessionCa::new(black_box(&params)).unwrap());
    });

    group.bench_function("ca_new_10_names_nested", |b| {
        let params = CaParams::new("sess-bench", 1, "gw-a", NESTED_NAMES);
        assert_eq!(SessionCa::new(&params).unwrap().level_count(), 3);
        b.iter(|| SessionCa::new(black_box(&params)).unwrap());
    });

    let ca = SessionCa::new(&params()).unwrap();
    group.bench_function("mint_leaf", |b| {
        b.iter(|| ca.mint_leaf(black_box("github.com")).unwrap());
    });

    let cache = LeafCache::new(ca);
    cache.get_or_mint("github.com").unwrap();
    group.bench_function("cache_hit", |b| {
        b.iter(|| cache.get_or_mint(black_box("github.com")).unwrap());
    });

    group.finish();
}

criterion_group!(benches, certs);
criterion_main!(benches);
