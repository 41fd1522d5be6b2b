//! Engines for tests: cheap password hashes, a stepping clock, short leases.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tarn_engine::{Caller, Clock, Engine, EngineConfig, NewUser, PasswordCost};
use tarn_store::Store;

pub fn config() -> EngineConfig {
    EngineConfig {
        password_cost: PasswordCost::for_tests(),
        clock: Clock::Stepping(Arc::new(AtomicI64::new(1_700_000_000_000_000))),
        ..EngineConfig::default()
    }
}

pub fn engine(store: Arc<dyn Store>) -> Engine {
    Engine::new(store, config())
}

pub fn memory() -> Engine {
    engine(Arc::new(tarn_store::memory::MemoryStore::new()))
}

/// An engine on the in-memory store laid out as Cassandra's is: the
/// partitions every reader shares split in 16 buckets, which listings and
/// searches merge. The model tests check that layout here at the cost of
/// memory, and SQLite's one partition on SQLite.
pub fn memory_split() -> Engine {
    engine(Arc::new(tarn_store::memory::MemoryStore::with_split(16)))
}

pub fn sqlite() -> (Engine, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = tarn_store_sqlite::SqliteStore::open(dir.path()).unwrap();
    (engine(Arc::new(store)), dir)
}

/// A store on the test PostgreSQL (TARN_TEST_POSTGRES), in a fresh schema.
pub async fn postgres_store() -> tarn_store_postgres::PgStore {
    postgres_store_with(tarn_store_postgres::PgOptions::default()).await
}

/// [`postgres_store`] with settings of its own (a small pool, say).
pub async fn postgres_store_with(
    options: tarn_store_postgres::PgOptions,
) -> tarn_store_postgres::PgStore {
    let base = std::env::var("TARN_TEST_POSTGRES").expect(
        "TARN_TEST_POSTGRES is not set: run the tests through `make test` or scripts/with-postgres.sh",
    );
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    let url = format!("{base}?schema=e_{:016x}", u64::from_le_bytes(b));
    tarn_store_postgres::PgStore::connect_with(&url, options)
        .await
        .unwrap()
}

/// A store on the test Cassandra cluster (TARN_TEST_CASSANDRA), in an
/// emptied keyspace of the cluster's pool, held until the test's thread
/// ends (`tarn_store_cassandra::pool`).
pub async fn cassandra_store() -> tarn_store_cassandra::CassandraStore {
    let base = std::env::var("TARN_TEST_CASSANDRA").expect(
        "TARN_TEST_CASSANDRA is not set: run the tests through `make test` or scripts/with-cassandra.sh",
    );
    let url = tarn_store_cassandra::pool::for_test(&base, "e")
        .await
        .unwrap();
    tarn_store_cassandra::CassandraStore::connect(&url)
        .await
        .unwrap()
}

/// An engine on the test Cassandra cluster, in an empty keyspace ([`cassandra_store`]).
pub async fn cassandra() -> Engine {
    engine(Arc::new(cassandra_store().await))
}

/// An engine on the test PostgreSQL (TARN_TEST_POSTGRES), in a fresh schema.
pub async fn postgres() -> Engine {
    let base = std::env::var("TARN_TEST_POSTGRES").expect(
        "TARN_TEST_POSTGRES is not set: run the tests through `make test` or scripts/with-postgres.sh",
    );
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    let url = format!("{base}?schema=e_{:016x}", u64::from_le_bytes(b));
    engine(Arc::new(
        tarn_store_postgres::PgStore::connect(&url).await.unwrap(),
    ))
}

pub fn user(name: &str) -> Caller {
    Caller::User {
        username: name.into(),
        admin: false,
    }
}

pub fn admin() -> Caller {
    Caller::User {
        username: "admin".into(),
        admin: true,
    }
}

pub async fn sign_up(e: &Engine, name: &str) -> Caller {
    e.create_user(
        &Caller::Anonymous,
        NewUser {
            username: name.into(),
            password: format!("{name}-password"),
            properties: Map::new(),
            admin: false,
        },
        true,
    )
    .await
    .unwrap();
    user(name)
}

pub fn props(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

/// Waits until an index is ready (its build runs in the background).
pub async fn wait_ready(e: &Engine, name: &str) {
    for _ in 0..500 {
        if e.get_index(&admin(), name).await.unwrap().state == tarn_engine::IndexState::Ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("index {name} never became ready");
}
