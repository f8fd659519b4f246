#!/usr/bin/env bash
# Installs what the tests need on a Debian machine that has Rust: the real
# clients the end-to-end tests drive, and the ops tools. With --demo, only
# what scripts/demo.sh itself runs (curl, openssl, python3, timeout, kill):
# a newcomer's first command installs no browser, JDK or firewall tools it
# never starts. Idempotent; installs only what is missing.
set -euo pipefail

demo=0
case "${1:-}" in
  --demo) demo=1 ;;
  "") ;;
  *) echo "usage: $0 [--demo]" >&2; exit 2 ;;
esac

need=()
# The demo's clients (and the tests').
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v python3 >/dev/null || need+=(python3)
command -v timeout >/dev/null || need+=(coreutils)
command -v kill >/dev/null || need+=(procps)
if [ "$demo" -eq 0 ]; then
  # ss shows a listener's accept queue (the fault tests) and the gateway's
  # TCP keep-alive timers (the adversarial tests); jq runs the signature
  # checks docs/records.md gives reviewers.
  command -v ss >/dev/null || need+=(iproute2)
  command -v jq >/dev/null || need+=(jq)
  # h2load drives many HTTP/2 streams through the gateway in the client tests.
  command -v h2load >/dev/null || need+=(nghttp2-client)
  # g++ builds libFuzzer for the fuzz smoke run.
  command -v g++ >/dev/null || need+=(g++)
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}"
fi

# The ops checks and the session-image client test: systemd-analyze, nft,
# NSS tools, wget, a JDK, Chromium, promtool (unpacked, not installed as a
# service). The demo needs none of them.
if [ "$demo" -eq 0 ]; then
    "$(dirname "$0")/install-ops-tools.sh"
fi
