#!/usr/bin/env bash
# Runs a command with a throwaway 3-node Apache Cassandra 5.0 cluster on
# 127.0.0.1, 127.0.0.2 and 127.0.0.3 (CQL on port 9042 of each), then stops
# and removes it, whatever the command did.
#   scripts/with-cassandra.sh cargo test -p tarn-store-cassandra
#
# Installs Java 17 and Maven (Debian packages) when missing, and fetches
# Cassandra's jars from Maven Central once (scripts/cassandra/pom.xml) into
# ${XDG_CACHE_HOME:-~/.cache}/tarn/cassandra-VERSION. Each node gets its own
# cassandra.yaml and logback.xml, written from the templates beside the pom,
# in a temporary directory. The command sees:
#   TARN_TEST_CASSANDRA       cassandra://127.0.0.1:9042,127.0.0.2:9042,127.0.0.3:9042/tarn_test?replication=3
#   TARN_TEST_CASSANDRA_CTL   a script: `CTL stop N` kills node N (SIGKILL, as
#                             a crash), `CTL start N` starts it again and
#                             waits until it serves CQL, `CTL status` lists,
#                             `CTL nodetool N ARGS...` runs nodetool on node N.
#   TARN_TEST_CASSANDRA_DIR   the cluster's directory (logs: nodeN/system.log)
# TARN_CASSANDRA_KEEP=1 keeps the directory (not the processes) afterwards.
# TARN_CASSANDRA_JVM_OPTS adds JVM flags after the template's (a later flag
# wins): scripts/bench-nodes.sh gives the nodes the full JIT this way.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TEMPLATES="$HERE/cassandra"
VERSION=$(sed -n 's:.*<cassandra.version>\(.*\)</cassandra.version>.*:\1:p' "$TEMPLATES/pom.xml")
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tarn/cassandra-$VERSION"
NODES=3
JMX_PORTS=(0 7199 7299 7399)
# Evenly spaced Murmur3 tokens, one per node: no token allocation at start.
TOKENS=(0 -9223372036854775808 -3074457345618258603 3074457345618258602)
say() { echo "with-cassandra: $*" >&2; }
trap 'say "failed at line $LINENO"' ERR

# --- Java 17 and Maven -------------------------------------------------------
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {
  say "installing $* (Debian packages)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
java17() {
  # Cassandra 5.0 runs on Java 11 or 17, not on later ones.
  for j in "${JAVA_HOME:-}/bin/java" /usr/lib/jvm/java-17-openjdk-*/bin/java "$(command -v java || true)"; do
    if [ -x "$j" ] && "$j" -version 2>&1 | grep -q 'version "17\.'; then
      echo "$j"
      return 0
    fi
  done
  return 1
}
if ! JAVA=$(java17); then
  apt_install openjdk-17-jre-headless ||
    { say "Cassandra 5.0 needs Java 17 (or 11), and this system has no openjdk-17 package"; exit 1; }
  JAVA=$(java17)
fi
command -v mvn >/dev/null || apt_install maven

# --- Cassandra's jars, once per version ------------------------------------------
mkdir -p "$CACHE"
if [ ! -f "$CACHE/lib/.complete" ]; then
  (
    # Two runs starting at once download once.
    flock 9
    if [ ! -f "$CACHE/lib/.complete" ]; then
      say "fetching Cassandra $VERSION jars from Maven Central into $CACHE"
      rm -rf "$CACHE/lib.part" "$CACHE/m2"
      mvn -B -Dstyle.color=never -f "$TEMPLATES/pom.xml" -Dmaven.repo.local="$CACHE/m2" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$CACHE/lib.part" \
        >"$CACHE/mvn.log" 2>&1 || { tail -n 40 "$CACHE/mvn.log" >&2; say "Maven failed (log: $CACHE/mvn.log)"; exit 1; }
      touch "$CACHE/lib.part/.complete"
      rm -rf "$CACHE/lib" "$CACHE/m2"
      mv "$CACHE/lib.part" "$CACHE/lib"
    fi
  ) 9>"$CACHE/.lock"
fi

# --- The cluster -------------------------------------------------------------------
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
for i in $(seq 1 $NODES); do
  if port_open "127.0.0.$i" 9042 || port_open "127.0.0.$i" 7000; then
    say "127.0.0.$i:9042 or :7000 is in use: is another test cluster running?"
    exit 1
  fi
done

DIR=$(mktemp -d /tmp/tarn-cassandra.XXXXXX)
JVM_OPTS=$(grep -v '^[[:space:]]*#' "$TEMPLATES/jvm.options" | grep -v '^[[:space:]]*$' | tr '\n' ' ')
JVM_OPTS="$JVM_OPTS ${TARN_CASSANDRA_JVM_OPTS:-}"
for i in $(seq 1 $NODES); do
  NODE="$DIR/node$i"
  mkdir -p "$NODE"
  sed -e "s|@NODE_DIR@|$NODE|g" -e "s|@ADDRESS@|127.0.0.$i|g" -e "s|@TOKEN@|${TOKENS[$i]}|g" \
    "$TEMPLATES/cassandra.yaml.in" >"$NODE/cassandra.yaml"
  sed -e "s|@NODE_DIR@|$NODE|g" "$TEMPLATES/logback.xml" >"$NODE/logback.xml"
  # The launch line of the node, kept so the control script can restart it.
  cat >"$NODE/run" <<EOF
#!/bin/sh
exec "$JAVA" $JVM_OPTS \\
  -Dcassandra.config=file://$NODE/cassandra.yaml \\
  -Dlogback.configurationFile=file://$NODE/logback.xml \\
  -Dcassandra.logdir=$NODE -Dcassandra.storagedir=$NODE \\
  -Dcassandra.jmx.local.port=${JMX_PORTS[$i]} \\
  -Dcassandra-foreground=yes \\
  -Dcassandra.skip_wait_for_gossip_to_settle=0 \\
  -cp "$CACHE/lib/*" org.apache.cassandra.service.CassandraDaemon
EOF
  chmod +x "$NODE/run"
done

# nodetool's launch line: the server's module flags, a small heap.
NODETOOL_OPTS=$(grep -E '^--add-(exports|opens)' "$TEMPLATES/jvm.options" | tr '\n' ' ')
# The control script: start, stop (kill -9) and status of one node.
cat >"$DIR/ctl" <<EOF
#!/usr/bin/env bash
# Controls one node of the test cluster in $DIR.
#   ctl start N | stop N | status | nodetool N ARGS...
set -euo pipefail
DIR="$DIR"
port_open() { (exec 3<>"/dev/tcp/\$1/\$2") 2>/dev/null; }
alive() { [ -f "\$DIR/node\$1/pid" ] && kill -0 "\$(cat "\$DIR/node\$1/pid")" 2>/dev/null; }
case "\${1:-}" in
  start)
    n=\$2
    if alive "\$n"; then echo "node \$n already runs" >&2; exit 0; fi
    setsid "\$DIR/node\$n/run" >>"\$DIR/node\$n/stdout.log" 2>&1 </dev/null &
    echo \$! >"\$DIR/node\$n/pid"
    for _ in \$(seq 1 1200); do
      if port_open "127.0.0.\$n" 9042; then exit 0; fi
      if ! alive "\$n"; then echo "node \$n died at start; see \$DIR/node\$n/system.log" >&2; exit 1; fi
      sleep 0.1
    done
    echo "node \$n did not open CQL in 120 s" >&2; exit 1 ;;
  stop)
    n=\$2
    if alive "\$n"; then
      pid=\$(cat "\$DIR/node\$n/pid")
      kill -9 "\$pid"
      while kill -0 "\$pid" 2>/dev/null; do sleep 0.05; done
    fi
    rm -f "\$DIR/node\$n/pid" ;;
  status)
    for f in "\$DIR"/node*/; do
      n=\${f%/}; n=\${n##*node}
      if alive "\$n"; then echo "node \$n up pid \$(cat "\$DIR/node\$n/pid")"; else echo "node \$n down"; fi
    done ;;
  nodetool)
    n=\$2; shift 2
    jmx=(0 ${JMX_PORTS[1]} ${JMX_PORTS[2]} ${JMX_PORTS[3]})
    exec "$JAVA" $NODETOOL_OPTS -Xmx128m -cp "$CACHE/lib/*" org.apache.cassandra.tools.NodeTool \\
      -h 127.0.0.1 -p "\${jmx[\$n]}" "\$@" ;;
  *) echo "usage: \$0 start N | stop N | status | nodetool N ARGS..." >&2; exit 2 ;;
esac
EOF
chmod +x "$DIR/ctl"

cleanup() {
  # The data is thrown away, so there is nothing to flush: kill at once.
  local pids=()
  for i in $(seq 1 $NODES); do
    if [ -f "$DIR/node$i/pid" ]; then
      pid=$(cat "$DIR/node$i/pid")
      kill -KILL "$pid" 2>/dev/null && pids+=("$pid")
    fi
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 200); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
  done
  if [ "${TARN_CASSANDRA_KEEP:-0}" = 1 ]; then say "kept $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

START=$(date +%s%N)
# The seed first; the others join as soon as it gossips.
setsid "$DIR/node1/run" >>"$DIR/node1/stdout.log" 2>&1 </dev/null &
echo $! >"$DIR/node1/pid"
disown
for _ in $(seq 1 600); do
  port_open 127.0.0.1 7000 && break
  kill -0 "$(cat "$DIR/node1/pid")" 2>/dev/null || { say "node 1 died; its log:"; tail -n 30 "$DIR/node1/system.log" >&2; exit 1; }
  sleep 0.1
done
for i in $(seq 2 $NODES); do
  setsid "$DIR/node$i/run" >>"$DIR/node$i/stdout.log" 2>&1 </dev/null &
  echo $! >"$DIR/node$i/pid"
  disown
done
for i in $(seq 1 $NODES); do
  for _ in $(seq 1 1800); do
    port_open "127.0.0.$i" 9042 && break
    if ! kill -0 "$(cat "$DIR/node$i/pid")" 2>/dev/null; then
      say "node $i died at start; its log:"; tail -n 30 "$DIR/node$i/system.log" "$DIR/node$i/stdout.log" >&2; exit 1
    fi
    sleep 0.1
  done
  port_open "127.0.0.$i" 9042 || { say "node $i did not open CQL in 180 s"; exit 1; }
done
# Every node serving CQL has joined the ring; wait until each one also sees
# the others up, so the first test does not race gossip.
for i in $(seq 1 $NODES); do
  for _ in $(seq 1 300); do
    up=$(grep -o -E "InetAddress /127\.0\.0\.[0-9]+:7000 is now UP" "$DIR/node$i/system.log" | sort -u | wc -l || true)
    [ "$up" -ge $((NODES - 1)) ] && break
    sleep 0.1
  done
done
say "Cassandra $VERSION: $NODES nodes up in $(awk "BEGIN { printf \"%.1f\", ($(date +%s%N) - $START) / 1e9 }") s ($DIR)"

hosts=""
for i in $(seq 1 $NODES); do hosts="$hosts${hosts:+,}127.0.0.$i:9042"; done
export TARN_TEST_CASSANDRA="cassandra://$hosts/tarn_test?replication=3"
export TARN_TEST_CASSANDRA_CTL="$DIR/ctl"
export TARN_TEST_CASSANDRA_DIR="$DIR"
trap - ERR
set +e
"$@"
rc=$?
set -e
exit $rc
