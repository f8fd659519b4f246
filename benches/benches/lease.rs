//! What the lease check costs a request: `Lease::live`, which every new
//! connection and every request of a session opened by the control plane
//! calls. It reads the boot clock once and, for a leased authority, the
//! freeze detector's atomics too (`session::lease::Awake`: is the process
//! known to have been frozen since the lease was last renewed?).
//!
//! - `lease/live_leased`: a leased authority: the clock, the lease's end,
//!   the freeze check;
//! - `lease/live_unleased`: an authority without a lease (a static
//!   session): the clock and the lease's end only;
//! - `lease/clock`: the boot clock alone (`clock_gettime(CLOCK_BOOTTIME)`
//!   through the vDSO).
//!
//! The difference between the first two is what the freeze check adds to a
//! request. `benches/load/gateway-ab.sh` cannot show it: its session is
//! static, so it never takes the leased path.
//!
//! Run: `cargo bench -p talos-benches --bench lease`.
//!
//! Measured on the shared 2-core build machine, with a test run and a
//! release build going on beside it (`-- --warm-up-time 1
//! --measurement-time 3`), 2026-12-04: `live_leased` 51 ns,
//! `live_unleased` 46 ns, `clock` 45 ns. The clock read is nearly all of
//! it; the freeze check adds about 5 ns per call, against some 25 µs of
//! CPU per HTTP/1.1 request (`gateway-ab.sh`'s h1 figure): 0.02 %.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use talos_gateway::session::lease::{boot_clock, Lease};

fn lease(c: &mut Criterion) {
    let clock = boot_clock();
    let leased = Lease::new(clock.clone(), Duration::from_secs(3600), None);
    let unleased = Lease::none(clock.clone());
    let mut g = c.benchmark_group("lease");
    g.bench_function("live_leased", |b| b.iter(|| black_box(&leased).live()));
    g.bench_function("live_unleased", |b| b.iter(|| black_box(&unleased).live()));
    g.bench_function("clock", |b| b.iter(|| black_box(&clock).now()));
    g.finish();
}

criterion_group!(benches, lease);
criterion_main!(benches);
