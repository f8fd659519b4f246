//! Benchmarks live in `benches/`; see `benches/README.md`.
