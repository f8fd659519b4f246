#!/usr/bin/env bash
# Installs what the tests and the demo need on a Debian machine that has
# Rust: the real clients the end-to-end tests drive. Idempotent; installs
# only what is missing.
set -euo pipefail

need=()
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v python3 >/dev/null || need+=(python3)
command -v timeout >/dev/null || need+=(coreutils)
command -v kill >/dev/null || need+=(procps)
# ss shows a listener's accept queue (the fault tests); jq runs the
# signature checks docs/records.md gives reviewers.
command -v ss >/dev/null || need+=(iproute2)
command -v jq >/dev/null || need+=(jq)
# h2load drives many HTTP/2 streams through the gateway in the client tests.
command -v h2load >/dev/null || need+=(nghttp2-client)
# g++ builds libFuzzer for the fuzz smoke run.
command -v g++ >/dev/null || need+=(g++)

if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}"
fi

# The ops checks and the session-image client test: systemd-analyze, nft,
# NSS tools, wget, a JDK, promtool (unpacked, not installed as a service).
"$(dirname "$0")/install-ops-tools.sh"
