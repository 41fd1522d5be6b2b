//! PgStore against a real PostgreSQL: the shared conformance suite, each
//! test in a schema of its own. `make test` starts the server
//! (scripts/with-postgres.sh) and sets TARN_TEST_POSTGRES.

use std::sync::Arc;

use tarn_store::{Batch, Expect, Key, Store, StoreError, Table};
use tarn_store_postgres::PgStore;

/// A URL with a fresh schema on the test server.
pub fn fresh_url() -> String {
    let base = std::env::var("TARN_TEST_POSTGRES").expect(
        "TARN_TEST_POSTGRES is not set: run the tests through `make test` or scripts/with-postgres.sh",
    );
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}schema=t_{:016x}", u64::from_le_bytes(b))
}

async fn fresh() -> (Arc<dyn Store>, ()) {
    let store = PgStore::connect(&fresh_url()).await.unwrap();
    (Arc::new(store) as Arc<dyn Store>, ())
}

tarn_store::conformance_tests!(fresh());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_share_one_database() {
    // Two stores on one schema stand for two nodes: a write through one is
    // visible through the other at once, and guards hold across them.
    let url = fresh_url();
    let a = PgStore::connect(&url).await.unwrap();
    let b = PgStore::connect(&url).await.unwrap();
    let t = Table::new("nodes");
    let k = Key::new(t, b"p", b"c");
    let mut w = Batch::new();
    w.put(k.clone(), b"from a".to_vec(), 1)
        .guard(k.clone(), Expect::Absent);
    a.write(w).await.unwrap();
    assert_eq!(b.get(k.clone()).await.unwrap().unwrap().value, b"from a");
    let mut w = Batch::new();
    w.put(k.clone(), b"from b".to_vec(), 2)
        .guard(k.clone(), Expect::Absent);
    assert!(matches!(
        b.write(w).await,
        Err(StoreError::GuardFailed { guard: 0 })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_idempotent_and_concurrent() {
    let url = fresh_url();
    let stores = futures_join(&url).await;
    assert_eq!(stores, 4);
}

async fn futures_join(url: &str) -> usize {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            PgStore::connect(&url).await.map(|_| ())
        }));
    }
    let mut ok = 0;
    for t in tasks {
        t.await.unwrap().unwrap();
        ok += 1;
    }
    ok
}

#[tokio::test]
async fn bad_urls_are_refused_clearly() {
    assert!(matches!(
        PgStore::connect("not a url").await,
        Err(StoreError::Invalid(_))
    ));
    let url = format!(
        "{}?schema=Bad;Name",
        std::env::var("TARN_TEST_POSTGRES").unwrap_or_default()
    );
    assert!(PgStore::connect(&url).await.is_err());
    // Nothing listens on port 9 of loopback.
    match PgStore::connect("postgres://tarn@127.0.0.1:9/tarn").await {
        Err(StoreError::Unavailable(_)) => {}
        Err(e) => panic!("expected unavailable, got {e}"),
        Ok(_) => panic!("connected to nothing"),
    }
}
