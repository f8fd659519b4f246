#!/usr/bin/env bash
# Runs every fuzz target for a bounded time and fails on a crash.
#
#   fuzz/smoke.sh                 20 s per target
#   FUZZ_SECONDS=300 fuzz/smoke.sh
#
# Runs on the stable toolchain: with `--sanitizer none` cargo-fuzz passes no
# unstable flag at all (coverage instrumentation is `-Cpasses=sancov-module`
# and `-Cllvm-args`, both stable), so neither nightly nor RUSTC_BOOTSTRAP is
# needed. AddressSanitizer (`-Zsanitizer`) is the one part that is not
# stable; the workspace forbids unsafe code, so it would find little that a
# panic does not already show.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
seconds="${FUZZ_SECONDS:-20}"
# The cargo-fuzz this script was checked with (builds with Rust 1.95).
cargo_fuzz_version="0.13.2"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked
fi

# Seeds (fuzz/corpus/ is not committed): the real captured hellos, and a
# few inputs of each other target's own format in fuzz/seeds/TARGET/.
seed_files() {
    case "$1" in
    client_hello) echo "$here/../gateway/testdata/hellos"/*.bin ;;
    *) if [ -d "$here/seeds/$1" ]; then echo "$here/seeds/$1"/*; fi ;;
    esac
}

status=0
for target in $(cargo fuzz list); do
    corpus="$here/corpus/$target"
    mkdir -p "$corpus"
    seeds="$(seed_files "$target")"
    if [ -n "$seeds" ]; then
        # shellcheck disable=SC2086 # a list of paths without spaces
        cp $seeds "$corpus/"
    fi
    echo "smoke.sh: fuzzing $target for ${seconds}s" >&2
    if ! cargo fuzz run --sanitizer none "$target" "$corpus" -- \
        -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1; then
        echo "smoke.sh: $target FAILED (reproducer in fuzz/artifacts/$target/)" >&2
        status=1
    fi
done
exit "$status"
