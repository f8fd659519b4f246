#!/usr/bin/env bash
# Masking on against off, side by side: two release gateways, one whose
# session attaches nothing and one whose session attaches 4 credentials to
# the destination (every reply masked, 4 headers injected), the same TLS
# origin, 1 MiB replies with h2load -c4 -m1 over HTTP/1.1 (--h1) and then
# HTTP/2. Rounds alternate which gateway goes first, so neither always runs
# on a warmer or quieter machine; it prints each round and the medians.
# Every run is bounded; everything started is stopped by PID at exit.
#
#   benches/load/masking-ab.sh               # 6 rounds of 5 s per protocol
#   ROUNDS=10 DUR=10 benches/load/masking-ab.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/lib.sh
bin=${BIN_DIR:-target/release}
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release --locked -q -p talos-gateway -p talos-bench-harness --bin gateway --bin load-origin --bin bench-figures
figures() { "$bin/bench-figures" "$@"; } # the rounds' figures and medians: benches/harness/src/figures.rs
command -v h2load >/dev/null || { echo "masking-ab: h2load is missing (apt-get install nghttp2-client)" >&2; exit 1; }
w=$(mktemp -d /tmp/ab.XXXXXX); pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$w"' EXIT
"$bin/load-origin" "$w" > "$w/peers.out" 2>/dev/null & pids+=($!)
sleep 2
dns=$(figures json-field dns <"$w/peers.out")
origin=$(figures json-field origin <"$w/peers.out")
name=origin.demo.test
mk() { # off|on [masked=DIR]
  local t=$1; shift
  bench_gateway_toml file="$w/gw$t.toml" id="gw-ab$t" session=sbx-ab name="$name" \
    dns="$dns" port="${origin##*:}" work="$w" records="$w/records$t.jsonl" trust="$w/ca$t.pem" \
    "$@" gateway="$bin/gateway"
}
mk off
mk on masked="$w"
declare -A pid port
for t in off on; do
  "$bin/gateway" run --config "$w/gw$t.toml" > "$w/g$t.out" 2>/dev/null & pid[$t]=$!; pids+=($!)
done
sleep 1.5
for t in off on; do port[$t]=$(head -n1 "$w/g$t.out" | figures json-field data | sed 's/.*://'); done
cpu() { figures ticks "$1"; }
tck=$(getconf CLK_TCK)
for proto in h1 h2; do
  flag=""; [ "$proto" = h1 ] && flag="--h1"
  label=HTTP/1.1; [ "$proto" = h2 ] && label=HTTP/2
  echo "== 1 MiB replies over $label"
  unset mb cpugb; declare -A mb cpugb
  rounds=${ROUNDS:-6}; dur=${DUR:-5}
  for r in $(seq "$rounds"); do
  order="off on"; [ $((r % 2)) = 0 ] && order="on off"
  for t in $order; do
    b=$(cpu ${pid[$t]})
    out=$(h2load $flag -c4 -m1 -D "$dur" --connect-to=127.0.0.1:${port[$t]} https://$name/download/1048576 2>&1)
    a=$(cpu ${pid[$t]})
    read -r mbs g < <(echo "$out" | figures masking-round "$dur" $((a - b)) "$tck")
    echo "round $r $t: $mbs MB/s, $g CPU-s/GB"
    mb[$t]="${mb[$t]:-} $mbs"; cpugb[$t]="${cpugb[$t]:-} $g"
  done
done
figures masking-summary "${mb[off]}" "${mb[on]}" "${cpugb[off]}" "${cpugb[on]}"
done
