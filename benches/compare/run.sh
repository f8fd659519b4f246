#!/usr/bin/env bash
# Side by side on loopback: the gateway against nginx, HAProxy and
# mitmproxy doing the same work (terminate TLS 1.3 with a leaf for the
# destination name, re-encrypt TLS 1.3 to the origin with certificate
# verification and upstream connection reuse, one worker each), plus a
# direct client -> origin baseline. Each figure runs in rounds that
# interleave the systems: every system once a round, back to back, in an
# order that rotates between rounds. Prints one Markdown table with the
# medians over the rounds and the ratios gateway/peer: the median of the
# per-round ratios and their spread, and a warning naming every ratio
# whose spread is too wide to read. Every run is bounded in time;
# everything started here is stopped by its PID on exit.
#
#   benches/compare/run.sh            # 5 rounds of 10 s per figure, 10,000 idle connections
#   QUICK=1 benches/compare/run.sh    # 3 rounds of 3 s per figure, 1,000 idle connections
#   AA=1 PEERS="" RELAY=0 benches/compare/run.sh   # A/A: the gateway against a twin of itself
#
# Knobs (environment): QUICK=1; DURATION=SECONDS (per load run, overrides
# QUICK); ROUNDS=N (rounds per figure, default 5, 3 with QUICK=1);
# AA=1 (a second, identical gateway, "gateway2", as one more peer: the
# harness's own noise, gw/gateway2); IDLE_CONNS=N (idle TLS connections held for the memory figure);
# IDLE_SOURCES=ADDR,... (client source addresses for them, each 127.0.0.x
# with its own ephemeral ports; the gateway's session lists them all);
# BIN_DIR=DIR (the release binaries, default $CARGO_TARGET_DIR/release or
# target/release); NO_BUILD=1 (use BIN_DIR as it is); NO_INSTALL=1 (do not
# apt-get/pip install); PEERS="nginx haproxy mitmproxy" (a subset);
# STRICT=1 (fail when a run loses requests or connections; speed is never
# judged); FIGURES="idle h1 h2 mib newconn resume" (a subset); RELAY=0 (leave out the plain
# TCP relay reference column); PASSTHROUGH=0 (leave out the gateway's
# passthrough column); QUIET_WAIT=SECONDS (wait for other jobs to
# leave the CPUs before each round and idle run, default 30); KEEP=1 (keep the work folder
# /tmp/talos-compare.*); FROM=DIR (print the table again from a kept work
# folder, and with STRICT=1 check it: no run); PROFILE=1 (after the
# rounds, profile the gateway and HAProxy under the HTTP/1.1 and HTTP/2
# loads with perf: where the CPU goes, by kind of work).
# The shell installs, starts and measures; the figures and the table are
# computed by bench-figures (benches/harness/src/figures.rs) from the raw output the
# work folder keeps.
# Every process started here inherits this environment: a GLIBC_TUNABLES
# set outside reaches the gateway, the peers, the origin and the clients
# alike, and the table's header line names it (docs/operators.md:
# memcpy on AMD Zen 3 and 4 with an older glibc).
# What it measures, how each peer is configured, the latest figures:
# benches/compare/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/lib.sh

if [ "${QUICK:-0}" = 1 ]; then
  dur=${DURATION:-3} idle_n=${IDLE_CONNS:-1000} speed_s=1 rounds=${ROUNDS:-3}
else
  dur=${DURATION:-10} idle_n=${IDLE_CONNS:-10000} speed_s=3 rounds=${ROUNDS:-5}
fi
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "compare: ROUNDS=$rounds is not a count of rounds" >&2; exit 1; }
idle_sources=${IDLE_SOURCES:-127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4}
peers=${PEERS-nginx haproxy mitmproxy}
# AA=1: a second gateway, configured as the first, is one more peer; its
# ratios (gw/gateway2) are what the harness reads between two identical
# systems: its own noise, measured in the same rounds as the others.
[ "${AA:-0}" = 1 ] && peers="${peers:+$peers }gateway2"
# The reference columns: the direct client -> origin run, and (RELAY=1, the
# default) a plain TCP relay, HAProxy in TCP mode passing the client's TLS
# through to the origin untouched: what moving the bytes through a
# user-space process costs on this kernel before any TLS is terminated.
refs="direct"
[ "${RELAY:-1}" = 1 ] && refs="direct relay"
# PASSTHROUGH=1 (the default): the gateway with the name marked
# passthrough, a second gateway process beside the terminating one: the
# client's TLS goes through to the origin (its clients trust the origin's
# CA) after the gate's checks, the bytes moved by splice(2). The figure to
# hold beside the relay's, and far below the terminating gateway's.
[ "${PASSTHROUGH:-1}" = 1 ] && refs="$refs passthrough"
figures_on=${FIGURES:-idle h1 h2 mib newconn resume}
# The TLS 1.3 suites, in the order the gateway prefers them, its choice
# made by the server's order and not the client's (gateway/src/tls.rs:
# AES-128-GCM first; OpenSSL's clients, wrk among them, list AES-256-GCM
# first). nginx and HAProxy are set the same way, toward the clients and
# toward the origin, so that every proxy does the same work on both legs.
suites=TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
name=origin.demo.test
mitmproxy_version=${MITMPROXY_VERSION:-11.0.2} # the last release for Python 3.11 (Debian 12)
venv=${XDG_CACHE_HOME:-$HOME/.cache}/talos-compare/mitmproxy-$mitmproxy_version
here=benches/compare
small_path=$BENCH_SMALL_PATH # the 1 KiB reply (benches/lib.sh)

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
die() { echo "compare: $*" >&2; exit 1; }
figures() { "$bin/bench-figures" "$@"; } # benches/harness/src/bin/bench-figures.rs

# FROM=DIR: the table (and with STRICT=1 the check) again from a work folder
# kept with KEEP=1; nothing is started.
if [ -n "${FROM:-}" ]; then
  [ -f "$FROM/run.env" ] || die "$FROM/run.env is missing: is it a work folder kept with KEEP=1?"
  [ "${NO_BUILD:-0}" = 1 ] || cargo build --release -q --locked -p talos-bench-harness --bin bench-figures
  figures compare-table "$FROM"
  [ "${STRICT:-0}" != 1 ] || figures compare-check "$FROM"
  exit
fi

# --- tools -----------------------------------------------------------------

# Everything from the distribution's packages, mitmproxy from PyPI into a
# private venv (the distribution's mitmproxy is older and Python's own
# packages stay untouched).
install_tools() {
  [ "${NO_INSTALL:-0}" = 1 ] && return 0
  local need=() p
  command -v wrk >/dev/null || need+=(wrk)
  command -v h2load >/dev/null || need+=(nghttp2-client)
  # Only the peers asked for (PEERS="" RELAY=0 needs neither package).
  if [[ " $peers " == *" nginx "* ]]; then
    command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
  fi
  if [[ " $peers " == *" haproxy "* || " $refs " == *" relay "* ]]; then
    command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
  fi
  command -v openssl >/dev/null || need+=(openssl)
  command -v unshare >/dev/null || need+=(util-linux)
  command -v ss >/dev/null || need+=(iproute2)
  command -v pgrep >/dev/null || need+=(procps)
  command -v python3 >/dev/null || need+=(python3)
  if [ "${PROFILE:-0}" = 1 ]; then command -v perf >/dev/null || need+=(linux-perf); fi
  if [[ " $peers " == *" mitmproxy "* ]]; then
    python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
  fi
  if [ ${#need[@]} -gt 0 ]; then
    say "Installing ${need[*]}"
    local sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}"
  fi
  for p in $peers; do
    if [ "$p" = mitmproxy ] && [ ! -x "$venv/bin/mitmdump" ]; then
      say "Installing mitmproxy $mitmproxy_version into $venv"
      python3 -m venv "$venv"
      timeout 600 "$venv/bin/pip" install -q "mitmproxy==$mitmproxy_version"
    fi
  done
}

# --- processes ---------------------------------------------------------------

work=$(mktemp -d /tmp/talos-compare.XXXXXX)
# Per target (direct, gateway, nginx, ...): its port on 127.0.0.1, the CA
# file its clients trust, the PIDs whose CPU time and memory are its own.
declare -A port=() ca=() tpids=()
pids=()
idle_pid=""
cleanup() {
  [ -z "$idle_pid" ] || kill -TERM "$idle_pid" 2>/dev/null || true
  # The gateway drains (at most shutdown_grace_ms, 2 s here); then insist.
  bench_stop 5 "${pids[@]}"
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "compare: files kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

# A free loopback port for the peers that cannot listen on port 0 and report
# it (a short race with other jobs, harmless on a test machine).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# 10,000 idle connections need 10,000 descriptors in the proxy and in the
# client: raise the limit for this shell and everything it starts.
raise_nofile() {
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  nofile=$(ulimit -n)
  # HAProxy refuses to start unless it has two descriptors per connection
  # it may hold (client and server side), whether or not the connections
  # have a server side. Where the limit cannot be raised (a container
  # without CAP_SYS_RESOURCE), every proxy gets the same, smaller count.
  local most=$(((nofile - 50) / 2 - 100))
  if [ "$idle_n" -gt "$most" ]; then
    echo "compare: ulimit -n is $nofile and cannot be raised: $most idle connections instead of $idle_n" >&2
    idle_n=$most
  fi
  [ "$idle_n" -gt 0 ] || die "ulimit -n is $nofile: too low"
}

# One test PKI for the peers' client-facing side: a CA the clients trust and
# a leaf for the destination name, both ECDSA P-256 like the gateway's
# session CA and leaves. (The origin has its own test CA, as in
# benches/load; every proxy verifies the origin against it.)
make_pki() {
  say "Test PKI: a client CA and a leaf for $name (ECDSA P-256)"
  local d=$work/pki
  mkdir -p "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=TALOS compare client CA" -keyout "$d/ca.key" -out "$d/ca.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$d/leaf.key" -out "$d/leaf.csr" 2>/dev/null
  printf 'subjectAltName=DNS:%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
    "$name" >"$d/leaf.ext"
  openssl x509 -req -in "$d/leaf.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -set_serial "0x$(openssl rand -hex 8)" \
    -days 2 -extfile "$d/leaf.ext" -out "$d/leaf.pem" 2>/dev/null
  # HAProxy and mitmproxy take the certificate and its key in one file.
  cat "$d/leaf.pem" "$d/leaf.key" >"$d/leaf-bundle.pem"
  chmod 600 "$d"/*.key "$d/leaf-bundle.pem"
}

# The origin: benches/load's load-origin (the end-to-end suite's TLS origin
# with Nagle off, and a DNS server for the gateway's resolver).
start_origin() {
  say "Starting the TLS origin (load-origin, own test CA) on 127.0.0.1"
  "$bin/load-origin" "$work" >"$work/origin.out" 2>"$work/origin.log" &
  origin_pid=$!
  pids+=("$origin_pid")
  local line
  line=$(bench_ready_line "$work/origin.out")
  dns=$(echo "$line" | figures json-field dns)
  origin_port=$(echo "$line" | figures json-field origin | sed 's/.*://')
  port[direct]=$origin_port ca[direct]=$work/origin-ca.pem tpids[direct]=$origin_pid
  echo "origin 127.0.0.1:$origin_port, dns $dns (pid $origin_pid)" >&2
}

# The gateway, configured as benches/load/quick.sh does (one static session,
# the origin's CA as an extra trust anchor, records to a file), with one
# runtime worker (`[runtime] workers = 1`: one thread serves everything).
# Its session lists every IDLE_SOURCES address, since the gateway maps a
# client to its session by source address. TARGET (default gateway) names
# it: AA=1 starts a second one, gateway2, with the same configuration and
# files of its own.
start_gateway() {
  local t=${1:-gateway} sfx=""
  [ "$t" = gateway ] || sfx=".$t"
  say "Starting $t with one runtime worker"
  bench_gateway_toml file="$work/$t.toml" id="gw-compare-$t" session=sbx-compare name="$name" \
    sources="$idle_sources" dns="$dns" port="$origin_port" work="$work" \
    records="$work/records$sfx.jsonl" trust="$work/session-ca$sfx.pem" \
    limits="max_connections = 30000
session_connections = 30000
session_handshakes = 30000
shutdown_grace_ms = 2000" gateway="$bin/gateway"
  "$bin/gateway" run --config "$work/$t.toml" \
    >"$work/$t.out" 2>"$work/$t.log" &
  local pid=$!
  pids+=("$pid")
  local line
  line=$(bench_ready_line "$work/$t.out")
  port[$t]=$(echo "$line" | figures json-field data | sed 's/.*://')
  ca[$t]=$work/session-ca$sfx.pem tpids[$t]=$pid
  bench_check_workers "$pid" "$line" 1 || die "$t is not serving with one worker"
  echo "$t 127.0.0.1:${port[$t]} (pid $pid, 1 worker)" >&2
}
start_gateway2() { start_gateway gateway2; }

# The gateway again, NAME marked passthrough in its session (the same
# limits, one worker): the pre-handshake stages, then the bytes moved
# between the two sockets inside the kernel.
start_passthrough() {
  say "Starting the gateway with $name passthrough (one runtime worker)"
  local d=$work/passthrough
  mkdir -p "$d"
  bench_gateway_toml file="$d/gateway.toml" id=gw-passthrough session=sbx-passthrough name="$name" \
    sources="$idle_sources" dns="$dns" port="$origin_port" work="$work" passthrough=1 \
    records="$d/records.jsonl" trust="$d/session-ca.pem" \
    limits="max_connections = 30000
session_connections = 30000
session_handshakes = 30000
shutdown_grace_ms = 2000" gateway="$bin/gateway"
  "$bin/gateway" run --config "$d/gateway.toml" >"$d/gateway.out" 2>"$d/gateway.log" &
  local pid=$!
  pids+=("$pid")
  local line
  line=$(bench_ready_line "$d/gateway.out")
  port[passthrough]=$(echo "$line" | figures json-field data | sed 's/.*://')
  ca[passthrough]=$work/origin-ca.pem tpids[passthrough]=$pid
  bench_check_workers "$pid" "$line" 1 || die "the passthrough gateway is not serving with one worker"
  echo "passthrough gateway 127.0.0.1:${port[passthrough]} (pid $pid, 1 worker)" >&2
}

# nginx: one worker process, in the foreground, with a private prefix,
# configuration, pid file and temp folders in the work folder.
start_nginx() {
  say "Starting nginx (worker_processes 1)"
  local d=$work/nginx
  mkdir -p "$d/logs" "$d/tmp"
  port[nginx]=$(free_port)
  cat >"$d/nginx.conf" <<NGINX
worker_processes 1;
worker_rlimit_nofile $nofile;
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
events { worker_connections $((nofile - 100)); }
http {
  access_log off;
  client_body_temp_path $d/tmp/body;
  proxy_temp_path $d/tmp/proxy;
  fastcgi_temp_path $d/tmp/fastcgi;
  uwsgi_temp_path $d/tmp/uwsgi;
  scgi_temp_path $d/tmp/scgi;
  # Idle client connections stay until the measurement is over (the
  # gateway allows 60 s for a request's headers).
  client_header_timeout 60s;
  keepalive_timeout 120s;
  # nginx closes a client connection after 1000 requests by default; the
  # others do not, so neither does it here.
  keepalive_requests 10000000;
  # Up to 512 idle upstream connections kept for reuse: the HTTP/2 run has
  # 256 requests in flight, each on its own HTTP/1.1 upstream connection;
  # with fewer kept, nginx would close the rest after each reply and pay a
  # new upstream handshake per request.
  upstream origin {
    server 127.0.0.1:$origin_port;
    keepalive 512;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
  }
  server {
    listen 127.0.0.1:${port[nginx]} ssl http2;
    server_name $name;
    ssl_certificate $work/pki/leaf.pem;
    ssl_certificate_key $work/pki/leaf.key;
    ssl_protocols TLSv1.3;
    # The suites in the gateway's order, the server's order deciding (see
    # SUITES): the same work on both legs.
    ssl_conf_command Ciphersuites $suites;
    ssl_prefer_server_ciphers on;
    location / {
      proxy_pass https://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $name;
      proxy_ssl_verify on;
      proxy_ssl_verify_depth 2;
      proxy_ssl_trusted_certificate $work/origin-ca.pem;
      proxy_ssl_name $name;
      proxy_ssl_server_name on;
      proxy_ssl_protocols TLSv1.3;
      proxy_ssl_conf_command Ciphersuites $suites;
      proxy_ssl_session_reuse on;
      # Stream large replies through memory buffers, never a temp file.
      proxy_max_temp_file_size 0;
    }
  }
}
NGINX
  nginx -p "$d" -c "$d/nginx.conf" -t -q
  nginx -p "$d" -c "$d/nginx.conf" -g 'daemon off;' >"$d/stdout" 2>"$d/stderr" &
  local pid=$!
  pids+=("$pid")
  wait_listening "${port[nginx]}" "$pid" nginx
  # The master forks one worker; both count (the master idles).
  tpids[nginx]="$pid $(pgrep -P "$pid" | tr '\n' ' ')"
  ca[nginx]=$work/pki/ca.pem
  echo "nginx 127.0.0.1:${port[nginx]} (pids ${tpids[nginx]})" >&2
}

# HAProxy: one thread, one process (-db: foreground, no master process).
start_haproxy() {
  say "Starting HAProxy (nbthread 1)"
  local d=$work/haproxy
  mkdir -p "$d"
  port[haproxy]=$(free_port)
  local haproxy_maxconn=$((idle_n + 100)) fit=$(((nofile - 50) / 2))
  [ "$haproxy_maxconn" -ge 2000 ] || haproxy_maxconn=$((fit < 2000 ? fit : 2000))
  cat >"$d/haproxy.cfg" <<HAPROXY
global
  nbthread 1
  # Room for the idle connections (raise_nofile made sure the descriptors
  # HAProxy asks for, two per connection, are there), and at least 2,000:
  # the HTTP/2 run has 256 requests in flight, each on its own upstream
  # connection, and HAProxy keeps idle upstream connections for reuse only
  # while they are a small share of its descriptors (with IDLE_CONNS=100 it
  # closed them and paid a handshake per request: 2k req/s).
  maxconn $haproxy_maxconn
  ssl-server-verify required
defaults
  mode http
  timeout connect 5s
  timeout client 120s
  timeout server 120s
  timeout http-request 60s
  timeout http-keep-alive 120s
  # Any idle upstream connection serves any client's next request.
  http-reuse always
frontend fe
  bind 127.0.0.1:${port[haproxy]} ssl crt $work/pki/leaf-bundle.pem alpn h2,http/1.1 ssl-min-ver TLSv1.3 ciphersuites $suites
  default_backend origin
backend origin
  http-request set-header Host $name
  server o 127.0.0.1:$origin_port ssl verify required ca-file $work/origin-ca.pem sni str($name) verifyhost $name ssl-min-ver TLSv1.3 alpn http/1.1 ciphersuites $suites
HAPROXY
  run_haproxy haproxy "$work/pki/ca.pem"
}

# run_haproxy TARGET CA: check and start HAProxy on $work/TARGET/haproxy.cfg,
# in the foreground (-db, no master), as TARGET whose clients trust CA.
run_haproxy() {
  local t=$1 d=$work/$1
  haproxy -c -q -f "$d/haproxy.cfg"
  haproxy -db -f "$d/haproxy.cfg" >"$d/stdout" 2>"$d/stderr" &
  local pid=$!
  pids+=("$pid")
  wait_listening "${port[$t]}" "$pid" "$t"
  tpids[$t]=$pid ca[$t]=$2
  echo "$t 127.0.0.1:${port[$t]} (pid $pid)" >&2
}

# The TCP relay reference: HAProxy in TCP mode, one thread, forwarding each
# client connection to the origin as it is (the client's TLS session is
# with the origin, whose CA its clients trust). No splicing (HAProxy only
# splices when told to): each byte is read into HAProxy's buffer and
# written out again, the kernel work any user-space TLS proxy also does,
# without the decryption, re-encryption and HTTP. 256 KiB buffers (the
# default is 16 KiB): fewer, larger system calls, so the least kernel time
# per GB a relay needs here (0.30 CPU-s against 0.42 with the default, in
# a trial run).
start_relay() {
  say "Starting the TCP relay reference (HAProxy, mode tcp)"
  local d=$work/relay
  mkdir -p "$d"
  port[relay]=$(free_port)
  cat >"$d/haproxy.cfg" <<HAPROXY
global
  nbthread 1
  maxconn 1000
  tune.bufsize 262144
defaults
  mode tcp
  timeout connect 5s
  timeout client 120s
  timeout server 120s
frontend fe
  bind 127.0.0.1:${port[relay]}
  default_backend origin
backend origin
  server o 127.0.0.1:$origin_port
HAPROXY
  run_haproxy relay "$work/origin-ca.pem"
}

# mitmproxy in reverse mode. It resolves the origin's name itself, so it
# runs in the same private mount namespace as wrk (below), where /etc/hosts
# names the origin 127.0.0.1; unshare and sh exec into mitmdump, so $! is
# mitmdump's PID.
start_mitmproxy() {
  say "Starting mitmproxy $mitmproxy_version (mitmdump, reverse mode)"
  local d=$work/mitmproxy
  mkdir -p "$d"
  port[mitmproxy]=$(free_port)
  # connection_strategy=lazy: connect upstream on the first request, as the
  # others do (mitmproxy's default connects when the client does).
  # stream_large_bodies: pass 1 MiB replies through instead of buffering
  # them whole. keep_host_header: send the client's Host, as the others do.
  "${ns[@]}" "$venv/bin/mitmdump" -q --mode "reverse:https://$name:$origin_port" \
    --listen-host 127.0.0.1 --listen-port "${port[mitmproxy]}" \
    --certs "$name=$work/pki/leaf-bundle.pem" \
    --set confdir="$d" \
    --set ssl_verify_upstream_trusted_ca="$work/origin-ca.pem" \
    --set tls_version_client_min=TLS1_3 --set tls_version_server_min=TLS1_3 \
    --set connection_strategy=lazy --set upstream_cert=false \
    --set stream_large_bodies=128k --set keep_host_header=true \
    --set flow_detail=0 --set termlog_verbosity=warn \
    >"$d/stdout" 2>"$d/stderr" &
  local pid=$!
  pids+=("$pid")
  wait_listening "${port[mitmproxy]}" "$pid" mitmproxy
  tpids[mitmproxy]=$pid ca[mitmproxy]=$work/pki/ca.pem
  echo "mitmproxy 127.0.0.1:${port[mitmproxy]} (pid $pid)" >&2
}

# Wait (at most 30 s) until PORT accepts connections, unless PID has died.
wait_listening() {
  for _ in $(seq 300); do
    kill -0 "$2" 2>/dev/null || die "$3 exited at start-up (see $work/$3/stderr; KEEP=1 keeps it)"
    ss -Hltn "sport = :$1" | grep -q . && return 0
    sleep 0.1
  done
  die "$3 is not listening on 127.0.0.1:$1"
}

# --- clients -----------------------------------------------------------------

# wrk runs in a private mount namespace whose /etc/hosts names the origin
# 127.0.0.1 (bench_wrk_clients in benches/lib.sh), as in
# benches/load/quick.sh; its report script prints the RESULT line the
# table is computed from.
prepare_clients() {
  bench_wrk_clients "$work" "$name"
  ns=("${BENCH_WRK_NS[@]}")
}

# Before measuring: one verified TLS 1.3 request through each target with
# the CA its clients are meant to trust, then a short warm-up (the gateway's
# leaf, everyone's upstream connections).
check_targets() {
  say "Checking each target (verified TLS 1.3, GET of a 1 KiB reply) and warming up"
  local t
  for t in $targets; do
    printf '  %-10s ' "$t" >&2
    timeout 30 python3 "$here/idle_conns.py" check "127.0.0.1:${port[$t]}" "$name" "${ca[$t]}" "$small_path" \
      >"$work/check.$t.out" || die "$t failed its check: $(cat "$work/check.$t.out")"
    cat "$work/check.$t.out" >&2
    timeout 30 h2load -n 200 -c 2 -m 4 --connect-to="127.0.0.1:${port[$t]}" "https://$name/" >/dev/null
    timeout 30 h2load --h1 -n 200 -c 2 --connect-to="127.0.0.1:${port[$t]}" "https://$name/" >/dev/null
  done
}

# --- measuring -----------------------------------------------------------------


# Readings from /proc (bench-figures reads them): utime+stime of processes
# (all their threads) and stime alone, in clock ticks; cutime+cstime of this
# shell, the CPU time of the children it waited for (the load generator);
# the busy ticks of the whole machine (user, nice, system, irq, softirq,
# steal); resident memory of processes in KiB (summed: nginx's master and
# worker).
ticks() { figures ticks "$@"; }
sys_ticks() { figures sys-ticks "$@"; }
child_ticks() { figures child-ticks $$; }
machine_ticks() { figures machine-ticks; }
rss_kib() { figures rss-kib "$@"; }

# Wait (at most QUIET_WAIT s, default 30) for a quiet machine (benches/lib.sh):
# before each round, each idle run and each AES-GCM floor.
settle() { bench_settle compare 30; }

# measure RUN TARGET COMMAND...: one bounded load; the CPU ticks of the
# target (the proxy; the origin itself for "direct"), the origin, the client
# and the rest of the machine. RUN is rN/FIGURE.TARGET: the round's folder.
# No wait for a quiet machine here: a round waits once, before its first
# run, so that the runs of a round follow each other back to back.
measure() {
  local run=$1 t=$2; shift 2
  local tp p0 k0 o0 c0 m0 p1 k1 o1 c1 m1
  read -r -a tp <<<"${tpids[$t]}"
  k0=$(sys_ticks "${tp[@]}")
  p0=$(ticks "${tp[@]}"); o0=$(ticks "$origin_pid"); c0=$(child_ticks); m0=$(machine_ticks)
  echo "$*" >"$work/$run.cmd"
  timeout -k 5 $((dur + 60)) "$@" >"$work/$run.out" 2>&1 || echo "compare: $run exited $?" >&2
  p1=$(ticks "${tp[@]}"); o1=$(ticks "$origin_pid"); c1=$(child_ticks); m1=$(machine_ticks)
  k1=$(sys_ticks "${tp[@]}")
  local p=$((p1 - p0)) o=$((o1 - o0)) c=$((c1 - c0))
  [ "$t" = direct ] && o=0 # the origin is the target
  echo "proxy_ticks=$p proxy_sys_ticks=$((k1 - k0)) origin_ticks=$o client_ticks=$c other_ticks=$((m1 - m0 - p - o - c))" >"$work/$run.cpu"
}

wrk_run() { # RUN TARGET PATH CONNECTIONS [WRK OPTIONS...]
  local run=$1 t=$2 path=$3 conns=$4; shift 4
  measure "$run" "$t" "${ns[@]}" wrk -t1 -c"$conns" -d"${dur}s" --latency -s "$work/report.lua" \
    -H "Host: $name" "$@" "https://$name:${port[$t]}$path"
}
h2load_run() { # RUN TARGET PATH H2LOAD OPTIONS...
  local run=$1 t=$2 path=$3; shift 3
  measure "$run" "$t" h2load --connect-to="127.0.0.1:${port[$t]}" "$@" "https://$name$path"
}

# Memory with N idle client TLS connections: the target's VmRSS before, and
# once every connection has finished its handshake, with the number of
# established connections the kernel shows on the target's port (the
# figure per connection divides by that, not by what was asked for).
idle_run() {
  local t=$1 tp r0 r1 est cpid line
  read -r -a tp <<<"${tpids[$t]}"
  settle
  r0=$(rss_kib "${tp[@]}")
  local c0
  c0=$(ticks "${tp[@]}")
  python3 "$here/idle_conns.py" hold "127.0.0.1:${port[$t]}" "$name" "${ca[$t]}" "$idle_n" \
    "$idle_sources" 300 >"$work/idle.$t.out" 2>&1 &
  cpid=$!
  idle_pid=$cpid
  # Bounded: at most 240 s for all the handshakes (mitmproxy is the slow one).
  for _ in $(seq 2400); do
    grep -q '^OPEN ' "$work/idle.$t.out" && break
    kill -0 "$cpid" 2>/dev/null || break
    sleep 0.1
  done
  sleep 1 # let the target finish its bookkeeping of the last handshakes
  line=$(grep '^OPEN ' "$work/idle.$t.out" || echo "OPEN opened=0 failed=$idle_n timed_out")
  r1=$(rss_kib "${tp[@]}")
  est=$(ss -Htn state established "( sport = :${port[$t]} )" | wc -l)
  echo "rss0_kib=$r0 rss1_kib=$r1 established=$est handshake_ticks=$(($(ticks "${tp[@]}") - c0)) ${line#OPEN }" \
    >"$work/idle.$t.res"
  kill -TERM "$cpid" 2>/dev/null || true
  wait "$cpid" 2>/dev/null || true
  idle_pid=""
  echo "  $t: $(cat "$work/idle.$t.res")" >&2
  sleep 2 # the target closes them
}

# The AES-GCM floor: what one core encrypts per second with AES-128-GCM in
# 16 KiB blocks (a TLS record's size), via the same OpenSSL as nginx and
# HAProxy. The suite every proxy negotiates on both legs is
# TLS_AES_128_GCM_SHA256 (SUITES; each target's check prints its own).
# Measured once a round (it moved by 15 % between two single runs): each
# round's "over the floor" figures use that round's, the header names the
# median and the range.
aes_floor() {
  say "AES-128-GCM floor (openssl speed -evp aes-128-gcm, 16 KiB blocks, ${speed_s}s, once a round)"
  local r
  for r in $(seq "$rounds"); do
    settle
    openssl speed -evp aes-128-gcm -bytes 16384 -seconds "$speed_s" >"$work/r$r/speed.out" 2>/dev/null
    echo "  round $r: $(figures aes-floor "$work/r$r/speed.out") bytes/s" >&2
  done
}

# FIGURES picks which of them run (all by default); the table leaves the
# others' rows empty.
has_figure() { case " $figures_on " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# The rounds. Round R runs the targets in their column order turned by R-1
# places (direct relay gateway nginx ..., then relay gateway nginx ...
# direct, ...), every figure alike: each system runs first, second, ...
# and last in turn, so no system always follows the same one or always
# meets the machine right after the wait for quiet. Each round's order is
# kept in rN/order, and its runs' files in rN/.
round_order() {
  local -a t
  read -r -a t <<<"$targets"
  local n=${#t[@]} i out=()
  for ((i = 0; i < n; i++)); do out+=("${t[$(((i + $1 - 1) % n))]}"); done
  echo "${out[*]}"
}
prepare_rounds() {
  local r
  for r in $(seq "$rounds"); do
    mkdir -p "$work/r$r"
    round_order "$r" >"$work/r$r/order"
  done
}

# in_rounds FUNCTION: ROUNDS rounds of one figure; FUNCTION ROUND TARGET
# makes one run. A round waits for a quiet machine once, then runs every
# target back to back in the round's order, so each ratio gateway/peer is
# taken from two runs a few seconds apart.
in_rounds() {
  local r t order
  for r in $(seq "$rounds"); do
    read -r -a order <"$work/r$r/order"
    settle
    echo "  round $r/$rounds: ${order[*]}" >&2
    for t in "${order[@]}"; do "$1" "r$r" "$t"; done
  done
}
fig_h1() { wrk_run "$1/h1_small.$2" "$2" "$small_path" 32; }
fig_h2() { h2load_run "$1/h2_small.$2" "$2" "$small_path" -D "$dur" -c 8 -m 32; }
fig_mib() { wrk_run "$1/h1_1mib.$2" "$2" /download/1048576 4; }
# "Connection: close": the target closes after each reply and wrk opens a
# new connection (a full TLS handshake: it resumes no sessions) for the
# next request, so requests/s = new connections/s.
fig_newconn() { wrk_run "$1/h1_newconn.$2" "$2" "$small_path" 16 -H "Connection: close"; }
# The same with a client that resumes TLS 1.3 sessions, as reconnecting
# clients do within a process (curl, Python, Node, Go, Java):
# resume-load (benches/harness/src/bin/resume-load.rs) keeps the tickets every
# connection receives and offers one on the next; its output says how many
# handshakes resumed. Every target offers resumption as it is configured
# here by default (nginx and HAProxy: stateless tickets; the gateway:
# tickets in its session authority's memory; the origin: rustls's cache).
fig_resume() {
  measure "$1/h1_resume.$2" "$2" "$bin/resume-load" "127.0.0.1:${port[$2]}" "$name" "${ca[$2]}" \
    "$small_path" 16 "$dur" resume
}

run_all() {
  local t
  # Memory is measured once (not in rounds): it moves by a tenth of a KiB
  # per connection between runs, and holding 10,000 connections per
  # system is the slowest part of the run.
  if has_figure idle; then
    say "Memory with $idle_n idle TLS connections (over $idle_sources)"
    for t in $proxies; do idle_run "$t"; done
  fi
  if has_figure h1; then
    say "HTTP/1.1 keep-alive, 1 KiB replies (wrk -t1 -c32, ${dur}s each, $rounds rounds)"
    in_rounds fig_h1
  fi
  if has_figure h2; then
    say "HTTP/2 multiplexed, 1 KiB replies (h2load -c8 -m32, ${dur}s each, $rounds rounds)"
    in_rounds fig_h2
  fi
  if has_figure mib; then
    say "1 MiB replies over HTTP/1.1 (wrk -t1 -c4, ${dur}s each, $rounds rounds)"
    in_rounds fig_mib
  fi
  if has_figure newconn; then
    say "New TLS connections, one request each (wrk -t1 -c16 Connection: close, ${dur}s each, $rounds rounds)"
    in_rounds fig_newconn
  fi
  if has_figure resume; then
    say "New TLS connections resumed, one request each (resume-load -c16, ${dur}s each, $rounds rounds)"
    in_rounds fig_resume
  fi
}

# PROFILE=1: after the rounds, the HTTP/1.1 and HTTP/2 figures (or
# PROFILE_FIGURES="h1 h2 mib newconn resume", a subset) run once more for
# the gateway and for HAProxy (when it is a peer), each under
# `perf record -g` (the cpu-clock event, which every machine has; the
# target's own PIDs; DWARF call graphs, as neither is built with frame
# pointers). These runs count in no figure. Kept in WORK/profile/: the
# perf data, `perf report` by object and symbol, and the shares by kind of
# work beside each other (perf_shares.py), printed after the table.
profile_run() { # FIGURE TARGET
  local fig=$1 t=$2 tp
  read -r -a tp <<<"${tpids[$t]}"
  settle
  bench_profile "$work/profile/$fig.$t.data" "$(IFS=,; echo "${tp[*]}")" "fig_$fig" profile "$t"
  echo "  $fig $t: $(grep -c '%' "$work/profile/$fig.$t.txt") symbols" >&2
}
profile_all() {
  local f t args=()
  local profiled="gateway"
  [[ " $peers " == *" haproxy "* ]] && profiled="gateway haproxy"
  mkdir -p "$work/profile"
  say "Profiles (perf record -g, one ${dur}s run each, counted in no figure): $profiled"
  for f in ${PROFILE_FIGURES:-h1 h2}; do
    has_figure "$f" || continue
    for t in $profiled; do
      profile_run "$f" "$t"
      args+=("$t $f=$work/profile/$f.$t.txt")
    done
  done
  [ ${#args[@]} -gt 0 ] || return 0
  python3 "$here/perf_shares.py" "${args[@]}" | tee "$work/profile/shares.md"
}

# --- the report ----------------------------------------------------------------

# The facts the table's header line names, beside the raw output, so that
# FROM=DIR prints the same table again. bench-figures compare-table reads
# them and every run's files (RUN.TARGET.out, .cpu, idle.TARGET.res,
# speed.out); benches/harness/src/figures.rs says what each cell is.
write_run_env() {
  {
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "nproc=$(nproc)"
    echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
    echo "kernel=$(uname -r)"
    echo "glibc=$(getconf GNU_LIBC_VERSION | sed 's/^glibc //')"
    echo "glibc_tunables=${GLIBC_TUNABLES:-(none)}"
    echo "duration_s=$dur"
    echo "rounds=$rounds"
    echo "idle_conns=$idle_n"
    echo "clk_tck=$tck"
    echo "refs=$refs"
    echo "peers=$peers"
  } >"$work/run.env"
}

install_tools
tck=$(getconf CLK_TCK)
raise_nofile
if [ "${NO_BUILD:-0}" != 1 ]; then
  say "Building release binaries"
  cargo build --release -q --locked -p talos-gateway -p talos-bench-harness --bins
fi
for b in gateway load-origin bench-figures resume-load; do [ -x "$bin/$b" ] || die "no $b in $bin (set BIN_DIR)"; done
make_pki
prepare_clients
start_origin
start_gateway
for p in $peers; do "start_$p"; done
proxies="gateway $peers"
[[ " $refs " == *" relay "* ]] && start_relay
[[ " $refs " == *" passthrough "* ]] && start_passthrough
targets="$refs $proxies"
prepare_rounds
check_targets
aes_floor
run_all
write_run_env
figures compare-table "$work" | tee "$work/table.md"
[ "${PROFILE:-0}" = 1 ] && profile_all
# STRICT=1 (the test command's smoke run): fail unless every load run that
# ran got requests through and lost at most 1 % of them, and every target
# held its idle connections. Speed is never judged.
if [ "${STRICT:-0}" = 1 ]; then figures compare-check "$work"; fi
