//! What a session's trust material costs.
//!
//! - `certs/ca_new_10_names`: a session CA for ten names (P-256 key
//!   generation, one self-signature, SHA-384 digest): paid at session open,
//!   resume and recovery.
//! - `certs/mint_leaf`: one leaf (key generation, one signature by the CA):
//!   paid on a name's first TLS accept in a session.
//! - `certs/cache_hit`: `LeafCache::get_or_mint` for a name already minted:
//!   paid on every other TLS accept.
//!
//! Run: `cargo bench -p talos-benches --bench certs`.
//!
//! Measured on a shared 2-core build machine (`-- --warm-up-time 1
//! --measurement-time 3`): `ca_new_10_names` 34.7 µs, `mint_leaf` 27.7 µs,
//! `cache_hit` 19.2 ns. Both mints are dominated by aws-lc's P-256 key
//! generation and one ECDSA signature; the name constraints of ten names
//! add little to the CA. A hit is a hash lookup, a `OnceLock` read and an
//! `Arc` clone, about 1/1400 of a mint, which is why leaves are cached per
//! session rather than minted per connection.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use talos_certs::{CaParams, LeafCache, SessionCa};

/// Ten names, none under another (a session CA refuses nested names).
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

fn params() -> CaParams {
    CaParams::new("sess-bench", 1, "gw-a", NAMES)
}

fn certs(c: &mut Criterion) {
    let mut group = c.benchmark_group("certs");

    group.bench_function("ca_new_10_names", |b| {
        let params = params();
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
