#!/usr/bin/env bash
# Capacity of one gateway member: sessions opened, used, renewed and closed
# through the real control channel (gRPC over mutual TLS, as the control
# plane does it), and what they cost.
#
# Part "memory": for each count N (default 1, 1,000 and 10,000) and each
# repeat, a fresh member (release build, one runtime worker) and a fresh
# control-plane driver (benches/harness/src/bin/capacity-driver.rs, which also takes
# the member's signed batches): a warm-up session (opened, one request to
# each name, closed), then the member's VmRSS; N sessions opened (CONC
# OpenSession calls in flight); VmRSS; one TLS connection and one request
# to each of the 3 names of every session (TOUCH of them), each from the
# session's own 127.0.X.Y source and checked against the CA the member
# returned; VmRSS; IDLE_S seconds of nothing but lease renewals; one timed
# RenewLeases of all; every session closed (CONC CloseSession calls in
# flight); VmRSS. The member's CPU time is read around each phase.
#
# Part "ab": per-request CPU with AB_SESSIONS sessions open against 1, side
# by side: member A holds one session, member B AB_SESSIONS (each touched
# as above, AB_TOUCH of them), both hold session 0 (source 127.0.0.1, where
# h2load comes from); h2load's small-reply workloads in ROUNDS rounds of DUR
# seconds that alternate which member goes first, as
# benches/load/gateway-ab.sh does.
#
#   benches/capacity/run.sh                     # both parts, ~15 minutes
#   PARTS=ab benches/capacity/run.sh            # one part
#   COUNTS="1 20" REPEAT=1 IDLE_S=1 ROUNDS=1 DUR=1 AB_SESSIONS=20 QUIET_WAIT=0 \
#     NO_BUILD=1 BIN_DIR=target/debug STRICT=1 benches/capacity/run.sh   # the smoke run (scripts/test.sh)
#
# Knobs: PARTS ("memory ab"), COUNTS ("1 1000 10000"), REPEAT (2), TOUCH
# (sessions touched per run: "all" or a number, spread evenly; at most
# what the open-files limit leaves room for, see below), CONC (8),
# TOUCH_CONC (16), IDLE_S (20), RENEW_MS (10000: the control plane's
# renewal interval; the member's lease is its default, 60000 ms),
# ATTACH (credentials attached to each session, 0), AB_SESSIONS (10000),
# AB_TOUCH ("all"), ROUNDS (6), DUR (5), WORKLOADS ("h1 h2"), WORKERS (the
# member's runtime workers, 1), QUIET_WAIT (seconds to wait for a quiet
# machine before each measured phase, 60), BIN_DIR (default
# $CARGO_TARGET_DIR/release or target/release), NO_BUILD=1, KEEP=1 (keep
# the work folder), STRICT=1 (fail when a call, request or lease renewal
# failed; speed is never judged), FROM=DIR (print a kept work folder's
# tables again: no run).
#
# The shell starts the processes and reads /proc (bench-figures); the
# driver does what the shell asks, one command a line through a FIFO, and
# answers one JSON line each; bench-figures computes the tables from the
# raw readings the work folder keeps (benches/harness/src/figures/capacity.rs).
# Every wait is bounded; everything started here is stopped by its PID.
# What it measures, and the latest figures: benches/capacity/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/lib.sh

parts=${PARTS:-memory ab}
counts=${COUNTS:-1 1000 10000}
repeat=${REPEAT:-2}
touch_n=${TOUCH:-all}
conc=${CONC:-8}
touch_conc=${TOUCH_CONC:-16}
idle_s=${IDLE_S:-20}
renew_ms=${RENEW_MS:-10000}
attach=${ATTACH:-0}
ab_sessions=${AB_SESSIONS:-10000}
ab_touch=${AB_TOUCH:-all}
rounds=${ROUNDS:-6}
dur=${DUR:-5}
workloads=${WORKLOADS:-h1 h2}
workers=${WORKERS:-1}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
# The three names every session lists, each its own destination address
# (load-origin: one source reaches one address and port from at most the
# kernel's ~28,000 ephemeral ports, and the member keeps a connection per
# session and name).
name=origin.demo.test
more_names=(api.demo.test@127.0.0.3 files.demo.test@127.0.0.4)
names=$name,api.demo.test,files.demo.test
permit=127.0.0.1/32,127.0.0.3/32,127.0.0.4/32
# The longest the shell waits for one answer of the driver (it bounds
# each command at 1,200 s itself).
answer_wait=1300

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
die() { echo "capacity: $*" >&2; exit 1; }
figures() { "$bin/bench-figures" "$@"; } # benches/harness/src/bin/bench-figures.rs

if [ -n "${FROM:-}" ]; then
  [ -f "$FROM/run.env" ] || die "$FROM/run.env is missing: is it a work folder kept with KEEP=1?"
  [ "${NO_BUILD:-0}" = 1 ] || cargo build --release -q --locked -p talos-bench-harness --bin bench-figures
  figures capacity-table "$FROM"
  [ "${STRICT:-0}" != 1 ] || figures capacity-check "$FROM"
  exit
fi

for p in $parts; do
  case $p in memory | ab) ;; *) die "PARTS: no part $p (memory, ab)" ;; esac
done
if [[ " $parts " == *" ab "* ]] && ! command -v h2load >/dev/null; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq nghttp2-client
fi

# File descriptors: each touched session keeps a connection to each of its
# 3 names open on the member (until the session ends), and the origin holds
# the other end of each. Untouched sessions hold none. So the sessions
# touched are at most what the limit allows (3 each, 4,096 spare), in
# thousands: 5,000 under a limit of 20,000.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fd_room=$((($(ulimit -n) - 4096) / 3))
[ "$fd_room" -ge 1000 ] && fd_room=$((fd_room / 1000 * 1000))
[ "$fd_room" -ge 1 ] || die "ulimit -n $(ulimit -n): too few file descriptors"
if [ "${NO_BUILD:-0}" != 1 ]; then
  say "Building release binaries"
  cargo build --release -q --locked -p talos-gateway -p talos-bench-harness --bins
fi
for b in gateway load-origin capacity-driver bench-figures; do
  [ -x "$bin/$b" ] || die "no $b in $bin"
done
tck=$(getconf CLK_TCK)

work=$(mktemp -d /tmp/talos-capacity.XXXXXX)
mkdir -p "$work/runs" "$work/ab"
pids=()
# stop PID...: TERM, at most 10 s (the member drains), then KILL.
stop() { bench_stop 10 "$@"; }
cleanup() {
  [ ${#pids[@]} -eq 0 ] || stop "${pids[@]}"
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "capacity: files kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

settle() { bench_settle capacity 60; }
rss() { figures rss-kib "$1"; }
ticks() { figures ticks "$1"; }
now() { date +%s.%N; }

# --- processes ---------------------------------------------------------------

say "Starting the DNS server and the TLS origin for $names (load-origin)"
"$bin/load-origin" "$work" "${more_names[@]}" >"$work/origin.out" 2>"$work/origin.log" &
pids+=($!)
line=$(bench_ready_line "$work/origin.out")
dns=$(echo "$line" | figures json-field dns)
origin=$(echo "$line" | figures json-field origin)

declare -A gw_pid drv_pid to_drv from_drv data_port
lease_ms=""

# start_member TAG: a control-plane driver (its ControlPlane service takes
# the member's batches), then a member shipping to it, then the driver
# connected to the member's control listener.
start_member() {
  local tag=$1 d=$work/$1 line plane
  rm -rf "$d"
  mkdir -p "$d/ctl"
  mkfifo "$d/to" "$d/from"
  "$bin/capacity-driver" dir="$d/ctl" names="$names" renew_ms="$renew_ms" attach="$attach" \
    <"$d/to" >"$d/from" 2>"$d/driver.log" &
  drv_pid[$tag]=$!
  pids+=($!)
  local to from
  exec {to}>"$d/to" {from}<"$d/from"
  to_drv[$tag]=$to from_drv[$tag]=$from
  IFS= read -r -t 30 line <&"$from" || die "driver $tag did not start: $(tail -3 "$d/driver.log")"
  plane=$(echo "$line" | figures json-field plane)
  bench_gateway_toml file="$d/gateway.toml" id="gw-cap-$tag" dns="$dns" port="${origin##*:}" \
    work="$work" records="$d/records.jsonl" control="$d/ctl" plane="$plane" permit="$permit" \
    workers="$workers" limits="shutdown_grace_ms = 2000" gateway="$bin/gateway"
  "$bin/gateway" run --config "$d/gateway.toml" >"$d/gateway.out" 2>"$d/gateway.log" &
  gw_pid[$tag]=$!
  pids+=($!)
  line=$(bench_ready_line "$d/gateway.out")
  # The ready line says how many workers serve. (bench_check_workers'
  # count of threads does not apply: with a [control] table the journal and
  # the spool have used blocking-pool threads before the ready line.)
  [ "$(echo "$line" | figures json-field workers)" = "$workers" ] ||
    die "member $tag is not serving with $workers worker(s): $line"
  local data control
  data=$(echo "$line" | figures json-field data)
  control=$(echo "$line" | figures json-field control)
  data_port[$tag]=${data##*:}
  line=$(ask "$tag" connect "$control" "$data")
  lease_ms=$(echo "$line" | figures json-field lease_ms)
  echo "member $tag: data $data, control $control (pid ${gw_pid[$tag]}); driver pid ${drv_pid[$tag]}" >&2
}

# ask TAG COMMAND...: the driver's one-line JSON answer; an error answer
# (or none in time) ends the run.
ask() {
  local tag=$1 line ev
  shift
  echo "$*" >&"${to_drv[$tag]}"
  IFS= read -r -t "$answer_wait" line <&"${from_drv[$tag]}" ||
    die "driver $tag did not answer '$*': $(tail -3 "$work/$tag/driver.log")"
  ev=$(echo "$line" | figures json-field event)
  [ "$ev" != error ] || die "driver $tag: '$*': $line"
  echo "$line"
}

# stop_member TAG: the member drains (shipping its last batches and
# reports to the driver) and exits; then the driver quits.
stop_member() {
  local tag=$1
  local to=${to_drv[$tag]} from=${from_drv[$tag]}
  stop "${gw_pid[$tag]}"
  echo quit >&"$to" || true
  exec {to}>&- {from}<&-
  stop "${drv_pid[$tag]}"
  local keep=() p
  for p in "${pids[@]}"; do
    [ "$p" = "${gw_pid[$tag]}" ] || [ "$p" = "${drv_pid[$tag]}" ] || keep+=("$p")
  done
  pids=("${keep[@]}")
}

# phase FILE NAME COMMAND...: after a quiet-machine wait, the member's CPU
# time around one command, its VmRSS a second later (what the phase left),
# the wall time, the answer: one line of FILE. COMMAND "sleep S" asks
# nothing for S seconds, then for the driver's status.
phase() {
  local file=$1 ph=$2 t0 t1 s0 s1 line
  shift 2
  local pid=${gw_pid[m]}
  settle
  t0=$(ticks "$pid")
  s0=$(now)
  if [ "$1" = sleep ]; then
    sleep "$2"
    t1=$(ticks "$pid")
    s1=$(now)
    line=$(ask m status)
  else
    line=$(ask m "$@")
    t1=$(ticks "$pid")
    s1=$(now)
  fi
  sleep 1
  echo "$ph $((t1 - t0)) $(rss "$pid") $(awk "BEGIN { print $s1 - $s0 }") $line" >>"$file"
  echo "  $ph: $line" >&2
}

touch_count() { # SPEC N: how many of N sessions to touch (all: as many as fd_room allows)
  local want=$1 n=$2
  [ "$want" = all ] && want=$n
  [ "$want" -gt "$n" ] && want=$n
  if [ "$want" -gt "$fd_room" ]; then
    echo "capacity: touching $fd_room of $n sessions: ulimit -n $(ulimit -n) leaves room for 3 connections each of at most $fd_room" >&2
    want=$fd_room
  fi
  echo "$want"
}

# --- the runs -----------------------------------------------------------------

memory_runs() {
  local r n f
  for r in $(seq "$repeat"); do
    for n in $counts; do
      say "$n sessions, run $r of $repeat"
      f=$work/runs/$n.$r.phases
      start_member m
      line=$(ask m warm)
      sleep 1
      echo "base 0 $(rss "${gw_pid[m]}") 0 $line" >"$f"
      phase "$f" open open "$n" "$conc"
      phase "$f" touch touch "$(touch_count "$touch_n" "$n")" "$touch_conc"
      phase "$f" idle sleep "$idle_s"
      phase "$f" renew renew
      phase "$f" close close "$conc"
      stop_member m
    done
  done
}

# ab_round T WL: one workload on member T; prints "CPU-per-1k rate".
ab_round() {
  local t=$1 wl=$2 out=$3 b a s0 s1
  local to=(timeout -k 5 $((dur + 60)) h2load --connect-to="127.0.0.1:${data_port[$t]}")
  b=$(ticks "${gw_pid[$t]}")
  s0=$(now)
  case $wl in
    h1) "${to[@]}" --h1 -c32 -m1 -D "$dur" "https://$name$BENCH_SMALL_PATH" >"$out" 2>&1 || true ;;
    h2) "${to[@]}" -c8 -m32 -D "$dur" "https://$name$BENCH_SMALL_PATH" >"$out" 2>&1 || true ;;
    *) die "WORKLOADS: no workload $wl (h1, h2)" ;;
  esac
  s1=$(now)
  a=$(ticks "${gw_pid[$t]}")
  "$bin/bench-figures" ab-round "$wl" $((a - b)) "$tck" "$s0" "$s1" <"$out"
}

ab_runs() {
  say "Per request: member A with 1 session, member B with $ab_sessions"
  start_member a
  start_member b
  local t line
  for t in a b; do ask "$t" warm >/dev/null; done
  line=$(ask a open 1 1)
  echo "  a: $line" >&2
  line=$(ask b open "$ab_sessions" "$conc")
  echo "  b: $line" >&2
  line=$(ask a touch 1 1)
  echo "  a: $line" >&2
  line=$(ask b touch "$(touch_count "$ab_touch" "$ab_sessions")" "$touch_conc")
  echo "  b: $line" >&2
  # Warm up: the pooled upstream connection for session 0, h2 and h1.
  for t in a b; do
    timeout 30 h2load -n 200 -c 2 -m 4 --connect-to="127.0.0.1:${data_port[$t]}" "https://$name/" >/dev/null
    timeout 30 h2load --h1 -n 200 -c 2 --connect-to="127.0.0.1:${data_port[$t]}" "https://$name/" >/dev/null
  done
  local wl r order tag out res
  for wl in $workloads; do
    echo "== $wl (CPU-s per 1k req, req/s)" >&2
    res=$work/ab/$wl.res
    : >"$res"
    for r in $(seq "$rounds"); do
      order="a b"
      [ $((r % 2)) = 0 ] && order="b a"
      for t in $order; do
        settle
        tag=A
        [ "$t" = b ] && tag=B
        out=$work/ab/$wl.$r.$tag.out
        line=$(ab_round "$t" "$wl" "$out")
        echo "round $r $tag: $line" | tee -a "$res" >&2
      done
    done
  done
  for t in a b; do
    line=$(ask "$t" status)
    echo "$t $(rss "${gw_pid[$t]}") $line" >>"$work/ab/status"
    echo "  $t: $line" >&2
  done
  stop_member a
  stop_member b
}

for p in $parts; do
  case $p in
    memory) memory_runs ;;
    ab) ab_runs ;;
  esac
done

{
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc=$(nproc)"
  echo "cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n1)"
  echo "clk_tck=$tck"
  echo "workers=$workers"
  echo "attach=$attach"
  echo "conc=$conc"
  echo "touch_conc=$touch_conc"
  echo "renew_ms=$renew_ms"
  echo "lease_ms=$lease_ms"
  echo "idle_s=$idle_s"
  echo "ab_sessions=$ab_sessions"
  echo "workloads=$workloads"
} >"$work/run.env"
figures capacity-table "$work" | tee "$work/table.md"
[ "${STRICT:-0}" != 1 ] || figures capacity-check "$work"
