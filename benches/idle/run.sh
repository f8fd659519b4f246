#!/usr/bin/env bash
# Resident memory per idle session-side TLS connection, HTTP/1.1 and HTTP/2
# ALPN apart. For each mode and each count N: a fresh gateway (one runtime
# worker thread, as in benches/compare), one warm-up connection (mints the
# leaf, so one-time costs are not counted), its VmRSS, N idle connections
# (benches/idle/idle_client.py), its VmRSS again once every handshake is
# done. Prints KiB per connection, and the slope between the two counts
# (what one more connection costs, one-time costs cancelled out).
#
#   benches/idle/run.sh                       # N = 2000 and 5000; http1, h2
#   COUNTS="1000" MODES="h2bare" benches/idle/run.sh
#
# Knobs: COUNTS, MODES (http1 h2 h2bare), NO_BUILD=1, BIN_DIR (default
# $CARGO_TARGET_DIR/release, else target/release), GW_ENV="VAR=x ..."
# (extra environment for the gateway only, e.g. MALLOC_ARENA_MAX=2),
# HEAPTRACK=1 (run the gateway under heaptrack; its files are kept in the
# work folder, which is then kept), KEEP=1 (keep the work folder).
# Every wait is bounded; everything started here is stopped by its PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/lib.sh
here=benches/idle
counts=${COUNTS:-2000 5000}
modes=${MODES:-http1 h2}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
name=origin.demo.test
sources=127.0.0.1,127.0.0.2

die() { echo "idle: $*" >&2; exit 1; }
[ "${HEAPTRACK:-0}" = 1 ] && KEEP=1

work=$(mktemp -d /tmp/talos-idle.XXXXXX)
pids=()
stop() { bench_stop 5 "$@"; } # PID...: TERM, wait at most 5 s, then KILL
cleanup() {
  [ ${#pids[@]} -eq 0 ] || stop "${pids[@]}"
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "idle: files kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

figures() { "$bin/bench-figures" "$@"; } # readings and figures: benches/harness/src/figures.rs
rss_kib() { figures rss-kib "$1"; }

ulimit -n "$(ulimit -Hn)"
max=$(echo "$counts" | tr ' ' '\n' | sort -n | tail -1)
[ "$(ulimit -n)" -gt $((max + 200)) ] || die "ulimit -n $(ulimit -n) too low for $max"

if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release -q --locked -p talos-gateway -p talos-bench-harness --bins
fi

"$bin/load-origin" "$work" >"$work/origin.out" 2>"$work/origin.log" &
pids+=($!)
line=$(bench_ready_line "$work/origin.out")
dns=$(echo "$line" | figures json-field dns)
origin_port=$(echo "$line" | figures json-field origin | sed 's/.*://')

bench_gateway_toml file="$work/gateway.toml" id=gw-idle session=sbx-idle name="$name" \
  sources="$sources" dns="$dns" port="$origin_port" work="$work" records="$work/records.jsonl" \
  trust="$work/session-ca.pem" limits="max_connections = 30000
session_connections = 30000
session_handshakes = 30000
shutdown_grace_ms = 500" gateway="$bin/gateway"

# one MODE N: prints "MODE N rss0 rss1 opened kib_per_conn"
one() {
  local mode=$1 n=$2 gw port r0 r1 cpid res opened
  local run=$work/$mode.$n
  : >"$run.gw.out"
  local wrap=()
  [ "${HEAPTRACK:-0}" = 1 ] && wrap=(heaptrack -o "$run.heaptrack")
  # shellcheck disable=SC2086 # GW_ENV is a list of VAR=value words
  env ${GW_ENV:-} "${wrap[@]}" "$bin/gateway" run --config "$work/gateway.toml" \
    >"$run.gw.out" 2>"$run.gw.log" &
  gw=$!
  pids+=("$gw")
  local wrapper=$gw
  line=""
  for _ in $(seq 200); do
    line=$(grep -m1 '"ready"' "$run.gw.out" || true)
    [ -n "$line" ] && break
    sleep 0.1
  done
  [ -n "$line" ] || die "gateway did not start: $(tail -3 "$run.gw.log")"
  port=$(echo "$line" | figures json-field data | sed 's/.*://')
  # heaptrack runs the gateway as its child: measure that process.
  if [ "${HEAPTRACK:-0}" = 1 ]; then
    local g
    for _ in $(seq 50); do g=$(pgrep -P "$gw" -x gateway || true); [ -n "$g" ] && break; sleep 0.1; done
    gw=$g
  fi
  timeout 20 python3 "$here/idle_client.py" "127.0.0.1:$port" "$name" "$work/session-ca.pem" 1 \
    127.0.0.1 "$mode" 0 >/dev/null || die "warm-up connection failed"
  sleep 0.5
  r0=$(rss_kib "$gw")
  timeout 300 python3 "$here/idle_client.py" "127.0.0.1:$port" "$name" "$work/session-ca.pem" "$n" \
    "$sources" "$mode" 120 >"$run.client" 2>&1 &
  cpid=$!
  pids+=("$cpid")
  for _ in $(seq 1200); do
    grep -q '^OPEN ' "$run.client" && break
    kill -0 "$cpid" 2>/dev/null || break
    sleep 0.1
  done
  sleep 1.5
  r1=$(rss_kib "$gw")
  res=$(grep '^OPEN ' "$run.client" || echo "OPEN opened=0")
  opened=${res#*opened=}; opened=${opened%% *}
  stop "$cpid"
  stop "$gw"
  [ "$wrapper" = "$gw" ] || timeout 120 tail --pid="$wrapper" -f /dev/null || stop "$wrapper"
  pids=("${pids[0]}")
  echo "$mode $n $((r1 - r0)) $opened" >>"$work/deltas"
  figures idle-line "$mode" "$n" "$r0" "$r1" "${opened:-0}" "${res#OPEN }" | tee -a "$work/results"
}

echo "gateway env: ${GW_ENV:-none}" >&2
for mode in $modes; do
  for n in $counts; do one "$mode" "$n"; done
done
# Slope between the smallest and largest count, per mode.
figures idle-slopes "$work/deltas"
