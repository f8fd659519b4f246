#!/usr/bin/env bash
# How long a card takes to reach a person's open page: from a proposal sent
# to control-stub serve (ControlPlane.Propose, as a member sends it) to the
# live card stream's event listing it, read whole by a client connected as
# the cards page is (GET /api/events over HTTPS, signed in with a passkey);
# p50/p90/p99/max over 100 cards, one at a time, on the end-to-end tests'
# rig (a gateway pair, serve --web-listen, an origin; loopback). Bounded:
# each card waited for at most 10 s, the whole run at most 240 s; every
# process it starts is stopped by its id when it exits.
#
#   benches/cards/run.sh            # debug build, 100 cards
#   PROFILE=release benches/cards/run.sh
#   COUNT=50 benches/cards/run.sh
#
# The harness is tests/src/bin/card-latency.rs; the figures are in
# benches/cards/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${COUNT:-100}
profile=${PROFILE:-debug}
flag=()
[ "$profile" = release ] && flag=(--release)
cargo build "${flag[@]}" --locked -q -p talos-gateway -p talos-control-stub -p talos-e2e \
  --bin gateway --bin control-stub --bin card-latency
bin="$(realpath "${CARGO_TARGET_DIR:-target}")/$profile"
TALOS_GATEWAY_BIN="$bin/gateway" TALOS_CONTROL_STUB_BIN="$bin/control-stub" \
  "$bin/card-latency" "$count" |
  python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print(json.dumps(r, indent=2))
s, a = r["from_propose_sent_ms"], r["from_propose_answered_ms"]
print()
print("{} cards: proposal sent -> card on the stream p50 {} ms, p99 {} ms (max {}); "
      "Propose answered -> card on the stream p50 {} ms, p99 {} ms".format(
      r["cards"], s["p50"], s["p99"], s["max"], a["p50"], a["p99"]))
'
