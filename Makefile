# The two commands a newcomer needs: `make run` and `make test`.
# Both set up what they need first (see scripts/setup.sh).

CARGO ?= cargo
LISTEN ?= 127.0.0.1:7700
DATA ?= ./tarn-data

.PHONY: run test setup build lint check-tests schemathesis bench-store test-cassandra

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build --release -p tarn

# Builds a release binary and serves on the embedded SQLite store.
run: build
	./target/release/tarn serve --listen $(LISTEN) --data $(DATA)

lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Every test, with a throwaway PostgreSQL (scripts/with-postgres.sh) and a
# throwaway 3-node Cassandra cluster (scripts/with-cassandra.sh); the HTTP
# suite runs four times: on the in-memory store, SQLite, PostgreSQL and
# Cassandra.
check-tests: setup
	scripts/with-postgres.sh scripts/with-cassandra.sh sh -c '\
	  $(CARGO) test --workspace --no-fail-fast && \
	  TARN_TEST_STORE=sqlite $(CARGO) test -p tarn-server --test it && \
	  TARN_TEST_STORE=postgres $(CARGO) test -p tarn-server --test it && \
	  TARN_TEST_STORE=cassandra $(CARGO) test -p tarn-server --test it'

# Fuzzes a running server against its own OpenAPI document (schemathesis
# 4.32.5 in a virtualenv under ~/.cache/tarn; see scripts/schemathesis.toml).
schemathesis: setup
	scripts/schemathesis.sh

# Everything CI runs.
test: lint check-tests schemathesis

# Criterion micro-benchmarks of the SQLite store (release build).
bench-store: setup
	$(CARGO) bench -p tarn-store-sqlite --bench store

# The Cassandra store's tests on a throwaway 3-node Cassandra 5.0 cluster
# (scripts/with-cassandra.sh: Java 17, Maven and the jars on first use).
test-cassandra: setup
	scripts/with-cassandra.sh $(CARGO) test -p tarn-store-cassandra
