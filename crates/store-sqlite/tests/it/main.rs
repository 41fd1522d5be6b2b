//! SqliteStore's tests: the shared conformance suite, crash safety, and the
//! data directory lock.

mod crash;

use std::sync::Arc;

use tarn_store::{SnapshotExt, Store, StoreError};
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
        .snapshot()
        .await
        .unwrap()
        .get(&tarn_store::Key::new(t, b"p", b"c"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.value, row.version), (b"v".to_vec(), 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_write_queue_refuses_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let options = tarn_store_sqlite::SqliteOptions {
        max_queued_writes: 4,
        ..Default::default()
    };
    let s = Arc::new(SqliteStore::open_with(dir.path(), options).unwrap());
    let t = tarn_store::Table::new("t");
    let mut tasks = Vec::new();
    for i in 0..400u32 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut b = tarn_store::Batch::new();
            b.put(
                tarn_store::Key::new(t, b"p", i.to_be_bytes()),
                vec![1; 1000],
                1,
            );
            s.write(b).await
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(StoreError::Unavailable(m)) => {
                assert!(m.contains("queue is full"), "{m}");
                refused += 1
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(ok > 0, "some writes land");
    assert!(
        refused > 0,
        "a bound of 4 queued writes refuses some of 400 at once"
    );
    let counters: std::collections::HashMap<_, _> = s.counters().into_iter().collect();
    assert_eq!(counters["sqlite_refused_writes_total"], refused);
    assert_eq!(counters["sqlite_commits_total"], ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_read_pool_refuses_after_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let options = tarn_store_sqlite::SqliteOptions {
        readers: 2,
        reader_wait: std::time::Duration::from_millis(50),
        ..Default::default()
    };
    let s = SqliteStore::open_with(dir.path(), options).unwrap();
    let a = s.snapshot().await.unwrap();
    let b = s.snapshot().await.unwrap();
    match s.snapshot().await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("busy"), "{m}"),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("a third snapshot of a pool of two must wait, then be refused"),
    }
    drop(a);
    let c = s.snapshot().await.expect("a returned connection is reused");
    drop((b, c));
}
