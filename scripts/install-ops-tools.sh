#!/usr/bin/env bash
# Installs what scripts/check-ops.sh and the session-image test
# (tests/tests/session_image.rs) need on a Debian machine: systemd-analyze,
# nft, unshare, nsenter and setpriv, ip, NSS's certutil and tstclnt, wget
# (Debian's is built with GnuTLS), a JDK (java, keytool), Chromium, and
# promtool; and what the browser tests (tests/src/browser) drive Chromium
# with: NSS's certutil for the browser's trust, and axe-core.
# Idempotent; installs only what is missing, so once installed it runs
# offline.
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
# encrypted client hello off) through the gateway, and is the browser the
# people-facing tests drive over the DevTools protocol: about a minute to
# install once; no service.
command -v chromium >/dev/null || need+=(chromium)
command -v python3 >/dev/null || need+=(python3)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v node >/dev/null || need+=(nodejs)
# npm fetches axe-core (below); Debian packages it apart from nodejs.
command -v npm >/dev/null || need+=(npm)
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
  trap 'rm -rf "${dl:-}" "${axe_dl:-}"' EXIT
  # apt-get download writes into the current directory; _apt cannot write
  # into a private temporary one, which only costs a warning.
  (cd "$dl" && apt-get download prometheus 2>/dev/null) ||
    { apt_update; (cd "$dl" && apt-get download prometheus 2>/dev/null); }
  mkdir -p "$tools/prometheus" "$tools/bin"
  dpkg-deb -x "$dl"/prometheus_*.deb "$tools/prometheus"
  ln -sf ../prometheus/usr/bin/promtool "$tools/bin/promtool"
  "$tools/bin/promtool" --version | head -1
fi

# axe-core, the accessibility check the browser tests run inside Chromium
# (tests/src/browser/axe.rs reads .tools/axe-core/node_modules/axe-core/
# axe.min.js and checks its banner names this version). The registry's
# tarball is fetched with npm and checked against the integrity pinned
# here before it is unpacked, so a changed tarball is refused.
axe_version=4.14.1
axe_integrity="sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
axe_dir="$tools/axe-core/node_modules/axe-core"
if ! head -n 1 "$axe_dir/axe.min.js" 2>/dev/null | grep -qx "/\*! axe v$axe_version"; then
  echo "fetching axe-core $axe_version from the npm registry into $axe_dir/"
  axe_dl=$(mktemp -d)
  trap 'rm -rf "${dl:-}" "${axe_dl:-}"' EXIT
  npm pack --silent --pack-destination "$axe_dl" "axe-core@$axe_version" >/dev/null
  tarball="$axe_dl/axe-core-$axe_version.tgz"
  got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  if [ "$got" != "$axe_integrity" ]; then
    echo "axe-core $axe_version: the tarball's digest is $got, not the pinned $axe_integrity" >&2
    exit 1
  fi
  rm -rf "$axe_dir"
  mkdir -p "$axe_dir"
  tar -xzf "$tarball" -C "$axe_dir" --strip-components=1 --no-same-owner
  head -n 1 "$axe_dir/axe.min.js"
fi
