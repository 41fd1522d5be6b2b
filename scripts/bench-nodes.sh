#!/usr/bin/env bash
# tarn bench WORKLOAD on PostgreSQL (durable commits), or with
# STORE=cassandra on a throwaway three-node Cassandra cluster: one node, then
# two nodes behind nginx (round-robin), server CPU summed over the nodes.
#   scripts/bench-nodes.sh kenai [extra tarn bench flags]
#   STORE=cassandra scripts/bench-nodes.sh user-home --quick
#   NODES=1 scripts/bench-nodes.sh chat     (only the one-node run; NODES=2 only the two)
# On Cassandra, user-home runs scripts/cassandra/after-load.sh after loading
# each pool size (tarn bench --after-load): it flushes every node's memtables
# and waits for their compactions, so that every size is read from sstables
# (not the smallest from memtables alone) on a quiet cluster; FLUSH=0 does not,
# and COMPACT=1 also compacts each node (nodetool compact) before the wait;
# the nodes' key cache counters are printed then and after the bench.
# On Cassandra the nodes run the full JIT, and each step warms its users up
# WARMUP seconds (default 45; tarn bench --warmup-seconds, which custard and
# chat ignore) before measuring them: set WARMUP rather than passing the flag.
# Needs nginx (apt-get install nginx) for the two-node run.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKLOAD=${1:?workload}; shift
cargo build --release -p tarn >/dev/null
OUT=${OUT:-bench-results/nodes}
mkdir -p "$OUT"
export STORE=${STORE:-postgres}
# The runs to make, under a name of its own: with-cassandra.sh sets NODES
# (the Cassandra cluster's size) for the command it runs.
export TARN_RUNS=${NODES:-1 2}
case $STORE in
  postgres) export TARN_PG_DURABLE=1; WITH=scripts/with-postgres.sh ;;
  cassandra) WITH=scripts/with-cassandra.sh
    # The nodes' full JIT (C2), as in production; tests stop at C1. It
    # compiles under load for about a minute: steps warm up 45 s.
    export TARN_CASSANDRA_JVM_OPTS=${TARN_CASSANDRA_JVM_OPTS--XX:TieredStopAtLevel=4}
    export TARN_WARMUP=${WARMUP:-45}
    if [ "$WORKLOAD" = user-home ] && [ "${FLUSH:-1}" != 0 ]; then
      TARN_AFTER_LOAD=$(printf %q "$PWD/scripts/cassandra/after-load.sh"); export TARN_AFTER_LOAD
    fi ;;
  *) echo "STORE is postgres or cassandra" >&2; exit 2 ;;
esac
exec $WITH bash -c '
set -euo pipefail
WORKLOAD=$1; OUT=$2; shift 2
free_port() { python3 -c "import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); print(s.getsockname()[1]); s.close()"; }
PIDS=()
BENCH_FLAGS=()
if [ -n "${TARN_AFTER_LOAD:-}" ]; then BENCH_FLAGS=(--after-load "$TARN_AFTER_LOAD"); fi
if [ -n "${TARN_WARMUP:-}" ]; then BENCH_FLAGS+=(--warmup-seconds "$TARN_WARMUP"); fi
cleanup() { for p in "${PIDS[@]}"; do kill $p 2>/dev/null || true; done; [ -n "${NGINX_DIR:-}" ] && nginx -p "$NGINX_DIR" -c "$NGINX_DIR/nginx.conf" -s stop 2>/dev/null || true; }
trap cleanup EXIT
store_url() { # schema (PostgreSQL) or keyspace (Cassandra)
  case $STORE in
    postgres) echo "$TARN_TEST_POSTGRES?schema=$1" ;;
    cassandra) echo "${TARN_TEST_CASSANDRA%/*}/bench_$1?replication=3" ;;
  esac
}
node() { # schema port
  TARN_ADMIN_PASSWORD=bench-admin-password RUST_LOG=warn ./target/release/tarn serve --listen 127.0.0.1:$2 --store "$(store_url $1)" >/dev/null &
  PIDS+=($!)
  until curl -sf http://127.0.0.1:$2/api/v1/health >/dev/null; do sleep 0.2; done
}
# One node.
if [ "$TARN_RUNS" != 2 ]; then
P1=$(free_port); node one $P1
./target/release/tarn bench "$WORKLOAD" --url http://127.0.0.1:$P1 --admin-password bench-admin-password \
  --server-pid ${PIDS[0]} --out "$OUT/$WORKLOAD-$STORE-1node" "${BENCH_FLAGS[@]}" "$@"
kill ${PIDS[0]}; PIDS=()
fi
[ "$TARN_RUNS" = 1 ] && exit 0
# Two nodes behind nginx.
PA=$(free_port); PB=$(free_port); PL=$(free_port)
node two $PA; node two $PB
NGINX_DIR=$(mktemp -d)
sed -e "s/127.0.0.1:7701/127.0.0.1:$PA/; s/127.0.0.1:7702/127.0.0.1:$PB/; s/listen 127.0.0.1:7700/listen 127.0.0.1:$PL/" \
  docs/nginx-two-nodes.conf > "$NGINX_DIR/nginx.conf"
nginx -p "$NGINX_DIR" -c "$NGINX_DIR/nginx.conf"
until curl -sf http://127.0.0.1:$PL/api/v1/health >/dev/null; do sleep 0.2; done
./target/release/tarn bench "$WORKLOAD" --url http://127.0.0.1:$PL --admin-password bench-admin-password \
  --server-pid ${PIDS[0]},${PIDS[1]} --out "$OUT/$WORKLOAD-$STORE-2nodes" "${BENCH_FLAGS[@]}" "$@"
if [ -n "${TARN_AFTER_LOAD:-}" ]; then "$TARN_AFTER_LOAD" caches | sed "s/^/after the bench: /" >&2; fi
' _ "$WORKLOAD" "$OUT" "$@"
