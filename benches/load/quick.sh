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
# KEEP=1 (keep the work folder).
# What it measures and the latest figures: benches/load/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/lib.sh

if [ "${QUICK:-0}" = 1 ]; then dur=${DURATION:-3}; else dur=${DURATION:-10}; fi
workers=${WORKERS:-1}
burst=${BURST:-1000}
name=origin.demo.test
bin=target/release

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
die() { echo "load: $*" >&2; exit 1; }

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
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # The gateway drains (at most shutdown_grace_ms, 2 s here); then insist.
  for _ in $(seq 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "load: files kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Wait (at most 20 s) for a process's ready line in FILE and print it.
ready_line() {
  for _ in $(seq 200); do
    if [ -s "$1" ]; then head -n1 "$1"; return 0; fi
    sleep 0.1
  done
  die "no ready line in $1"
}
# The value of "KEY":"VALUE" in a one-line JSON object (addresses only).
json_field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }

# load-origin: demo-peers' DNS server and the end-to-end TLS origin (same
# routes: `/` a short text, `/download/N` N bytes streamed), with Nagle's
# algorithm off on the origin's sockets; tests/src/bin/load-origin.rs says why.
start_peers() {
  say "Starting the DNS server and TLS origin (load-origin, own test CA) on 127.0.0.1"
  "$bin/load-origin" "$work" >"$work/peers.out" 2>"$work/peers.log" &
  peers_pid=$!
  pids+=("$peers_pid")
  local line
  line=$(ready_line "$work/peers.out")
  dns=$(echo "$line" | json_field dns)
  origin=$(echo "$line" | json_field origin)
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
  local extra=""
  if [ "$tag" = .masked ]; then
    bench_credentials "$work" "$name"
    extra="attach = [$BENCH_ATTACH]
$BENCH_SECRETS"
  fi
  # Configured like scripts/demo.sh, except that the session's source is
  # 127.0.0.1: wrk and h2load cannot choose their source address.
  bench_gateway_toml file="$conf" id=gw-load session=sbx-load name="$name" \
    dns="$dns" port="$origin_port" work="$work" records="$work/records$tag.jsonl" \
    trust="$work/session-ca$tag.pem" limits="shutdown_grace_ms = 2000" extra="$extra" \
    workers="$workers" gateway="$bin/gateway"
  # One worker (`[runtime] workers`) keeps the comparison fair on a small
  # machine: the load generator and the origin need the other core.
  "$bin/gateway" run --config "$conf" \
    >"$work/gateway$tag.out" 2>"$work/gateway$tag.log" &
  local pid=$!
  pids+=("$pid")
  local line
  line=$(ready_line "$work/gateway$tag.out")
  local addr
  addr=$(echo "$line" | json_field data)
  echo "gateway$tag $addr (pid $pid)" >&2
  if [ "$tag" = .masked ]; then
    gwm_pid=$pid gwm_port=${addr##*:}
  else
    gw_pid=$pid gw=$addr gw_port=${addr##*:}
    bench_check_workers "$pid" "$line" "$workers" || die "the gateway is not serving with $workers worker(s)"
  fi
}

# --- measuring -----------------------------------------------------------------

# utime+stime of a process (all its threads), in clock ticks. The command
# name in /proc/PID/stat is in parentheses and may hold spaces: count the
# fields after its closing parenthesis (utime, stime are fields 14, 15).
ticks() { sed 's/^.*) //' /proc/"$1"/stat | awk '{print $12 + $13}'; }
# cutime+cstime of this shell: the CPU time of the children it has waited
# for, the load generator (and what it waited for) included.
child_ticks() { sed 's/^.*) //' /proc/$$/stat | awk '{print $14 + $15}'; }
# Busy ticks of the whole machine (all CPUs, all processes): user, nice,
# system, irq, softirq and steal from /proc/stat.
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
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

# Before each run, wait (at most QUIET_WAIT seconds, default 60) until the
# machine is quiet: under a quarter of a CPU busy over one second. Our own
# processes are idle then, so what is busy is other jobs (a shared machine's
# builds and tests). Past the wait the run goes ahead, and the report marks
# it if other jobs took CPU while it ran.
settle() {
  local waited=0 m0 m1
  while :; do
    m0=$(machine_ticks); sleep 1; m1=$(machine_ticks)
    awk -v t=$((m1 - m0)) -v tck="$tck" 'BEGIN { exit !(t / tck < 0.25) }' && return 0
    waited=$((waited + 1))
    if [ "$waited" -ge "${QUIET_WAIT:-60}" ]; then
      echo "load: the machine is still busy after ${waited}s; running anyway" >&2
      return 0
    fi
  done
}

# wrk has neither an SNI nor a connect-to option: it resolves the URL's
# host with getaddrinfo and sends that host as SNI. So it runs in a private
# mount namespace where /etc/hosts is a bind-mounted file naming the origin
# 127.0.0.1; the machine's /etc/hosts is never touched, and the mount goes
# away with the process. The Host header is set without the port, since the
# gateway refuses a Host naming a port other than 443 (host_mismatch).
# (A command prefix rather than a function, so that `timeout` can run it.)
wrk_ns=(unshare --mount)
[ "$(id -u)" -eq 0 ] || wrk_ns+=(--map-root-user)
# shellcheck disable=SC2016 # $0 and $@ belong to the inner shell
wrk_ns+=(sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$work/hosts")

# wrk_run RUN PORT PATH CONNECTIONS [WRK OPTIONS...]
wrk_run() {
  local run=$1 port=$2 path=$3 conns=$4; shift 4
  measure "$run" "${wrk_ns[@]}" wrk -t1 -c"$conns" -d"${dur}s" --latency -s "$work/report.lua" \
    -H "Host: $name" "$@" "https://$name:$port$path"
}

# h2load_run RUN PORT PATH H2LOAD OPTIONS...: h2load sends the URL's host
# as SNI and :authority and connects where --connect-to says.
h2load_run() {
  local run=$1 port=$2 path=$3; shift 3
  measure "$run" h2load --connect-to="127.0.0.1:$port" "$@" "https://$name$path"
}

prepare_clients() {
  printf '127.0.0.1 localhost\n127.0.0.1 %s\n' "$name" >"$work/hosts"
  # Only done() is defined, so wrk keeps its fast path for every request.
  cat >"$work/report.lua" <<'LUA'
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d bytes=%d duration_us=%d errors=%d non2xx=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.bytes, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
LUA
  local got
  got=$("${wrk_ns[@]}" getent hosts "$name" | awk '{print $1}')
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

masked_report() {
  echo
  echo "Masking: the via-gateway 1 MiB runs above against the same runs through a gateway masking 4 attached values:"
  echo
  echo "| figure | masking off | masking on | on/off | CPU-s per GB off / on |"
  echo "|---|---:|---:|---:|---:|"
  local run label
  for run in h1_1mib h2_1mib; do
    label="1 MiB HTTP/1.1 MB/s"; [ "$run" = h2_1mib ] && label="1 MiB HTTP/2 MB/s"
    local b0 s0 b1 s1 g0 g1
    read -r _ s0 b0 _ < <(figures "$run.gw")
    read -r _ s1 b1 _ < <(figures "$run.gwm")
    g0=$(cpu_field "$run.gw" gw_ticks); g1=$(cpu_field "$run.gwm" gw_ticks)
    awk -v l="$label" -v b0="$b0" -v s0="$s0" -v b1="$b1" -v s1="$s1" -v g0="$g0" -v g1="$g1" -v tck="$tck" 'BEGIN {
      r0 = (s0 > 0 ? b0 / s0 / 1e6 : 0); r1 = (s1 > 0 ? b1 / s1 / 1e6 : 0)
      printf "| %s | %.0f | %.0f | %.2f | %.2f / %.2f |\n", l, r0, r1, (r0 > 0 ? r1 / r0 : 0),
        (b0 > 0 ? g0 / tck / b0 * 1e9 : 0), (b1 > 0 ? g1 / tck / b1 * 1e9 : 0) }'
  done
}

# --- the report ----------------------------------------------------------------

# Figures of one run as "requests seconds bytes errors p50_us p99_us mean_us"
# (latencies in microseconds, "-" where the tool gives none). Numbers are
# printed with %.0f, not %d: mawk's %d stops at 2^31 - 1 and a 10 s run of
# 1 MiB replies reads more bytes than that.
figures() {
  local out=$work/$1.out
  if grep -q '^RESULT ' "$out"; then
    sed -n 's/^RESULT //p' "$out" | tr ' ' '\n' | awk -F= '{v[$1]=$2}
      END {printf "%.0f %.3f %.0f %.0f %.0f %.0f -\n", v["requests"] - v["non2xx"], v["duration_us"] / 1e6,
        v["bytes"], v["errors"] + v["non2xx"], v["p50_us"], v["p99_us"]}'
  elif grep -q '^finished in' "$out"; then
    awk '
      function us(s) { # h2load durations: 12.3us, 4.5ms, 1.2s
        if (s ~ /us$/) return s + 0; if (s ~ /ms$/) return s * 1000; return s * 1e6 }
      /^finished in/ { sub(/,$/, "", $3); secs = us($3) / 1e6 }
      /^requests:/ { ok = $8; bad = $10 + $12 + $14 }
      /^status codes:/ { ok2xx = $3 }
      /^traffic:/ { gsub(/[()]/, "", $3); bytes = $3 }
      /^time for request:/ { mean = us($6) }
      END { if (ok2xx < ok) { bad += ok - ok2xx; ok = ok2xx }
            printf "%.0f %.3f %.0f %.0f - - %.0f\n", ok, secs, bytes, bad, mean }' "$out"
  else
    echo "0 0 0 1 - - -"
  fi
}
field() { figures "$1" | awk -v i="$2" '{print $i}'; }
cpu_field() { sed 's/ /\n/g' "$work/$1.cpu" | sed -n "s/^$2=//p"; }

rate() { awk -v n="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.0f", n / s; else print "-" }'; }
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.0f", b / s / 1e6; else print "-" }'; }
ms() { awk -v u="$1" 'BEGIN { if (u == "-") print "-"; else printf "%.2f", u / 1000 }'; }
ratio() { awk -v a="${1%\*}" -v b="${2%\*}" 'BEGIN { if (a + 0 > 0 && b != "-") printf "%.2f", b / a; else print "-" }'; }
row() { printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }

# A figure's row: RUN LABEL KIND (reqs | conns | mbps | p50 | p99 | mean).
figure_row() {
  local run=$1 label=$2 kind=$3 d g side
  for side in direct gw; do
    local n s b p50 p99 mean v
    read -r n s b _ p50 p99 mean < <(figures "$run.$side")
    case $kind in
      reqs | conns) v=$(rate "$n" "$s") ;;
      mbps) v=$(mbps "$b" "$s") ;;
      p50) v=$(ms "$p50") ;;
      p99) v=$(ms "$p99") ;;
      mean) v=$(ms "$mean") ;;
    esac
    [ "$(disturbed "$run.$side" "$s")" = 1 ] && v="$v*"
    if [ "$side" = direct ]; then d=$v; else g=$v; fi
  done
  row "$label" "$d" "$g"
}

# 1 when other jobs used more than a quarter of a CPU during the run RUN
# (of SECONDS): its figure is marked with a star.
disturbed() {
  awk -v o="$(cpu_field "$1" other_ticks)" -v tck="$tck" -v s="$2" \
    'BEGIN { print (s > 0 && o / tck / s > 0.25) ? 1 : 0 }'
}

runs="h1_small h2_small h1_1mib h2_1mib h2_1mib_1 h1_newconn h2_burst"
report() {
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -n1)," \
    "${dur} s per run, gateway with $workers runtime worker(s)"
  echo
  echo "| figure | direct | via gateway | via/direct |"
  echo "|---|---:|---:|---:|"
  figure_row h1_small "HTTP/1.1 keep-alive, small replies: req/s (wrk -c32)" reqs
  figure_row h1_small "… latency p50, ms" p50
  figure_row h1_small "… latency p99, ms" p99
  figure_row h2_small "HTTP/2, small replies: req/s (h2load -c8 -m32)" reqs
  figure_row h2_small "… mean latency, ms" mean
  figure_row h1_1mib "1 MiB replies, HTTP/1.1: MB/s (wrk -c4)" mbps
  figure_row h2_1mib "1 MiB replies, HTTP/2: MB/s (h2load -c4 -m1)" mbps
  figure_row h2_1mib_1 "1 MiB replies one at a time, HTTP/2: MB/s (h2load -c1 -m1)" mbps
  figure_row h1_newconn "new TLS connections/s, one request each (wrk -c16, Connection: close)" conns
  figure_row h2_burst "burst of $burst new connections: conn/s (h2load -c$burst -n$burst)" conns
  echo
  echo "\\* other jobs on the machine used more than a quarter of a CPU during that run."
  echo
  echo "Gateway CPU time in the via-gateway runs; the other processes' CPU time in both (\"other"
  echo "jobs\": the rest of the machine, approximate: within about ±0.5 CPU-s per 10 s when quiet)."
  echo
  echo "| run | gateway CPU-s | gateway busy | gateway CPU-s per 1k req | gateway CPU-s per GB | origin CPU-s direct / via | client CPU-s direct / via | other jobs CPU-s direct / via | gateway records |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  local run
  for run in $runs; do
    local n s b gt
    read -r n s b _ < <(figures "$run.gw")
    gt=$(cpu_field "$run.gw" gw_ticks)
    awk -v run="$run" -v gt="$gt" -v tck="$tck" -v n="$n" -v s="$s" -v b="$b" \
      -v od="$(cpu_field "$run.direct" origin_ticks)" -v og="$(cpu_field "$run.gw" origin_ticks)" \
      -v cd="$(cpu_field "$run.direct" client_ticks)" -v cg="$(cpu_field "$run.gw" client_ticks)" \
      -v xd="$(cpu_field "$run.direct" other_ticks)" -v xg="$(cpu_field "$run.gw" other_ticks)" \
      -v rec="$(cpu_field "$run.gw" records)" 'BEGIN {
        cpu = gt / tck
        printf "| %s | %.2f | %s | %s | %s | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %d |\n", run, cpu,
          (s > 0 ? sprintf("%.0f%%", 100 * cpu / s) : "-"),
          (n > 0 ? sprintf("%.4f", cpu / n * 1000) : "-"),
          (b > 0 ? sprintf("%.2f", cpu / b * 1e9) : "-"),
          od / tck, og / tck, cd / tck, cg / tck, xd / tck, xg / tck, rec }'
  done
  echo
  echo "Failed requests/connections per run (0 expected; the end of a timed wrk run may cut a few):"
  for run in $runs; do
    printf '  %s: direct %s, via gateway %s\n' "$run" "$(field "$run.direct" 4)" "$(field "$run.gw" 4)"
  done
  echo
  echo "Gateway threads at the end (name: CPU ticks):"
  local t
  for t in /proc/"$gw_pid"/task/*; do
    printf '  %s: %s\n' "$(cat "$t/comm")" "$(ticks "${t#/proc/}")"
  done
}

install_tools
tck=$(getconf CLK_TCK) # the unit of every CPU time in /proc
say "Building release binaries"
cargo build --release -q -p talos-gateway -p talos-e2e --bins
start_peers
start_gateway
start_gateway .masked
prepare_clients
warm_up
run_all
run_masked
{ report; masked_report; } | tee "$work/table.md"
