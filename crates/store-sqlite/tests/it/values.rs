//! The value file: values past 64 KiB written once beside the database,
//! readable by every snapshot that may still see them, their space given
//! back and reused once none can.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tarn_store::{Batch, Key, SnapshotExt, Store, Table};
use tarn_store_sqlite::SqliteStore;

const T: Table = Table::new("t");
const CHUNK: usize = 256 * 1024;

fn key(c: u8) -> Key {
    Key::new(T, b"p".to_vec(), vec![c])
}

fn value(fill: u8) -> Vec<u8> {
    (0..CHUNK).map(|i| (i % 251) as u8 ^ fill).collect()
}

async fn put(s: &SqliteStore, k: Key, v: Vec<u8>) {
    let mut b = Batch::new();
    b.put(k, v, 1);
    s.write(b).await.unwrap();
}

async fn delete(s: &SqliteStore, k: Key) {
    let mut b = Batch::new();
    b.delete(k);
    s.write(b).await.unwrap();
}

fn count(dir: &Path, sql: &str) -> i64 {
    super::peek(dir).query_row(sql, [], |r| r.get(0)).unwrap()
}

fn file(dir: &Path) -> std::fs::Metadata {
    std::fs::metadata(dir.join("values.dat")).unwrap()
}

/// Bytes of the value file on disk (its holes take none).
fn on_disk(dir: &Path) -> u64 {
    file(dir).blocks() * 512
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_written_once_to_the_value_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    for c in 0..8 {
        put(&s, key(c), value(c)).await;
    }
    assert!(file(dir.path()).len() >= 8 * CHUNK as u64);
    let wal = std::fs::metadata(dir.path().join("tarn.sqlite-wal")).map_or(0, |m| m.len());
    assert!(
        wal < CHUNK as u64,
        "the WAL took {wal} bytes for 2 MiB of values"
    );
    assert_eq!(
        count(
            dir.path(),
            "SELECT count(*) FROM big WHERE off IS NOT NULL AND length(value) = 0"
        ),
        8
    );
    let mut snap = s.snapshot().await.unwrap();
    for c in 0..8 {
        assert_eq!(snap.get(&key(c)).await.unwrap().unwrap().value, value(c));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_value_stays_readable_to_older_snapshots_then_goes() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    put(&s, key(1), value(1)).await;
    let mut old = s.snapshot().await.unwrap();
    assert_eq!(old.get(&key(1)).await.unwrap().unwrap().value, value(1));

    delete(&s, key(1)).await;
    for c in 10..14 {
        put(&s, key(c), b"small".to_vec()).await;
    }
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_freed"), 1);
    assert!(
        on_disk(dir.path()) >= CHUNK as u64,
        "punched while a snapshot that may read it is open"
    );
    assert_eq!(
        old.get(&key(1)).await.unwrap().unwrap().value,
        value(1),
        "the old snapshot reads the value whole"
    );
    let mut now = s.snapshot().await.unwrap();
    assert_eq!(now.get(&key(1)).await.unwrap(), None);
    drop(now);
    drop(old);

    // The next group punches it out; the one after makes it free.
    put(&s, key(20), b"small".to_vec()).await;
    assert!(
        on_disk(dir.path()) < CHUNK as u64,
        "{} bytes on disk after the last snapshot that could read it ended",
        on_disk(dir.path())
    );
    put(&s, key(21), b"small".to_vec()).await;
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_freed"), 0);
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_free"), 1);

    // A new value takes the freed range: the file does not grow.
    let size = file(dir.path()).len();
    put(&s, key(2), value(2)).await;
    assert_eq!(file(dir.path()).len(), size);
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_free"), 0);
    let mut snap = s.snapshot().await.unwrap();
    assert_eq!(snap.get(&key(2)).await.unwrap().unwrap().value, value(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_no_commit_points_at_are_cut_off_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = SqliteStore::open(dir.path()).unwrap();
        put(&s, key(1), value(1)).await;
        put(&s, key(2), value(2)).await;
        delete(&s, key(2)).await;
    }
    // What a group that wrote its bytes and died before its commit leaves.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("values.dat"))
            .unwrap();
        f.write_all(&[7u8; 100_000]).unwrap();
    }
    let s = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(
        file(dir.path()).len(),
        2 * CHUNK as u64,
        "cut back to the last range in use or freed"
    );
    // The range key 2 held was freed before the stop: free at open.
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_freed"), 0);
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_free"), 1);
    let mut snap = s.snapshot().await.unwrap();
    assert_eq!(snap.get(&key(1)).await.unwrap().unwrap().value, value(1));
    drop(snap);
    put(&s, key(3), value(3)).await;
    assert_eq!(file(dir.path()).len(), 2 * CHUNK as u64, "key 3 reused it");
    let mut snap = s.snapshot().await.unwrap();
    assert_eq!(snap.get(&key(3)).await.unwrap().unwrap().value, value(3));
}
