//! SqliteStore's tests: the shared conformance suite, crash safety, and the
//! data directory lock.

mod crash;

use std::sync::Arc;

use tarn_store::{Store, StoreError};
use tarn_store_sqlite::SqliteStore;

async fn fresh() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    (Arc::new(store) as Arc<dyn Store>, dir)
}

tarn_store::conformance_tests!(fresh());

#[test]
fn second_open_of_a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = SqliteStore::open(dir.path()).unwrap();
    match SqliteStore::open(dir.path()) {
        Err(StoreError::Unavailable(msg)) => assert!(msg.contains("in use"), "{msg}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a second open must be refused"),
    }
    drop(first);
    SqliteStore::open(dir.path()).expect("reopens once the first is closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let t = tarn_store::Table::new("t");
    {
        let s = SqliteStore::open(dir.path()).unwrap();
        let mut b = tarn_store::Batch::new();
        b.put(tarn_store::Key::new(t, b"p", b"c"), b"v".to_vec(), 3);
        s.write(b).await.unwrap();
    }
    let s = SqliteStore::open(dir.path()).unwrap();
    let row = s
        .get(tarn_store::Key::new(t, b"p", b"c"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.value, row.version), (b"v".to_vec(), 3));
}
