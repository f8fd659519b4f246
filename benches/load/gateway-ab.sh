#!/usr/bin/env bash
# One gateway build against another, side by side: how an optimisation is
# judged before it is kept. Two release gateways (binaries A and B, the same
# configuration: one static session, WORKERS runtime workers each,
# one by default), one TLS origin (load-origin), and h2load doing the
# comparison's workloads in
# rounds that alternate which gateway goes first. Prints every round and,
# per workload, the medians of B/A for the gateway's CPU per unit and for
# the rate. Every run is bounded; everything started is stopped by PID.
#
#   GW_A=/tmp/gateway.before GW_B=target/release/gateway benches/load/gateway-ab.sh
#   ROUNDS=6 DUR=5 WORKLOADS="h1 h2 mib newconn" WORKERS=1 ...   (the defaults)
#   PROFILE=1 ...  after each workload's rounds, A and B once more each under
#                  perf record (counted in no figure): the shares of their CPU
#                  by kind of work side by side, and their heaviest symbols
#   MASKED=1 ...   the session has four credentials: every request carries
#                  them and every reply is masked (the path a change to
#                  injection or the reply filter costs on)
#
# Workloads (as in benches/compare, with h2load for both protocols):
#   h1      HTTP/1.1 keep-alive, 1 KiB replies: h2load --h1 -c32 -m1
#   h2      HTTP/2 multiplexed, 1 KiB replies:  h2load -c8 -m32
#   mib     1 MiB replies over HTTP/1.1:        h2load --h1 -c4 -m1
#   newconn one request per new TLS connection: h2load --h1 -c16, -n per client 1, repeated for DUR s
# Needs: h2load (nghttp2-client); BIN_DIR holds load-origin and bench-figures
# (which computes each round's figures and the medians: benches/harness/src/figures.rs).
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/lib.sh
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
: "${GW_A:?GW_A=path of gateway binary A}" "${GW_B:?GW_B=path of gateway binary B}"
rounds=${ROUNDS:-6} dur=${DUR:-5} workloads=${WORKLOADS:-h1 h2 mib newconn}
command -v h2load >/dev/null || { echo "gateway-ab: h2load is missing (apt-get install nghttp2-client)" >&2; exit 1; }
for b in load-origin bench-figures; do
  [ -x "$bin/$b" ] || { echo "gateway-ab: no $b in $bin (cargo build --release -p talos-bench-harness --bin $b)" >&2; exit 1; }
done
w=$(mktemp -d /tmp/gw-ab.XXXXXX); pids=()
stop_all() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$w"
}
trap stop_all EXIT
"$bin/load-origin" "$w" >"$w/peers.out" 2>/dev/null & pids+=($!)
for _ in $(seq 100); do [ -s "$w/peers.out" ] && break; sleep 0.1; done
field() { head -n1 "$1" | "$bin/bench-figures" json-field "$2"; } # FILE NAME: a ready line's field
dns=$(field "$w/peers.out" dns); origin=$(field "$w/peers.out" origin)
name=origin.demo.test
small_path=$BENCH_SMALL_PATH # the 1 KiB reply (benches/lib.sh)
declare -A pid port
masked=()
[ "${MASKED:-0}" = 1 ] && masked=(masked="$w")
for t in A B; do
  gw=GW_$t
  bench_gateway_toml file="$w/gw$t.toml" id="gw-ab-$t" session=sbx-ab name="$name" \
    dns="$dns" port="${origin##*:}" work="$w" records="$w/records$t.jsonl" trust="$w/ca$t.pem" \
    workers="${WORKERS:-1}" "${masked[@]}" gateway="${!gw}"
  "${!gw}" run --config "$w/gw$t.toml" >"$w/g$t.out" 2>"$w/g$t.log" & pid[$t]=$!; pids+=($!)
done
for t in A B; do
  for _ in $(seq 100); do [ -s "$w/g$t.out" ] && break; sleep 0.1; done
  port[$t]=$(field "$w/g$t.out" data | sed 's/.*://')
  # Warm up: the leaf, the upstream connections.
  timeout 30 h2load -n 200 -c 2 -m 4 --connect-to="127.0.0.1:${port[$t]}" "https://$name/" >/dev/null
  timeout 30 h2load --h1 -n 200 -c 2 --connect-to="127.0.0.1:${port[$t]}" "https://$name/" >/dev/null
done
cpu() { "$bin/bench-figures" ticks "$1"; }
tck=$(getconf CLK_TCK)
# run T WORKLOAD: prints the round's "CPU-per-unit rate" (CPU-s per 1k
# requests and req/s; CPU-s per GB and MB/s for mib), "- -" if nothing got through.
run() {
  local t=$1 wl=$2 b a out
  local to=(timeout -k 5 $((dur + 60)) h2load --connect-to="127.0.0.1:${port[$t]}")
  b=$(cpu "${pid[$t]}")
  local s0 s1
  s0=$(date +%s.%N)
  case $wl in
    h1) out=$("${to[@]}" --h1 -c32 -m1 -D "$dur" "https://$name$small_path" 2>&1) ;;
    h2) out=$("${to[@]}" -c8 -m32 -D "$dur" "https://$name$small_path" 2>&1) ;;
    mib) out=$("${to[@]}" --h1 -c4 -m1 -D "$dur" "https://$name/download/1048576" 2>&1) ;;
    newconn)
      # h2load opens each client's connection once: -n = -c gives one
      # request per connection; repeat until DUR seconds have passed.
      out=""
      local end=$((SECONDS + dur))
      while [ $SECONDS -lt $end ]; do
        out+=$("${to[@]}" --h1 -c16 -n16 "https://$name$small_path" 2>&1)$'\n'
      done ;;
  esac
  s1=$(date +%s.%N)
  a=$(cpu "${pid[$t]}")
  echo "$out" | "$bin/bench-figures" ab-round "$wl" $((a - b)) "$tck" "$s0" "$s1"
}
# PROFILE=1: after a workload's rounds, one more run of it for A and for B
# each under `perf record -g` (cpu-clock, the gateway's PID, DWARF call
# graphs), counted in no figure; prints the shares of each one's CPU by
# kind of work and its heaviest symbols (benches/compare/perf_shares.py).
# PROFILE_DIR=DIR keeps the perf data and reports there.
profile() {
  local wl=$1 t args=() dir=${PROFILE_DIR:-$w/profile}
  mkdir -p "$dir"
  for t in A B; do
    bench_profile "$dir/$wl.$t.data" "${pid[$t]}" run "$t" "$wl" >/dev/null
    args+=("$t $wl=$dir/$wl.$t.txt")
  done
  python3 benches/compare/perf_shares.py "${args[@]}"
}
for wl in $workloads; do
  unit="CPU-s per 1k req"; [ "$wl" = mib ] && unit="CPU-s per GB"
  echo "== $wl ($unit, rate)"
  : >"$w/$wl.res"
  for r in $(seq "$rounds"); do
    order="A B"; [ $((r % 2)) = 0 ] && order="B A"
    for t in $order; do
      line=$(run "$t" "$wl")
      echo "round $r $t: $line" | tee -a "$w/$wl.res"
    done
  done
  "$bin/bench-figures" ab-summary "$w/$wl.res" "$wl"
  if [ "${PROFILE:-0}" = 1 ]; then profile "$wl"; fi
done
