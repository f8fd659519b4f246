//! The load harnesses' Rust side. The scripts under `benches/` install
//! tools, start processes and keep every tool's raw output; what they
//! compute, and the processes of their own they start, are here, built
//! by `cargo build -p talos-bench-harness --bins` into the target folder
//! beside `gateway` (the scripts' `BIN_DIR`).
//!
//! - [`figures`]: the arithmetic and tables, from the raw output a run
//!   keeps (unit-tested over kept runs in `testdata/`).
//!
//! The binaries (`src/bin/`), each named by the script that runs it:
//!
//! | binary | run by | what it is |
//! |---|---|---|
//! | `bench-figures` | `compare`, `load`, `idle`, `capacity` (and `benches/lib.sh`); `scripts/demo.sh` for `json-field` | [`figures`] on the command line; `/proc` readings; a ready line's fields; the bench gateway's config |
//! | `load-origin` | `compare`, `load`, `idle`, `capacity` | the DNS server and TLS origin (Nagle off) behind the gateway |
//! | `resume-load` | `compare` | new connections from a client that resumes TLS sessions |
//! | `capacity-driver` | `capacity` | the control plane's side: sessions opened, renewed, closed |
//! | `hold-load` | `held` | 10,000 requests held for approval |
//! | `share-load` | `share` | one session at every bound of its share, another beside it |
//! | `pair-bench` | `pair` | forwarding over the member link |
//!
//! They stand on the end-to-end suite's library (`talos-e2e`: its
//! origin, DNS server, control CA, relay, config writer and rigs), one
//! copy for the tests and the benchmarks; nothing there depends on this
//! crate.

pub mod figures;
