//! PgStore against a real PostgreSQL: the shared conformance suite, each
//! test in a schema of its own. `make test` starts the server
//! (scripts/with-postgres.sh) and sets TARN_TEST_POSTGRES.

use std::sync::Arc;

use tarn_store::{Batch, Expect, Key, Scan, SnapshotExt, Store, StoreError, Table};
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

/// The end of `feed`, in a fresh snapshot.
async fn feed_end(store: &PgStore, feed: Table) -> Vec<u8> {
    store
        .snapshot()
        .await
        .unwrap()
        .feed_end(feed)
        .await
        .unwrap()
}

/// Up to `limit` entries of `feed` after `cursor`, in a fresh snapshot.
async fn read_feed(
    store: &PgStore,
    feed: Table,
    cursor: &[u8],
    limit: usize,
) -> Vec<tarn_store::FeedEntry> {
    store
        .snapshot()
        .await
        .unwrap()
        .read_feed(feed, Some(cursor), limit)
        .await
        .unwrap()
}

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
    let seen = b.snapshot().await.unwrap().get(&k).await.unwrap();
    assert_eq!(seen.unwrap().value, b"from a");
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
    // Four nodes start at once on an empty schema: every one must come up,
    // and all must share the one table the first created.
    let url = fresh_url();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move { PgStore::connect(&url).await }));
    }
    let mut stores = Vec::new();
    for t in tasks {
        stores.push(t.await.unwrap().expect("a concurrent start succeeds"));
    }
    let t = Table::new("migrate");
    for (i, s) in stores.iter().enumerate() {
        let mut w = Batch::new();
        w.put(Key::new(t, b"p", [i as u8 + 1]), vec![i as u8], 1);
        s.write(w).await.unwrap();
    }
    for s in &stores {
        let rows = s
            .snapshot()
            .await
            .unwrap()
            .scan(&Scan::partition(t, b"p".to_vec(), 10))
            .await
            .unwrap();
        assert_eq!(rows.len(), 4, "every node sees every node's rows");
    }
    // A fifth start on the existing schema changes nothing.
    let again = PgStore::connect(&url).await.unwrap();
    let rows = again
        .snapshot()
        .await
        .unwrap()
        .scan(&Scan::partition(t, b"p".to_vec(), 10))
        .await
        .unwrap();
    assert_eq!(rows.len(), 4, "a restart keeps the data");
}

#[tokio::test]
async fn bad_urls_are_refused_clearly() {
    let base = std::env::var("TARN_TEST_POSTGRES").expect(
        "TARN_TEST_POSTGRES is not set: run the tests through `make test` or scripts/with-postgres.sh",
    );
    assert!(matches!(
        PgStore::connect("not a url").await,
        Err(StoreError::Invalid(_))
    ));
    match PgStore::connect(&format!("{base}?schema=Bad;Name")).await {
        Err(StoreError::Invalid(m)) => assert!(m.contains("schema"), "{m}"),
        Err(e) => panic!("expected invalid, got {e}"),
        Ok(_) => panic!("a bad schema name must be refused"),
    }
    // Nothing listens on port 9 of loopback.
    match PgStore::connect("postgres://tarn@127.0.0.1:9/tarn").await {
        Err(StoreError::Unavailable(_)) => {}
        Err(e) => panic!("expected unavailable, got {e}"),
        Ok(_) => panic!("connected to nothing"),
    }
}

/// A transaction that takes its id first and commits last is never passed
/// over by a poller: PostgreSQL's sequences and ids are not commit-ordered,
/// so the feed is read only below the oldest transaction still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_feed_poller_never_skips_a_late_commit() {
    let store = PgStore::connect(&fresh_url()).await.unwrap();
    let feed = Table::new("late");
    let t = Table::new("late_rows");
    let start = feed_end(&store, feed).await;
    // The slow one starts first (smaller transaction id, smaller sequence
    // number) and is held open.
    let mut slow = Batch::new();
    slow.put(Key::new(t, b"p", b"slow"), vec![1], 1)
        .append(feed, b"slow".to_vec());
    let held = store.write_held(slow).await.unwrap();
    // Others start later and commit at once.
    for i in 0..5u8 {
        let mut b = Batch::new();
        b.put(Key::new(t, b"p", [i]), vec![1], 1)
            .append(feed, vec![b'f', i]);
        store.write(b).await.unwrap();
    }
    // A poller reading now sees nothing past the open transaction...
    let mut cursor = start.clone();
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let page = read_feed(&store, feed, &cursor, 100).await;
    assert!(
        page.is_empty(),
        "entries after a transaction still running must wait for it: {page:?}"
    );
    // ...and once it commits, sees everything, the late one included.
    // An empty page means "nothing more is safe to read yet", not "done":
    // a write of another test on the same cluster may be running, and
    // entries after it wait for it. So poll, as the change feed does.
    held.commit().await.unwrap();
    for _ in 0..600 {
        let page = read_feed(&store, feed, &cursor, 2).await;
        if page.is_empty() {
            if seen.len() >= 6 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        for e in page {
            cursor = e.cursor;
            seen.push(e.value);
        }
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert_eq!(seen[0], b"slow".to_vec(), "the first to start comes first");
    assert!(seen.contains(&vec![b'f', 4]));
}

/// A transaction left open in another database of the server holds back
/// nothing: PostgreSQL's own horizon counts every database, and the feed
/// (`/changes`, `/events`) used to wait for such a transaction to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_open_in_another_database_holds_the_feed_back_in_none() {
    let url = fresh_url();
    let store = PgStore::connect(&url).await.unwrap();
    let feed = Table::new("elsewhere");
    let start = feed_end(&store, feed).await;
    // The server's own database, `postgres`, with a transaction that has
    // taken an id, left open.
    let base = std::env::var("TARN_TEST_POSTGRES").unwrap();
    let (path, _) = base.rsplit_once('/').unwrap();
    let (other, connection) =
        tokio_postgres::connect(&format!("{path}/postgres"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    other
        .batch_execute("BEGIN; SELECT pg_current_xact_id()")
        .await
        .unwrap();
    let mut b = Batch::new();
    b.put(
        Key::new(Table::new("elsewhere_rows"), b"p", b"c"),
        vec![1],
        1,
    )
    .append(feed, b"after".to_vec());
    store.write(b).await.unwrap();
    // Other tests' writes in this database may run meanwhile and hold the
    // feed back a moment; the open transaction stays open throughout.
    let mut seen = Vec::new();
    for _ in 0..200 {
        let page = read_feed(&store, feed, &start, 10).await;
        seen.extend(page.into_iter().map(|e| e.value));
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(seen, vec![b"after".to_vec()], "the entry was held back");
    // Its end moved past the entry as well.
    let end = feed_end(&store, feed).await;
    assert!(end > start);
    other.batch_execute("ROLLBACK").await.unwrap();
}

/// Writes guarded on a row they do not write share its lock: one held open
/// does not stop another from committing. A write that changes the row
/// waits for the holder, and a guard on the old version fails after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_that_only_depend_on_a_row_do_not_queue_behind_each_other() {
    let store = Arc::new(PgStore::connect(&fresh_url()).await.unwrap());
    let t = Table::new("shared");
    let row = Key::new(t, b"p", b"stamp");
    let mut w = Batch::new();
    w.put(row.clone(), b"-".to_vec(), 1);
    store.write(w).await.unwrap();
    let depending = |name: &[u8]| {
        let mut b = Batch::new();
        b.put(Key::new(t, b"p", name), b"x".to_vec(), 1)
            .guard(row.clone(), Expect::Version(1));
        b
    };
    let held = store.write_held(depending(b"a")).await.unwrap();
    // Were the row locked exclusively, this would wait for `held` forever.
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        store.write(depending(b"b")),
    )
    .await
    .expect("a write depending on the same row is not held up")
    .unwrap();
    // One that changes the row waits for the holder, then holds its guard.
    let mut change = Batch::new();
    change
        .put(row.clone(), b"-".to_vec(), 2)
        .guard(row.clone(), Expect::Version(1));
    let changer = {
        let store = store.clone();
        tokio::spawn(async move { store.write(change).await })
    };
    held.commit().await.unwrap();
    changer.await.unwrap().unwrap();
    assert!(matches!(
        store.write(depending(b"c")).await,
        Err(StoreError::GuardFailed { guard: 0 })
    ));
    let snap = &mut store.snapshot().await.unwrap();
    for (name, present) in [(&b"a"[..], true), (b"b", true), (b"c", false)] {
        let got = snap.get(&Key::new(t, b"p", name)).await.unwrap();
        assert_eq!(got.is_some(), present, "{name:?}");
    }
}

/// PostgreSQL over TLS: verify-full with the CA that signed the server's
/// certificate works and is encrypted; another CA is refused; require
/// encrypts without checking; no sslmode stays in the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_verify_the_server() {
    let ca = std::env::var("TARN_TEST_POSTGRES_CA")
        .expect("TARN_TEST_POSTGRES_CA is not set: run the tests through scripts/with-postgres.sh");
    let other = std::env::var("TARN_TEST_POSTGRES_OTHER_CA").expect("TARN_TEST_POSTGRES_OTHER_CA");
    let url = fresh_url();
    let full = PgStore::connect(&format!("{url}&sslmode=verify-full&sslrootcert={ca}"))
        .await
        .expect("verify-full with the right CA");
    assert!(full.uses_tls().await.unwrap(), "verify-full encrypts");
    let mut w = Batch::new();
    w.put(Key::new(Table::new("tls"), b"p", b"c"), b"v".to_vec(), 1);
    full.write(w).await.unwrap();
    let ca_only = PgStore::connect(&format!("{url}&sslmode=verify-ca&sslrootcert={ca}"))
        .await
        .expect("verify-ca with the right CA");
    assert!(ca_only.uses_tls().await.unwrap());
    match PgStore::connect(&format!("{url}&sslmode=verify-full&sslrootcert={other}")).await {
        Err(StoreError::Unavailable(m)) => assert!(
            m.to_lowercase().contains("certificate") || m.contains("tls") || m.contains("TLS"),
            "{m}"
        ),
        Err(e) => panic!("expected a refused certificate, got {e}"),
        Ok(_) => panic!("a server whose certificate the CA did not sign must be refused"),
    }
    let require = PgStore::connect(&format!("{url}&sslmode=require"))
        .await
        .unwrap();
    assert!(require.uses_tls().await.unwrap(), "require encrypts");
    let plain = PgStore::connect(&url).await.unwrap();
    assert!(!plain.uses_tls().await.unwrap(), "no sslmode: in the clear");
    match PgStore::connect(&format!(
        "{url}&sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"
    ))
    .await
    {
        Err(StoreError::Invalid(m)) => assert!(m.contains("sslrootcert"), "{m}"),
        other => panic!("{:?}", other.err()),
    }
}

/// Awaits `op`, which finds every connection of its pool busy, and asserts
/// it is refused as unavailable. Not a timing: a pool that queues for ever
/// fails the 30 s guard instead of hanging.
async fn assert_refused<T>(op: impl std::future::Future<Output = tarn_store::StoreResult<T>>) {
    let bounded = std::time::Duration::from_secs(30);
    match tokio::time::timeout(bounded, op)
        .await
        .expect("refused, not queued")
    {
        Err(StoreError::Unavailable(_)) => {}
        Err(e) => panic!("refused otherwise: {e:?}"),
        Ok(_) => panic!("served while every connection was busy"),
    }
}

/// A snapshot or a write that finds every connection busy for longer than
/// the pool's wait is refused as unavailable (the server answers 503), as
/// on SQLite, rather than queued for as long as the connections stay busy.
#[tokio::test]
async fn a_pool_busy_past_its_wait_refuses() {
    let options = tarn_store_postgres::PgOptions {
        pool_size: 1,
        wait: std::time::Duration::from_millis(100),
    };
    let store = PgStore::connect_with(&fresh_url(), options).await.unwrap();
    let key = Key::new(Table::new("conf_a"), b"p".to_vec(), b"c".to_vec());
    let mut held = store.snapshot().await.unwrap();
    held.get(&key).await.unwrap();
    assert_refused(store.snapshot()).await;
    let mut b = Batch::new();
    b.put(key.clone(), b"v".to_vec(), 1);
    assert_refused(store.write(b.clone())).await;
    // Once the connection is free again, both are served.
    drop(held);
    store.write(b).await.unwrap();
    let row = store.snapshot().await.unwrap().get(&key).await.unwrap();
    assert_eq!(row.map(|r| r.value), Some(b"v".to_vec()));
}

/// The URL's `pool_size` and `pool_wait` size the pool, as an operator
/// running many nodes on one database sets them.
#[tokio::test]
async fn the_url_sizes_the_pool() {
    let url = format!("{}&pool_size=4&pool_wait=100", fresh_url());
    let store = PgStore::connect(&url).await.unwrap();
    assert_eq!(store.connections(), Some(4));
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut snap = store.snapshot().await.unwrap();
        snap.get(&Key::new(
            Table::new("conf_a"),
            b"p".to_vec(),
            b"c".to_vec(),
        ))
        .await
        .unwrap();
        held.push(snap);
    }
    assert_refused(store.snapshot()).await;
    drop(held);
    let url = format!("{}&pool_size=0", fresh_url());
    match PgStore::connect(&url).await {
        Err(StoreError::Invalid(m)) => assert!(m.contains("pool_size"), "{m}"),
        other => panic!("{:?}", other.err()),
    }
}

/// A server that takes connections and never answers is refused after the
/// connection wait, not waited for for ever (found by a black-box audit:
/// `tarn serve` printed nothing and never started).
#[tokio::test]
async fn a_server_that_never_answers_is_refused() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for c in silent.incoming().take(4) {
            open.push(c);
        }
        std::thread::sleep(std::time::Duration::from_secs(60));
    });
    let url = format!("postgres://tarn@127.0.0.1:{port}/tarn");
    let bounded = std::time::Duration::from_secs(50);
    let r = tokio::time::timeout(bounded, PgStore::connect(&url))
        .await
        .expect("refused, not waited for");
    match r {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("did not answer"), "{m}"),
        other => panic!("{:?}", other.err()),
    }
    drop(held);
}

const PLAN_ROWS: Table = Table::new("plan_rows");
const PLAN_FEED: Table = Table::new("plan_feed");

fn plan_key(part: &[u8], n: u32) -> Key {
    Key::new(PLAN_ROWS, part.to_vec(), n.to_be_bytes().to_vec())
}

/// Runs every statement the store prepares: a write with a put, a delete,
/// a guard on a row it writes and on one it only reads, an absent guard it
/// leaves unclaimed, and an append; a point read, a scan of each shape
/// (either bound absent, included or excluded, either direction), the
/// feed's reads and a trim, and the export's scans.
async fn every_statement(store: &PgStore, round: u32) {
    use std::ops::Bound;
    let mut b = Batch::new();
    b.put(plan_key(b"a", round + 1), vec![1], 1)
        .delete(plan_key(b"a", round))
        .guard(plan_key(b"g", 0), Expect::Version(1))
        .guard(plan_key(b"g", 1), Expect::Version(1))
        .guard(plan_key(b"g", 2 + round), Expect::Absent)
        .put(plan_key(b"g", 0), vec![1], 1)
        .append(PLAN_FEED, vec![1]);
    store.write(b).await.unwrap();
    let bounds = |at: u8| {
        [
            Bound::Unbounded,
            Bound::Included(vec![at]),
            Bound::Excluded(vec![at]),
        ]
    };
    let mut scans = Vec::new();
    for lower in bounds(0) {
        for upper in bounds(9) {
            let scan = Scan::partition(PLAN_ROWS, b"a".to_vec(), 10).bounds(lower.clone(), upper);
            scans.push(scan.clone().direction(tarn_store::Direction::Reverse));
            scans.push(scan);
        }
    }
    let mut snap = store.snapshot().await.unwrap();
    snap.read(&[plan_key(b"a", round)], &scans).await.unwrap();
    let end = snap.feed_end(PLAN_FEED).await.unwrap();
    snap.read_feed(PLAN_FEED, None, 10).await.unwrap();
    snap.read_feed(PLAN_FEED, Some(&end), 10).await.unwrap();
    let (_, next) = snap.scan_all(None, 2).await.unwrap();
    snap.scan_all(next.as_deref(), 2).await.unwrap();
    drop(snap);
    store.trim_feed(PLAN_FEED, &[0; 16], 1).await.unwrap();
}

/// Regression: PostgreSQL keeps a prepared statement's plan. The joined
/// bulk delete, planned on a small table, kept scanning it whole as it
/// grew (a rebuild stalled up to a minute), and the feed's read sorted
/// every entry after its cursor. Every statement runs while the tables
/// are small, often enough for a plan to be kept; they grow; each kept
/// plan must read by the primary key and sort nothing.
#[tokio::test]
async fn plans_made_on_small_tables_keep_to_the_primary_key() {
    let url = fresh_url();
    let schema = url.rsplit_once("schema=").unwrap().1.to_string();
    // No autovacuum: its ANALYZE would make PostgreSQL plan again, and
    // what is tested is a plan kept while nothing does.
    let store = PgStore::connect(&url).await.unwrap();
    drop(store);
    let base = std::env::var("TARN_TEST_POSTGRES").unwrap();
    let (admin, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute(&format!(
            "ALTER TABLE {schema}.tarn_rows SET (autovacuum_enabled = false);
             ALTER TABLE {schema}.tarn_feed SET (autovacuum_enabled = false);"
        ))
        .await
        .unwrap();
    // One connection: the one whose plans are looked at.
    let one = tarn_store_postgres::PgOptions {
        pool_size: 1,
        ..Default::default()
    };
    let store = PgStore::connect_with(&url, one).await.unwrap();
    let mut b = Batch::new();
    b.put(plan_key(b"g", 0), vec![1], 1)
        .put(plan_key(b"g", 1), vec![1], 1);
    store.write(b).await.unwrap();
    // PostgreSQL considers keeping a plan from a statement's sixth run.
    for round in 0..8 {
        every_statement(&store, round).await;
    }
    for chunk in 0..20u32 {
        let mut b = Batch::new();
        for n in 0..1000 {
            b.put(plan_key(b"z", chunk * 1000 + n), vec![0; 64], 1)
                .append(PLAN_FEED, vec![0; 64]);
        }
        store.write(b).await.unwrap();
    }
    every_statement(&store, 8).await;
    let mut looked_at = 0;
    for (sql, plan) in store.kept_plans().await.unwrap() {
        if !sql.contains("tarn_rows") && !sql.contains("tarn_feed") {
            continue;
        }
        assert!(
            !plan.contains("Seq Scan on tarn_") && !plan.contains("Sort"),
            "{sql}\n{plan}"
        );
        looked_at += 1;
    }
    // A point read, 18 scans, two row locks, a claim, the upsert, a delete,
    // an unclaim, the append, the feed's read and trim, two export scans.
    assert_eq!(looked_at, 30);
}
