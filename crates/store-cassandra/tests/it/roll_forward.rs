//! A guarded write whose writer died between its two steps is completed by
//! the roll-forward, without undoing anything written since.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tarn_store::{Batch, Expect, Key, SnapshotExt, Store, Table};
use tarn_store_cassandra::{CassandraOptions, CassandraStore};

use crate::{connect, pooled_url, CLUSTER};

const T: Table = Table::new("orders");
const U: Table = Table::new("index");

/// A store whose intents may be completed after one second, with no
/// sweeper of its own unless asked.
async fn store(url: &str, sweep: Option<Duration>) -> CassandraStore {
    connect(
        url,
        CassandraOptions {
            sweep_interval: sweep,
            intent_grace: Duration::from_secs(1),
            ..CassandraOptions::default()
        },
    )
    .await
}

/// The guarded batch of a writer: its own row in partition `p`, and rows of
/// two other partitions (one put, one delete).
fn batch() -> Batch {
    let mut w = Batch::new();
    w.put(Key::new(T, b"p", b"item"), b"v2".to_vec(), 2)
        .put(Key::new(U, b"by-user", b"item"), b"listed".to_vec(), 2)
        .put(Key::new(U, b"by-kind", b"item"), b"stale".to_vec(), 2)
        .delete(Key::new(U, b"old", b"item"))
        .guard(Key::new(T, b"p", b"item"), Expect::Version(1));
    w
}

async fn setup(s: &CassandraStore) {
    let mut w = Batch::new();
    w.put(Key::new(T, b"p", b"item"), b"v1".to_vec(), 1).put(
        Key::new(U, b"old", b"item"),
        b"gone soon".to_vec(),
        1,
    );
    s.write(w).await.unwrap();
}

async fn value(s: &CassandraStore, k: Key) -> Option<Vec<u8>> {
    let mut snap = s.snapshot().await.unwrap();
    snap.get(&k).await.unwrap().map(|r| r.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_second_step_never_ran_is_rolled_forward() {
    let _g = CLUSTER.read().await;
    let s = store(&pooled_url().await, None).await;
    setup(&s).await;
    s.write_first_step_only(batch()).await.unwrap();

    // Step 1 alone: the guarded partition is ahead, the others are not.
    assert_eq!(value(&s, Key::new(T, b"p", b"item")).await.unwrap(), b"v2");
    assert!(value(&s, Key::new(U, b"by-user", b"item")).await.is_none());
    assert!(value(&s, Key::new(U, b"old", b"item")).await.is_some());
    assert_eq!(s.pending_intents(10).await.unwrap(), 1);
    // The guard already holds the new version: a second writer loses.
    let mut w = Batch::new();
    w.put(Key::new(T, b"p", b"item"), b"late".to_vec(), 2)
        .guard(Key::new(T, b"p", b"item"), Expect::Version(1));
    assert!(s.write(w).await.is_err());

    // Someone writes one of the intent's rows after the writer died.
    let mut w = Batch::new();
    w.put(Key::new(U, b"by-kind", b"item"), b"newer".to_vec(), 3);
    s.write(w).await.unwrap();

    // Too young: the roll-forward leaves it to its writer.
    assert_eq!(s.roll_forward().await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(s.roll_forward().await.unwrap(), 1);
    assert_eq!(
        value(&s, Key::new(U, b"by-user", b"item")).await.unwrap(),
        b"listed"
    );
    assert!(value(&s, Key::new(U, b"old", b"item")).await.is_none());
    assert_eq!(
        value(&s, Key::new(U, b"by-kind", b"item")).await.unwrap(),
        b"newer",
        "rolling forward never undoes a later write"
    );
    assert_eq!(s.pending_intents(10).await.unwrap(), 0);
    assert_eq!(s.roll_forward().await.unwrap(), 0, "done once");
    let counters: HashMap<_, _> = s.counters().into_iter().collect();
    assert_eq!(counters["cassandra_intents_rolled_forward_total"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_of_another_store_completes_a_dead_writers_batch() {
    let _g = CLUSTER.read().await;
    let url = pooled_url().await;
    let writer = store(&url, None).await;
    setup(&writer).await;
    writer.write_first_step_only(batch()).await.unwrap();
    drop(writer);
    // Another node, with its sweeper running, finds and completes it.
    let other = store(&url, Some(Duration::from_millis(200))).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while value(&other, Key::new(U, b"by-user", b"item"))
        .await
        .is_none()
    {
        assert!(Instant::now() < deadline, "the sweeper never completed it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while other.pending_intents(10).await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "the intent stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The intent goes once all its partitions are written (they are
    // written side by side, so one may show before another).
    assert!(value(&other, Key::new(U, b"old", b"item")).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_writes_leave_no_intent() {
    let _g = CLUSTER.read().await;
    let s = store(&pooled_url().await, None).await;
    setup(&s).await;
    // Connecting writes the store's birth row once (a transaction too).
    let before: HashMap<_, _> = s.counters().into_iter().collect();
    s.write(batch()).await.unwrap();
    // A guarded batch touching only its own partition leaves none either.
    let mut w = Batch::new();
    w.put(Key::new(T, b"p", b"item"), b"v3".to_vec(), 3)
        .guard(Key::new(T, b"p", b"item"), Expect::Version(2));
    s.write(w).await.unwrap();
    assert_eq!(s.pending_intents(10).await.unwrap(), 0);
    assert_eq!(
        value(&s, Key::new(U, b"by-user", b"item")).await.unwrap(),
        b"listed"
    );
    let counters: HashMap<_, _> = s.counters().into_iter().collect();
    assert_eq!(
        counters["cassandra_lwt_applied_total"] - before["cassandra_lwt_applied_total"],
        2
    );
    assert_eq!(counters["cassandra_intents_rolled_forward_total"], 0);
}
