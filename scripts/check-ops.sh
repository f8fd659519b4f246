#!/usr/bin/env bash
# Checks the operator's kit in ops/ with the tools that read it:
# - the systemd units: `systemd-analyze verify` (against the binaries just
#   built: a copy of each unit with its ExecStart paths pointed at them, so
#   nothing is installed) with any warning counted as a failure, the
#   hardening every unit must keep, and `systemd-analyze security` under a
#   threshold;
# - ops/nftables.conf: `nft -c -f` inside a network namespace of its own
#   (the host's ruleset is never read or touched);
# - the Prometheus rules: `promtool check rules` and `promtool test rules`;
# - the Grafana dashboard: it parses, every query names only metrics of
#   ops/prometheus/metrics.txt, and promtool parses every query;
#   and every alert has its section in docs/runbook.md.
# Tools: scripts/install-ops-tools.sh. BIN_DIR: where the gateway and
# control-stub binaries are (default target/debug).
set -euo pipefail
cd "$(dirname "$0")/.."

bin_dir=$(realpath "${BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}")
promtool=.tools/bin/promtool
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "check-ops: $*" >&2
  exit 1
}

# --- systemd units
required=(NoNewPrivileges=yes ProtectSystem=strict MemoryDenyWriteExecute=yes PrivateTmp=yes
  ProtectHome=yes LimitCORE=0 LimitNOFILE= CapabilityBoundingSet= User= RestrictAddressFamilies=)
for unit in ops/systemd/*.service; do
  name=$(basename "$unit")
  for bin in gateway control-stub; do
    [ -x "$bin_dir/$bin" ] || fail "$bin_dir/$bin is missing: build the binaries first"
  done
  sed -e "s#/usr/local/bin/gateway #$bin_dir/gateway #g" \
    -e "s#/usr/local/bin/control-stub #$bin_dir/control-stub #g" "$unit" >"$tmp/$name"
  out=$(systemd-analyze verify --man=no "$tmp/$name" 2>&1) || fail "$name: $out"
  [ -z "$out" ] || fail "$name: systemd-analyze verify warned: $out"
  for key in "${required[@]}"; do
    grep -q "^$key" "$unit" || fail "$name: no $key"
  done
  # Exposure 0-10 (x10 here): both units score under 2 today.
  systemd-analyze security --offline=yes --threshold=25 "$tmp/$name" >"$tmp/security.txt" 2>&1 ||
    fail "$name: exposure above 2.5: $(tail -1 "$tmp/security.txt")"
  echo "$name: verified; $(tail -1 "$tmp/security.txt" | sed 's/^→ //')"
done
grep -q '^ExecReload=/bin/kill -HUP \$MAINPID' ops/systemd/talos-gateway.service || fail "gateway unit: no ExecReload"
grep -q '^CapabilityBoundingSet=CAP_NET_BIND_SERVICE$' ops/systemd/talos-gateway.service ||
  fail "gateway unit: capabilities other than CAP_NET_BIND_SERVICE"

# --- nftables: checked in a network namespace of its own; as a user other
# than root, in a user namespace too.
ns=(unshare --net)
[ "$(id -u)" -eq 0 ] || ns=(unshare --map-root-user --net)
"${ns[@]}" -- nft -c -f ops/nftables.conf || fail "ops/nftables.conf does not load"
echo "ops/nftables.conf: nft -c passed"

# --- Prometheus rules and the dashboard
"$promtool" check rules ops/prometheus/talos.rules.yml
"$promtool" test rules ops/prometheus/tests/*.test.yml
python3 scripts/check-ops-metrics.py ops/prometheus/metrics.txt ops/prometheus/talos.rules.yml \
  ops/grafana/talos.json docs/runbook.md "$tmp/dashboard-queries.yml"
"$promtool" check rules "$tmp/dashboard-queries.yml" >/dev/null ||
  fail "a dashboard query does not parse: $("$promtool" check rules "$tmp/dashboard-queries.yml" 2>&1 | tail -3)"
echo "ops: all checks passed"
