//! SqliteStore's tests: the shared conformance suite, crash safety, and the
//! data directory lock.

mod crash;
mod values;

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

/// Under writes that never stop and readers that always hold a snapshot,
/// the WAL is still restarted: its file stays a fraction of what is
/// written instead of growing with everything ever written (it reached 10 GB for a
/// 1.7 GB database loading the search workload before it was restarted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_stays_bounded_under_steady_reads_and_writes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let options = tarn_store_sqlite::SqliteOptions {
        checkpoint_every: std::time::Duration::from_millis(20),
        checkpoint_pages: 256,
        ..Default::default()
    };
    let s = Arc::new(SqliteStore::open_with(dir.path(), options).unwrap());
    let t = tarn_store::Table::new("t");
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..4u32 {
        let (s, stop) = (s.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut snap = s.snapshot().await.unwrap();
                snap.get(&tarn_store::Key::new(t, b"p", r.to_be_bytes()))
                    .await
                    .unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
                drop(snap);
                reads += 1;
            }
            reads
        }));
    }
    let wal = dir.path().join("tarn.sqlite-wal");
    let wal_size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    // 128 MB in 2,000-byte rows: each dirties a page of its own, so
    // without restarts the WAL grows to about three times that.
    const ROUNDS: u64 = 800;
    let (mut most, mut written) = (0u64, 0u64);
    for round in 0..ROUNDS {
        let mut writes = Vec::new();
        for w in 0..8u64 {
            let s = s.clone();
            writes.push(tokio::spawn(async move {
                let mut b = tarn_store::Batch::new();
                for i in 0..10u64 {
                    // Keys spread over the table: every row dirties a page.
                    let k = (round * 80 + w * 10 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    b.put(
                        tarn_store::Key::new(t, b"p", k.to_be_bytes()),
                        vec![7; 2000],
                        1,
                    );
                }
                s.write(b).await.unwrap();
            }));
        }
        for w in writes {
            w.await.unwrap();
        }
        written += 80 * 2000;
        most = most.max(wal_size());
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.await.unwrap() > 0, "readers held snapshots throughout");
    }
    assert!(
        most < written / 2,
        "the WAL reached {most} bytes for {written} written; {:?}",
        s.counters()
    );
    let restarts = s
        .counters()
        .into_iter()
        .find(|(n, _)| *n == "sqlite_wal_restarts_total");
    assert!(restarts.is_some_and(|(_, n)| n > 0), "{restarts:?}");
    let mut snap = s.snapshot().await.unwrap();
    for n in (0..ROUNDS * 80).step_by(97) {
        let k = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let row = snap
            .get(&tarn_store::Key::new(t, b"p", k.to_be_bytes()))
            .await
            .unwrap();
        assert!(row.is_some(), "row {n} was written");
    }
}

/// Writes go without savepoints; a write that fails after changing rows
/// must still leave nothing behind (rows or feed entries), and the writes
/// around it land, their feed entries in rising cursors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_failing_halfway_undoes_only_itself() {
    use tarn_store::{Batch, Expect, Key};
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let t = tarn_store::Table::new("t");
    let feed = tarn_store::Table::new("f");
    let key = |p: &str, c: u32| Key::new(t, p.as_bytes(), c.to_be_bytes());
    let redone = |s: &SqliteStore| {
        s.counters()
            .into_iter()
            .find(|(n, _)| *n == "sqlite_commit_groups_redone_total")
            .map(|(_, v)| v)
            .unwrap()
    };
    let mut cursor: Option<Vec<u8>> = None;
    for round in 0..20u32 {
        let mut writes = Vec::new();
        for i in 0..32u32 {
            let mut b = Batch::new();
            b.put(key("good", round * 100 + i), b"v".to_vec(), 1);
            b.put(key("good", round * 100 + i + 50), b"w".to_vec(), 1);
            b.append(feed, format!("{round}/{i}").into_bytes());
            if i == 16 {
                // Its first put lands in the group's transaction; its
                // second cannot be stored (versions are stored as i64).
                b = Batch::new();
                b.put(key("bad", round), b"x".to_vec(), 1);
                b.append(feed, b"bad".to_vec());
                b.put(key("bad", round + 1000), b"y".to_vec(), u64::MAX);
            }
            if i == 20 {
                b.guard(key("never", 0), Expect::Version(1));
            }
            let s = s.clone();
            writes.push(tokio::spawn(async move { s.write(b).await }));
        }
        for (i, w) in writes.into_iter().enumerate() {
            let outcome = w.await.unwrap();
            match i {
                16 => assert!(
                    matches!(outcome, Err(StoreError::Invalid(_))),
                    "{outcome:?}"
                ),
                20 => assert!(matches!(outcome, Err(StoreError::GuardFailed { guard: 0 }))),
                _ => outcome.unwrap(),
            }
        }
        let mut snap = s.snapshot().await.unwrap();
        assert_eq!(
            snap.get(&key("bad", round)).await.unwrap(),
            None,
            "round {round}"
        );
        for i in (0..32u32).filter(|i| *i != 16) {
            let landed = snap
                .get(&key("good", round * 100 + i))
                .await
                .unwrap()
                .is_some()
                && snap
                    .get(&key("good", round * 100 + i + 50))
                    .await
                    .unwrap()
                    .is_some();
            assert_eq!(landed, i != 20, "round {round}, write {i}");
        }
        // The round's entries: one per write that landed, none of the bad
        // write's, in cursors that only rise.
        let entries = snap.read_feed(feed, cursor.as_deref(), 100).await.unwrap();
        let mut got: Vec<String> = entries
            .iter()
            .map(|e| String::from_utf8(e.value.clone()).unwrap())
            .collect();
        assert!(entries.windows(2).all(|w| w[0].cursor < w[1].cursor));
        assert!(!got.contains(&"bad".to_string()), "round {round}: {got:?}");
        got.sort();
        let mut want: Vec<String> = (0..32u32)
            .filter(|i| *i != 16 && *i != 20)
            .map(|i| format!("{round}/{i}"))
            .collect();
        want.sort();
        assert_eq!(got, want, "round {round}");
        cursor = entries.last().map(|e| e.cursor.clone());
    }
    assert!(
        redone(&s) >= 20,
        "every round's bad write was undone by a redo"
    );
}

/// A read-only connection to the database of an open store in `dir`, on
/// the store's VFS (the store refuses connections of any other beside it).
pub(crate) fn peek(dir: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags_and_vfs(
        dir.join("tarn.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        "tarn",
    )
    .unwrap()
}

/// Large values live in `big`, out of the `rows` b-tree, so that no descent
/// of `rows` reads them; they go when their row is replaced or deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_kept_out_of_the_rows_tree() {
    use tarn_store::{Batch, Direction, Key, Scan};
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    let t = tarn_store::Table::new("t");
    let key = |c: u8| Key::new(t, b"p".to_vec(), vec![c]);
    let big = |n: usize, fill: u8| vec![fill; n];
    let put = |k: Key, v: Vec<u8>| {
        let mut b = Batch::new();
        b.put(k, v, 1);
        b
    };
    s.write(put(key(1), big(256 * 1024, 1))).await.unwrap();
    s.write(put(key(2), big(900, 2))).await.unwrap();
    s.write(put(key(3), big(2000, 3))).await.unwrap();
    s.write(put(key(4), b"small".to_vec())).await.unwrap();
    let db = || peek(dir.path());
    let count = |sql: &str| -> i64 { db().query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM big"),
        2,
        "the 256 KiB and 2,000-byte values"
    );
    assert!(
        count("SELECT max(length(value)) FROM rows") < 1002,
        "no row spills"
    );

    let mut snap = s.snapshot().await.unwrap();
    let got = snap.get(&key(1)).await.unwrap().unwrap();
    assert_eq!(got.value, big(256 * 1024, 1));
    let rows = snap
        .scan(&Scan::partition(t, b"p".to_vec(), 10).direction(Direction::Reverse))
        .await
        .unwrap();
    let values: Vec<Vec<u8>> = rows.into_iter().map(|r| r.value).collect();
    assert_eq!(
        values,
        vec![
            b"small".to_vec(),
            big(2000, 3),
            big(900, 2),
            big(256 * 1024, 1)
        ]
    );
    drop(snap);

    // Replaced by a small value, by another large one, and deleted: no
    // value is left behind in `big`.
    s.write(put(key(1), b"now small".to_vec())).await.unwrap();
    s.write(put(key(3), big(3000, 4))).await.unwrap();
    assert_eq!(count("SELECT count(*) FROM big"), 1);
    let mut b = Batch::new();
    b.delete(key(3));
    s.write(b).await.unwrap();
    assert_eq!(count("SELECT count(*) FROM big"), 0);
    let mut snap = s.snapshot().await.unwrap();
    assert_eq!(
        snap.get(&key(1)).await.unwrap().unwrap().value,
        b"now small"
    );
    assert_eq!(snap.get(&key(3)).await.unwrap(), None);
}

/// A store written before values could live apart (no `big` column) opens,
/// reads its large values where they are, and keeps new ones apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_big_values_still_reads() {
    use tarn_store::{Batch, Key};
    let dir = tempfile::tempdir().unwrap();
    {
        let db = rusqlite::Connection::open(dir.path().join("tarn.sqlite")).unwrap();
        db.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE rows (tbl TEXT NOT NULL, part BLOB NOT NULL, clus BLOB NOT NULL,
                 value BLOB NOT NULL, version INTEGER NOT NULL,
                 PRIMARY KEY (tbl, part, clus)) WITHOUT ROWID;",
        )
        .unwrap();
        db.execute(
            "INSERT INTO rows VALUES ('t', x'70', x'01', ?1, 7)",
            [vec![9u8; 100_000]],
        )
        .unwrap();
    }
    let s = SqliteStore::open(dir.path()).unwrap();
    let t = tarn_store::Table::new("t");
    let old = Key::new(t, b"p".to_vec(), vec![1]);
    let read = || async {
        s.snapshot()
            .await
            .unwrap()
            .get(&old)
            .await
            .unwrap()
            .unwrap()
    };
    let row = read().await;
    assert_eq!((row.value, row.version), (vec![9u8; 100_000], 7));
    let mut b = Batch::new();
    b.put(old.clone(), vec![8u8; 50_000], 8);
    s.write(b).await.unwrap();
    let row = read().await;
    assert_eq!((row.value, row.version), (vec![8u8; 50_000], 8));
    let db = peek(dir.path());
    let (inline, apart): (i64, i64) = db
        .query_row("SELECT length(value), big IS NOT NULL FROM rows", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((inline, apart), (0, 1));
}

/// Feed entries carry whole items: a large one lives in `big` too, and goes
/// when the feed is trimmed past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_feed_entries_are_kept_apart_and_trimmed() {
    use tarn_store::Batch;
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    let feed = tarn_store::Table::new("f");
    for value in [vec![7u8; 5000], b"small".to_vec(), vec![8u8; 70_000]] {
        let mut b = Batch::new();
        b.append(feed, value);
        s.write(b).await.unwrap();
    }
    let db = peek(dir.path());
    let count = |sql: &str| -> i64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(count("SELECT count(*) FROM big"), 2);
    assert!(
        count("SELECT max(length(value)) FROM feed") < 1002,
        "no entry spills"
    );
    let read = || async {
        s.snapshot()
            .await
            .unwrap()
            .read_feed(feed, None, 10)
            .await
            .unwrap()
    };
    let entries = read().await;
    let values: Vec<Vec<u8>> = entries.iter().map(|e| e.value.clone()).collect();
    assert_eq!(
        values,
        vec![vec![7u8; 5000], b"small".to_vec(), vec![8u8; 70_000]]
    );
    s.trim_feed(feed, &entries[1].cursor, 10).await.unwrap();
    assert_eq!(
        count("SELECT count(*) FROM big"),
        1,
        "the trimmed entry's value went"
    );
    let left = read().await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].value, vec![8u8; 70_000]);
}

/// Issue 15: a 256 KiB upload must not delay a small write by more than a
/// commit group. A group takes at most one large write and small writes go
/// first, so a small write queued behind two dozen large ones commits with
/// the group in progress or the next, not after all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_write_waits_for_at_most_one_group_of_large_ones() {
    const LARGE: u64 = 24;
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let t = tarn_store::Table::new("t");
    let counter = |name: &str| {
        s.counters()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .unwrap()
    };
    let mut tasks = Vec::new();
    for i in 0..LARGE {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut b = tarn_store::Batch::new();
            b.put(
                tarn_store::Key::new(t, b"large", i.to_be_bytes()),
                vec![7; 256 * 1024],
                1,
            );
            s.write(b).await.unwrap();
        }));
    }
    // Every large write queued (or already committed).
    while counter("sqlite_queued_writes") + counter("sqlite_commits_total") < LARGE {
        tokio::task::yield_now().await;
    }
    // The writer counts a group before it answers its writes: the group in
    // progress now and the one with the small write make at most two more.
    let groups = counter("sqlite_commit_groups_total");
    let mut b = tarn_store::Batch::new();
    b.put(tarn_store::Key::new(t, b"small", [0]), vec![1; 100], 1);
    s.write(b).await.unwrap();
    let waited = counter("sqlite_commit_groups_total") - groups;
    assert!(
        waited <= 2,
        "{waited} commit groups ran while the small write waited"
    );
    assert!(
        counter("sqlite_commits_total") < LARGE + 1,
        "large writes were still queued when the small one committed"
    );
    for t in tasks {
        t.await.unwrap();
    }
}
