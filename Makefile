# The two commands a newcomer needs: `make run` and `make test`.
# Both set up what they need first (see scripts/setup.sh).

CARGO ?= cargo
NPM ?= npm
LISTEN ?= 127.0.0.1:7700
DATA ?= ./tarn-data
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
# The scripts build with the same cargo.
export CARGO

.PHONY: run test setup build web lint check-tests schemathesis test-web check-client bench-store test-cassandra

setup:
	@scripts/setup.sh

# The web app (web/): installed from its lockfile and built into web/dist,
# which the server embeds when it is compiled; fails if its JavaScript is
# 200 KB or more gzipped.
web: setup
	cd web && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(NPM) ci --no-audit --no-fund --loglevel=error
	cd web && $(NPM) run build --silent && $(NPM) run size --silent

build: web
	$(CARGO) build --release -p tarn

# Builds the web app and a release binary, and serves on the embedded SQLite store.
run: build
	$(TARGET_DIR)/release/tarn serve --listen $(LISTEN) --data $(DATA) --app-indexes true

lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Every test, with a throwaway PostgreSQL (scripts/with-postgres.sh) and a
# throwaway 3-node Cassandra cluster (scripts/with-cassandra.sh); the HTTP
# suite runs six times: on the in-memory store, SQLite and PostgreSQL with
# one node, and on the in-memory store, PostgreSQL and Cassandra with two
# nodes taking requests in turn (TARN_TEST_NODES=2; scripts/http-suites.sh
# says why Cassandra runs it with two only).
check-tests: setup
	scripts/with-postgres.sh scripts/with-cassandra.sh sh -c '\
	  $(CARGO) test --workspace --no-fail-fast && scripts/http-suites.sh'

# Fuzzes a running server against its own OpenAPI document (schemathesis
# 4.32.5 in a virtualenv under ~/.cache/tarn; see scripts/schemathesis.toml).
schemathesis: setup
	scripts/schemathesis.sh

# The TypeScript client (clients/typescript) matches the OpenAPI document.
check-client: setup
	scripts/client-typescript.sh check

# The web app in Debian's Chromium (installed when missing): type checks,
# then Playwright against a real `tarn serve` (a debug build with the app in
# it, target/debug/tarn as the tests build it: scripts/debug-tarn.sh)
# — people in separate browser contexts, an axe-core scan and a
# screenshot of every page (web/test-results/screenshots).
test-web: web check-client
	@scripts/setup.sh --browser
	scripts/debug-tarn.sh >/dev/null
	cd web && $(NPM) run check --silent
	cd web && $(NPM) test

# Everything CI runs (the web app first, so that every build embeds it).
test: web lint check-tests schemathesis test-web

# Criterion micro-benchmarks of the SQLite store (release build).
bench-store: setup
	$(CARGO) bench -p tarn-store-sqlite --bench store

# The Cassandra store's tests on a throwaway 3-node Cassandra 5.0 cluster
# (scripts/with-cassandra.sh: Java 17, Maven and the jars on first use).
test-cassandra: setup
	scripts/with-cassandra.sh $(CARGO) test -p tarn-store-cassandra
