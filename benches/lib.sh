# shellcheck shell=bash
# Shared by the bench scripts (sourced, not run).

# bench_gateway_toml key=value ...: writes the bench gateway's config, one
# static session for NAME in front of load-origin, with
# `$bin/bench-figures gateway-config` (the end-to-end test rig's writer,
# tests/src/gateway.rs), and checks it with `GATEWAY check-config`.
#
#   file=PATH      where to write it
#   id=ID          gateway_id            session=ID  the session's id
#   name=NAME      the one listed name   sources=A,B  its source addresses (127.0.0.1)
#   dns=ADDR       load-origin's DNS     port=N       load-origin's TLS port
#   work=DIR       load-origin's folder (its CA: DIR/origin-ca.pem)
#   records=PATH   the records file      trust=PATH   where the session CA goes
#   limits=TOML    lines for [limits]    workers=N    runtime.workers (1: one thread serves everything)
#   masked=DIR     writes 4 random credentials (0600) to DIR/secret1..4, each
#                  injected into NAME's requests as x-api-key-N: every reply is masked
#   gateway=PATH   the gateway binary (for the check)
bench_gateway_toml() {
  local a file="" gateway="" args=()
  for a in "$@"; do
    case $a in
      gateway=*) gateway=${a#gateway=} ;;
      *) [[ $a == file=* ]] && file=${a#file=}; args+=("$a") ;;
    esac
  done
  "${bin:?}/bench-figures" gateway-config "${args[@]}"
  "$gateway" check-config "$file" >/dev/null
}

# bench_check_workers PID READY_LINE N: the gateway PID, whose ready line is
# READY_LINE, serves with N runtime workers. The ready line says how many;
# the threads agree: tokio names its pool's workers (and, later, the
# blocking-pool threads the records writer's file I/O uses) "tokio-rt-worker",
# so at start-up, before any blocking work, there are N of them; with one
# worker there are none, the main thread being the runtime.
bench_check_workers() {
  local pid=$1 line=$2 want=$3 said n
  said=$(echo "$line" | "${bin:?}/bench-figures" json-field workers || true)
  [ "$said" = "$want" ] || { echo "gateway says ${said:-no} workers, not $want: $line" >&2; return 1; }
  n=$(cat /proc/"$pid"/task/*/comm | grep -c '^tokio-rt-worker$' || true)
  [ "$want" = 1 ] && want=0
  echo "gateway threads at start-up: $(ls /proc/"$pid"/task | wc -l) ($n tokio-rt-worker)" >&2
  [ "$n" = "$want" ] || { echo "expected $want tokio-rt-worker thread(s), found $n" >&2; return 1; }
}

# bench_ready_line FILE: waits (at most 20 s) for a process's first line in
# FILE (its ready line) and prints it; the caller's `die` otherwise.
bench_ready_line() {
  for _ in $(seq 200); do
    if [ -s "$1" ]; then head -n1 "$1"; return 0; fi
    sleep 0.1
  done
  die "no ready line in $1"
}

# bench_settle PREFIX DEFAULT: before a run, waits (at most QUIET_WAIT
# seconds, else DEFAULT) until the machine is under a quarter of a CPU busy
# over one second. Our own processes are idle then, so what is busy is
# other jobs (a shared machine's builds and tests). Past the wait the run
# goes ahead (PREFIX names the script in the message), and the report stars
# it if other jobs took CPU while it ran. Needs `$bin/bench-figures` and
# `tck` (getconf CLK_TCK).
bench_settle() {
  local waited=0 m0 m1
  while :; do
    m0=$("${bin:?}/bench-figures" machine-ticks); sleep 1; m1=$("$bin/bench-figures" machine-ticks)
    [ $((4 * (m1 - m0))) -lt "${tck:?}" ] && return 0 # under a quarter of a CPU
    waited=$((waited + 1))
    if [ "$waited" -ge "${QUIET_WAIT:-$2}" ]; then
      echo "$1: the machine is still busy after ${waited}s; running anyway" >&2
      return 0
    fi
  done
}

# bench_wrk_clients WORK NAME: wrk has neither an SNI nor a connect-to
# option: it resolves the URL's host with getaddrinfo and sends that host as
# SNI. So it runs in a private mount namespace where /etc/hosts is a
# bind-mounted file (WORK/hosts) naming NAME 127.0.0.1; the machine's
# /etc/hosts is never touched, and the mount goes away with the process.
# Sets BENCH_WRK_NS, that command prefix (a prefix rather than a function,
# so that `timeout` can run it), and writes WORK/report.lua, wrk's script
# printing the RESULT line bench-figures reads; only done() is defined, so
# wrk keeps its fast path for every request. (The Host header is to be set
# without the port: the gateway refuses a Host naming a port other than 443,
# host_mismatch.)
bench_wrk_clients() {
  local work=$1 name=$2
  BENCH_WRK_NS=(unshare --mount)
  [ "$(id -u)" -eq 0 ] || BENCH_WRK_NS+=(--map-root-user)
  # shellcheck disable=SC2016 # $0 and $@ belong to the inner shell
  BENCH_WRK_NS+=(sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$work/hosts")
  printf '127.0.0.1 localhost\n127.0.0.1 %s\n' "$name" >"$work/hosts"
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
}

# The path of the benchmarks' 1 KiB reply: GET /bytes/1024, which
# load-origin answers from one pattern block it built at start, with a
# Content-Length. SMALL_PATH replaces it (for example a long one, to weigh
# header coding: SMALL_PATH=/$(printf '%0990d' 0 | tr 0 x) gets the
# origin's catch-all route, whose reply "origin says hello: HTTP/1.1 GET
# PATH" is then 1 KiB).
BENCH_SMALL_PATH=${SMALL_PATH:-/bytes/1024}

# bench_stop SECONDS PID...: SIGTERM to each PID, then at most SECONDS for
# all of them to exit (a gateway drains within its shutdown grace), then
# SIGKILL to any left.
bench_stop() {
  local limit=$1 p alive
  shift
  [ $# -gt 0 ] || return 0
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq $((limit * 10))); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; done
}

# bench_profile DATA PIDS COMMAND...: COMMAND run while `perf record -g`
# samples PIDS (comma-separated) on the cpu-clock event (every machine has
# it; no hardware counters needed), with DWARF call graphs (the gateway
# and the peers are built without frame pointers); the data in DATA, and
# `perf report` by object and symbol in DATA with .txt for .data, which
# benches/compare/perf_shares.py reads. COMMAND's output is its own.
bench_profile() {
  local data=$1 pids=$2 pp
  shift 2
  perf record -q -e cpu-clock -F 499 --call-graph dwarf,8192 -p "$pids" \
    -o "$data" >"${data%.data}.record.log" 2>&1 &
  pp=$!
  sleep 1 # perf attached
  "$@"
  kill -INT "$pp" 2>/dev/null || true
  wait "$pp" 2>/dev/null || true
  perf report -i "$data" --stdio --no-children --sort dso,sym -g none --percent-limit 0 \
    >"${data%.data}.txt" 2>/dev/null
}
