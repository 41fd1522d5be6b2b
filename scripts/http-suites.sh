#!/usr/bin/env bash
# Runs the HTTP suite (crates/server/tests/it) on every store and node count
# that `make test` covers after `cargo test --workspace`: SQLite and
# PostgreSQL with one node; the in-memory store, PostgreSQL and Cassandra
# with two nodes taking requests in turn. Needs TARN_TEST_POSTGRES and
# TARN_TEST_CASSANDRA (scripts/with-postgres.sh, scripts/with-cassandra.sh).
#
# Cassandra runs it with two nodes only: each node answers every other
# request, and the tests of what one node counts for itself (metrics,
# connections) make one node whatever TARN_TEST_NODES says, so a run with
# one node would add little but its 180-230 s (the slowest of these runs,
# on 2 cores, with three Cassandra JVMs beside it).
#
# It runs the test binary that `cargo test --workspace` built rather than
# `cargo test -p tarn-server`: features are unified over the packages a
# command selects, so the latter would compile two dozen crates again
# (about 85 s on 2 cores) for the same tests.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

# The artifact of the server's `it` test target (compiler errors are still
# printed, on stderr).
SUITE=$("$CARGO" test --workspace --no-run --message-format=json-render-diagnostics |
  { grep '"reason":"compiler-artifact".*"src_path":"[^"]*/crates/server/tests/it/main.rs"' || true; } |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')
if [ -z "$SUITE" ] || [ "$(printf '%s\n' "$SUITE" | wc -l)" -ne 1 ] || [ ! -x "$SUITE" ]; then
  echo "http-suites: no test binary for crates/server/tests/it" >&2
  exit 1
fi

# Cargo runs a test binary in its package's directory; so does this.
cd crates/server
run() {
  echo "http-suites: $* $(basename "$SUITE")"
  env "$@" "$SUITE"
}
run TARN_TEST_NODES=2
run TARN_TEST_STORE=sqlite
run TARN_TEST_STORE=postgres
run TARN_TEST_STORE=postgres TARN_TEST_NODES=2
run TARN_TEST_STORE=cassandra TARN_TEST_NODES=2
