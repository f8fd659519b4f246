#!/usr/bin/env bash
# Screenshots of the web pages people use, at a phone's viewport (390x844
# CSS pixels at 3 device pixels each: 1170x2532 PNGs), made by the browser
# driver the tests use (tests/src/browser): Debian's Chromium, headless,
# over the DevTools protocol, against the real pages (a gateway pair,
# control-stub serve --web-listen, an origin, as tests/tests/people.rs
# starts them). Each page is checked before its picture is taken
# (axe-core: no serious or critical violation; no console error,
# exception or CSP violation), so the pictures show pages that work.
#
#   scripts/people-screenshots.sh OUT_DIR     (docs/people for the docs)
#
# The scenarios are in tests/src/bin/people-screenshots.rs. Rerunning
# writes the same file names again (NN-NAME.png).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out="$(realpath -m "$1")"
cd "$(dirname "$0")/.."
# Chromium, NSS's certutil and axe-core (installs only what is missing).
scripts/install-ops-tools.sh
cargo build -p talos-gateway -p talos-control-stub -p talos-e2e --bins --locked
bin="$(realpath "${CARGO_TARGET_DIR:-target}")/debug"
TALOS_GATEWAY_BIN="$bin/gateway" TALOS_CONTROL_STUB_BIN="$bin/control-stub" \
  "$bin/people-screenshots" "$out"
