#!/usr/bin/env bash
# Two Tarn nodes of each binary on the test Cassandra cluster (a fresh
# keyspace each run), alternated twice: how long a change written on one
# node takes to show in `/changes` polled on the other
# (scripts/measure-changes-latency.py), N changes a run.
#   scripts/measure-changes-latency.sh BIN_BEFORE BIN_AFTER [N]
set -euo pipefail
cd "$(dirname "$0")/.."
exec scripts/with-cassandra.sh bash -c '
set -euo pipefail
BEFORE=$1; AFTER=$2; N=$3
PIDS=(); trap "kill \${PIDS[@]} 2>/dev/null || true" EXIT
free_port() { python3 -c "import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); print(s.getsockname()[1]); s.close()"; }
run() { # name binary
  local url="${TARN_TEST_CASSANDRA%/*}/mc_$1_$RANDOM?replication=3" pa pb
  pa=$(free_port); pb=$(free_port)
  RUST_LOG=warn "$2" serve --listen 127.0.0.1:$pa --store "$url" >/dev/null 2>&1 & PIDS+=($!)
  until curl -sf http://127.0.0.1:$pa/api/v1/health >/dev/null; do sleep 0.2; done
  RUST_LOG=warn "$2" serve --listen 127.0.0.1:$pb --store "$url" >/dev/null 2>&1 & PIDS+=($!)
  until curl -sf http://127.0.0.1:$pb/api/v1/health >/dev/null; do sleep 0.2; done
  echo -n "$1: "; python3 scripts/measure-changes-latency.py http://127.0.0.1:$pa http://127.0.0.1:$pb "$N"
  kill "${PIDS[-1]}" "${PIDS[-2]}"; wait "${PIDS[-1]}" "${PIDS[-2]}" 2>/dev/null || true
}
run before "$BEFORE"; run after "$AFTER"; run before "$BEFORE"; run after "$AFTER"
' _ "$1" "$2" "${3:-100}"
