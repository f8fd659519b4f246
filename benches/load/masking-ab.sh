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
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release --locked -q -p talos-gateway -p talos-e2e --bin gateway --bin load-origin
command -v h2load >/dev/null || { echo "masking-ab: h2load is missing (apt-get install nghttp2-client)" >&2; exit 1; }
w=$(mktemp -d /tmp/ab.XXXXXX); pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$w"' EXIT
"$bin/load-origin" "$w" > "$w/peers.out" 2>/dev/null & pids+=($!)
sleep 2
dns=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dns"])' "$w/peers.out")
origin=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["origin"])' "$w/peers.out")
name=origin.demo.test
mk() { # off|on ATTACH SECRETS
  bench_gateway_toml file="$w/gw$1.toml" id="gw-ab$1" session=sbx-ab name="$name" \
    dns="$dns" port="${origin##*:}" work="$w" records="$w/records$1.jsonl" trust="$w/ca$1.pem" \
    extra="attach = [$2]
$3" gateway="$bin/gateway"
}
bench_credentials "$w" "$name"
mk off "" ""
mk on "$BENCH_ATTACH" "$BENCH_SECRETS"
declare -A pid port
for t in off on; do
  "$bin/gateway" run --config "$w/gw$t.toml" > "$w/g$t.out" 2>/dev/null & pid[$t]=$!; pids+=($!)
done
sleep 1.5
for t in off on; do port[$t]=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["data"].split(":")[1])' "$w/g$t.out"); done
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
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
    bytes=$(echo "$out" | sed -n 's/.*traffic: [^(]*(\([0-9]*\)) total.*/\1/p')
    mbs=$(python3 -c "print(round($bytes/1e6/$dur,1))")
    g=$(python3 -c "print(round(($a-$b)/$tck/($bytes/1e9),3))")
    echo "round $r $t: $mbs MB/s, $g CPU-s/GB"
    mb[$t]="${mb[$t]:-} $mbs"; cpugb[$t]="${cpugb[$t]:-} $g"
  done
done
python3 - "${mb[off]}" "${mb[on]}" "${cpugb[off]}" "${cpugb[on]}" <<'PY'
import sys, statistics as st
off, on, coff, con = ([float(x) for x in a.split()] for a in sys.argv[1:5])
print(f"median MB/s off {st.median(off)} on {st.median(on)} -> on/off {st.median(on)/st.median(off):.2f}")
print(f"per-round on/off: {[round(b/a,2) for a,b in zip(off,on)]}")
print(f"median CPU-s/GB off {st.median(coff):.3f} on {st.median(con):.3f}")
PY
done
