#!/usr/bin/env bash
# The demo: a gateway, a DNS server and a TLS origin on loopback, and real
# clients (curl, openssl s_client, python3) showing what the gateway lets
# through, what it refuses and what it records. Everything it starts is
# stopped by its PID when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo build --workspace --bins --locked -q
bin=target/debug

work=$(mktemp -d /tmp/talos-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
json_field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())[sys.argv[1]])' "$1"; }
# Wait (at most 20 s) for a process's ready line in FILE and print it.
ready_line() {
  for _ in $(seq 200); do
    if [ -s "$1" ]; then head -n1 "$1"; return 0; fi
    sleep 0.1
  done
  echo "demo: no ready line in $1" >&2; return 1
}

say "Starting the demo's DNS server and TLS origin (its own test CA) on 127.0.0.1"
"$bin/demo-peers" "$work" >"$work/peers.out" &
pids+=("$!")
peers_line=$(ready_line "$work/peers.out")
dns=$(echo "$peers_line" | json_field dns)
origin=$(echo "$peers_line" | json_field origin)
echo "dns $dns, origin $origin"

# A credential the session never sees: the gateway reads it from a file.
printf 'demo-T0KEN-%s\n' "$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$work/demo-token"
chmod 600 "$work/demo-token"

cat >"$work/gateway.toml" <<TOML
gateway_id = "gw-demo"
[listen]
data = "127.0.0.1:0"
admin = "127.0.0.1:0"
[records]
path = "$work/records.jsonl"
[resolver]
nameservers = ["$dns"]
timeout_ms = 500
attempts = 1
# The demo origin lives on loopback: only 127.0.0.1 is let through.
permit_internal = ["127.0.0.1/32"]
[upstream]
port = ${origin##*:}
# The demo origin's own test CA, trusted beside the public roots.
extra_trust_anchors = ["$work/origin-ca.pem"]
[[session]]
id = "sbx-demo"
tenant = "acme"
sources = ["127.0.0.2"]
allowlist = ["origin.demo.test", "internal.demo.test", "metadata.demo.test", "gone.demo.test"]
# The session CA certificate: the session's only trust anchor.
trust_file = "$work/session-ca.pem"
# The gateway adds this credential to every request for origin.demo.test.
attach = ["DEMO_TOKEN=origin.demo.test:authorization:Bearer"]

[[secret]]
name = "DEMO_TOKEN"
file = "$work/demo-token"
TOML

say "Checking the config"
"$bin/gateway" check-config "$work/gateway.toml"

say "Starting the gateway (session sbx-demo speaks from 127.0.0.2)"
"$bin/gateway" run --config "$work/gateway.toml" >"$work/gateway.out" 2>"$work/gateway.log" &
pids+=("$!")
gw_line=$(ready_line "$work/gateway.out")
gw=$(echo "$gw_line" | json_field data)
admin=$(echo "$gw_line" | json_field admin)
port=${gw##*:}
echo "gateway data $gw, admin $admin"

through() { # name, then curl options
  local name=$1; shift
  curl -sS --max-time 5 --interface 127.0.0.2 --cacert "$work/session-ca.pem" \
    --connect-to "$name:443:127.0.0.1:$port" "$@" "https://$name${path:-/hello?token=not-recorded}" 2>&1 || true
}

say "The session CA (made in the gateway's memory for this session alone)"
grep -o 'ca_digest="[0-9a-f]*"' "$work/gateway.log" | head -1 || true
openssl x509 -in "$work/session-ca.pem" -noout -subject -ext nameConstraints 2>/dev/null | sed 's/^/  /'

say "Allowed: curl over HTTP/1.1 and HTTP/2, trusting only the session CA; the gateway re-originates TLS 1.3"
through origin.demo.test --http1.1
through origin.demo.test --http2
path=/download/10485760 through origin.demo.test --http1.1 -o /dev/null \
  -w "downloaded %{size_download} bytes over HTTP/%{http_version}, streamed (no whole-body buffering)\n"

say "Credentials by name: the session sends its own Authorization; the gateway replaces it"
path=/echo through origin.demo.test --http2 -H "Authorization: Bearer session-made-up" | python3 -c '
import json, sys
e = json.load(sys.stdin)
print("the origin received:", [v for k, v in e["headers"] if k == "authorization"], "(the echo is masked on its way back)")'
say "Every echo of the credential is masked: in a header, the body, the body gzip-compressed, base64"
path="/reflect?how=header" through origin.demo.test -s -D - -o /dev/null | grep -i '^x-reflected'
path="/reflect?how=body" through origin.demo.test
path="/reflect?how=body&enc=gzip" through origin.demo.test --http2
path="/reflect?how=base64" through origin.demo.test; echo
echo "and the reviewers' tool, on a reply of your own:"
printf 'token=%s\n' "$(cat "$work/demo-token")" | "$bin/gateway" mask --secret-file "DEMO_TOKEN=$work/demo-token"

say "Refused per request (HTTP answers with the reason): another Host, a WebSocket upgrade"
through origin.demo.test --http1.1 -H "Host: elsewhere.example" -i | grep -iE '^HTTP|^hangar-refusal|refusal'
through origin.demo.test --http1.1 -H "Connection: Upgrade" -H "Upgrade: websocket" -i | grep -iE '^HTTP|^hangar-refusal'

say "Refused: a source address that is no session's (127.0.0.9)"
curl -sS --max-time 5 --interface 127.0.0.9 --cacert "$work/session-ca.pem" \
  --connect-to "origin.demo.test:443:127.0.0.1:$port" https://origin.demo.test/ 2>&1 || true

say "Refused: plain HTTP is not TLS"
curl -sS --max-time 5 --interface 127.0.0.2 "http://127.0.0.1:$port/" 2>&1 || true

say "Refused: openssl s_client without a server name"
openssl s_client -connect "127.0.0.1:$port" -bind 127.0.0.2:0 -noservername </dev/null 2>&1 | grep -m1 -i alert || true

say "Refused: a name that is not on the session's allowlist"
through api.example.com

say "Refused: names that resolve to internal addresses (10.0.0.1, ::ffff:169.254.169.254)"
through internal.demo.test
through metadata.demo.test

say "Refused: a name that does not resolve"
through gone.demo.test

say "Refused: a hello with an encrypted client hello extension (python3)"
python3 - "$port" gateway/testdata/hellos/crafted-curl-http2-ech.bin <<'PY'
import socket, sys
s = socket.socket(); s.bind(("127.0.0.2", 0)); s.connect(("127.0.0.1", int(sys.argv[1])))
s.sendall(open(sys.argv[2], "rb").read()); s.settimeout(5)
print("gateway answered with TLS alert bytes:", s.recv(64).hex(" "))
PY

sleep 0.5
say "The records: one per connection, allowed or refused"
python3 - "$work/records.jsonl" <<'PY'
import json, sys
print(f"{'verdict':<23} {'sni':<19} {'alpn in/out':<13} {'cause':<24} {'bytes in/out':<16} {'masked':<14} requests")
for line in open(sys.argv[1]):
    r = json.loads(line)
    alpn = f"{r.get('alpn_session') or '-'}/{r.get('alpn_upstream') or '-'}"
    reqs = "; ".join(f"{q['method']} {q['path']} {q['status']}" + (f" {q['refusal']}" if q.get('refusal') else "")
                     for q in r.get("requests", []))
    print(f"{r['verdict']:<23} {str(r.get('sni') or '-'):<19} {alpn:<13} {str(r.get('cause') or '-'):<24} "
          f"{str(r['bytes_from_session']) + '/' + str(r['bytes_to_session']):<16} "
          f"{','.join(f'{k}:{v}' for k, v in r.get('masked', {}).items()) or '-':<14} {reqs}")
print("(no query string, header value, body or secret is ever recorded)")
PY

say "Metrics (admin listener)"
curl -sS "http://$admin/metrics" | grep '^gateway_connections_total' || true

say "The credential appears nowhere in the gateway's log or records"
if grep -qF "$(cat "$work/demo-token")" "$work/gateway.log" "$work/records.jsonl"; then
  echo "FOUND: this is a bug"; exit 1
else
  echo "not found in gateway.log nor records.jsonl"
fi

say "Done. Files are in $work"
