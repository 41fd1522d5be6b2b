//! The conformance suite: one set of checks, written once, that every backend
//! runs from its own tests through [`conformance_tests!`](crate::conformance_tests).
//!
//! Each check takes a fresh, empty store and panics with a message naming
//! what broke. Expected answers come from plain ordered maps, never from the
//! store under test.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use crate::{
    Batch, Consistency, Direction, Expect, Key, Scan, SnapshotExt, Store, StoreError, Table,
};

const T1: Table = Table::new("conf_a");
const T2: Table = Table::new("conf_b");

/// Generates one `#[tokio::test]` per check for a backend. `$make` is an
/// expression evaluating to a future of `(Arc<dyn Store>, guard)`; the guard
/// lives as long as the test (a temp directory, a database handle).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            clustering_byte_order, bounds_and_limits, point_reads, versions_and_overwrite,
            batch_across_tables_and_partitions, failed_guard_applies_nothing, guard_kinds,
            guards_on_two_partitions_refused, ops_in_order, concurrent_guarded_writers_one_winner,
            concurrent_counter_increments, large_values, many_partitions, many_reads_match_single,
            oversized_input_refused, snapshots_see_one_state, many_snapshots_at_once,
            read_bounds_refused, feed_in_order_from_any_cursor, feed_appends_are_atomic,
            feed_pollers_never_miss_concurrent_appends, feed_trims_the_oldest,
            scan_all_pulls_every_row_once);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let (store, _guard) = $make.await;
                $crate::conformance::$name(store).await;
            }
        )*
    };
}

fn key(t: Table, p: &[u8], c: &[u8]) -> Key {
    Key::new(t, p, c)
}

async fn put(s: &dyn Store, t: Table, p: &[u8], c: &[u8], v: &[u8], ver: u64) {
    let mut b = Batch::new();
    b.put(key(t, p, c), v.to_vec(), ver);
    s.write(b).await.expect("put");
}

/// A point read through a fresh snapshot.
async fn get(s: &dyn Store, k: Key) -> Option<crate::Row> {
    let mut snap = s.snapshot().await.expect("snapshot");
    snap.get(&k).await.expect("get")
}

/// A scan through a fresh snapshot.
async fn scan(s: &dyn Store, sc: Scan) -> Vec<crate::Row> {
    let mut snap = s.snapshot().await.expect("snapshot");
    snap.scan(&sc).await.expect("scan")
}

fn clusterings(rows: &[crate::Row]) -> Vec<Vec<u8>> {
    rows.iter().map(|r| r.clustering.clone()).collect()
}

/// The tricky keys: 0x00, 0xFF, prefixes of each other.
fn tricky_keys() -> Vec<Vec<u8>> {
    vec![
        vec![0x00],
        vec![0x00, 0x00],
        vec![0x00, 0x01],
        vec![0x01],
        vec![0x01, 0x00],
        vec![0x7f],
        vec![0x80],
        vec![0xfe, 0xff],
        vec![0xff],
        vec![0xff, 0x00],
        vec![0xff, 0xff],
        vec![0xff, 0xff, 0xff],
        b"a".to_vec(),
        b"ab".to_vec(),
        b"abc".to_vec(),
        b"b".to_vec(),
    ]
}

/// Clustering keys come back in plain byte order, both directions.
pub async fn clustering_byte_order(s: Arc<dyn Store>) {
    let mut keys = tricky_keys();
    // Insert in a scrambled order so no backend can pass by insertion order.
    keys.reverse();
    keys.swap(2, 9);
    for (i, k) in keys.iter().enumerate() {
        put(&*s, T1, b"p", k, &[i as u8], 1).await;
    }
    let mut want = tricky_keys();
    want.sort();
    let fwd = scan(&*s, Scan::partition(T1, b"p".to_vec(), 100)).await;
    assert_eq!(
        clusterings(&fwd),
        want,
        "forward scan must be in byte order"
    );
    let rev = scan(
        &*s,
        Scan::partition(T1, b"p".to_vec(), 100).direction(Direction::Reverse),
    )
    .await;
    want.reverse();
    assert_eq!(
        clusterings(&rev),
        want,
        "reverse scan must be in reverse byte order"
    );
}

/// Every combination of bound kinds, both directions, several limits, checked
/// against an ordered map.
pub async fn bounds_and_limits(s: Arc<dyn Store>) {
    let keys = tricky_keys();
    let mut model = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        put(&*s, T1, b"q", k, &[i as u8], i as u64).await;
        model.insert(k.clone(), i as u64);
    }
    let mut probes = tricky_keys();
    probes.push(vec![0x00, 0x00, 0x00]);
    probes.push(b"aa".to_vec());
    let bounds = |k: &Vec<u8>| {
        vec![
            Bound::Unbounded,
            Bound::Included(k.clone()),
            Bound::Excluded(k.clone()),
        ]
    };
    let mut checked = 0;
    for lo_key in probes.iter().step_by(2) {
        for hi_key in probes.iter().skip(1).step_by(2) {
            for lower in bounds(lo_key) {
                for upper in bounds(hi_key) {
                    for direction in [Direction::Forward, Direction::Reverse] {
                        for limit in [0usize, 1, 3, 100] {
                            let sc = Scan::partition(T1, b"q".to_vec(), limit)
                                .bounds(lower.clone(), upper.clone())
                                .direction(direction);
                            let mut want: Vec<Vec<u8>> =
                                model.keys().filter(|k| sc.contains(k)).cloned().collect();
                            if direction == Direction::Reverse {
                                want.reverse();
                            }
                            want.truncate(limit);
                            let got = scan(&*s, sc.clone()).await;
                            assert_eq!(clusterings(&got), want, "scan {sc:?}");
                            for r in &got {
                                assert_eq!(r.version, model[&r.clustering], "version of row");
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000);
}

/// Absent rows read as `None`; present rows with their value and version.
pub async fn point_reads(s: Arc<dyn Store>) {
    assert!(get(&*s, key(T1, b"p", b"x")).await.is_none());
    put(&*s, T1, b"p", b"x", b"hello", 7).await;
    let row = get(&*s, key(T1, b"p", b"x")).await.expect("row");
    assert_eq!(row.value, b"hello");
    assert_eq!(row.version, 7);
    assert_eq!(row.clustering, b"x");
    assert!(get(&*s, key(T1, b"p", b"\0")).await.is_none());
    assert!(get(&*s, key(T1, b"p\0", b"x")).await.is_none());
    assert!(
        get(&*s, key(T2, b"p", b"x")).await.is_none(),
        "tables are apart"
    );
    let mut b = Batch::new();
    b.delete(key(T1, b"p", b"x"))
        .delete(key(T1, b"p", b"never"));
    s.write(b).await.unwrap();
    assert!(get(&*s, key(T1, b"p", b"x")).await.is_none());
}

/// A put replaces value and version; an empty value is a value.
pub async fn versions_and_overwrite(s: Arc<dyn Store>) {
    put(&*s, T1, b"p", b"k", b"one", 1).await;
    put(&*s, T1, b"p", b"k", b"", 2).await;
    let row = get(&*s, key(T1, b"p", b"k")).await.unwrap();
    assert_eq!((row.value.as_slice(), row.version), (&b""[..], 2));
    put(&*s, T1, b"p", b"k", b"three", u64::MAX >> 1).await;
    let row = get(&*s, key(T1, b"p", b"k")).await.unwrap();
    assert_eq!(row.version, u64::MAX >> 1, "large versions survive");
}

/// One batch over two tables and many partitions applies entirely.
pub async fn batch_across_tables_and_partitions(s: Arc<dyn Store>) {
    let mut b = Batch::new();
    for i in 0..20u8 {
        let t = if i % 2 == 0 { T1 } else { T2 };
        b.put(key(t, &[i], &[i, i]), vec![i; 10], 1);
    }
    b.guard(key(T1, b"g", b"g"), Expect::Absent);
    s.write(b).await.unwrap();
    for i in 0..20u8 {
        let t = if i % 2 == 0 { T1 } else { T2 };
        let row = get(&*s, key(t, &[i], &[i, i])).await;
        assert_eq!(row.map(|r| r.value), Some(vec![i; 10]));
    }
}

/// A failed guard applies nothing, names the failing guard, and leaves every
/// row as it was.
pub async fn failed_guard_applies_nothing(s: Arc<dyn Store>) {
    put(&*s, T1, b"g", b"a", b"A", 3).await;
    put(&*s, T2, b"x", b"keep", b"old", 1).await;
    let mut b = Batch::new();
    b.put(key(T1, b"g", b"a"), b"A2".to_vec(), 4)
        .put(key(T2, b"x", b"keep"), b"new".to_vec(), 2)
        .put(key(T2, b"y", b"fresh"), b"new".to_vec(), 1)
        .delete(key(T1, b"g", b"a"))
        .guard(key(T1, b"g", b"a"), Expect::Version(3))
        .guard(key(T1, b"g", b"b"), Expect::Version(1));
    match s.write(b).await {
        Err(StoreError::GuardFailed { guard }) => assert_eq!(guard, 1),
        other => panic!("expected guard 1 to fail, got {other:?}"),
    }
    let a = get(&*s, key(T1, b"g", b"a")).await.unwrap();
    assert_eq!((a.value.as_slice(), a.version), (&b"A"[..], 3));
    assert_eq!(
        get(&*s, key(T2, b"x", b"keep")).await.unwrap().value,
        b"old"
    );
    assert!(get(&*s, key(T2, b"y", b"fresh")).await.is_none());
}

/// `Absent` and `Version` guards hold exactly when they should.
pub async fn guard_kinds(s: Arc<dyn Store>) {
    let k = key(T1, b"p", b"row");
    let try_write = |expect: Expect, ver: u64| {
        let s = s.clone();
        let k = k.clone();
        async move {
            let mut b = Batch::new();
            b.put(k.clone(), vec![ver as u8], ver).guard(k, expect);
            s.write(b).await
        }
    };
    assert!(matches!(
        try_write(Expect::Version(1), 1).await,
        Err(StoreError::GuardFailed { guard: 0 })
    ));
    try_write(Expect::Absent, 1).await.expect("absent holds");
    assert!(matches!(
        try_write(Expect::Absent, 2).await,
        Err(StoreError::GuardFailed { guard: 0 })
    ));
    assert!(matches!(
        try_write(Expect::Version(2), 2).await,
        Err(StoreError::GuardFailed { guard: 0 })
    ));
    try_write(Expect::Version(1), 2)
        .await
        .expect("version holds");
    assert_eq!(get(&*s, k.clone()).await.unwrap().version, 2);
    // A guard on a deleted row sees it absent.
    let mut b = Batch::new();
    b.delete(k.clone()).guard(k.clone(), Expect::Version(2));
    s.write(b).await.unwrap();
    try_write(Expect::Absent, 1)
        .await
        .expect("absent after delete");
}

/// Guards on two partitions are refused before anything is applied.
pub async fn guards_on_two_partitions_refused(s: Arc<dyn Store>) {
    let mut b = Batch::new();
    b.put(key(T1, b"p", b"x"), b"v".to_vec(), 1)
        .guard(key(T1, b"p", b"x"), Expect::Absent)
        .guard(key(T1, b"other", b"x"), Expect::Absent);
    assert!(matches!(s.write(b).await, Err(StoreError::Invalid(_))));
    let mut b = Batch::new();
    b.put(key(T1, b"p", b"x"), b"v".to_vec(), 1)
        .guard(key(T1, b"p", b"x"), Expect::Absent)
        .guard(key(T2, b"p", b"x"), Expect::Absent);
    assert!(matches!(s.write(b).await, Err(StoreError::Invalid(_))));
    assert!(get(&*s, key(T1, b"p", b"x")).await.is_none());
}

/// Ops apply in order: the last op on a row wins.
pub async fn ops_in_order(s: Arc<dyn Store>) {
    let mut b = Batch::new();
    b.put(key(T1, b"p", b"a"), b"1".to_vec(), 1)
        .delete(key(T1, b"p", b"a"))
        .delete(key(T1, b"p", b"b"))
        .put(key(T1, b"p", b"b"), b"2".to_vec(), 2)
        .put(key(T1, b"p", b"c"), b"3".to_vec(), 1)
        .put(key(T1, b"p", b"c"), b"4".to_vec(), 5);
    s.write(b).await.unwrap();
    assert!(get(&*s, key(T1, b"p", b"a")).await.is_none());
    assert_eq!(get(&*s, key(T1, b"p", b"b")).await.unwrap().version, 2);
    let c = get(&*s, key(T1, b"p", b"c")).await.unwrap();
    assert_eq!((c.value.as_slice(), c.version), (&b"4"[..], 5));
}

/// N writers all guarded on the same version of one row: exactly one wins.
pub async fn concurrent_guarded_writers_one_winner(s: Arc<dyn Store>) {
    put(&*s, T1, b"hot", b"row", b"start", 1).await;
    for round in 0..5u64 {
        let version = round + 1;
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let mut tasks = Vec::new();
        for w in 0..16u8 {
            let s = s.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let mut b = Batch::new();
                b.put(key(T1, b"hot", b"row"), vec![w], version + 1)
                    .put(key(T2, &[w], b"side"), vec![w], 1)
                    .guard(key(T1, b"hot", b"row"), Expect::Version(version));
                barrier.wait().await;
                s.write(b).await
            }));
        }
        let mut winners = Vec::new();
        for (w, t) in tasks.into_iter().enumerate() {
            match t.await.unwrap() {
                Ok(()) => winners.push(w as u8),
                Err(StoreError::GuardFailed { guard: 0 }) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one winner");
        let row = get(&*s, key(T1, b"hot", b"row")).await.unwrap();
        assert_eq!(
            (row.value.clone(), row.version),
            (vec![winners[0]], version + 1)
        );
        for w in 0..16u8 {
            let side = get(&*s, key(T2, &[w], b"side")).await;
            let won_before = side.is_some();
            if w == winners[0] {
                assert!(won_before, "the winner's other rows are applied");
            }
        }
        // Clear the side rows so the next round can tell who wrote them.
        let mut b = Batch::new();
        for w in 0..16u8 {
            b.delete(key(T2, &[w], b"side"));
        }
        s.write(b).await.unwrap();
    }
}

/// Read-modify-write with guards and retries loses no increment.
pub async fn concurrent_counter_increments(s: Arc<dyn Store>) {
    put(&*s, T1, b"ctr", b"n", &0u64.to_be_bytes(), 1).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                loop {
                    let row = get(&*s, key(T1, b"ctr", b"n")).await.unwrap();
                    let n = u64::from_be_bytes(row.value.as_slice().try_into().unwrap());
                    let mut b = Batch::new();
                    b.put(
                        key(T1, b"ctr", b"n"),
                        (n + 1).to_be_bytes().to_vec(),
                        row.version + 1,
                    )
                    .guard(key(T1, b"ctr", b"n"), Expect::Version(row.version));
                    match s.write(b).await {
                        Ok(()) => break,
                        Err(StoreError::GuardFailed { .. }) => continue,
                        Err(e) if e.is_retryable() => continue,
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let row = get(&*s, key(T1, b"ctr", b"n")).await.unwrap();
    assert_eq!(
        u64::from_be_bytes(row.value.as_slice().try_into().unwrap()),
        160
    );
    assert_eq!(row.version, 161);
}

/// Values up to 1 MiB round-trip byte for byte, in points and scans.
pub async fn large_values(s: Arc<dyn Store>) {
    let mib: Vec<u8> = (0..1024 * 1024)
        .map(|i: u32| (i * 7 + i / 251) as u8)
        .collect();
    let mut b = Batch::new();
    for i in 0..4u8 {
        let mut v = mib.clone();
        v[0] = i;
        b.put(key(T1, b"big", &[i]), v, 1);
    }
    s.write(b).await.unwrap();
    let row = get(&*s, key(T1, b"big", &[2])).await.unwrap();
    assert_eq!(row.value.len(), mib.len());
    assert_eq!(row.value[0], 2);
    assert_eq!(row.value[1..], mib[1..]);
    let rows = scan(&*s, Scan::partition(T1, b"big".to_vec(), 10)).await;
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r.value[1..] == mib[1..]));
}

/// Many partitions stay apart, including partitions that are prefixes of
/// each other.
pub async fn many_partitions(s: Arc<dyn Store>) {
    // Minimal big-endian bytes: partition 1 is a prefix of partition 256.
    let part = |i: u32| -> Vec<u8> {
        let bytes = i.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count().min(3);
        let mut p = b"part".to_vec();
        p.extend_from_slice(&bytes[skip..]);
        p
    };
    let mut b = Batch::new();
    for i in 0..1000u32 {
        for j in 0..3u8 {
            b.put(key(T1, &part(i), &[j]), i.to_be_bytes().to_vec(), 1);
        }
        if b.ops.len() >= 300 {
            s.write(std::mem::take(&mut b)).await.unwrap();
        }
    }
    s.write(b).await.unwrap();
    for i in (0..1000u32).step_by(7) {
        let rows = scan(&*s, Scan::partition(T1, part(i), 10)).await;
        assert_eq!(rows.len(), 3, "partition {i}");
        assert!(rows.iter().all(|r| r.value == i.to_be_bytes()));
    }
    assert!(scan(&*s, Scan::partition(T1, b"part".to_vec(), 10))
        .await
        .is_empty());
}

/// One call with several point reads and scans answers exactly like single
/// calls.
pub async fn many_reads_match_single(s: Arc<dyn Store>) {
    for p in 0..5u8 {
        for c in 0..10u8 {
            put(&*s, T2, &[p], &[c], &[p, c], c as u64).await;
        }
    }
    let keys: Vec<Key> = (0..12u8).map(|i| key(T2, &[i % 6], &[i])).collect();
    let scans: Vec<Scan> = (0..7u8)
        .map(|p| {
            Scan::partition(T2, vec![p], 4)
                .bounds(Bound::Excluded(vec![2]), Bound::Unbounded)
                .direction(if p % 2 == 0 {
                    Direction::Forward
                } else {
                    Direction::Reverse
                })
        })
        .collect();
    let mut snap = s.snapshot().await.unwrap();
    let both = snap.read(&keys, &scans).await.unwrap();
    assert_eq!(both.rows.len(), keys.len());
    assert_eq!(both.scans.len(), scans.len());
    for (k, got) in keys.into_iter().zip(both.rows) {
        assert_eq!(got, get(&*s, k).await);
    }
    for (sc, got) in scans.into_iter().zip(both.scans) {
        assert_eq!(got, scan(&*s, sc).await);
    }
    let empty = snap.read(&[], &[]).await.unwrap();
    assert!(empty.rows.is_empty() && empty.scans.is_empty());
}

/// A snapshot of a backend that promises [`Consistency::Snapshot`] keeps
/// reading the state of its first read while writes land; every backend's
/// new snapshot sees every acknowledged write.
pub async fn snapshots_see_one_state(s: Arc<dyn Store>) {
    put(&*s, T1, b"snap", b"a", b"1", 1).await;
    put(&*s, T1, b"snap", b"b", b"1", 1).await;
    let mut old = s.snapshot().await.unwrap();
    assert_eq!(
        old.get(&key(T1, b"snap", b"a"))
            .await
            .unwrap()
            .unwrap()
            .value,
        b"1"
    );
    // Both rows change in one batch, and a third appears.
    let mut b = Batch::new();
    b.put(key(T1, b"snap", b"a"), b"2".to_vec(), 2)
        .put(key(T1, b"snap", b"b"), b"2".to_vec(), 2)
        .put(key(T1, b"snap", b"c"), b"2".to_vec(), 1);
    s.write(b).await.unwrap();
    let new = scan(&*s, Scan::partition(T1, b"snap".to_vec(), 10)).await;
    assert_eq!(new.len(), 3, "a new snapshot sees the acknowledged write");
    assert!(new.iter().all(|r| r.value == b"2"));
    let later = old
        .read(
            &[key(T1, b"snap", b"b")],
            &[Scan::partition(T1, b"snap".to_vec(), 10)],
        )
        .await
        .unwrap();
    let b_row = later.rows[0].as_ref().unwrap();
    match s.consistency() {
        Consistency::Snapshot => {
            assert_eq!(b_row.value, b"1", "a snapshot reads one state");
            assert_eq!(
                clusterings(&later.scans[0]),
                vec![b"a".to_vec(), b"b".to_vec()]
            );
        }
        Consistency::PerRead => {
            // Each read sees every write acknowledged before it started,
            // and never part of a batch.
            assert_eq!(b_row.value, b"2");
            assert!(later.scans[0].iter().all(|r| r.value == b"2"));
        }
    }
    drop(old);
}

/// Many snapshots open at once (more than any pool) all answer or are
/// refused as unavailable — never hang, never mix up answers.
pub async fn many_snapshots_at_once(s: Arc<dyn Store>) {
    for i in 0..50u8 {
        put(&*s, T2, b"many", &[i], &[i], 1).await;
    }
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut snap = match s.snapshot().await {
                Ok(snap) => snap,
                Err(StoreError::Unavailable(_)) => return false,
                Err(e) => panic!("snapshot: {e}"),
            };
            let k = (i % 50) as u8;
            tokio::task::yield_now().await;
            let row = snap.get(&key(T2, b"many", &[k])).await.unwrap().unwrap();
            assert_eq!(row.value, vec![k]);
            true
        }));
    }
    let mut answered = 0;
    for t in tasks {
        answered += t.await.unwrap() as usize;
    }
    assert!(answered > 0);
}

/// Reads over the per-call bounds are refused as invalid, as are empty keys.
pub async fn read_bounds_refused(s: Arc<dyn Store>) {
    let mut snap = s.snapshot().await.unwrap();
    let keys: Vec<Key> = (0..=crate::MAX_READ_KEYS as u32)
        .map(|i| key(T1, b"p", &i.to_be_bytes()))
        .collect();
    assert!(matches!(
        snap.read(&keys, &[]).await,
        Err(StoreError::Invalid(_))
    ));
    let scans = vec![
        Scan::partition(T1, b"p".to_vec(), crate::MAX_READ_ROWS),
        Scan::partition(T1, b"q".to_vec(), 1),
    ];
    assert!(matches!(
        snap.read(&[], &scans).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        snap.read(&[key(T1, b"", b"x")], &[]).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        snap.read(&[key(T1, b"p", b"")], &[]).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        snap.read(&[], &[Scan::partition(T1, Vec::new(), 1)]).await,
        Err(StoreError::Invalid(_))
    ));
    // The snapshot still works after refusals.
    assert!(snap.get(&key(T1, b"p", b"x")).await.unwrap().is_none());
}

/// Oversized keys and values are refused as invalid, and nothing applies.
pub async fn oversized_input_refused(s: Arc<dyn Store>) {
    let mut b = Batch::new();
    b.put(key(T1, b"ok", b"a"), b"v".to_vec(), 1).put(
        key(T1, &vec![1; crate::MAX_KEY_LEN + 1], b"x"),
        b"v".to_vec(),
        1,
    );
    assert!(matches!(s.write(b).await, Err(StoreError::Invalid(_))));
    let mut b = Batch::new();
    b.put(key(T1, b"ok", b"a"), b"v".to_vec(), 1).put(
        key(T1, b"ok", b"b"),
        vec![0; crate::MAX_VALUE_LEN + 1],
        1,
    );
    assert!(matches!(s.write(b).await, Err(StoreError::Invalid(_))));
    for empty in [key(T1, b"", b"x"), key(T1, b"ok", b"")] {
        let mut b = Batch::new();
        b.put(key(T1, b"ok", b"a"), b"v".to_vec(), 1)
            .put(empty, b"v".to_vec(), 1);
        assert!(matches!(s.write(b).await, Err(StoreError::Invalid(_))));
    }
    assert!(get(&*s, key(T1, b"ok", b"a")).await.is_none());
}

const F1: Table = Table::new("conf_feed_a");
const F2: Table = Table::new("conf_feed_b");

async fn append(s: &dyn Store, feed: Table, value: &[u8]) {
    let mut b = Batch::new();
    b.append(feed, value.to_vec());
    s.write(b).await.expect("append");
}

/// Waits until `feed` is readable through its end as of now (at once on
/// a backend whose feed does not lag), at most half a minute.
async fn settle(s: &dyn Store, feed: Table) {
    let mut snap = s.snapshot().await.expect("snapshot");
    let end = snap.feed_end(feed).await.expect("feed_end");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut snap = s.snapshot().await.expect("snapshot");
        if snap.feed_readable(feed).await.expect("feed_readable") >= end {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the feed is not readable through its end after 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn read_feed(
    s: &dyn Store,
    feed: Table,
    after: Option<&[u8]>,
    limit: usize,
) -> Vec<crate::FeedEntry> {
    let mut snap = s.snapshot().await.expect("snapshot");
    snap.read_feed(feed, after, limit).await.expect("read_feed")
}

/// Entries come back in the order their writes committed, from any cursor,
/// at most `limit` at a time; feeds are apart; the end cursor comes after
/// every entry.
pub async fn feed_in_order_from_any_cursor(s: Arc<dyn Store>) {
    let mut snap = s.snapshot().await.unwrap();
    let start = snap.feed_end(F1).await.unwrap();
    drop(snap);
    assert!(read_feed(&*s, F1, Some(&start), 10).await.is_empty());
    for i in 0..30u8 {
        append(&*s, F1, &[i]).await;
        if i % 3 == 0 {
            append(&*s, F2, &[100 + i]).await;
        }
    }
    settle(&*s, F1).await;
    settle(&*s, F2).await;
    let all = read_feed(&*s, F1, Some(&start), 100).await;
    assert_eq!(
        all.iter().map(|e| e.value[0]).collect::<Vec<_>>(),
        (0..30).collect::<Vec<_>>()
    );
    assert!(
        all.windows(2).all(|w| w[0].cursor < w[1].cursor),
        "cursors ascend"
    );
    assert!(all
        .iter()
        .all(|e| !e.cursor.is_empty() && e.cursor.as_slice() > start.as_slice()));
    let page = read_feed(&*s, F1, Some(&all[9].cursor), 5).await;
    assert_eq!(
        page.iter().map(|e| e.value[0]).collect::<Vec<_>>(),
        vec![10, 11, 12, 13, 14]
    );
    let from_start = read_feed(&*s, F1, None, 1000).await;
    assert!(from_start.len() >= 30);
    assert_eq!(from_start[from_start.len() - 30..].to_vec(), all);
    let other = read_feed(&*s, F2, None, 100).await;
    assert_eq!(other.len(), 10, "feeds are apart");
    let mut snap = s.snapshot().await.unwrap();
    let end = snap.feed_end(F1).await.unwrap();
    assert!(end >= all[29].cursor);
    assert!(snap.read_feed(F1, Some(&end), 10).await.unwrap().is_empty());
    // Settled, the feed is readable through every entry; a later entry
    // comes after what was readable.
    let readable = snap.feed_readable(F1).await.unwrap();
    assert!(readable >= all[29].cursor);
    drop(snap);
    append(&*s, F1, &[99]).await;
    settle(&*s, F1).await;
    let after_end = read_feed(&*s, F1, Some(&end), 10).await;
    assert_eq!(after_end.len(), 1);
    assert_eq!(after_end[0].value, vec![99]);
    assert!(after_end[0].cursor > readable);
}

/// A batch's entries land with its rows, in batch order, or not at all.
pub async fn feed_appends_are_atomic(s: Arc<dyn Store>) {
    let mut snap = s.snapshot().await.unwrap();
    let start = snap.feed_end(F1).await.unwrap();
    drop(snap);
    let mut b = Batch::new();
    b.put(key(T1, b"fa", b"k"), b"v".to_vec(), 1)
        .append(F1, b"one".to_vec())
        .append(F1, b"two".to_vec())
        .guard(key(T1, b"fa", b"k"), Expect::Version(7));
    assert!(matches!(
        s.write(b).await,
        Err(StoreError::GuardFailed { guard: 0 })
    ));
    assert!(
        read_feed(&*s, F1, Some(&start), 10).await.is_empty(),
        "a failed guard appends nothing"
    );
    let mut b = Batch::new();
    b.put(key(T1, b"fa", b"k"), b"v".to_vec(), 1)
        .append(F1, b"one".to_vec())
        .append(F1, b"two".to_vec())
        .guard(key(T1, b"fa", b"k"), Expect::Absent);
    s.write(b).await.unwrap();
    settle(&*s, F1).await;
    let got = read_feed(&*s, F1, Some(&start), 10).await;
    assert_eq!(
        got.iter().map(|e| e.value.clone()).collect::<Vec<_>>(),
        vec![b"one".to_vec(), b"two".to_vec()]
    );
    if s.consistency() == Consistency::Snapshot {
        // A snapshot reads the feed as of its first read.
        let mut old = s.snapshot().await.unwrap();
        let seen = old.read_feed(F1, Some(&start), 10).await.unwrap();
        append(&*s, F1, b"three").await;
        assert_eq!(old.read_feed(F1, Some(&start), 10).await.unwrap(), seen);
    }
}

/// Writers append concurrently while a poller reads on from its last
/// cursor: the poller sees every acknowledged entry exactly once.
pub async fn feed_pollers_never_miss_concurrent_appends(s: Arc<dyn Store>) {
    let mut snap = s.snapshot().await.unwrap();
    let start = snap.feed_end(F2).await.unwrap();
    drop(snap);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (s, done) = (s.clone(), done.clone());
        tokio::spawn(async move {
            let mut cursor = start;
            let mut seen = Vec::new();
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                loop {
                    let page = read_feed(&*s, F2, Some(&cursor), 7).await;
                    if page.is_empty() {
                        break;
                    }
                    for e in page {
                        assert!(e.cursor > cursor, "cursors move forward");
                        cursor = e.cursor;
                        seen.push(u32::from_be_bytes(e.value[..4].try_into().unwrap()));
                    }
                }
                if finished {
                    return seen;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut writers = Vec::new();
    for w in 0..8u32 {
        let s = s.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..25u32 {
                let mut b = Batch::new();
                b.put(key(T2, &w.to_be_bytes(), &i.to_be_bytes()), vec![1], 1)
                    .append(F2, (w * 1000 + i).to_be_bytes().to_vec());
                s.write(b).await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    settle(&*s, F2).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut seen = poller.await.unwrap();
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "no entry twice");
    assert_eq!(n, 200, "every acknowledged entry seen");
}

/// Trimming removes the oldest entries up to a cursor, in bounded steps;
/// a feed trimmed empty keeps its end after what it held.
pub async fn feed_trims_the_oldest(s: Arc<dyn Store>) {
    let f = Table::new("conf_feed_trim");
    for i in 0..10u8 {
        append(&*s, f, &[i]).await;
    }
    settle(&*s, f).await;
    let all = read_feed(&*s, f, None, 100).await;
    assert_eq!(all.len(), 10);
    assert_eq!(s.trim_feed(f, &all[5].cursor, 4).await.unwrap(), 4);
    assert_eq!(s.trim_feed(f, &all[5].cursor, 4).await.unwrap(), 2);
    assert_eq!(s.trim_feed(f, &all[5].cursor, 4).await.unwrap(), 0);
    let left = read_feed(&*s, f, None, 100).await;
    assert_eq!(
        left.iter().map(|e| e.value[0]).collect::<Vec<_>>(),
        vec![6, 7, 8, 9]
    );
    // Trimmed empty, the feed's end is still after every entry it had: a
    // cursor taken there is not older than what was trimmed, and reads on
    // to the next entry alone.
    assert_eq!(s.trim_feed(f, &all[9].cursor, 100).await.unwrap(), 4);
    assert!(read_feed(&*s, f, None, 100).await.is_empty());
    let end = s.snapshot().await.unwrap().feed_end(f).await.unwrap();
    assert!(
        end >= all[9].cursor,
        "the end went back to before the trimmed"
    );
    append(&*s, f, &[10]).await;
    settle(&*s, f).await;
    let after = read_feed(&*s, f, Some(&end), 100).await;
    assert_eq!(
        after.iter().map(|e| e.value[0]).collect::<Vec<_>>(),
        vec![10]
    );
}

/// Every row of every table comes back from `scan_all`, once, in bounded
/// pages resumed from their cursors.
pub async fn scan_all_pulls_every_row_once(s: Arc<dyn Store>) {
    let mut want = BTreeMap::new();
    let mut b = Batch::new();
    for t in [T1, T2] {
        for p in 0..13u8 {
            for c in 0..7u8 {
                let k = key(t, &[b'p', p], &[c, 0xFF]);
                b.put(k.clone(), vec![p, c], u64::from(c) + 1);
                want.insert(k, (vec![p, c], u64::from(c) + 1));
            }
        }
    }
    b.append(F1, b"not a row".to_vec());
    s.write(b).await.unwrap();
    let mut snap = s.snapshot().await.unwrap();
    let mut got = BTreeMap::new();
    let mut cursor: Option<Vec<u8>> = None;
    let mut pages = 0;
    loop {
        let (rows, next) = snap.scan_all(cursor.as_deref(), 10).await.unwrap();
        assert!(rows.len() <= 10);
        for (k, r) in rows {
            assert_eq!(k.clustering, r.clustering);
            assert!(got.insert(k, (r.value, r.version)).is_none(), "a row twice");
        }
        pages += 1;
        match next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert!(pages >= 18);
    // Rows of other tests' tables may be there too; ours are all there.
    for (k, v) in &want {
        assert_eq!(got.get(k), Some(v), "{k:?}");
    }
}

/// A memory store that lets the first write touching a table through and
/// holds back every later one until the process ends: for tests that need
/// background work to stay unfinished (an index that stays `building`).
pub struct HoldWrites {
    inner: crate::memory::MemoryStore,
    table: &'static str,
    passed: std::sync::atomic::AtomicBool,
}

impl HoldWrites {
    /// Holds every write touching `table` after the first.
    pub fn after_first(table: &'static str) -> HoldWrites {
        HoldWrites {
            inner: crate::memory::MemoryStore::new(),
            table,
            passed: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl Store for HoldWrites {
    async fn snapshot(&self) -> crate::StoreResult<Box<dyn crate::Snapshot>> {
        self.inner.snapshot().await
    }

    async fn write(&self, batch: Batch) -> crate::StoreResult<()> {
        let touches = batch
            .ops
            .iter()
            .any(|op| op.key().table.name() == self.table);
        if touches && self.passed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.write(batch).await
    }

    fn consistency(&self) -> Consistency {
        self.inner.consistency()
    }

    fn feed_lag(&self) -> std::time::Duration {
        self.inner.feed_lag()
    }
    fn connections(&self) -> Option<usize> {
        self.inner.connections()
    }

    async fn trim_feed(
        &self,
        feed: Table,
        through: &[u8],
        limit: usize,
    ) -> crate::StoreResult<usize> {
        self.inner.trim_feed(feed, through, limit).await
    }

    async fn stop(&self) {
        self.inner.stop().await
    }
}
