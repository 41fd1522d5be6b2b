//! A listing's cost depends on page size and the caller's principals, never
//! on the pool's size: proven by counting store rows read, not by timing.

use std::sync::Arc;

use serde_json::json;
use tarn_engine::{Engine, Grant, ListQuery, Order, Principal, Role, SortField};
use tarn_store::memory::MemoryStore;
use tarn_store::{CountingStore, ReadCounts};

use crate::common;

const GROUPS: usize = 4;

/// A pool of `size` items shared with everyone and with four groups; a
/// reader `r0` in no group and a reader `r4` in all four.
async fn pool(size: usize) -> (Engine, Arc<CountingStore<MemoryStore>>) {
    let store = Arc::new(CountingStore::new(MemoryStore::new()));
    let engine = common::engine(store.clone());
    let owner = common::sign_up(&engine, "owner").await;
    common::sign_up(&engine, "r0").await;
    common::sign_up(&engine, "r4").await;
    let mut acl = vec![Grant {
        principal: Principal::Everyone,
        role: Role::Viewer,
    }];
    for g in 0..GROUPS {
        let id = format!("g{g}");
        engine
            .create_group(&owner, &id, None, serde_json::Map::new())
            .await
            .unwrap();
        engine
            .add_member(&owner, &id, &Principal::User("r4".into()))
            .await
            .unwrap();
        acl.push(Grant {
            principal: Principal::Group(id),
            role: Role::Viewer,
        });
    }
    engine
        .declare_index(
            &common::admin(),
            "doc-by-rank",
            "doc",
            vec![],
            vec![SortField {
                field: "rank".into(),
                order: Order::Asc,
            }],
        )
        .await
        .unwrap();
    common::wait_ready(&engine, "doc-by-rank").await;
    for i in 0..size {
        engine
            .create_item(
                &owner,
                "doc",
                common::props(json!({ "rank": (i * 7919) % 1000 })),
                acl.clone(),
            )
            .await
            .unwrap();
    }
    (engine, store)
}

async fn page_cost(
    engine: &Engine,
    store: &CountingStore<MemoryStore>,
    reader: &str,
    q: &ListQuery,
) -> ReadCounts {
    let who = common::user(reader);
    // Second page: the cursor path costs the same as the first.
    let first = engine.list_items(&who, q).await.unwrap();
    let q2 = ListQuery {
        cursor: first.next.clone(),
        ..q.clone()
    };
    store.reset();
    let page = engine.list_items(&who, &q2).await.unwrap();
    assert_eq!(page.items.len(), q.limit);
    store.counts()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_cost_is_independent_of_pool_size() {
    let queries = [
        ListQuery {
            kind: Some("doc".into()),
            limit: 25,
            ..ListQuery::default()
        },
        ListQuery {
            kind: Some("doc".into()),
            limit: 25,
            sort: vec![SortField {
                field: "rank".into(),
                order: Order::Desc,
            }],
            ..ListQuery::default()
        },
    ];
    let (small, small_store) = pool(100).await;
    let (large, large_store) = pool(10_000).await;
    for q in &queries {
        let mut per_reader = Vec::new();
        for reader in ["r0", "r4"] {
            let a = page_cost(&small, &small_store, reader, q).await;
            let b = page_cost(&large, &large_store, reader, q).await;
            assert_eq!(a, b, "{reader}: rows read over 100 and 10,000 items");
            per_reader.push(a);
        }
        let (r0, r4) = (per_reader[0], per_reader[1]);
        // r0 reads 3 partitions (user, authenticated, everyone), r4 seven:
        // each costs at most limit + 1 rows; items read are the page.
        assert!(
            r4.rows > r0.rows,
            "more principals, more rows: {r0:?} {r4:?}"
        );
        // Per group: its index partition, and its memberships at the next
        // nesting level.
        assert_eq!(r4.scans - r0.scans, 2 * GROUPS as u64, "{r0:?} {r4:?}");
        let bound = |principals: u64, c: ReadCounts| {
            assert!(
                c.rows <= principals * 26 + 25 + 10,
                "{c:?} over the bound for {principals} principals"
            );
        };
        bound(3, r0);
        bound(7, r4);
    }
}

/// Store calls (round trips) and snapshots per operation, pinned: a change
/// that adds a dependent read to a hot path fails here.
async fn round_trips_on<S: tarn_store::Store>(store: Arc<CountingStore<S>>) {
    let engine = common::engine(store.clone());
    let owner = common::sign_up(&engine, "owner").await;
    common::sign_up(&engine, "solo").await;
    common::sign_up(&engine, "member").await;
    common::sign_up(&engine, "nested").await;
    for g in ["g1", "g2", "g3", "outer"] {
        engine
            .create_group(&owner, g, None, serde_json::Map::new())
            .await
            .unwrap();
    }
    for g in ["g2", "g3"] {
        engine
            .add_member(&owner, g, &Principal::User("member".into()))
            .await
            .unwrap();
    }
    engine
        .add_member(&owner, "g1", &Principal::User("nested".into()))
        .await
        .unwrap();
    engine
        .add_member(&owner, "outer", &Principal::Group("g1".into()))
        .await
        .unwrap();
    engine
        .declare_index(
            &common::admin(),
            "doc-by-rank",
            "doc",
            vec![],
            vec![SortField {
                field: "rank".into(),
                order: Order::Asc,
            }],
        )
        .await
        .unwrap();
    common::wait_ready(&engine, "doc-by-rank").await;
    let acl = vec![
        Grant {
            principal: Principal::Everyone,
            role: Role::Viewer,
        },
        Grant {
            principal: Principal::Group("outer".into()),
            role: Role::Viewer,
        },
    ];
    let mut id = String::new();
    for i in 0..40 {
        id = engine
            .create_item(
                &owner,
                "doc",
                common::props(json!({ "rank": i })),
                acl.clone(),
            )
            .await
            .unwrap()
            .item
            .id;
    }
    let token = |name: &str| {
        let engine = engine.clone();
        let name = name.to_string();
        async move {
            let (t, _) = engine
                .sign_in(&name, &format!("{name}-password"))
                .await
                .unwrap();
            tarn_engine::Caller::Token(t)
        }
    };
    let solo = token("solo").await;
    let member = token("member").await;
    let nested = token("nested").await;
    let list = ListQuery {
        kind: Some("doc".into()),
        limit: 25,
        sort: vec![SortField {
            field: "rank".into(),
            order: Order::Asc,
        }],
        ..ListQuery::default()
    };
    // Warm this thread's decoded declarations.
    engine.list_items(&solo, &list).await.unwrap();

    let measure = |store: &CountingStore<S>| {
        let c = store.counts();
        store.reset();
        c
    };
    store.reset();
    // (what, caller, store calls)
    let cases: [(&str, &tarn_engine::Caller, u64); 3] = [
        ("no groups", &solo, 1),
        ("groups", &member, 2),
        ("nested groups", &nested, 3),
    ];
    for (what, caller, walk) in cases {
        engine.get_item(caller, &id, None).await.unwrap();
        let c = measure(&store);
        // Point reads: the session, the user and the item; a plain read
        // does not need the index declarations.
        assert_eq!(
            (c.snapshots, c.calls, c.gets, c.writes),
            (1, walk, 3, 0),
            "item read, {what}: {c:?}"
        );
        engine.me(caller).await.unwrap();
        let c = measure(&store);
        assert_eq!(
            (c.snapshots, c.calls, c.gets, c.writes),
            (1, walk, 2, 0),
            "/me, {what}: {c:?}"
        );
        let page = engine.list_items(caller, &list).await.unwrap();
        assert_eq!(page.items.len(), 25);
        let c = measure(&store);
        // Without nesting: who + declarations, then index (beside the
        // next level of memberships), then items. Each further level of
        // nesting adds one.
        let listing = 3 + walk.saturating_sub(2);
        assert_eq!(
            (c.snapshots, c.calls, c.writes),
            (1, listing, 0),
            "listing, {what}: {c:?}"
        );
    }
    engine
        .list_items(&tarn_engine::Caller::Anonymous, &list)
        .await
        .unwrap();
    let c = measure(&store);
    assert_eq!((c.snapshots, c.calls), (1, 3), "anonymous listing: {c:?}");
    engine
        .create_item(
            &member,
            "doc",
            common::props(json!({"rank": 1})),
            acl.clone(),
        )
        .await
        .unwrap();
    let c = measure(&store);
    assert_eq!((c.snapshots, c.calls, c.writes), (1, 2, 1), "create: {c:?}");
}

#[tokio::test]
async fn round_trips_per_operation_are_pinned() {
    round_trips_on(Arc::new(CountingStore::new(MemoryStore::new()))).await;
}

#[tokio::test]
async fn round_trips_per_operation_are_pinned_on_postgres() {
    let store = common::postgres_store().await;
    round_trips_on(Arc::new(CountingStore::new(store))).await;
}
