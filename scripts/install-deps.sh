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
# The certificate bundle's verifier (verifier/verify_bundle.py) and the
# demo's software passkey (scripts/demo-passkey.py) use Python's
# cryptography package, and nothing else outside the standard library.
python3 -c 'import cryptography' 2>/dev/null || need+=(python3-cryptography)
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
  # dig asks the gateway's DNS answerer in the session DNS tests; unshare
  # and mount (util-linux, mount) give a client its own /etc/resolv.conf.
  command -v dig >/dev/null || need+=(bind9-dnsutils)
  command -v unshare >/dev/null || need+=(util-linux)
  command -v mount >/dev/null || need+=(mount)
  # The tests' own Web Push endpoint (tests/peers/push_endpoint.py)
  # decrypts and verifies with Python's cryptography package.
  python3 -c 'import cryptography' 2>/dev/null || need+=(python3-cryptography)
fi

# PostgreSQL's server binaries for the replicated store's tests
# (scripts/postgres.sh runs a server of its own in a temporary folder): the
# package is installed without its system cluster, and nothing is started.
pg_server=0
if [ "$demo" -eq 0 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
  pg_server=1
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  policy_made=0
  if [ "$pg_server" -eq 1 ]; then
    # No "main" cluster made, and no service started by the package.
    $sudo_cmd mkdir -p /etc/postgresql-common
    if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
      echo "create_main_cluster = false" | $sudo_cmd tee /etc/postgresql-common/createcluster.conf >/dev/null
    fi
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
      $sudo_cmd chmod 755 /usr/sbin/policy-rc.d
      policy_made=1
    fi
  fi
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq \
    -o Dpkg::Options::=--force-confold "${need[@]}"
  if [ "$policy_made" -eq 1 ]; then $sudo_cmd rm -f /usr/sbin/policy-rc.d; fi
fi

# The ops checks, the session-image client test and the browser tests:
# systemd-analyze, nft, NSS tools, wget, a JDK, Chromium, promtool
# (unpacked, not installed as a service), axe-core (pinned, from the npm
# registry, into .tools/). The demo needs none of them.
if [ "$demo" -eq 0 ]; then
    "$(dirname "$0")/install-ops-tools.sh"
fi
