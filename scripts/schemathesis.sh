#!/usr/bin/env bash
# Fuzzes the running server against its own OpenAPI document with
# schemathesis: every operation, positive and negative data, every phase
# and every check (schemathesis 4 enables them all unless told otherwise;
# scripts/schemathesis.toml holds the few adjustments and why each is
# needed; `--checks` on the command line would override them). Fails on any
# failure.
#
#   scripts/schemathesis.sh                 # the run `make schemathesis` does
#   scripts/schemathesis.sh --phases examples,coverage,fuzzing,stateful
#
# Extra arguments go to both `st run`s. Environment: ST_MAX_EXAMPLES (50 by
# default), ST_SEED (random by default; printed by schemathesis).
#
# 1. Installs schemathesis 4.32.5 into a virtualenv outside the repository
#    (${XDG_CACHE_HOME:-~/.cache}/tarn/venv-schemathesis-4.32.5).
# 2. Builds `tarn` (debug) and starts `tarn serve` on a fresh data directory
#    and a free loopback port, with an administrator.
# 3. Signs up a user and signs in, then runs schemathesis twice: as that
#    user over every operation, and as the administrator over the
#    operations only administrators pass (index declarations, creating
#    users, resetting passwords), so that their successes are fuzzed too.
# 4. Stops the server (trap), whatever happened; after a failure keeps the
#    requests and responses (HAR) and the server log in /tmp.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ST_VERSION=4.32.5
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/tarn/venv-schemathesis-$ST_VERSION
MAX_EXAMPLES=${ST_MAX_EXAMPLES:-50}

if ! "$VENV/bin/st" --version 2>/dev/null | grep -q "version $ST_VERSION"; then
  echo "schemathesis: installing schemathesis==$ST_VERSION into $VENV" >&2
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
  fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "schemathesis==$ST_VERSION"
fi

cd "$ROOT"
BIN=$(scripts/debug-tarn.sh)

WORK=$(mktemp -d /tmp/tarn-schemathesis.XXXXXX)
ADMIN_PASSWORD=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
PID=""
cleanup() {
  if [ -n "$PID" ]; then
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

TARN_ADMIN_PASSWORD=$ADMIN_PASSWORD "$BIN" serve --listen 127.0.0.1:0 --data "$WORK/data" \
  >"$WORK/stdout" 2>"$WORK/server.log" &
PID=$!
BASE=""
for _ in $(seq 1 300); do
  BASE=$(sed -n 's/^tarn listening on \(http:\/\/[^ ]*\)$/\1/p' "$WORK/stdout")
  [ -n "$BASE" ] && break
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "schemathesis: tarn serve exited:" >&2
    cat "$WORK/server.log" >&2
    exit 1
  fi
  sleep 0.1
done
[ -n "$BASE" ] || { echo "schemathesis: tarn serve did not start" >&2; exit 1; }
echo "schemathesis: tarn serving on $BASE" >&2

# Signs up (when a password is given twice) or in; prints the token.
session() {
  "$VENV/bin/python" - "$BASE" "$@" <<'EOF'
import json, sys, urllib.request
base, user, password = sys.argv[1], sys.argv[2], sys.argv[3]
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(req) as r:
        return json.load(r)
if len(sys.argv) > 4:
    post("/api/v1/users", {"username": user, "password": password})
print(post("/api/v1/sessions", {"username": user, "password": password})["token"])
EOF
}
USER_TOKEN=$(session fuzz fuzz-password-1 signup)
ADMIN_TOKEN=$(session admin "$ADMIN_PASSWORD")

run() {
  local who=$1 token=$2
  shift 2
  echo "schemathesis: as $who" >&2
  "$VENV/bin/st" --config-file "$ROOT/scripts/schemathesis.toml" run "$BASE/api/v1/openapi.json" \
    --url "$BASE" \
    -H "Authorization: Bearer $token" \
    --max-examples "$MAX_EXAMPLES" \
    ${ST_SEED:+--seed "$ST_SEED"} \
    --no-color \
    --report har --report-dir "$WORK/reports/$who" \
    "$@" 2>&1 | tee "$WORK/st-$who.log"
  local rc=${PIPESTATUS[0]}
  # A crash inside schemathesis (a worker thread's traceback) leaves
  # operations untested without failing the run: count it as a failure.
  if grep -q '^Traceback' "$WORK/st-$who.log"; then
    echo "schemathesis: schemathesis itself crashed during the run as $who" >&2
    return 1
  fi
  return "$rc"
}

# schemathesis keeps its example database and caches in the working
# directory: the temporary one, removed with the server's data.
cd "$WORK"
status=0
run user "$USER_TOKEN" "$@" || status=1
run admin "$ADMIN_TOKEN" --include-tag indexes --include-operation-id createUser \
  --include-operation-id resetPassword "$@" || status=1
if [ $status -ne 0 ]; then
  KEEP=$(mktemp -d /tmp/tarn-schemathesis-failed.XXXXXX)
  cp -r "$WORK/reports" "$WORK/server.log" "$WORK"/st-*.log "$KEEP/"
  echo "schemathesis: failures; every request and response (HAR) and the server log are in $KEEP" >&2
fi
exit $status
