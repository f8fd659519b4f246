#!/usr/bin/env bash
# What forwarding over the member link costs, on one machine: a linked
# pair (release builds, one runtime worker each) under `control-stub
# serve`, one session on both members, one member SIGKILLed and started
# again so that it forwards the session to the other. Side by side, in
# rounds alternating which goes first: CPU per new connection on the
# forwarder against a terminated one, CPU per GB of the forwarded path
# against a terminated one, both against a plain TCP relay (HAProxy in TCP
# mode, as benches/compare/run.sh's relay column), and each new
# connection's time through the hop and without it, at p50 and p99.
# Prints one Markdown table (benches/harness/src/bin/pair-bench.rs computes it).
#
#   benches/pair/run.sh     # 2000 connections 16 at once, 300 one at a time, 1 GiB; 3 rounds
#   CONNS=1000 CONCURRENCY=16 LATENCY_CONNS=100 MIB=64 ROUNDS=3 benches/pair/run.sh
#   NO_BUILD=1 (use BIN_DIR as it is)  NO_INSTALL=1 (do not apt-get haproxy)
#   GATEWAY_B=path/to/other/gateway benches/pair/run.sh   # two builds of the
#     forwarder side by side: CPU per new connection of each, every round
#
# Every process is stopped by its PID (the driver stops the rig's and
# HAProxy's); the run is bounded by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release -q -p talos-gateway -p talos-control-stub --bins
  cargo build --release -q -p talos-bench-harness --bin pair-bench
fi
if [ "${NO_INSTALL:-0}" != 1 ] && ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq haproxy
fi
export TALOS_GATEWAY_BIN=$bin/gateway TALOS_CONTROL_STUB_BIN=$bin/control-stub
export TALOS_TEST_WORKERS=${WORKERS:-1}
export RUST_LOG=${RUST_LOG:-warn} TALOS_GATEWAY_LOG=${TALOS_GATEWAY_LOG:-info}
ab=()
[ -z "${GATEWAY_B:-}" ] || ab=(--ab "$(realpath "$GATEWAY_B")")
timeout -k 5 900 "$bin/pair-bench" "${ab[@]}" --conns "${CONNS:-2000}" --concurrency "${CONCURRENCY:-16}" --latency-conns "${LATENCY_CONNS:-300}" --mib "${MIB:-1024}" --rounds "${ROUNDS:-3}"
