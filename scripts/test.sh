#!/usr/bin/env bash
# Runs every test: formatting, lints, unit, property and end-to-end tests
# (real clients on loopback), every criterion benchmark once, a short fuzz
# run of every fuzz target, and smoke runs of the comparison and the
# capacity harnesses.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
# What of this checkout's binaries runs before the tests (a demo, say) is
# not theirs to stop; anything else still running after them is a leak.
before="$(mktemp)"
scripts/check-leftovers.sh --record "$before"
# A PostgreSQL server of this run's own (scripts/postgres.sh: a temporary
# folder, 127.0.0.1 only) for the replicated store's tests; stopped at the
# end, whatever happened.
pgdir="$(mktemp -d)"
TALOS_TEST_POSTGRES="$(scripts/postgres.sh start "$pgdir/pg")"
export TALOS_TEST_POSTGRES
# On a failure too, whatever the tests left is listed and stopped.
trap 'status=$?; scripts/postgres.sh stop "$pgdir/pg" || true; rm -rf "$pgdir"; if [ $status -ne 0 ]; then scripts/check-leftovers.sh --check "$before" || true; fi; rm -f "$before"' EXIT
# A run from a clean checkout (CI) reuses nothing of incremental state,
# which would only take disk beside the build.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# No import cycle between the files of gateway/src or control-stub/src, and
# no gateway module using one declared after it in lib.rs (the checker
# checks itself first on planted faults).
python3 scripts/check-layering.py --self-test && python3 scripts/check-layering.py
# The end-to-end tests start the binaries as operators do.
cargo build --workspace --bins --locked
# The operator's kit in ops/, each file checked by the tool that reads it
# (systemd units against the binaries just built, nftables, Prometheus
# rules and their unit tests, the dashboard's queries).
scripts/check-ops.sh
cargo test --workspace --locked
# The control plane's tests again with every store a PostgreSQL database
# (each test its own, on the server above): the store's code and schema
# hold on both.
TALOS_TEST_STORE=postgres cargo test -p talos-control-stub --locked
scripts/check-leftovers.sh --check "$before"
# Every criterion benchmark once, in criterion's test mode (each routine
# runs once, debug build, and its own checks must hold), so that a
# benchmark cannot rot unnoticed; timing is never judged here.
cargo test -p talos-benches --benches --locked
# The certificate bundle's benchmark once, small (1 and 200 connections):
# written from the store and checked by the independent verifier, which
# must say VERIFIED; its figures are in benches/bundle/README.md.
cargo test -p talos-control-stub --bench bundle --locked
# The end-to-end tests again with `[runtime] workers = 1`: the first pass
# ran the default (one worker per CPU, a work-stealing pool), this one the
# single-threaded scheduler the benchmarks measure.
TALOS_TEST_WORKERS=1 cargo test -p talos-e2e --locked
scripts/check-leftovers.sh --check "$before"
FUZZ_SECONDS="${FUZZ_SECONDS:-15}" fuzz/smoke.sh
# The comparison harness (benches/compare) as a smoke test, so it cannot rot
# unnoticed: the debug binaries just built, the gateway against a twin of
# itself (AA=1) and the direct baseline, 2 interleaved rounds of 1 s per
# figure, 200 idle connections. It fails if anything does not start or
# check, or a run loses requests; it never judges speed, nor the spread.
# (The peers are left out here: installing their packages would start
# system services on a developer's machine.)
QUICK=1 DURATION=1 ROUNDS=2 AA=1 IDLE_CONNS=200 QUIET_WAIT=0 NO_BUILD=1 PEERS="" RELAY=0 STRICT=1 \
  BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" benches/compare/run.sh
# The capacity harness (benches/capacity) as a smoke test, likewise: the
# debug binaries, 1 and then 20 sessions opened, used, renewed and closed
# over the control channel, one 1 s round of 20 sessions against 1. It fails
# if a call, a request or a lease renewal fails; it never judges speed.
COUNTS="1 20" REPEAT=1 IDLE_S=1 ROUNDS=1 DUR=1 AB_SESSIONS=20 QUIET_WAIT=0 NO_BUILD=1 STRICT=1 \
  BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" benches/capacity/run.sh
# Nothing the tests or the harnesses started is left running.
scripts/check-leftovers.sh --check "$before"
echo "all tests passed"
