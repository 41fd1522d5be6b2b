//! How guarded writes learn their outcome: from the transaction's own
//! answer when there is one, from the intent when the answer is lost.

use std::collections::HashMap;

use tarn_store::{Batch, Expect, Key, SnapshotExt, Store, StoreError, Table};
use tarn_store_cassandra::CassandraStore;

use crate::{connect, options, pooled_url, CLUSTER};

const T: Table = Table::new("guards");
const U: Table = Table::new("elsewhere");

fn counter(s: &CassandraStore, name: &str) -> u64 {
    let all: HashMap<_, _> = s.counters().into_iter().collect();
    all[name]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failing_guard_is_named_from_the_transactions_answer() {
    let _g = CLUSTER.read().await;
    let s = connect(&pooled_url().await, options()).await;
    let mut w = Batch::new();
    w.put(Key::new(T, b"p", b"a"), b"A".to_vec(), 3)
        .put(Key::new(T, b"p", b"b"), b"B".to_vec(), 1);
    s.write(w).await.unwrap();
    // (guards, index of the first that fails)
    type Case = (Vec<(&'static [u8], Expect)>, usize);
    let cases: Vec<Case> = vec![
        (
            vec![(b"a", Expect::Version(3)), (b"b", Expect::Version(2))],
            1,
        ),
        (
            vec![(b"a", Expect::Version(2)), (b"b", Expect::Version(2))],
            0,
        ),
        (vec![(b"c", Expect::Absent), (b"a", Expect::Absent)], 1),
        (
            vec![(b"b", Expect::Version(1)), (b"c", Expect::Version(1))],
            1,
        ),
        (
            vec![
                (b"a", Expect::Version(3)),
                (b"c", Expect::Absent),
                (b"b", Expect::Absent),
            ],
            2,
        ),
    ];
    for (guards, want) in cases {
        let mut w = Batch::new();
        w.put(Key::new(T, b"p", b"a"), b"changed".to_vec(), 9).put(
            Key::new(U, b"q", b"x"),
            b"changed".to_vec(),
            9,
        );
        for (c, expect) in &guards {
            w.guard(Key::new(T, b"p", *c), *expect);
        }
        match s.write(w).await {
            Err(StoreError::GuardFailed { guard }) => assert_eq!(guard, want, "{guards:?}"),
            other => panic!("{guards:?}: expected guard {want} to fail, got {other:?}"),
        }
    }
    assert_eq!(
        counter(&s, "cassandra_guard_rereads_total"),
        0,
        "every failing guard was found in the transaction's answer"
    );
    // Two different expectations of one row cannot both hold: the first
    // that fails against the current row is named.
    let mut w = Batch::new();
    w.put(Key::new(T, b"p", b"a"), b"x".to_vec(), 4)
        .guard(Key::new(T, b"p", b"a"), Expect::Version(3))
        .guard(Key::new(T, b"p", b"a"), Expect::Absent);
    assert!(matches!(
        s.write(w).await,
        Err(StoreError::GuardFailed { guard: 1 })
    ));
    let mut snap = s.snapshot().await.unwrap();
    let a = snap.get(&Key::new(T, b"p", b"a")).await.unwrap().unwrap();
    assert_eq!((a.value.as_slice(), a.version), (&b"A"[..], 3));
    assert!(snap.get(&Key::new(U, b"q", b"x")).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_learnt_from_the_intent_never_guessed() {
    let _g = CLUSTER.read().await;
    let s = connect(&pooled_url().await, options()).await;
    // Applied, answer lost: the SERIAL read finds the intent, the write
    // completes and answers Ok.
    let mut w = Batch::new();
    w.put(Key::new(T, b"p", b"row"), b"one".to_vec(), 1)
        .put(Key::new(U, b"q", b"row"), b"one".to_vec(), 1)
        .guard(Key::new(T, b"p", b"row"), Expect::Absent);
    s.write_losing_the_answer(w).await.unwrap();
    let mut snap = s.snapshot().await.unwrap();
    assert_eq!(
        snap.get(&Key::new(U, b"q", b"row"))
            .await
            .unwrap()
            .unwrap()
            .value,
        b"one"
    );
    assert_eq!(counter(&s, "cassandra_unknown_resolved_applied_total"), 1);
    // Not applied (its guard failed), answer lost: the SERIAL read finds no
    // intent, and the answer is a retryable error, not a guess.
    let mut w = Batch::new();
    w.put(Key::new(T, b"p", b"row"), b"two".to_vec(), 2)
        .put(Key::new(U, b"q", b"row"), b"two".to_vec(), 2)
        .guard(Key::new(T, b"p", b"row"), Expect::Absent);
    match s.write_losing_the_answer(w).await {
        Err(e) if e.is_retryable() => {}
        other => panic!("expected a retryable error, got {other:?}"),
    }
    assert_eq!(
        counter(&s, "cassandra_unknown_resolved_not_applied_total"),
        1
    );
    assert_eq!(
        snap.get(&Key::new(U, b"q", b"row"))
            .await
            .unwrap()
            .unwrap()
            .value,
        b"one",
        "nothing of the failed write applied"
    );
    assert_eq!(s.pending_intents(10).await.unwrap(), 0);
}
