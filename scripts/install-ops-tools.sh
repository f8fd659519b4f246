#!/usr/bin/env bash
# Installs what scripts/check-ops.sh and the session-image test
# (tests/tests/session_image.rs) need on a Debian machine: systemd-analyze,
# nft, unshare, nsenter and setpriv, ip, NSS's certutil and tstclnt, wget
# (Debian's is built with GnuTLS), a JDK (java, keytool), Chromium, and
# promtool.
# Idempotent; installs only what is missing.
#
# promtool comes from Debian's `prometheus` package, but installing that
# package would start a Prometheus server on a developer's machine, so the
# package is downloaded and only unpacked, into .tools/ (gitignored).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
updated=0
apt_update() {
  if [ "$updated" -eq 0 ]; then
    $sudo_cmd apt-get update -qq
    updated=1
  fi
}

need=()
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v nft >/dev/null || need+=(nftables)
command -v unshare >/dev/null || need+=(util-linux)
command -v setpriv >/dev/null || need+=(util-linux)
command -v nsenter >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
command -v certutil >/dev/null || need+=(libnss3-tools)
command -v tstclnt >/dev/null || need+=(libnss3-tools)
command -v wget >/dev/null || need+=(wget)
command -v java >/dev/null || need+=(openjdk-17-jdk-headless)
command -v keytool >/dev/null || need+=(openjdk-17-jdk-headless)
# Headless Chromium checks the session image's Chromium policy (trust and
# encrypted client hello off) through the gateway: about a minute to
# install once; no service.
command -v chromium >/dev/null || need+=(chromium)
command -v python3 >/dev/null || need+=(python3)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v node >/dev/null || need+=(nodejs)
command -v git >/dev/null || need+=(git)
if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  echo "installing: ${need[*]}"
  apt_update
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}"
fi

tools=.tools
if [ ! -x "$tools/bin/promtool" ]; then
  echo "unpacking promtool from Debian's prometheus package into $tools/"
  dl=$(mktemp -d)
  trap 'rm -rf "$dl"' EXIT
  # apt-get download writes into the current directory; _apt cannot write
  # into a private temporary one, which only costs a warning.
  (cd "$dl" && apt-get download prometheus 2>/dev/null) ||
    { apt_update; (cd "$dl" && apt-get download prometheus 2>/dev/null); }
  mkdir -p "$tools/prometheus" "$tools/bin"
  dpkg-deb -x "$dl"/prometheus_*.deb "$tools/prometheus"
  ln -sf ../prometheus/usr/bin/promtool "$tools/bin/promtool"
  "$tools/bin/promtool" --version | head -1
fi
