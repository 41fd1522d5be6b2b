#!/usr/bin/env bash
# The typed TypeScript client (clients/typescript) from the OpenAPI document.
#
#   scripts/client-typescript.sh generate   # rewrite openapi.json and src/schema.d.ts
#   scripts/client-typescript.sh check      # fail when they differ from what the code makes
#
# Builds `tarn` (debug), prints its document with `tarn openapi` (no server
# needed), and runs openapi-typescript (the version of clients/typescript's
# lockfile, installed with `npm ci` when missing).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLIENT=$ROOT/clients/typescript
mode=${1:-check}

cd "$ROOT"
BIN=$(scripts/debug-tarn.sh)

if [ ! -x "$CLIENT/node_modules/.bin/openapi-typescript" ]; then
  (cd "$CLIENT" && npm ci --no-audit --no-fund --loglevel=error)
fi

WORK=$(mktemp -d /tmp/tarn-client.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$BIN" openapi >"$WORK/openapi.json"
(cd "$CLIENT" && node_modules/.bin/openapi-typescript "$WORK/openapi.json" --empty-objects-unknown --default-non-nullable false --output "$WORK/schema.d.ts" >/dev/null 2>"$WORK/gen.log") \
  || { cat "$WORK/gen.log" >&2; exit 1; }

case $mode in
  generate)
    cp "$WORK/openapi.json" "$CLIENT/openapi.json"
    cp "$WORK/schema.d.ts" "$CLIENT/src/schema.d.ts"
    echo "client-typescript: openapi.json and src/schema.d.ts regenerated"
    ;;
  check)
    stale=0
    diff -u "$CLIENT/openapi.json" "$WORK/openapi.json" >"$WORK/doc.diff" || stale=1
    diff -u "$CLIENT/src/schema.d.ts" "$WORK/schema.d.ts" >"$WORK/schema.diff" || stale=1
    if [ $stale -ne 0 ]; then
      head -n 60 "$WORK/doc.diff" "$WORK/schema.diff" >&2
      echo "client-typescript: clients/typescript is stale; run scripts/client-typescript.sh generate and commit" >&2
      exit 1
    fi
    (cd "$CLIENT" && node_modules/.bin/tsc --noEmit -p .)
    echo "client-typescript: clients/typescript matches the API"
    ;;
  *)
    echo "usage: $0 generate|check" >&2
    exit 2
    ;;
esac
