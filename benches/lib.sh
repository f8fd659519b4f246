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

# The path of the benchmarks' 1 KiB reply: GET /bytes/1024, which
# load-origin answers from one pattern block it built at start, with a
# Content-Length. SMALL_PATH replaces it (for example a long one, to weigh
# header coding: SMALL_PATH=/$(printf '%0990d' 0 | tr 0 x) gets the
# origin's catch-all route, whose reply "origin says hello: HTTP/1.1 GET
# PATH" is then 1 KiB).
BENCH_SMALL_PATH=${SMALL_PATH:-/bytes/1024}
