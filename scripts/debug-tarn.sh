#!/usr/bin/env bash
# Builds the debug `tarn` binary (with the web app in web/dist embedded) as
# `cargo test --workspace` builds it, and prints its path. The scripts that
# run a server for tests (schemathesis, the TypeScript client check, the
# browser tests) use it: `cargo build -p tarn` would unify features over
# fewer packages than the tests did and compile two dozen crates again
# (60–70 s on 2 cores in `make test`). Run alone, it builds every test
# target, which takes minutes on a fresh checkout.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
"${CARGO:-cargo}" test -q --workspace --no-run >&2
echo "${CARGO_TARGET_DIR:-$ROOT/target}/debug/tarn"
