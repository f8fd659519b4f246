#!/usr/bin/env bash
# What the control plane's store costs on SQLite and on PostgreSQL, side
# by side in one run (control-stub/benches/store.rs): batch ingest
# (records/s) with one replica and with two taking the same stream at
# once; opening, renewing and closing SESSIONS sessions. PostgreSQL is a
# server of this run's own (scripts/postgres.sh: a temporary folder,
# 127.0.0.1, fsync on), stopped at the end. Prints a table; the raw lines
# are kept in $OUT.
#
#   SESSIONS=10000 BATCHES=200 RECORDS=50 ROUNDS=3 benches/store/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

SESSIONS="${SESSIONS:-10000}"
BATCHES="${BATCHES:-200}"
RECORDS="${RECORDS:-50}"
ROUNDS="${ROUNDS:-3}"
OUT="${OUT:-$(mktemp -t store-bench.XXXXXX.jsonl)}"

cargo bench -p talos-control-stub --bench store --no-run --locked >/dev/null 2>&1
bench="$(ls -t target/release/deps/store-* | grep -v '\.d$' | head -1)"

tmp="$(mktemp -d)"
trap 'scripts/postgres.sh stop "$tmp/pg" || true; rm -rf "$tmp"' EXIT
url="$(scripts/postgres.sh start "$tmp/pg")"
base="${url%/*}"

: > "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  # Alternate which database goes first.
  if [ $((round % 2)) -eq 1 ]; then order="sqlite postgres"; else order="postgres sqlite"; fi
  for db in $order; do
    case "$db" in
      sqlite) where="$tmp/round-$round.db" ;;
      postgres)
        psql -q "$url" -c "CREATE DATABASE bench_$round" >/dev/null
        where="$base/bench_$round" ;;
    esac
    "$bench" --db "$where" --sessions "$SESSIONS" --batches "$BATCHES" --records "$RECORDS" \
      | sed "s/^{/{\"round\":$round,/" >> "$OUT"
  done
done

python3 - "$OUT" "$SESSIONS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
sessions = sys.argv[2]
def med(db, figure, key, **kw):
    vals = [r[key] for r in rows if r["db"] == db and r["figure"] == figure
            and all(r.get(k) == v for k, v in kw.items())]
    return statistics.median(vals) if vals else float("nan")
lines = [
    ("batch ingest, 1 replica (records/s)", "batch_ingest", "records_per_s", {"replicas": 1}),
    ("batch ingest, 2 replicas taking every batch (records/s)", "batch_ingest", "records_per_s", {"replicas": 2}),
    (f"open {sessions} sessions (per s)", "open", "per_s", {}),
    (f"one renewal round over {sessions} sessions (s)", "renewal_round", "seconds", {}),
    (f"close {sessions} sessions (per s)", "close", "per_s", {}),
]
print(f"| figure (median of {len(set(r['round'] for r in rows))} rounds) | SQLite | PostgreSQL | PostgreSQL / SQLite |")
print("|---|---|---|---|")
for label, fig, key, kw in lines:
    a, b = med("sqlite", fig, key, **kw), med("postgres", fig, key, **kw)
    fmt = (lambda v: f"{v:.3f}") if key == "seconds" else (lambda v: f"{v:,.0f}")
    print(f"| {label} | {fmt(a)} | {fmt(b)} | {b / a:.2f} |")
PY
echo "raw: $OUT"
