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

    // The writer punches it out after the next group (before it takes the
    // one after), and makes it free with that one.
    put(&s, key(20), b"small".to_vec()).await;
    put(&s, key(21), b"small".to_vec()).await;
    assert!(
        on_disk(dir.path()) < CHUNK as u64,
        "{} bytes on disk after the last snapshot that could read it ended",
        on_disk(dir.path())
    );
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_freed"), 0);
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_free"), 1);

    // A new value takes the freed range: the file does not grow.
    let size = file(dir.path()).len();
    put(&s, key(2), value(2)).await;
    assert_eq!(file(dir.path()).len(), size);
    assert_eq!(count(dir.path(), "SELECT count(*) FROM values_free"), 0);
    let mut snap = s.snapshot().await.unwrap();
    assert_eq!(snap.get(&key(2)).await.unwrap().unwrap().value, value(2));
    drop(snap);

    // And again, and again: every freed range comes back, not only the
    // first (the ids of freed ranges never repeat).
    for round in 3..6u8 {
        delete(&s, key(round - 1)).await;
        put(&s, key(30), b"small".to_vec()).await;
        put(&s, key(31), b"small".to_vec()).await;
        assert_eq!(
            count(dir.path(), "SELECT count(*) FROM values_free"),
            1,
            "round {round}"
        );
        put(&s, key(round), value(round)).await;
        assert_eq!(file(dir.path()).len(), size, "round {round}");
        let mut snap = s.snapshot().await.unwrap();
        assert_eq!(
            snap.get(&key(round)).await.unwrap().unwrap().value,
            value(round)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_undone_alone_gives_its_range_back() {
    use tarn_store::StoreError;
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    put(&s, key(1), value(1)).await;
    // Its value goes to the file, then its second put cannot be stored
    // (versions are stored as i64): the group runs again with a savepoint
    // per write, and this write alone is undone.
    let mut bad = Batch::new();
    bad.put(key(2), value(2), 1);
    bad.put(key(3), b"x".to_vec(), u64::MAX);
    assert!(matches!(s.write(bad).await, Err(StoreError::Invalid(_))));
    put(&s, key(4), value(4)).await;
    let off = |c: u8| -> i64 {
        super::peek(dir.path())
            .query_row(
                "SELECT b.off FROM rows r JOIN big b ON b.id = r.big WHERE r.clus = ?1",
                [vec![c]],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(
        (off(1), off(4)),
        (0, CHUNK as i64),
        "the next value took the undone write's range"
    );
    let mut snap = s.snapshot().await.unwrap();
    assert_eq!(snap.get(&key(2)).await.unwrap(), None);
    assert_eq!(snap.get(&key(4)).await.unwrap().unwrap().value, value(4));
}

/// A store made before the value file (its `big` table without ranges)
/// reads its large values where they are and keeps new ones in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_the_value_file_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = rusqlite::Connection::open(dir.path().join("tarn.sqlite")).unwrap();
        db.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE rows (tbl TEXT NOT NULL, part BLOB NOT NULL, clus BLOB NOT NULL,
                 value BLOB NOT NULL, version INTEGER NOT NULL, big INTEGER,
                 PRIMARY KEY (tbl, part, clus)) WITHOUT ROWID;
             CREATE TABLE big (id INTEGER PRIMARY KEY, value BLOB NOT NULL);",
        )
        .unwrap();
        db.execute("INSERT INTO big (id, value) VALUES (1, ?1)", [value(9)])
            .unwrap();
        db.execute("INSERT INTO rows VALUES ('t', x'70', x'01', x'', 3, 1)", [])
            .unwrap();
    }
    let s = SqliteStore::open(dir.path()).unwrap();
    let mut snap = s.snapshot().await.unwrap();
    let row = snap.get(&key(1)).await.unwrap().unwrap();
    assert_eq!((row.value, row.version), (value(9), 3));
    drop(snap);
    put(&s, key(1), value(8)).await;
    assert_eq!(
        count(
            dir.path(),
            "SELECT count(*) FROM big WHERE off IS NOT NULL AND length(value) = 0"
        ),
        1,
        "the new value went to the file, the old one with its row"
    );
    assert_eq!(count(dir.path(), "SELECT count(*) FROM big"), 1);
    let mut snap = s.snapshot().await.unwrap();
    assert_eq!(snap.get(&key(1)).await.unwrap().unwrap().value, value(8));
}

/// The database alone, without its value file, is refused, not served with
/// values that fail to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_without_its_value_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = SqliteStore::open(dir.path()).unwrap();
        put(&s, key(1), value(1)).await;
    }
    std::fs::remove_file(dir.path().join("values.dat")).unwrap();
    match SqliteStore::open(dir.path()) {
        Err(tarn_store::StoreError::Corrupt(m)) => assert!(m.contains("values.dat"), "{m}"),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("opened without its value file"),
    }
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
