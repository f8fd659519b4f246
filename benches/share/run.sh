#!/usr/bin/env bash
# What one session at every bound of its share costs another session's
# latency: session A holds every connection it may open (a quarter of them
# half-sent hellos), every request it may hold and every proposal it may
# have waiting, and keeps pushing at each bound, while session B's requests
# are timed (keep-alive and new connections, 1 KiB replies), in rounds that
# alternate B alone and B beside A. Release gateway, one runtime worker.
# Bounded: the harness stops itself after 600 s; everything it starts is
# stopped when it exits.
#
#   benches/share/run.sh              # 2000 requests a round, 3 rounds
#   COUNT=500 ROUNDS=5 benches/share/run.sh
#
# The harness is benches/harness/src/bin/share-load.rs; the figures are in
# benches/share/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${COUNT:-2000}
rounds=${ROUNDS:-3}
cargo build --release --locked -q -p talos-gateway -p talos-bench-harness --bin gateway --bin share-load
work=$(mktemp -d /tmp/talos-share.XXXXXX)
trap 'rm -rf "$work"' EXIT
ulimit -n 65536 2>/dev/null || true
TALOS_GATEWAY_BIN=$PWD/target/release/gateway target/release/share-load "$work" "$count" "$rounds" |
  python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print(json.dumps(r, indent=2))
print()
print("session B, p99 (median of {rounds} rounds of {count} requests): keep-alive {median_keepalive_p99_alone_us} us alone, "
      "{median_keepalive_p99_holding_us} us beside A holding every bound ({keepalive_p99_ratio_holding:.2f}x), "
      "{median_keepalive_p99_pushing_us} us beside A also pushing at each ({keepalive_p99_ratio_pushing:.2f}x); "
      "new connections {median_newconn_p99_alone_us} us, {median_newconn_p99_holding_us} us ({newconn_p99_ratio_holding:.2f}x), "
      "{median_newconn_p99_pushing_us} us ({newconn_p99_ratio_pushing:.2f}x); A refused {a_refused_while_b_measured} times".format(**r))
'
