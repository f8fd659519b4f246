#!/usr/bin/env bash
# Checks that no process of this checkout's binaries is left running: every
# process a test starts, and every process the gateway spawns on a test's
# behalf (an upgrade's successor), must have been stopped by its PID.
#
#   scripts/check-leftovers.sh --record FILE   note what runs now (before)
#   scripts/check-leftovers.sh --check FILE    fail on anything new since
#
# A process counts as the project's when its executable is under this
# checkout's target directory (debug or release, deleted or not), or when it
# is one of the Chromium processes the browser tests start
# (tests/src/browser): each of those names the browser's temporary folder,
# `talos-chromium-TAG-…`, on its command line, where TAG is the first 12 hex
# digits of the SHA-256 of this checkout's path, so another checkout's
# browsers running at the same time are not counted. Anything found is
# listed with its command line, then stopped (SIGKILL), so that a failed run
# still leaves nothing behind; the check fails all the same.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
# The same tag as talos_e2e::browser::checkout_tag().
browser_tag="talos-chromium-$(printf '%s' "$(pwd -P)" | sha256sum | cut -c1-12)-"

ours() {
  local exe cmd
  for proc in /proc/[0-9]*; do
    exe="$(readlink "$proc/exe" 2>/dev/null)" || continue
    exe="${exe% (deleted)}"
    case "$exe" in
      "$target"/*) echo "${proc#/proc/}"; continue ;;
    esac
    cmd="$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null)" || continue
    case "$cmd" in
      *"$browser_tag"*) echo "${proc#/proc/}" ;;
    esac
  done
}

mode="${1:-}"
file="${2:-}"
if [ -z "$file" ]; then
  echo "usage: $0 --record FILE | --check FILE" >&2
  exit 2
fi
case "$mode" in
  --record)
    ours >"$file"
    ;;
  --check)
    touch "$file"
    left=()
    for pid in $(ours); do
      [ "$pid" = "$$" ] && continue
      grep -qx "$pid" "$file" && continue
      left+=("$pid")
    done
    if [ "${#left[@]}" -eq 0 ]; then
      echo "check-leftovers: no process of the project's binaries or browsers left running"
      exit 0
    fi
    echo "check-leftovers: ${#left[@]} process(es) of the project's binaries or browsers left running:" >&2
    for pid in "${left[@]}"; do
      cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
      parent="$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)"
      echo "  pid $pid (parent $parent): $cmd" >&2
    done
    kill -KILL "${left[@]}" 2>/dev/null || true
    exit 1
    ;;
  *)
    echo "usage: $0 --record FILE | --check FILE" >&2
    exit 2
    ;;
esac
