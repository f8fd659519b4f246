#!/usr/bin/env bash
# What a request held for approval costs the gateway: 10,000 requests held
# at once over 50 HTTP/2 connections (loopback), the gateway's resident
# memory before and after, its thread count, and every held request
# answered `approval_withdrawn` when the session is paused. Bounded: the
# harness stops itself after 240 s; everything it starts is stopped when it
# exits (the gateway by SIGTERM from its owner process).
#
#   benches/held/run.sh              # 10,000 held requests, 50 connections
#   COUNT=2000 CONNS=20 benches/held/run.sh
#
# The harness is benches/harness/src/bin/hold-load.rs; the figures are in
# benches/held/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${COUNT:-10000}
conns=${CONNS:-50}
cargo build --release --locked -q -p talos-gateway -p talos-bench-harness --bin gateway --bin hold-load
work=$(mktemp -d /tmp/talos-held.XXXXXX)
trap 'rm -rf "$work"' EXIT
ulimit -n 65536 2>/dev/null || true
TALOS_GATEWAY_BIN=$PWD/target/release/gateway target/release/hold-load "$work" "$count" "$conns" |
  python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print(json.dumps(r, indent=2))
print()
print("{held} requests held at once on {connections} connections: {rss_idle_connections_kib} KiB -> "
      "{rss_all_held_kib} KiB resident, {bytes_per_held_request} bytes per held request, "
      "{gateway_threads} gateway threads; {answered_approval_withdrawn} answered approval_withdrawn "
      "at the pause".format(**r))
'
