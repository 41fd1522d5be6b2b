#!/usr/bin/env bash
# Resident memory of a release `tarn serve` (SQLite) idle and after 400
# sign-ins, 16 at once: password hashing must not leave memory behind.
# Usage: scripts/measure-signin-rss.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p tarn >/dev/null
DIR=$(mktemp -d); PORT=$((20000 + RANDOM % 20000)); API=http://127.0.0.1:$PORT/api/v1
TARN_ADMIN_PASSWORD=rss-admin-pass RUST_LOG=warn ./target/release/tarn serve --listen 127.0.0.1:$PORT --data "$DIR" >/dev/null &
PID=$!; trap 'kill $PID; rm -rf $DIR' EXIT
until curl -sf $API/health >/dev/null; do sleep 0.2; done
rss() { awk '/VmRSS/ {print $2/1024 " MiB"}' /proc/$PID/status; }
echo "idle: $(rss)"
curl -s -XPOST $API/users -H 'content-type: application/json' -d '{"username":"u1","password":"u1-password"}' >/dev/null
seq 400 | xargs -P16 -I{} curl -s -o /dev/null -XPOST $API/sessions -H 'content-type: application/json' -d '{"username":"u1","password":"u1-password"}'
echo "after 400 sign-ins: $(rss)"
