#!/usr/bin/env bash
# The demo: the control stub, a gateway, a DNS server and a TLS origin on
# loopback, and real clients (curl, openssl s_client, python3). The control
# stub serves the people's web app too: alice enrols a software passkey
# (scripts/demo-passkey.py) and decides the Lock's cards with it, as her
# browser would. A session is started through the control stub; the demo
# shows what the gateway lets through, masks, holds for alice, refuses and
# records, then pauses, resumes and stops the session and prints and
# verifies its certificate. Everything it starts is
# stopped by its PID when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh --demo
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
# A field of the JSON object on stdin (benches/harness/src/bin/bench-figures.rs).
json_field() { "$bin/bench-figures" json-field "$1"; }
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

say "Making the control channel's identities (control-stub init: a control CA, the stub's and the gateway's certificates)"
"$bin/control-stub" init --dir "$work/control" --gateway gw-demo >/dev/null
ls "$work/control" | sed 's/^/  /'

say "The people's web app: a certificate for people.demo.test from a CA of the demo's own (openssl)"
# Passkeys are bound to the origin, port and all, and the web app sends
# decisions to the gateway's control listener, which starts after it: pick
# both free ports first.
read -r web_port ctl_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
rp_id=people.demo.test
web_origin="https://$rp_id:$web_port"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj "/CN=TALOS demo people web CA" -keyout "$work/web-ca.key" -out "$work/web-ca.pem" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$rp_id" \
  -keyout "$work/web.key" -out "$work/web.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n' \
  "$rp_id" >"$work/web.ext"
openssl x509 -req -in "$work/web.csr" -CA "$work/web-ca.pem" -CAkey "$work/web-ca.key" -CAcreateserial \
  -days 1 -extfile "$work/web.ext" -out "$work/web.pem" 2>/dev/null
chmod 600 "$work/web-ca.key" "$work/web.key"
openssl x509 -in "$work/web.pem" -noout -subject -ext subjectAltName 2>/dev/null | tr -s ' \n' ' ' | sed 's/^/  /; s/ *$/\n/'

say "Starting the control stub (control-stub serve): the gateways' batch consumer (mutual TLS) and the people's web app (HTTPS, $web_origin)"
"$bin/control-stub" --db "$work/stub.db" --control-dir "$work/control" serve --listen 127.0.0.1:0 \
  --web-listen "127.0.0.1:$web_port" --web-origin "$web_origin" --web-rp-id "$rp_id" \
  --web-cert "$work/web.pem" --web-key "$work/web.key" --gateway "gw-demo=127.0.0.1:$ctl_port" \
  >"$work/serve.out" 2>"$work/serve.log" &
pids+=("$!")
serve_line=$(ready_line "$work/serve.out")
plane=$(echo "$serve_line" | json_field listening)
web=$(echo "$serve_line" | json_field web)
echo "control plane $plane, people's web app $web (rp id $rp_id)"

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
[control]
# Where the control stub opens and closes sessions, and the web app sends
# people's decisions (serve --gateway names it).
listen = "127.0.0.1:$ctl_port"
ca_file = "$work/control/ca.pem"
cert_file = "$work/control/gw-demo.pem"
key_file = "$work/control/gw-demo.key"
# Signs record batches and drop reports; made (0600) at first start.
signing_key_file = "$work/gw-demo-signing.key"
# Records go to the control stub in signed batches, spooled until acknowledged.
plane = "$plane"
spool_dir = "$work/spool"
batch_interval_ms = 200
[dns]
# The sessions' DNS: listed names get their addresses, every other name
# NXDOMAIN and no lookup (nftables brings a session's port 53 here).
listen = "127.0.0.1:0"
[process]
# Where \`gateway reload\` and \`gateway upgrade\` reach the running process.
socket = "$work/gateway.sock"
TOML

say "Checking the config"
"$bin/gateway" check-config "$work/gateway.toml"

say "Starting the gateway (no session yet: the control stub opens them)"
"$bin/gateway" run --config "$work/gateway.toml" >"$work/gateway.out" 2>"$work/gateway.log" &
pids+=("$!")
gw_line=$(ready_line "$work/gateway.out")
gw=$(echo "$gw_line" | json_field data)
admin=$(echo "$gw_line" | json_field admin)
ctl=$(echo "$gw_line" | json_field control)
answerer=$(echo "$gw_line" | json_field dns)
port=${gw##*:}
echo "gateway data $gw, admin $admin, control $ctl, session DNS $answerer"

stub() { "$bin/control-stub" --db "$work/stub.db" --control-dir "$work/control" --gateway "gw-demo=$ctl" "$@"; }

say "The account: its egress list and tenant acme's secret (the value is read from a file, never printed)"
for name in origin.demo.test internal.demo.test metadata.demo.test gone.demo.test; do
  stub policy egress add "$name" >/dev/null
done
echo "egress list: $(stub policy egress list | python3 -c 'import json,sys; print(", ".join(json.load(sys.stdin)))')"
stub secret set DEMO_TOKEN --tenant acme --from-file "$work/demo-token" >/dev/null
say "alice enrols a passkey: a one-time link from the operator, opened with her authenticator (a software one, scripts/demo-passkey.py)"
# Only a person with a passkey can be named by a Lock rule; her decisions
# carry her device's signature, which the gateway checks itself.
passkey() { python3 scripts/demo-passkey.py "$@" --ca "$work/web-ca.pem" --connect "$web"; }
enrol_link=$(stub people enroll alice --role approver --web-origin "$web_origin" | json_field link)
echo "control-stub people enroll alice --role approver: a link good for 15 minutes and one passkey, $web_origin/enrol#..."
passkey enrol "$enrol_link" --state "$work/alice.passkey" | python3 -c '
import json, sys
e = json.load(sys.stdin)
print(" ", e["person"], "(" + e["role"] + ") registered an", e["algorithm"], "passkey for rp id", e["rp_id"],
      "(attestation none, user verified; its private key stays in the demo folder, 0600)")'
# mallory enrols too, but no rule names her.
passkey enrol "$(stub people enroll mallory --role approver --web-origin "$web_origin" | json_field link)" \
  --state "$work/mallory.passkey" >/dev/null
echo "  mallory registered a passkey as well"

# The Lock: a POST under /deploy on origin.demo.test waits for alice.
stub policy lock add --destination origin.demo.test --method POST --path-prefix /deploy \
  --mode every_request --approver alice >/dev/null
echo "Lock rules: $(stub policy lock list | python3 -c 'import json,sys; print("; ".join(r["id"] + ": " + r["method"] + " " + r["destination"] + r["path_prefix"] + "* needs " + " or ".join(r["approvers"]) for r in json.load(sys.stdin)))')"
echo "tenant acme's secrets: $(stub secret list --tenant acme | python3 -c 'import json,sys; print(", ".join(s["name"] for s in json.load(sys.stdin)))')"

say "Starting a session (mode commands, speaking from 127.0.0.2) with the credential attached by name"
start=$(stub sandbox start --tenant acme --source 127.0.0.2 \
  --allow origin.demo.test --allow internal.demo.test --allow metadata.demo.test --allow gone.demo.test \
  --attach DEMO_TOKEN=origin.demo.test:authorization:Bearer --mode commands)
echo "$start"
sid=$(echo "$start" | json_field session_id)
# What the session's instance is given: the CA its gateway made, to trust.
stub sandbox trust "$sid" >"$work/session-ca.pem"

through() { # name, then curl options
  local name=$1; shift
  curl -sS --max-time 5 --interface 127.0.0.2 --cacert "$work/session-ca.pem" \
    --connect-to "$name:443:127.0.0.1:$port" "$@" "https://$name${path:-/hello?token=not-recorded}" 2>&1 || true
}

say "The session CA (made in the gateway's memory for this session alone)"
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

say "The session's DNS, answered by the gateway (python3 speaks DNS from 127.0.0.2; a source that is no session's gets REFUSED)"
ask_dns() { # name type source
  python3 - "$answerer" "$1" "$2" "$3" <<'PY'
import socket, struct, sys
(host, port), name, qtype, source = sys.argv[1].rsplit(":", 1), sys.argv[2], sys.argv[3], sys.argv[4]
types = {"A": 1, "AAAA": 28, "HTTPS": 65}
q = struct.pack(">HHHHHH", 0x7A10, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack(">HH", types[qtype], 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((source, 0)); s.settimeout(3)
s.sendto(q, (host, int(port)))
r = s.recv(1232)
rcode = ["NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED"][r[3] & 0x0F]
answers, i = struct.unpack(">H", r[6:8])[0], len(q)
addrs = []
for _ in range(answers):
    i += 2  # the name, a pointer to the question
    t, _, ttl, n = struct.unpack(">HHIH", r[i:i + 10]); i += 10
    if t == 1: addrs.append("%s (ttl %d)" % (socket.inet_ntoa(r[i:i + n]), ttl))
    i += n
print("  %-5s %-28s from %-10s -> %s %s" % (qtype, name, source, rcode, ", ".join(addrs)))
PY
}
ask_dns origin.demo.test A 127.0.0.2
ask_dns origin.demo.test HTTPS 127.0.0.2
ask_dns approvals.hangar.internal A 127.0.0.2
ask_dns api.example.com A 127.0.0.2
ask_dns c2VjcmV0.exfil.example A 127.0.0.2
ask_dns origin.demo.test A 127.0.0.9

say "Refused: a hello with an encrypted client hello extension (python3)"
python3 - "$port" gateway/testdata/hellos/crafted-curl-http2-ech.bin <<'PY'
import socket, sys
s = socket.socket(); s.bind(("127.0.0.2", 0)); s.connect(("127.0.0.1", int(sys.argv[1])))
s.sendall(open(sys.argv[2], "rb").read()); s.settimeout(5)
print("gateway answered with TLS alert bytes:", s.recv(64).hex(" "))
PY

# Print the gist of a control-stub transition (JSON on stdin).
show() {
  python3 -c '
import json, sys
t = json.load(sys.stdin)
what = sys.argv[1]
print("state:", t["state"], " attempt:", t["attempt"])
if what == "pause":
    for r in t["reports"]:
        print("signed drop report from", r["gateway_id"] + ": reason", r["reason"] + ", CA",
              r["ca_digest"][:16] + "... destroyed, secrets dropped:", ", ".join(r["secrets"]))
if what == "resume":
    for ca in t["ca"]:
        print("new CA from", ca["gateway_id"] + ":", ca["digest"][:16] + "...")
if what == "stop":
    for s in t["reset"]:
        how = "stub response" if s["step"] <= 3 else "confirmed by the signed drop report"
        print(" ", s["step"], s["name"].ljust(22), "confirmed" if s["confirmed"] else "NOT CONFIRMED", "(" + how + ")")
' "$1"
}

# The SHA-384 of each certificate in a PEM bundle, as the session can compute it.
digest_of() { "$bin/demo-check" digest "$1"; }

# Wait (at most 20 s) for a pending approval card and print its id.
next_card() {
  for _ in $(seq 200); do
    local id
    id=$(stub approvals list | python3 -c 'import json,sys; c=json.load(sys.stdin); print(c[0]["id"] if c else "")')
    if [ -n "$id" ]; then echo "$id"; return 0; fi
    sleep 0.1
  done
  echo "demo: no approval card came" >&2; return 1
}

say "Approval holds: a POST to /deploy waits for a named person; other requests go on meanwhile"
path=/deploy/v1 through origin.demo.test --http1.1 -X POST -s -o /dev/null -w "the held POST /deploy/v1 got %{http_code}\n" >"$work/held1.out" &
held=$!
card=$(next_card)
stub approvals list | python3 -c 'import json,sys; c=json.load(sys.stdin)[0]; print("card for", ", ".join(c["approvers"]) + ":", c["sentence"]); print("digest", c["digest"][:16] + "...")'
path=/hello through origin.demo.test --http2
echo "a decision from the CLI alone (the relay's signature, no person's device) is refused:"
stub approvals approve "$card" --as alice 2>&1 | sed 's/^/  /' || true
echo "alice signs in to the web app with her passkey and approves the card, her passkey signing the card's digest and the verdict:"
passkey decide "$card" approved --state "$work/alice.passkey" | python3 -c '
import json,sys; d=json.load(sys.stdin); print(" ", d["decision"], "by", d["approver"], "->", d["outcome"], "(the gateway checked her assertion)")'
wait "$held" || true
cat "$work/held1.out"

path=/deploy/v2 through origin.demo.test --http1.1 -X POST -s -D - -o /dev/null >"$work/held2.out" &
held=$!
card=$(next_card)
digest=$(stub approvals list | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["digest"])')
echo "mallory is not listed: with her own passkey, over this card's digest, she is refused:"
passkey decide "$card" declined --digest "$digest" --state "$work/mallory.passkey" 2>&1 | sed 's/^/  /' || true
echo "alice declines it with her passkey:"
passkey decide "$card" declined --state "$work/alice.passkey" | python3 -c '
import json,sys; d=json.load(sys.stdin); print(" ", d["decision"], "by", d["approver"], "->", d["outcome"])'
wait "$held" || true
grep -iE '^HTTP|^hangar-refusal' "$work/held2.out"

say "Reload: a config with a bad line is refused, naming it; the running config stays whole"
cp "$work/gateway.toml" "$work/gateway.toml.good"
sed -i 's/^batch_interval_ms = 200$/batch_interval_ms = 200\n[limits]\nhello_max_bytes = 10/' "$work/gateway.toml"
"$bin/gateway" reload --config "$work/gateway.toml" 2>&1 >/dev/null | sed 's/^/  /' || true
cp "$work/gateway.toml.good" "$work/gateway.toml"
"$bin/gateway" reload --config "$work/gateway.toml" | python3 -c 'import json,sys; a=json.load(sys.stdin); print(" ", a["message"], "- config", a["digest"][:16] + "...")'
path=/hello through origin.demo.test --http2

say "Upgrade in place: a new gateway process takes over every live session and the listeners; the session's CA stays"
old_pid=$(echo "$gw_line" | json_field pid)
new_pid=$("$bin/gateway" upgrade --config "$work/gateway.toml" | json_field pid)
pids+=("$new_pid")
echo "process $new_pid took over from process $old_pid (same instance, the CA keys handed over memory to memory)"
for _ in $(seq 100); do kill -0 "$old_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$old_pid" 2>/dev/null && echo "the old process still drains" || echo "the old process has drained and exited"
echo "the same session CA file, a new connection:"
path=/hello through origin.demo.test --http2

say "Pause: the gateway closes the session's connections, destroys its CA and drops the credential"
# A slow download that is still running when the pause comes.
path=/download/104857600 through origin.demo.test --http1.1 --limit-rate 2M -o /dev/null \
  -w "the download in flight stopped after %{size_download} bytes\n" >"$work/inflight.out" &
inflight=$!
sleep 1
stub sandbox pause "$sid" | show pause
wait "$inflight" || true
cat "$work/inflight.out"
echo "a new connection while paused:"
through origin.demo.test

say "Resume: a new attempt with a new CA (new digest), attachments read from the secret store now"
stub sandbox resume "$sid" | show resume
cp "$work/session-ca.pem" "$work/session-ca-attempt-1.pem"
stub sandbox trust "$sid" >"$work/session-ca.pem"
echo "digest before the pause: $(digest_of "$work/session-ca-attempt-1.pem" | cut -c1-16)..."
echo "digest after the resume: $(digest_of "$work/session-ca.pem" | cut -c1-16)..."
path=/echo through origin.demo.test --http2 | python3 -c '
import json, sys
e = json.load(sys.stdin)
print("allowed again; the origin received:", [v for k, v in e["headers"] if k == "authorization"])'
echo "the first attempt's CA no longer works:"
curl -sS --max-time 5 --interface 127.0.0.2 --cacert "$work/session-ca-attempt-1.pem" \
  --connect-to "origin.demo.test:443:127.0.0.1:$port" https://origin.demo.test/ 2>&1 | head -n1 || true

say "Stop: the sandbox reset (steps 1-3 are stub responses; 4-5 are confirmed by the gateway's signed drop report)"
stub sandbox stop "$sid" | show stop

sleep 0.5
say "The records: one per connection, allowed or refused"
python3 - "$work/records.jsonl" <<'PY'
import json, sys
print(f"{'verdict':<23} {'sni':<19} {'alpn in/out':<13} {'cause':<24} {'bytes in/out':<16} {'masked':<14} requests")
dns = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "dns":
        dns.append(r)
        continue
    alpn = f"{r.get('alpn_session') or '-'}/{r.get('alpn_upstream') or '-'}"
    reqs = "; ".join(f"{q['method']} {q['path']} {q['status']}" + (f" {q['refusal']}" if q.get('refusal') else "")
                     for q in r.get("requests", []))
    print(f"{r['verdict']:<23} {str(r.get('sni') or '-'):<19} {alpn:<13} {str(r.get('cause') or '-'):<24} "
          f"{str(r['bytes_from_session']) + '/' + str(r['bytes_to_session']):<16} "
          f"{','.join(f'{k}:{v}' for k, v in r.get('masked', {}).items()) or '-':<14} {reqs}")
print("(no query string, header value, body or secret is ever recorded)")
for r in dns:
    print(f"the session's DNS ({r['session_id']}): {r['queries']}; {r['refused_names']} distinct names refused,"
          f" the longest {r['longest_refused_name']} bytes (no name is recorded)")
PY

say "Metrics (admin listener)"
curl -sS "http://$admin/metrics" | grep '^gateway_connections_total' || true

say "The session certificate, from the control stub's store (records as the gateway signed them in batches)"
# Wait for the last batches to be acknowledged, then print and check it.
for _ in $(seq 100); do
  [ -z "$(ls "$work/spool"/*.batch 2>/dev/null)" ] && break
  sleep 0.1
done
stub certificate "$sid" >"$work/certificate.json"
# Print it and verify it against what the session and the gateway saw
# (tests/src/bin/demo-check.rs): exits non-zero if it does not hold.
"$bin/demo-check" "$work/certificate.json" "$work/records.jsonl" "$sid" "$work/session-ca-attempt-1.pem" "$work/session-ca.pem"

say "The credential appears nowhere in the gateway's log or records"
if grep -qF "$(cat "$work/demo-token")" "$work/gateway.log" "$work/records.jsonl" "$work/certificate.json" "$work/serve.log"; then
  echo "FOUND: this is a bug"; exit 1
else
  echo "not found in gateway.log, records.jsonl, the certificate nor the control stub's log"
fi

say "The certificate bundle: the certificate with every signed batch, report and decision it rests on, and the keys that signed them"
stub certificate bundle "$sid" --out "$work/session.bundle" | python3 -c '
import json, sys
w = json.load(sys.stdin)["written"]
print("wrote", w["bytes"], "bytes:", w["batches"], "signed batches (" + ", ".join(
    g + " " + str(a) + "-" + str(b) for g, (a, b) in w["runs"].items()) + "),",
    w["reports"], "drop reports answered to closes,", w["proposals"], "cards,", w["keys"], "keys bound under the control CA")'
if grep -qF "$(cat "$work/demo-token")" "$work/session.bundle"; then
  echo "the credential is in the bundle: this is a bug"; exit 1
fi
# Only alice's public key leaves her passkey's file: its private scalar
# (hex, base64 or base64url) is in no log, record, certificate nor bundle.
python3 - "$work" <<'PY'
import base64, json, os, sys
from cryptography.hazmat.primitives import serialization
work = sys.argv[1]
key = serialization.load_pem_private_key(json.load(open(os.path.join(work, "alice.passkey")))["private_key_pem"].encode(), None)
d = key.private_numbers().private_value.to_bytes(32, "big")
forms = [d.hex().encode(), base64.b64encode(d).rstrip(b"="), base64.urlsafe_b64encode(d).rstrip(b"=")]
for f in ("gateway.log", "serve.log", "records.jsonl", "certificate.json", "session.bundle"):
    if any(x in open(os.path.join(work, f), "rb").read() for x in forms):
        print("alice's private key is in", f + ": this is a bug"); sys.exit(1)
print("alice's passkey: its private key is in no log, record, certificate nor bundle (the bundle lists only her public key)")
PY

say "A reviewer checks it alone: verifier/verify_bundle.py (Python and its cryptography package; no code of the product)"
python3 verifier/verify_bundle.py "$work/session.bundle"

say "Done. Files are in $work"
