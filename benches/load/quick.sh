#!/usr/bin/env bash
# A side-by-side loopback load comparison: load generators (wrk, h2load)
# straight to a TLS origin, then the same load through the gateway, and the
# gateway's CPU time for each run. Everything runs on 127.0.0.1; every run is
# bounded in time; everything started here is stopped by its PID on exit.
#
#   benches/load/quick.sh            # 10 s per run (about 4 minutes in all)
#   QUICK=1 benches/load/quick.sh    # 3 s per run
#
# Knobs (environment): QUICK=1, DURATION=SECONDS (overrides QUICK),
# WORKERS=N (the gateway's `[runtime] workers`, default 1), BURST=N (clients in
# the new-connection burst, default 1000), QUIET_WAIT=SECONDS (how long to
# wait for other jobs to leave the CPUs before each run, default 60),
# BIN_DIR=DIR (the binaries, default target/release), NO_BUILD=1 (use
# BIN_DIR as it is), KEEP=1 (keep the work folder), FROM=DIR (print the
# tables again from a kept work folder: no run).
# The shell starts and measures; bench-figures (benches/harness/src/figures.rs)
# computes the figures and prints the tables from the raw output it keeps.
# What it measures and the latest figures: benches/load/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/lib.sh

if [ "${QUICK:-0}" = 1 ]; then dur=${DURATION:-3}; else dur=${DURATION:-10}; fi
workers=${WORKERS:-1}
burst=${BURST:-1000}
name=origin.demo.test
bin=${BIN_DIR:-target/release}

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
die() { echo "load: $*" >&2; exit 1; }
figures() { "$bin/bench-figures" "$@"; } # benches/harness/src/bin/bench-figures.rs

# FROM=DIR: the tables again from a work folder kept with KEEP=1.
if [ -n "${FROM:-}" ]; then
  [ -f "$FROM/run.env" ] || die "$FROM/run.env is missing: is it a work folder kept with KEEP=1?"
  [ "${NO_BUILD:-0}" = 1 ] || cargo build --release -q --locked -p talos-bench-harness --bin bench-figures
  figures load-table "$FROM"
  exit
fi

# --- tools -----------------------------------------------------------------

install_tools() {
  local need=()
  command -v wrk >/dev/null || need+=(wrk)
  command -v h2load >/dev/null || need+=(nghttp2-client)
  command -v unshare >/dev/null || need+=(util-linux)
  command -v timeout >/dev/null || need+=(coreutils)
  command -v getconf >/dev/null || need+=(libc-bin)
  if [ ${#need[@]} -gt 0 ]; then
    say "Installing ${need[*]}"
    local sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}"
  fi
}

# --- processes ---------------------------------------------------------------

work=$(mktemp -d /tmp/talos-load.XXXXXX)
pids=()
cleanup() {
  # The gateway drains (at most shutdown_grace_ms, 2 s here); then insist.
  bench_stop 5 "${pids[@]}"
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "load: files kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT


# load-origin: demo-peers' DNS server and the end-to-end TLS origin (same
# routes: `/` a short text, `/download/N` N bytes streamed), with Nagle's
# algorithm off on the origin's sockets; benches/harness/src/bin/load-origin.rs says why.
start_peers() {
  say "Starting the DNS server and TLS origin (load-origin, own test CA) on 127.0.0.1"
  "$bin/load-origin" "$work" >"$work/peers.out" 2>"$work/peers.log" &
  peers_pid=$!
  pids+=("$peers_pid")
  local line
  line=$(bench_ready_line "$work/peers.out")
  dns=$(echo "$line" | figures json-field dns)
  origin=$(echo "$line" | figures json-field origin)
  origin_port=${origin##*:}
  echo "dns $dns, origin $origin (pid $peers_pid)" >&2
}

# start_gateway [MASKED]: with MASKED=masked, a second gateway whose session
# has 4 credentials attached to the destination, so every reply is masked
# (and each request carries 4 injected headers).
start_gateway() {
  local tag=${1:-}
  local conf=$work/gateway$tag.toml
  say "Starting the gateway$tag with $workers runtime worker(s)"
  local masked=()
  [ "$tag" = .masked ] && masked=(masked="$work")
  # Configured like scripts/demo.sh, except that the session's source is
  # 127.0.0.1: wrk and h2load cannot choose their source address.
  bench_gateway_toml file="$conf" id=gw-load session=sbx-load name="$name" \
    dns="$dns" port="$origin_port" work="$work" records="$work/records$tag.jsonl" \
    trust="$work/session-ca$tag.pem" limits="shutdown_grace_ms = 2000" "${masked[@]}" \
    workers="$workers" gateway="$bin/gateway"
  # One worker (`[runtime] workers`) keeps the comparison fair on a small
  # machine: the load generator and the origin need the other core.
  "$bin/gateway" run --config "$conf" \
    >"$work/gateway$tag.out" 2>"$work/gateway$tag.log" &
  local pid=$!
  pids+=("$pid")
  local line
  line=$(bench_ready_line "$work/gateway$tag.out")
  local addr
  addr=$(echo "$line" | figures json-field data)
  echo "gateway$tag $addr (pid $pid)" >&2
  if [ "$tag" = .masked ]; then
    gwm_pid=$pid gwm_port=${addr##*:}
  else
    gw_pid=$pid gw=$addr gw_port=${addr##*:}
    bench_check_workers "$pid" "$line" "$workers" || die "the gateway is not serving with $workers worker(s)"
  fi
}

# --- measuring -----------------------------------------------------------------

# Readings from /proc (bench-figures reads them): utime+stime of a process
# (all its threads), in clock ticks; cutime+cstime of this shell, the CPU
# time of the children it has waited for, the load generator (and what it
# waited for) included; busy ticks of the whole machine (all CPUs, all
# processes): user, nice, system, irq, softirq and steal from /proc/stat.
ticks() { figures ticks "$1"; }
child_ticks() { figures child-ticks $$; }
machine_ticks() { figures machine-ticks; }
records() { [ -f "$work/records.jsonl" ] && wc -l <"$work/records.jsonl" || echo 0; }

# measure RUN COMMAND...: run one bounded load; note the CPU ticks of the
# gateway, the origin and the load generator, and the gateway's new records.
measure() {
  local run=$1; shift
  local g0 o0 c0 m0 r0 g1 o1 c1 m1 r1
  settle
  local gpid=${measured_gw_pid:-$gw_pid}
  g0=$(ticks "$gpid"); o0=$(ticks "$peers_pid"); c0=$(child_ticks)
  m0=$(machine_ticks); r0=$(records)
  echo "  $run: $*" >"$work/$run.cmd"
  timeout -k 5 $((dur + 60)) "$@" >"$work/$run.out" 2>&1 || echo "load: $run exited $?" >&2
  g1=$(ticks "$gpid"); o1=$(ticks "$peers_pid"); c1=$(child_ticks)
  m1=$(machine_ticks)
  sleep 0.5 # records are written when a connection closes
  r1=$(records)
  # "other": CPU time the machine spent on anything but these three, i.e.
  # other jobs on a shared machine: high means noisy figures. Approximate:
  # the machine-wide counters are sampled at each tick, the per-process ones
  # are measured (softirq work done on a process's behalf lands in both).
  local g=$((g1 - g0)) o=$((o1 - o0)) c=$((c1 - c0))
  echo "gw_ticks=$g origin_ticks=$o client_ticks=$c" \
    "other_ticks=$((m1 - m0 - g - o - c)) records=$((r1 - r0))" >"$work/$run.cpu"
}

# Before each run, wait (at most QUIET_WAIT seconds, default 60) for a quiet
# machine (benches/lib.sh): past the wait the report marks the run.
settle() { bench_settle load 60; }


# wrk_run RUN PORT PATH CONNECTIONS [WRK OPTIONS...]
wrk_run() {
  local run=$1 port=$2 path=$3 conns=$4; shift 4
  measure "$run" "${BENCH_WRK_NS[@]}" wrk -t1 -c"$conns" -d"${dur}s" --latency -s "$work/report.lua" \
    -H "Host: $name" "$@" "https://$name:$port$path"
}

# h2load_run RUN PORT PATH H2LOAD OPTIONS...: h2load sends the URL's host
# as SNI and :authority and connects where --connect-to says.
h2load_run() {
  local run=$1 port=$2 path=$3; shift 3
  measure "$run" h2load --connect-to="127.0.0.1:$port" "$@" "https://$name$path"
}

# wrk runs in a private mount namespace whose /etc/hosts names the origin
# 127.0.0.1 (bench_wrk_clients in benches/lib.sh); the Host header is set
# without the port. Checked here before any run.
prepare_clients() {
  bench_wrk_clients "$work" "$name"
  local got
  read -r got _ < <("${BENCH_WRK_NS[@]}" getent hosts "$name") || true
  [ "$got" = 127.0.0.1 ] || die "the private hosts file does not name $name 127.0.0.1 (got '$got')"
}

warm_up() {
  say "Warming up (the gateway's leaf for $name, its upstream connection)"
  local port
  for port in "$origin_port" "$gw_port" "$gwm_port"; do
    timeout 20 h2load -n 200 -c 2 -m 4 --connect-to="127.0.0.1:$port" "https://$name/" >/dev/null
    timeout 20 h2load --h1 -n 200 -c 2 --connect-to="127.0.0.1:$port" "https://$name/" >/dev/null
  done
}

# --- the runs ----------------------------------------------------------------

# Each figure runs straight to the origin ("direct") and right after through
# the gateway ("gw"), with the same client options: interleaving keeps a
# burst of other work on a shared machine from landing on one side only.
both() { # RUNNER RUN PATH ARGS...
  local runner=$1 run=$2 path=$3; shift 3
  "$runner" "$run.direct" "$origin_port" "$path" "$@"
  "$runner" "$run.gw" "$gw_port" "$path" "$@"
}

run_all() {
  say "HTTP/1.1 keep-alive, small replies (wrk -c32, ${dur}s each)"
  both wrk_run h1_small / 32
  say "HTTP/2 multiplexed, small replies (h2load -c8 -m32, ${dur}s each)"
  both h2load_run h2_small / -D "$dur" -c 8 -m 32
  say "1 MiB replies over HTTP/1.1 (wrk -c4, ${dur}s each)"
  both wrk_run h1_1mib /download/1048576 4
  say "1 MiB replies over HTTP/2 (h2load -c4 -m1, ${dur}s each)"
  both h2load_run h2_1mib /download/1048576 -D "$dur" -c 4 -m 1
  # One reply at a time: what one stream gets, i.e. the added latency of
  # each hop rather than the CPU left over.
  say "1 MiB replies, one at a time (h2load -c1 -m1, ${dur}s each)"
  both h2load_run h2_1mib_1 /download/1048576 -D "$dur" -c 1 -m 1
  # "Connection: close" makes the server close after each reply, and wrk
  # opens a new connection (a full TLS handshake: wrk resumes no sessions)
  # for the next request: requests/s = new connections/s.
  say "New TLS connections, one request each (wrk -c16 Connection: close, ${dur}s each)"
  both wrk_run h1_newconn / 16 -H "Connection: close"
  say "Burst: $burst clients at once, one request each (h2load -c$burst -n$burst)"
  both h2load_run h2_burst / -n "$burst" -c "$burst" -m 1
}

# Masking on against masking off: the same 1 MiB runs through a second
# gateway whose session attaches 4 credentials to the destination, right
# after the unmasked ones.
run_masked() {
  say "1 MiB replies through a gateway masking 4 attached values"
  measured_gw_pid=$gwm_pid wrk_run h1_1mib.gwm "$gwm_port" /download/1048576 4
  measured_gw_pid=$gwm_pid h2load_run h2_1mib.gwm "$gwm_port" /download/1048576 -D "$dur" -c 4 -m 1
}

# --- the report ----------------------------------------------------------------

# The facts the tables' header line names and the gateway's threads at the
# end ("NAME: TICKS"), beside the raw output (RUN.direct/.gw/.gwm .out and
# .cpu), so that FROM=DIR prints the same tables again. bench-figures
# load-table reads them; benches/harness/src/figures.rs says what each cell is.
write_run_env() {
  {
    echo "date=$(date -u +%Y-%m-%d)"
    echo "nproc=$(nproc)"
    echo "cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n1)"
    echo "duration_s=$dur"
    echo "workers=$workers"
    echo "burst=$burst"
    echo "clk_tck=$tck"
  } >"$work/run.env"
  figures threads "$gw_pid" >"$work/threads"
}

install_tools
tck=$(getconf CLK_TCK) # the unit of every CPU time in /proc
if [ "${NO_BUILD:-0}" != 1 ]; then
  say "Building release binaries"
  cargo build --release -q -p talos-gateway -p talos-bench-harness --bins
fi
start_peers
start_gateway
start_gateway .masked
prepare_clients
warm_up
run_all
run_masked
write_run_env
figures load-table "$work" | tee "$work/table.md"
