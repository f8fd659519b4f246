#!/usr/bin/env bash
# Runs every test: formatting, lints, unit, property and end-to-end tests
# (real clients on loopback), then a short fuzz run of every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The end-to-end tests start the binaries as operators do.
cargo build --workspace --bins --locked
cargo test --workspace --locked
FUZZ_SECONDS="${FUZZ_SECONDS:-15}" fuzz/smoke.sh
echo "all tests passed"
