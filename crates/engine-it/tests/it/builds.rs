//! Index builds racing writers: whatever writes land while an index is
//! declared, built and dropped, a ready index lists exactly what a brute
//! force over the items says.
//!
//! Regression for: builds relied on a wall-clock lease checked before a
//! write was queued, so a slow commit could land an item without its index
//! rows while the index was marked ready.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tarn_engine::{
    Caller, Engine, EngineError, Grant, ListQuery, Order, Principal, Role, SortField,
};

use crate::common::{self, admin, props, sign_up};

const READERS: [&str; 3] = ["ann", "ben", "cat"];

fn by_rank(order: Order) -> Vec<SortField> {
    vec![SortField {
        field: "rank".into(),
        order,
    }]
}

/// Every page of `kind` sorted by rank through the index, as ids.
async fn listed(
    e: &Engine,
    who: &Caller,
    kind: &str,
    order: Order,
) -> Result<Vec<String>, EngineError> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = e
            .list_items(
                who,
                &ListQuery {
                    kind: Some(kind.into()),
                    sort: by_rank(order),
                    limit: 7,
                    cursor,
                    ..ListQuery::default()
                },
            )
            .await?;
        out.extend(page.items.into_iter().map(|v| v.item.id));
        match page.next {
            Some(n) => cursor = Some(n),
            None => return Ok(out),
        }
    }
}

/// What the index must list: every live item `who` may read, ordered by
/// rank (missing last), ties by id.
async fn expected(e: &Engine, who: &Caller, ids: &[String], order: Order) -> Vec<String> {
    let mut rows: Vec<(Option<i64>, String)> = Vec::new();
    for id in ids {
        if let Ok(v) = e.get_item(who, id, None).await {
            rows.push((
                v.item.properties.map().get("rank").and_then(Value::as_i64),
                id.clone(),
            ));
        }
    }
    rows.sort_by(|a, b| {
        let by = match (a.0, b.0) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        by.then(a.1.cmp(&b.1))
    });
    if order == Order::Desc {
        rows.reverse();
    }
    rows.into_iter().map(|(_, id)| id).collect()
}

fn grants(seed: u64) -> Vec<Grant> {
    let mut g = Vec::new();
    for (i, r) in READERS.iter().enumerate() {
        if (seed >> i) & 1 == 1 {
            g.push(Grant {
                principal: Principal::User(r.to_string()),
                role: Role::Viewer,
            });
        }
    }
    if seed.is_multiple_of(7) {
        g.push(Grant {
            principal: Principal::Everyone,
            role: Role::Viewer,
        });
    }
    g
}

fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

async fn race(e: Engine, seed: u64) {
    let owner = sign_up(&e, "owner").await;
    for r in READERS {
        sign_up(&e, r).await;
    }
    let mut ids = Vec::new();
    let mut s = seed | 1;
    for i in 0..150u64 {
        let rank = (next(&mut s) % 50) as i64;
        let p = if i % 9 == 0 {
            json!({})
        } else {
            json!({ "rank": rank })
        };
        let v = e
            .create_item(&owner, "doc", props(p), grants(next(&mut s)))
            .await
            .unwrap();
        ids.push(v.item.id);
    }
    let ids = Arc::new(tokio::sync::Mutex::new(ids));
    let stop = Arc::new(AtomicBool::new(false));
    // Writers: creates, edits (moving sort keys), re-shares and deletes,
    // until the index is ready and a little after.
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let (e, ids, stop, owner) = (e.clone(), ids.clone(), stop.clone(), owner.clone());
        writers.push(tokio::spawn(async move {
            let mut s = seed.wrapping_mul(31).wrapping_add(w) | 1;
            let mut after_stop = 0;
            while after_stop < 20 {
                if stop.load(Ordering::Relaxed) {
                    after_stop += 1;
                }
                let pick = {
                    let ids = ids.lock().await;
                    ids[(next(&mut s) as usize) % ids.len()].clone()
                };
                let r = match next(&mut s) % 6 {
                    0 | 1 => {
                        let p = json!({ "rank": (next(&mut s) % 50) as i64 });
                        e.create_item(&owner, "doc", props(p), grants(next(&mut s)))
                            .await
                            .map(|v| Some(v.item.id))
                    }
                    2 | 3 => e
                        .patch_item(
                            &owner,
                            &pick,
                            None,
                            &json!({ "rank": (next(&mut s) % 50) as i64 }),
                            None,
                        )
                        .await
                        .map(|_| None),
                    4 => {
                        let mut acl = grants(next(&mut s));
                        acl.push(Grant {
                            principal: Principal::User("owner".into()),
                            role: Role::Manager,
                        });
                        e.set_acl(&owner, &pick, None, acl, None)
                            .await
                            .map(|_| None)
                    }
                    _ => e.delete_item(&owner, &pick, None, None).await.map(|_| None),
                };
                match r {
                    Ok(Some(id)) => ids.lock().await.push(id),
                    Ok(None) | Err(EngineError::NotFound(_)) => {}
                    Err(other) => panic!("writer: {other:?}"),
                }
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    e.declare_index(&admin(), "doc-by-rank", "doc", vec![], by_rank(Order::Asc))
        .await
        .unwrap();
    common::wait_ready(&e, "doc-by-rank").await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let ids = ids.lock().await.clone();
    for r in READERS
        .iter()
        .map(|r| common::user(r))
        .chain([Caller::Anonymous])
    {
        for order in [Order::Asc, Order::Desc] {
            let want = expected(&e, &r, &ids, order).await;
            let got = listed(&e, &r, "doc", order).await.unwrap();
            assert_eq!(got, want, "seed {seed}, {r:?}, {order:?}");
        }
    }
}

/// A store whose writes land a random while after they are asked for:
/// slow commits, so that writes computed before a declaration commit
/// after the build has passed them.
struct SlowCommits<S> {
    inner: S,
    seed: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl<S: tarn_store::Store> tarn_store::Store for SlowCommits<S> {
    async fn snapshot(&self) -> tarn_store::StoreResult<Box<dyn tarn_store::Snapshot>> {
        self.inner.snapshot().await
    }

    async fn write(&self, batch: tarn_store::Batch) -> tarn_store::StoreResult<()> {
        let mut s = self.seed.fetch_add(0x9e37_79b9, Ordering::Relaxed) | 1;
        // Mostly quick; one write in ten lands tens of milliseconds late.
        let r = next(&mut s);
        let micros = if r.is_multiple_of(10) {
            20_000 + r % 60_000
        } else {
            r % 1000
        };
        tokio::time::sleep(std::time::Duration::from_micros(micros)).await;
        self.inner.write(batch).await
    }

    fn consistency(&self) -> tarn_store::Consistency {
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
        feed: tarn_store::Table,
        through: &[u8],
        limit: usize,
    ) -> tarn_store::StoreResult<usize> {
        self.inner.trim_feed(feed, through, limit).await
    }
}

fn slow<S: tarn_store::Store>(inner: S, seed: u64) -> Engine {
    common::engine(Arc::new(SlowCommits {
        inner,
        seed: seed.into(),
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn builds_racing_writers_on_memory() {
    for seed in [1, 2, 3] {
        race(common::memory(), seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn builds_racing_slow_commits() {
    for seed in 7..13 {
        race(slow(tarn_store::memory::MemoryStore::new(), seed), seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn builds_racing_writers_on_sqlite() {
    for seed in [4, 5] {
        let (e, _dir) = common::sqlite();
        race(e, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn builds_racing_writers_on_postgres() {
    race(common::postgres().await, 6).await;
}

/// Regression: a build kept up to 128 item refreshes in flight but stopped
/// polling them while it read its next batch; refreshes that held pooled
/// connections then waited for that read, which waited for a connection:
/// every writer and the build hung (PostgreSQL, 16 connections). With two
/// connections, a build of a few hundred items must still finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_wider_than_the_pool_finishes() {
    let store = common::postgres_store_with(tarn_store_postgres::PgOptions {
        pool_size: 2,
        ..Default::default()
    })
    .await;
    let e = common::engine(Arc::new(store));
    let owner = sign_up(&e, "owner").await;
    for i in 0..300i64 {
        e.create_item(&owner, "doc", props(json!({ "rank": i % 50 })), vec![])
            .await
            .unwrap();
    }
    e.declare_index(&admin(), "doc-by-rank", "doc", vec![], by_rank(Order::Asc))
        .await
        .unwrap();
    // Not a timing: a deadlock never ends, and a test must fail, not hang.
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        common::wait_ready(&e, "doc-by-rank"),
    )
    .await
    .expect("the build finishes");
    let listed = listed(&e, &owner, "doc", Order::Asc).await.unwrap();
    assert_eq!(listed.len(), 300);
}

/// A store of eight connections that counts how many item refreshes (the
/// writes guarded on an item's row, in a test that edits none) run at once.
struct EightConnections {
    inner: tarn_store::memory::MemoryStore,
    busy: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl tarn_store::Store for EightConnections {
    async fn snapshot(&self) -> tarn_store::StoreResult<Box<dyn tarn_store::Snapshot>> {
        self.inner.snapshot().await
    }

    async fn write(&self, batch: tarn_store::Batch) -> tarn_store::StoreResult<()> {
        if !batch.guards.iter().any(|g| g.key.table.name() == "items") {
            return self.inner.write(batch).await;
        }
        let now = self.busy.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        // Long enough for every write the build has in flight to begin.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let done = self.inner.write(batch).await;
        self.busy.fetch_sub(1, Ordering::SeqCst);
        done
    }

    fn consistency(&self) -> tarn_store::Consistency {
        self.inner.consistency()
    }

    fn feed_lag(&self) -> std::time::Duration {
        self.inner.feed_lag()
    }

    fn connections(&self) -> Option<usize> {
        Some(8)
    }

    async fn trim_feed(
        &self,
        feed: tarn_store::Table,
        through: &[u8],
        limit: usize,
    ) -> tarn_store::StoreResult<usize> {
        self.inner.trim_feed(feed, through, limit).await
    }
}

/// Regression: a build kept 128 item refreshes waiting for a node's 16
/// PostgreSQL connections, so the node's requests queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn builds_keep_to_half_the_connections() {
    let store = Arc::new(EightConnections {
        inner: tarn_store::memory::MemoryStore::new(),
        busy: 0.into(),
        most: 0.into(),
    });
    let e = common::engine(store.clone());
    let owner = sign_up(&e, "owner").await;
    for i in 0..100i64 {
        for kind in ["doc", "note"] {
            e.create_item(&owner, kind, props(json!({ "rank": i })), vec![])
                .await
                .unwrap();
        }
    }
    assert_eq!(store.most.load(Ordering::SeqCst), 0);
    // Two builds at once share the node's four places.
    let admin = admin();
    let (doc, note) = tokio::join!(
        e.declare_index(&admin, "doc-by-rank", "doc", vec![], by_rank(Order::Asc)),
        e.declare_index(&admin, "note-by-rank", "note", vec![], by_rank(Order::Asc)),
    );
    doc.unwrap();
    note.unwrap();
    common::wait_ready(&e, "doc-by-rank").await;
    common::wait_ready(&e, "note-by-rank").await;
    let most = store.most.load(Ordering::SeqCst);
    assert!((2..=4).contains(&most), "{most} refreshes at once");
    for kind in ["doc", "note"] {
        let listed = listed(&e, &owner, kind, Order::Asc).await.unwrap();
        assert_eq!(listed.len(), 100);
    }
}

/// Regression: a sort value longer than the store's key limit made every
/// write of its item fail, and a backfill that met one stayed `building`.
#[tokio::test]
async fn long_sort_values_are_indexed_by_a_prefix() {
    let e = common::memory();
    let owner = sign_up(&e, "owner").await;
    let long = |c: char| c.to_string().repeat(20_000);
    let before = e
        .create_item(&owner, "note", props(json!({"title": long('b')})), vec![])
        .await
        .unwrap();
    e.declare_index(
        &admin(),
        "note-by-title",
        "note",
        vec!["topic".into()],
        vec![SortField {
            field: "title".into(),
            order: Order::Asc,
        }],
    )
    .await
    .unwrap();
    common::wait_ready(&e, "note-by-title").await;
    let mut made = BTreeMap::new();
    made.insert(long('b'), before.item.id);
    for c in ['c', 'a'] {
        let v = e
            .create_item(
                &owner,
                "note",
                props(json!({"title": long(c), "topic": long('t')})),
                vec![],
            )
            .await
            .expect("a write never fails for a long value");
        made.insert(long(c), v.item.id);
    }
    let list = |topic: Value| {
        let e = e.clone();
        let owner = owner.clone();
        async move {
            e.list_items(
                &owner,
                &ListQuery {
                    kind: Some("note".into()),
                    where_: vec![("topic".into(), topic)],
                    sort: vec![SortField {
                        field: "title".into(),
                        order: Order::Asc,
                    }],
                    ..ListQuery::default()
                },
            )
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|v| v.item.id)
            .collect::<Vec<_>>()
        }
    };
    // Long where-values stay exact: the one without a topic is apart.
    let got = list(json!(long('t'))).await;
    assert_eq!(
        got,
        vec![made[&long('a')].clone(), made[&long('c')].clone()]
    );
    let other = long('t') + "x";
    assert!(list(json!(other)).await.is_empty());
}

/// An index on a kind with no items, or few, is ready when its
/// declaration answers (it answered `building`, and a listing right after
/// it could be refused `index-building`).
async fn few_items_are_built_before_the_declaration_answers(e: Engine) {
    let (def, _) = e
        .declare_index(&admin(), "empty-by-x", "empty", vec![], by_rank(Order::Asc))
        .await
        .unwrap();
    assert_eq!(def.state, tarn_engine::IndexState::Ready);
    let alice = sign_up(&e, "alice").await;
    for rank in [3, 1, 2] {
        e.create_item(&alice, "few", props(json!({"rank": rank})), vec![])
            .await
            .unwrap();
    }
    let (def, _) = e
        .declare_index(&admin(), "few-by-rank", "few", vec![], by_rank(Order::Desc))
        .await
        .unwrap();
    assert_eq!(def.state, tarn_engine::IndexState::Ready);
    let ids = listed(&e, &alice, "few", Order::Desc).await.unwrap();
    assert_eq!(ids.len(), 3);
}

/// An engine on `store` whose declarations wait for their builds far
/// longer than these take, however slow a shared machine is.
fn patient(store: Arc<dyn tarn_store::Store>) -> Engine {
    Engine::new(
        store,
        tarn_engine::EngineConfig {
            build_wait: std::time::Duration::from_secs(120),
            ..common::config()
        },
    )
}

#[tokio::test]
async fn few_items_are_built_before_the_declaration_answers_on_memory() {
    let store = Arc::new(tarn_store::memory::MemoryStore::new());
    few_items_are_built_before_the_declaration_answers(patient(store)).await;
}

#[tokio::test]
async fn few_items_are_built_before_the_declaration_answers_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = tarn_store_sqlite::SqliteStore::open(dir.path()).unwrap();
    few_items_are_built_before_the_declaration_answers(patient(Arc::new(store))).await;
}

#[tokio::test]
async fn few_items_are_built_before_the_declaration_answers_on_postgres() {
    let store = common::postgres_store().await;
    few_items_are_built_before_the_declaration_answers(patient(Arc::new(store))).await;
}

#[tokio::test]
async fn few_items_are_built_before_the_declaration_answers_on_cassandra() {
    let store = common::cassandra_store().await;
    few_items_are_built_before_the_declaration_answers(patient(Arc::new(store))).await;
}

/// Dropping an index while writes go on, then declaring one of the same
/// name at once, never shows the old index's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeclared_index_starts_empty_of_old_rows() {
    let e = common::memory();
    let owner = sign_up(&e, "owner").await;
    let mut ids = Vec::new();
    for i in 0..30 {
        ids.push(
            e.create_item(&owner, "doc", props(json!({"rank": i})), vec![])
                .await
                .unwrap()
                .item
                .id,
        );
    }
    e.declare_index(&admin(), "r", "doc", vec![], by_rank(Order::Asc))
        .await
        .unwrap();
    common::wait_ready(&e, "r").await;
    e.drop_index(&admin(), "r").await.unwrap();
    for id in &ids[..10] {
        e.delete_item(&owner, id, None, None).await.unwrap();
    }
    // The name is free at once, while the old rows may still be going.
    assert!(e.get_index(&admin(), "r").await.is_err());
    e.declare_index(&admin(), "r", "doc", vec![], by_rank(Order::Asc))
        .await
        .unwrap();
    common::wait_ready(&e, "r").await;
    let got = listed(&e, &owner, "doc", Order::Asc).await.unwrap();
    assert_eq!(got, ids[10..].to_vec());
}

/// A store holds at most 1,000 indexes, the four built-in ones counted; a
/// dropped one frees its place once its rows are gone. A refusal the test
/// catches before then must say why (an audit saw `GET /indexes` list 999
/// while 1,000 were counted, without a word of it); whether it catches
/// one depends on how fast the drop runs.
#[tokio::test]
async fn indexes_are_bounded_and_a_drop_frees_a_place() {
    let e = common::memory();
    let declare = |n: usize| {
        let e = e.clone();
        async move {
            e.declare_index(
                &admin(),
                &format!("i{n}"),
                &format!("k{n}"),
                vec![],
                by_rank(Order::Asc),
            )
            .await
        }
    };
    for n in 0..996 {
        declare(n).await.unwrap();
    }
    match declare(996).await {
        Err(EngineError::Conflict(m)) => assert_eq!(m, "at most 1000 indexes"),
        other => panic!("the 1,001st index: {other:?}"),
    }
    e.drop_index(&admin(), "i0").await.unwrap();
    let mut tries = 0;
    loop {
        match declare(996).await {
            Ok(_) => break,
            Err(EngineError::Conflict(m)) => {
                assert!(m.contains("1 of them still being dropped"), "{m}");
            }
            Err(other) => panic!("{other:?}"),
        }
        tries += 1;
        assert!(tries < 100, "the dropped index's place never came free");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(e.list_indexes(&admin()).await.unwrap().len(), 1000);
}
