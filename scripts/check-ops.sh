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
#   and every alert has its section in docs/runbook.md, which its runbook
#   link names;
# - a live scrape: the gateway and `control-stub serve --metrics-listen`
#   just built, started on loopback (ports the kernel picks), their
#   /metrics checked against metrics.txt (every metric with its type,
#   labels and label values; histograms with buckets) and against every
#   series the rules and the dashboard select. Both are stopped by PID.
# Tools: scripts/install-ops-tools.sh. BIN_DIR: where the gateway and
# control-stub binaries are (default target/debug).
set -euo pipefail
cd "$(dirname "$0")/.."

bin_dir=$(realpath "${BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}")
promtool=.tools/bin/promtool
tmp=$(mktemp -d)
pids=()
stop() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop; rm -rf "$tmp"' EXIT
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
# `systemctl reload` must report the reload's outcome: the command that
# asks the gateway and exits 1 on a refusal, on the file ExecStart= runs.
grep -q '^ExecReload=/usr/local/bin/gateway reload --config /etc/talos-gateway/gateway.toml$' \
  ops/systemd/talos-gateway.service || fail "gateway unit: ExecReload= is not gateway reload on its config"
grep -q '^CapabilityBoundingSet=CAP_NET_BIND_SERVICE$' ops/systemd/talos-gateway.service ||
  fail "gateway unit: capabilities other than CAP_NET_BIND_SERVICE"

# --- nftables: checked in a network namespace of its own; as a user other
# than root, in a user namespace too.
ns=(unshare --net)
[ "$(id -u)" -eq 0 ] || ns=(unshare --map-root-user --net)
"${ns[@]}" -- nft -c -f ops/nftables.conf || fail "ops/nftables.conf does not load"
echo "ops/nftables.conf: nft -c passed"

# --- A live scrape of both programs, checked with the rules and the
# dashboard below
live=$tmp/live
mkdir -p "$live"
# The JSON ready line a process started with PID $1 writes to file $2 (at
# most 20 s; fails at once if the process exits).
ready_line() {
  for _ in $(seq 400); do
    if [ -s "$2" ]; then head -n1 "$2"; return 0; fi
    kill -0 "$1" 2>/dev/null || fail "$3 exited: $(tail -5 "$4")"
    sleep 0.05
  done
  fail "$3: no ready line in 20 s: $(tail -5 "$4")"
}
field() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
"$bin_dir/control-stub" init --dir "$live/control" --gateway gw-check >/dev/null
cat >"$live/gateway.toml" <<TOML
gateway_id = "gw-check"
[listen]
data = "127.0.0.1:0"
admin = "127.0.0.1:0"
[records]
path = "$live/records.jsonl"
[control]
listen = "127.0.0.1:0"
ca_file = "$live/control/ca.pem"
cert_file = "$live/control/gw-check.pem"
key_file = "$live/control/gw-check.key"
signing_key_file = "$live/gw-check-signing.key"
# A session on loopback, for one connection that is not TLS: refused
# not_tls, with its first bytes counted in gateway_hello_bytes.
[[session]]
id = "sess-check"
tenant = "ops"
sources = ["127.0.0.1"]
allowlist = ["example.test"]
TOML
"$bin_dir/gateway" run --config "$live/gateway.toml" >"$live/gateway.out" 2>"$live/gateway.log" &
pids+=("$!")
line=$(ready_line "$!" "$live/gateway.out" gateway "$live/gateway.log")
admin=$(field "$line" admin)
data=$(field "$line" data)
"$bin_dir/control-stub" --db "$live/stub.db" --control-dir "$live/control" \
  --gateway "gw-check=$(field "$line" control)" serve --listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 >"$live/serve.out" 2>"$live/serve.log" &
pids+=("$!")
line=$(ready_line "$!" "$live/serve.out" "control-stub serve" "$live/serve.log")
stub_metrics=$(field "$line" metrics)
curl -s --max-time 5 -o /dev/null "http://$data/" || true
# Its record, and so its count, is written once the gateway closes it.
for _ in $(seq 200); do
  curl -sSf --max-time 5 "http://$admin/metrics" >"$live/gateway.prom"
  grep -q '^gateway_connections_total{verdict="not_tls"} 1$' "$live/gateway.prom" && break
  sleep 0.1
done
grep -q '^gateway_connections_total{verdict="not_tls"} 1$' "$live/gateway.prom" ||
  fail "gateway: the connection that is not TLS is not counted in 20 s: $(tail -5 "$live/gateway.log")"
# The stub's gauges come with its first tick, stub_gateway_up with its
# first Describe of the member: both right after it starts.
stub_ready() {
  grep -q '^stub_gateway_up{gateway="gw-check"} 1$' "$live/stub.prom" &&
    grep -q '^stub_certificates_waiting ' "$live/stub.prom"
}
for _ in $(seq 200); do
  curl -sSf --max-time 5 "http://$stub_metrics/metrics" >"$live/stub.prom"
  stub_ready && break
  sleep 0.1
done
stub_ready || fail "control-stub serve: no Describe of gw-check or no tick in 20 s: $(tail -5 "$live/serve.log")"
stop

# --- Prometheus rules and the dashboard
"$promtool" check rules ops/prometheus/talos.rules.yml
"$promtool" test rules ops/prometheus/tests/*.test.yml
python3 scripts/check-ops-metrics.py ops/prometheus/metrics.txt ops/prometheus/talos.rules.yml \
  ops/grafana/talos.json docs/runbook.md "$tmp/dashboard-queries.yml" \
  --gateway-scrape "$live/gateway.prom" --stub-scrape "$live/stub.prom" --member gw-check
"$promtool" check rules "$tmp/dashboard-queries.yml" >/dev/null ||
  fail "a dashboard query does not parse: $("$promtool" check rules "$tmp/dashboard-queries.yml" 2>&1 | tail -3)"

echo "ops: all checks passed"
