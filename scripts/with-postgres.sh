#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL cluster on a free loopback port,
# then stops it. Installs Debian's PostgreSQL when missing. The command sees
# TARN_TEST_POSTGRES=postgres://tarn@127.0.0.1:PORT/tarn.
#   scripts/with-postgres.sh cargo test --workspace
set -euo pipefail

find_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1; }
BIN=$(find_bin)
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
  echo "with-postgres: installing PostgreSQL (Debian packages)" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # policy-rc.d keeps the package from starting its own cluster.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
  $SUDO rm -f /usr/sbin/policy-rc.d
  BIN=$(find_bin)
fi

# PostgreSQL refuses to run as root: use the postgres user then.
if [ "$(id -u)" -eq 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --create-home postgres
  AS=(runuser -u postgres --)
else
  AS=()
fi

DIR=$(mktemp -d /tmp/tarn-pg.XXXXXX)
chmod 755 "$DIR"
[ "$(id -u)" -eq 0 ] && chown postgres "$DIR"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')

cleanup() {
  "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT

"${AS[@]}" "$BIN/initdb" -D "$DIR/data" -U tarn --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
# TLS: a throwaway CA and a server certificate for 127.0.0.1, so tests can
# connect with sslmode=verify-full (TARN_TEST_POSTGRES_CA) as well as without.
TLS="$DIR/tls"
mkdir -p "$TLS"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=tarn test CA" \
  -keyout "$TLS/ca.key" -out "$TLS/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$TLS/server.key" -out "$TLS/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > "$TLS/ext.cnf"
openssl x509 -req -in "$TLS/server.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" -CAcreateserial \
  -days 2 -extfile "$TLS/ext.cnf" -out "$TLS/server.pem" 2>/dev/null
# A second CA that signed nothing: trusting it must fail.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=another CA" \
  -keyout "$TLS/other.key" -out "$TLS/other.pem" 2>/dev/null
cp "$TLS/server.pem" "$TLS/server.key" "$DIR/data/"
chmod 600 "$DIR/data/server.key"
[ "$(id -u)" -eq 0 ] && chown postgres "$DIR/data/server.pem" "$DIR/data/server.key"
chmod 644 "$TLS/ca.pem" "$TLS/other.pem"
# Tests check semantics, not durability: skip fsyncs to keep them fast,
# unless TARN_PG_DURABLE=1 (benchmarks: every commit is fsynced, as in use).
OPTS="-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=512MB -c ssl=on -c ssl_cert_file=server.pem -c ssl_key_file=server.key"
if [ "${TARN_PG_DURABLE:-0}" != 1 ]; then
  OPTS="$OPTS -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
fi
"${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -w -l "$DIR/log" -o "$OPTS" start >/dev/null
"${AS[@]}" "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U tarn tarn

export TARN_TEST_POSTGRES="postgres://tarn@127.0.0.1:$PORT/tarn"
export TARN_TEST_POSTGRES_CA="$TLS/ca.pem"
export TARN_TEST_POSTGRES_OTHER_CA="$TLS/other.pem"
echo "with-postgres: PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT" >&2
set +e
"$@"
rc=$?
set -e
exit $rc
