//! Several stores on one keyspace stand for several Tarn nodes.

use std::sync::Arc;

use tarn_store::{Batch, Expect, Key, Scan, SnapshotExt, Store, StoreError, Table};
use tarn_store_cassandra::{CassandraOptions, CassandraStore};

use crate::{connect, fresh_url, options, CLUSTER};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_share_one_keyspace() {
    // A write through one store is visible through the other at once, and
    // guards hold across them.
    let _g = CLUSTER.read().await;
    let url = fresh_url();
    let a = connect(&url, options()).await;
    let b = connect(&url, options()).await;
    let t = Table::new("nodes");
    let k = Key::new(t, b"p", b"c");
    let mut w = Batch::new();
    w.put(k.clone(), b"from a".to_vec(), 1)
        .put(Key::new(t, b"other", b"c"), b"side".to_vec(), 1)
        .guard(k.clone(), Expect::Absent);
    a.write(w).await.unwrap();
    let mut snap = b.snapshot().await.unwrap();
    assert_eq!(snap.get(&k).await.unwrap().unwrap().value, b"from a");
    assert_eq!(
        snap.get(&Key::new(t, b"other", b"c"))
            .await
            .unwrap()
            .unwrap()
            .value,
        b"side",
        "the other partition of a guarded batch is visible once write returns"
    );
    let mut w = Batch::new();
    w.put(k.clone(), b"from b".to_vec(), 2)
        .guard(k.clone(), Expect::Absent);
    assert!(matches!(
        b.write(w).await,
        Err(StoreError::GuardFailed { guard: 0 })
    ));
    let mut w = Batch::new();
    w.put(k.clone(), b"from b".to_vec(), 2)
        .guard(k.clone(), Expect::Version(1));
    b.write(w).await.unwrap();
    let row = a.snapshot().await.unwrap().get(&k).await.unwrap().unwrap();
    assert_eq!((row.value.as_slice(), row.version), (&b"from b"[..], 2));
    // Intents never show: the partition holds exactly the contract's rows.
    let rows = a
        .snapshot()
        .await
        .unwrap()
        .scan(&Scan::partition(t, b"p".to_vec(), 100))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_guarded_writers_on_two_stores_one_winner() {
    // Sixteen writers on two stores, all guarded on one version of a row,
    // each also writing a row of its own elsewhere: one wins, and only the
    // winner's other row exists.
    let _g = CLUSTER.read().await;
    let url = fresh_url();
    let stores = [
        Arc::new(connect(&url, options()).await),
        Arc::new(connect(&url, options()).await),
    ];
    let t = Table::new("race");
    let hot = Key::new(t, b"hot", b"row");
    let mut w = Batch::new();
    w.put(hot.clone(), b"start".to_vec(), 1);
    stores[0].write(w).await.unwrap();
    for round in 1..=3u64 {
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16u8)
            .map(|i| {
                let s = stores[usize::from(i % 2)].clone();
                let (hot, barrier) = (hot.clone(), barrier.clone());
                tokio::spawn(async move {
                    let mut w = Batch::new();
                    w.put(hot.clone(), vec![i], round + 1)
                        .put(Key::new(t, [round as u8, i], b"mine"), vec![i], 1)
                        .guard(hot, Expect::Version(round));
                    barrier.wait().await;
                    s.write(w).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            match task.await.unwrap() {
                Ok(()) => winners.push(i as u8),
                Err(StoreError::GuardFailed { guard: 0 }) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => panic!("writer {i}: {e}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: one winner, got {winners:?}"
        );
        let mut snap = stores[1].snapshot().await.unwrap();
        let row = snap.get(&hot).await.unwrap().unwrap();
        assert_eq!((row.value, row.version), (vec![winners[0]], round + 1));
        for i in 0..16u8 {
            let mine = snap
                .get(&Key::new(t, [round as u8, i], b"mine"))
                .await
                .unwrap();
            assert_eq!(mine.is_some(), i == winners[0], "round {round}, writer {i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_agree_on_schema() {
    // Four processes start at once on a keyspace nobody created: every one
    // comes up, and all share the one table.
    let _g = CLUSTER.read().await;
    let url = fresh_url();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { CassandraStore::connect_with(&url, options()).await })
        })
        .collect();
    let mut stores = Vec::new();
    for t in tasks {
        stores.push(t.await.unwrap().expect("a concurrent start succeeds"));
    }
    let t = Table::new("starts");
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
        assert_eq!(rows.len(), 4, "every store sees every store's rows");
    }
    let again = connect(&url, options()).await;
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
    let _g = CLUSTER.read().await;
    let base = fresh_url();
    for bad in [
        "not a url".to_string(),
        base.replace("/t_", "/T_"),
        format!("{base}&replicaton=1"),
    ] {
        match CassandraStore::connect(&bad).await {
            Err(StoreError::Invalid(_)) => {}
            Err(e) => panic!("{bad}: expected invalid, got {e}"),
            Ok(_) => panic!("{bad} must be refused"),
        }
    }
    // Nothing listens on port 9 of loopback.
    match CassandraStore::connect("cassandra://127.0.0.1:9/tarn").await {
        Err(StoreError::Unavailable(_)) => {}
        Err(e) => panic!("expected unavailable, got {e}"),
        Ok(_) => panic!("connected to nothing"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_size_limit_is_split_and_fully_applied() {
    let _g = CLUSTER.read().await;
    let small = CassandraOptions {
        max_batch_bytes: tarn_store::MAX_VALUE_LEN + 3 * tarn_store::MAX_KEY_LEN,
        ..options()
    };
    let s = connect(&fresh_url(), small).await;
    let t = Table::new("big");
    let mut w = Batch::new();
    for i in 0..3u8 {
        w.put(Key::new(t, [i], b"v"), vec![i; 3 * 1024 * 1024], 1);
    }
    s.write(w).await.unwrap();
    let mut snap = s.snapshot().await.unwrap();
    for i in 0..3u8 {
        let row = snap.get(&Key::new(t, [i], b"v")).await.unwrap().unwrap();
        assert_eq!(row.value, vec![i; 3 * 1024 * 1024]);
    }
    let counters: std::collections::HashMap<_, _> = s.counters().into_iter().collect();
    assert_eq!(counters["cassandra_split_batches_total"], 1);
    // A guarded batch cannot be split: refused whole, nothing applied.
    let mut w = Batch::new();
    for i in 0..3u8 {
        w.put(Key::new(t, [9], [i]), vec![i; 3 * 1024 * 1024], 1);
    }
    w.guard(Key::new(t, [9], [0]), Expect::Absent);
    assert!(matches!(s.write(w).await, Err(StoreError::Invalid(_))));
    assert!(snap.get(&Key::new(t, [9], [0])).await.unwrap().is_none());
}

/// A feed entry that lands seconds after it was stamped (its write kept
/// retrying, say) is not passed over by a reader on another node that
/// follows the feed meanwhile, past a later entry: the writer's marks hold
/// every reader below its stamp until it lands. Without them the reader got
/// the later entry only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_entry_landing_late_is_read_late_not_passed_over() {
    use std::time::{Duration, Instant};
    let _g = CLUSTER.read().await;
    let url = fresh_url();
    let a = connect(&url, options()).await;
    let b = connect(&url, options()).await;
    let feed = Table::new("late_feed");
    let append = |value: &[u8]| {
        let mut w = Batch::new();
        w.append(feed, value.to_vec());
        w
    };
    // A is marking already (its first feed write starts its marks).
    a.write(append(b"first")).await.unwrap();
    let start = b.snapshot().await.unwrap().feed_end(feed).await.unwrap();
    let slow = {
        let (a, w) = (a.clone(), append(b"late"));
        tokio::spawn(async move { a.write_landing_late(w, Duration::from_secs(6)).await })
    };
    // Past the lag behind the late entry's stamp, so that without marks
    // the reader is free to pass it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.write(append(b"after")).await.unwrap();
    // B follows the feed, as a node's feed reader does, until both are in
    // or well after the late write returned.
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let mut cursor = start;
    let mut landed: Option<Instant> = None;
    while seen.len() < 2 && landed.is_none_or(|t| t.elapsed() < Duration::from_secs(5)) {
        let mut snap = b.snapshot().await.unwrap();
        for e in snap.read_feed(feed, Some(&cursor), 100).await.unwrap() {
            seen.push(e.value);
            cursor = e.cursor;
        }
        if landed.is_none() && slow.is_finished() {
            landed = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    slow.await.unwrap().unwrap();
    assert_eq!(seen, [b"late".to_vec(), b"after".to_vec()]);
}

/// A store that stops (its node shuts down) refuses changes from then,
/// waits for its writes in flight to land, and removes its feed mark, so
/// the other nodes' feeds need not wait out its hold (5 s); while a write
/// of its may still land (past that wait), it keeps its mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_store_lets_go_of_its_mark() {
    use std::time::Duration;
    let _g = CLUSTER.read().await;
    let url = fresh_url();
    let [a, b, c, d] = [
        connect(&url, options()).await,
        connect(&url, options()).await,
        connect(&url, options()).await,
        connect(&url, options()).await,
    ];
    let feed = Table::new("stop_feed");
    let append = |value: &[u8]| {
        let mut w = Batch::new();
        w.append(feed, value.to_vec());
        w
    };
    let marks = || async {
        let scan = Scan::partition(Table::new("zfeedmeta"), b"marks".to_vec(), 100);
        let mut snap = c.snapshot().await.unwrap();
        snap.read(&[], &[scan]).await.unwrap().scans[0].len()
    };
    for s in [&a, &b, &d] {
        s.write(append(b"first")).await.unwrap();
    }
    assert_eq!(marks().await, 3, "each store that wrote a change marks");
    a.stop().await;
    assert_eq!(marks().await, 2, "a's mark is gone");
    assert!(matches!(
        a.write(append(b"after")).await,
        Err(StoreError::Unavailable(_))
    ));
    // C never wrote a change; stopped, it writes none, nor a mark.
    c.stop().await;
    assert!(matches!(
        c.write(append(b"after")).await,
        Err(StoreError::Unavailable(_))
    ));
    // Five of a's marking intervals.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(marks().await, 2, "stopped stores mark no more");
    // B's write lands within the stop's wait, d's after it.
    let slow = |s: &CassandraStore, delay| {
        let (s, w) = (s.clone(), append(b"late"));
        tokio::spawn(async move { s.write_landing_late(w, delay).await })
    };
    let (b_slow, d_slow) = (
        slow(&b, Duration::from_secs(2)),
        slow(&d, Duration::from_secs(8)),
    );
    // Both stamped (at most 3,000 looks, a bound against a hang).
    let mut looks = 0;
    while !(b.writes_in_flight() && d.writes_in_flight()) {
        looks += 1;
        assert!(looks < 3_000, "the slow writes were never stamped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::join!(b.stop(), d.stop());
    b_slow.await.unwrap().unwrap();
    assert_eq!(
        marks().await,
        1,
        "b's mark is gone; d's write may still land"
    );
    d_slow.await.unwrap().unwrap();
}
