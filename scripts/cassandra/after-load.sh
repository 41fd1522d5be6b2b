#!/usr/bin/env bash
# Run by `tarn bench --after-load` on the test cluster (scripts/bench-nodes.sh
# with STORE=cassandra): flushes every node's memtables, then waits until no
# node has a compaction pending or running, so that each pool size is read
# from sstables on a cluster that is done with its load. Fails if nodetool
# does, or if compactions still run 10 minutes after the flush. Says on
# stderr how long the flush and the wait took together, and how many
# sstables each node's bench table then has (a read slices every one that
# holds its partition: a bucket partition is in all of them). COMPACT=1
# also compacts each node's tables (nodetool compact; leveled compaction
# then keeps one sstable a level while the data is under its 160 MiB
# sstable size) before the wait, so that every size is read from the same
# number of sstables. The 10 minutes count from the flush, the compaction
# included. It also prints each node's key cache counters (cumulative);
# `after-load.sh caches` prints only those.
set -euo pipefail
CTL=${TARN_TEST_CASSANDRA_CTL:?run under scripts/with-cassandra.sh}
start=$(date +%s)
for n in 1 2 3; do "$CTL" nodetool "$n" flush >/dev/null; done
if [ "${COMPACT:-0}" = 1 ]; then
  for n in 1 2 3; do "$CTL" nodetool "$n" compact >/dev/null; done
fi
sstables() { # the bench keyspaces' sstables on each node (diagnostic only)
  for n in 1 2 3; do
    "$CTL" nodetool "$n" tablestats 2>/dev/null | awk -v n="$n" '
      /^Keyspace *: / { ks = $NF }
      ks !~ /^bench_/ { next }
      /^[ \t]*SSTable count:/ { printf "node %s %s: %s sstables\n", n, ks, $NF }
      /^[ \t]*SSTables in each level:/ { sub(/.*level: /, ""); printf "node %s %s: by level %s\n", n, ks, $0 }' ||
      echo "node $n: nodetool tablestats failed"
  done
}
caches() { # each node's key cache (and chunk cache, when enabled), cumulative (diagnostic only)
  for n in 1 2 3; do
    "$CTL" nodetool "$n" info 2>/dev/null | awk -v n="$n" '/^(Key|Chunk) Cache/ { print "node " n ": " $0 }' ||
      echo "node $n: nodetool info failed"
  done
}
[ "${1:-}" = caches ] && { caches; exit 0; }
busy() { # node: is a compaction pending or running?
  local out
  out=$("$CTL" nodetool "$1" compactionstats) || { echo "after-load: nodetool compactionstats failed on node $1" >&2; exit 1; }
  awk '
    /^pending tasks/ { seen = 1; if ($NF != 0) busy = 1 }
    /compaction type/ { busy = 1 }
    END { exit !(busy || !seen) }' <<<"$out"
}
while (( $(date +%s) - start < 600 )); do
  quiet=1
  for n in 1 2 3; do if busy "$n"; then quiet=0; fi; done
  if [ $quiet = 1 ]; then
    echo "after-load: flushed${COMPACT:+ (COMPACT=$COMPACT)}, and no compaction left, after $(( $(date +%s) - start )) s" >&2
    sstables | sed 's/^/after-load: /' >&2
    caches | sed 's/^/after-load: /' >&2
    exit 0
  fi
  sleep 5
done
echo "after-load: compactions still running $(( $(date +%s) - start )) s after the flush" >&2
exit 1
