//! Every refusal the engine makes, one test each.

use std::sync::Arc;

use serde_json::json;
use tarn_engine::{
    Caller, Engine, EngineError, Grant, ListQuery, Order, Principal, Role, SortField,
};

use crate::common::{self, admin, props, sign_up};

fn grant(p: &str, role: Role) -> Grant {
    Grant {
        principal: p.parse().unwrap(),
        role,
    }
}

async fn alice_bob(e: &Engine) -> (Caller, Caller) {
    (sign_up(e, "alice").await, sign_up(e, "bob").await)
}

#[tokio::test]
async fn group_cycles_are_refused() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    for g in ["a", "b", "c"] {
        e.create_group(&alice, g, None, Default::default())
            .await
            .unwrap();
    }
    let g = |id: &str| Principal::Group(id.into());
    e.add_member(&alice, "a", &g("b")).await.unwrap();
    e.add_member(&alice, "b", &g("c")).await.unwrap();
    for (parent, child) in [("c", "a"), ("c", "b"), ("b", "a"), ("a", "a")] {
        let r = e.add_member(&alice, parent, &g(child)).await;
        assert!(
            matches!(r, Err(EngineError::Conflict(_))),
            "{child} into {parent}: {r:?}"
        );
    }
    // Not a cycle: a diamond.
    e.add_member(&alice, "a", &g("c")).await.unwrap();
}

#[tokio::test]
async fn a_group_keeps_a_manager() {
    let e = common::memory();
    let (alice, bob) = alice_bob(&e).await;
    e.create_group(&alice, "g", None, Default::default())
        .await
        .unwrap();
    let r = e
        .remove_manager(&alice, "g", &Principal::User("alice".into()))
        .await;
    assert!(matches!(r, Err(EngineError::Conflict(_))), "{r:?}");
    e.add_manager(&alice, "g", &Principal::User("bob".into()))
        .await
        .unwrap();
    e.remove_manager(&bob, "g", &Principal::User("alice".into()))
        .await
        .unwrap();
    let r = e
        .add_member(&alice, "g", &Principal::User("alice".into()))
        .await;
    assert!(
        matches!(r, Err(EngineError::Forbidden(_))),
        "no longer a manager: {r:?}"
    );
}

#[tokio::test]
async fn an_item_keeps_a_manager() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    let item = e
        .create_item(&alice, "doc", Default::default(), vec![])
        .await
        .unwrap();
    let r = e
        .set_acl(
            &alice,
            &item.item.id,
            None,
            vec![grant("user:alice", Role::Editor)],
            None,
        )
        .await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    assert_eq!(
        e.get_item(&alice, &item.item.id, None).await.unwrap().role,
        Role::Manager
    );
}

#[tokio::test]
async fn wrong_roles_are_refused() {
    let e = common::memory();
    let (alice, bob) = alice_bob(&e).await;
    let item = e
        .create_item(
            &alice,
            "doc",
            Default::default(),
            vec![grant("user:bob", Role::Viewer)],
        )
        .await
        .unwrap();
    let id = &item.item.id;
    let forbidden =
        |r: Result<(), EngineError>| assert!(matches!(r, Err(EngineError::Forbidden(_))), "{r:?}");
    forbidden(
        e.patch_item(&bob, id, None, &json!({"x": 1}), None)
            .await
            .map(drop),
    );
    forbidden(
        e.set_acl(&bob, id, None, vec![grant("user:bob", Role::Manager)], None)
            .await
            .map(drop),
    );
    forbidden(e.delete_item(&bob, id, None, None).await);
    forbidden(
        e.create_link(&bob, id, None, Role::Viewer, None)
            .await
            .map(drop),
    );
    forbidden(
        e.begin_body(&bob, id, None, "text/plain", None)
            .await
            .map(drop),
    );
    // An editor may edit but not share or delete.
    e.set_acl(
        &alice,
        id,
        None,
        vec![
            grant("user:alice", Role::Manager),
            grant("user:bob", Role::Editor),
        ],
        None,
    )
    .await
    .unwrap();
    e.patch_item(&bob, id, None, &json!({"x": 1}), None)
        .await
        .unwrap();
    forbidden(e.delete_item(&bob, id, None, None).await);
    // Strangers and anonymous callers learn nothing.
    let carol = sign_up(&e, "carol").await;
    for who in [carol, Caller::Anonymous] {
        let r = e.get_item(&who, id, None).await;
        assert!(matches!(r, Err(EngineError::NotFound(_))), "{r:?}");
        let r = e.delete_item(&who, id, None, None).await;
        assert!(matches!(r, Err(EngineError::NotFound(_))), "{r:?}");
    }
    // Anonymous callers cannot create.
    let r = e
        .create_item(&Caller::Anonymous, "doc", Default::default(), vec![])
        .await;
    assert!(matches!(r, Err(EngineError::Unauthenticated(_))), "{r:?}");
    // A link never gives manager.
    let r = e.create_link(&alice, id, None, Role::Manager, None).await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
}

#[tokio::test]
async fn stale_versions_are_refused() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    let item = e
        .create_item(&alice, "doc", Default::default(), vec![])
        .await
        .unwrap();
    let id = &item.item.id;
    let v2 = e
        .patch_item(&alice, id, None, &json!({"a": 1}), Some(1))
        .await
        .unwrap();
    assert_eq!(v2.item.version, 2);
    let r = e
        .patch_item(&alice, id, None, &json!({"a": 2}), Some(1))
        .await;
    assert!(
        matches!(
            r,
            Err(EngineError::VersionMismatch {
                expected: 1,
                current: 2
            })
        ),
        "{r:?}"
    );
    let r = e
        .set_acl(
            &alice,
            id,
            None,
            vec![grant("user:alice", Role::Manager)],
            Some(1),
        )
        .await;
    assert!(
        matches!(r, Err(EngineError::VersionMismatch { .. })),
        "{r:?}"
    );
    let r = e.delete_item(&alice, id, None, Some(7)).await;
    assert!(
        matches!(r, Err(EngineError::VersionMismatch { .. })),
        "{r:?}"
    );
    e.delete_item(&alice, id, None, Some(2)).await.unwrap();
}

#[tokio::test]
async fn unknown_principals_are_refused() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    e.create_group(&alice, "g", None, Default::default())
        .await
        .unwrap();
    for p in ["user:ghost", "group:ghost"] {
        let r = e.add_member(&alice, "g", &p.parse().unwrap()).await;
        assert!(matches!(r, Err(EngineError::NotFound(_))), "{p}: {r:?}");
        let r = e
            .create_item(
                &alice,
                "doc",
                Default::default(),
                vec![grant(p, Role::Viewer)],
            )
            .await;
        assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{p}: {r:?}");
    }
    let r = e.add_member(&alice, "g", &Principal::Everyone).await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    let r = e
        .add_member(&alice, "nope", &Principal::User("alice".into()))
        .await;
    assert!(matches!(r, Err(EngineError::NotFound(_))), "{r:?}");
}

#[tokio::test]
async fn missing_index_names_the_index_to_declare() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    // An index of the name the advice would take, sorting by another
    // field: the advice names another.
    let taken = "user-home-by-public-lastname-where-team";
    e.declare_index(
        &common::admin(),
        taken,
        "user-home",
        vec!["team".into()],
        vec![SortField {
            field: "rank".into(),
            order: Order::Asc,
        }],
    )
    .await
    .unwrap();
    common::wait_ready(&e, taken).await;
    let q = ListQuery {
        kind: Some("user-home".into()),
        sort: vec![SortField {
            field: "public.lastName".into(),
            order: Order::Asc,
        }],
        where_: vec![("team".into(), json!("red"))],
        ..ListQuery::default()
    };
    match e.list_items(&alice, &q).await {
        Err(EngineError::NoIndex { name, declare, .. }) => {
            assert!(tarn_engine::is_valid_name(&name), "{name}");
            assert_eq!(name, format!("{taken}-2"));
            let d: serde_json::Value = serde_json::from_str(&declare).unwrap();
            assert!(d.get("name").is_none(), "the body of a PUT: {d}");
            assert_eq!(d["kind"], "user-home");
            assert_eq!(d["where"], json!(["team"]));
            assert_eq!(
                d["sort"],
                json!([{"field": "public.lastName", "order": "asc"}])
            );
        }
        other => panic!("expected no-index, got {other:?}"),
    }
    let r = e.list_items(&alice, &ListQuery::default()).await;
    assert!(
        matches!(r, Err(EngineError::InvalidInput(_))),
        "kind is required: {r:?}"
    );
}

/// A cursor of one listing, taken by another (another where value, kind
/// or index of the same name), started it at a foreign place.
#[tokio::test]
async fn a_cursor_serves_only_its_own_listing() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    let sort = vec![SortField {
        field: "n".into(),
        order: Order::Asc,
    }];
    e.declare_index(
        &admin(),
        "doc-by-g-n",
        "doc",
        vec!["g".into()],
        sort.clone(),
    )
    .await
    .unwrap();
    common::wait_ready(&e, "doc-by-g-n").await;
    for (kind, g) in [("doc", "x"), ("doc", "y"), ("note", "x")] {
        for n in 0..3 {
            e.create_item(&alice, kind, props(json!({"g": g, "n": n})), vec![])
                .await
                .unwrap();
        }
    }
    let by_g = |g: &str, cursor: Option<String>| ListQuery {
        kind: Some("doc".into()),
        where_: vec![("g".into(), json!(g))],
        sort: sort.clone(),
        limit: 2,
        cursor,
        ..ListQuery::default()
    };
    let newest = |kind: &str, cursor: Option<String>| ListQuery {
        kind: Some(kind.into()),
        limit: 2,
        cursor,
        ..ListQuery::default()
    };
    let x = e.list_items(&alice, &by_g("x", None)).await.unwrap();
    let c = x.next.expect("a second page");
    // Its own listing goes on from it ...
    let rest = e
        .list_items(&alice, &by_g("x", Some(c.clone())))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    // ... another where value, or another kind, refuses it.
    let r = e.list_items(&alice, &by_g("y", Some(c))).await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    let docs = e.list_items(&alice, &newest("doc", None)).await.unwrap();
    let c = docs.next.expect("a second page");
    assert!(e
        .list_items(&alice, &newest("doc", Some(c.clone())))
        .await
        .is_ok());
    let r = e.list_items(&alice, &newest("note", Some(c))).await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    // The index dropped and declared again under its name: a new index.
    let c = e.list_items(&alice, &by_g("x", None)).await.unwrap().next;
    e.drop_index(&admin(), "doc-by-g-n").await.unwrap();
    e.declare_index(
        &admin(),
        "doc-by-g-n",
        "doc",
        vec!["g".into()],
        sort.clone(),
    )
    .await
    .unwrap();
    common::wait_ready(&e, "doc-by-g-n").await;
    let r = e.list_items(&alice, &by_g("x", c)).await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
}

/// A members cursor of one group, taken to another, answered an empty page.
#[tokio::test]
async fn a_members_cursor_serves_only_its_own_group() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    for g in ["one", "two"] {
        e.create_group(&alice, g, None, Default::default())
            .await
            .unwrap();
        for u in ["carol", "dave", "erin"] {
            sign_up(&e, &format!("{u}{g}")).await;
            let p = Principal::User(format!("{u}{g}"));
            e.add_member(&alice, g, &p).await.unwrap();
        }
    }
    let page = e.list_members(&alice, "one", 2, None).await.unwrap();
    let c = page.next.expect("a second page");
    let rest = e.list_members(&alice, "one", 2, Some(&c)).await.unwrap();
    assert_eq!(rest.members, vec![Principal::User("erinone".into())]);
    let r = e.list_members(&alice, "two", 2, Some(&c)).await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
}

#[tokio::test]
async fn index_still_building_is_refused() {
    // A store that holds back every write to the index declarations after
    // the first (the declaration itself), so the build never marks the
    // index ready.
    let store = Arc::new(tarn_store::conformance::HoldWrites::after_first(
        "index_defs",
    ));
    let e = Engine::new(store.clone(), common::config());
    let (alice, _) = alice_bob(&e).await;
    let sort = vec![SortField {
        field: "title".into(),
        order: Order::Asc,
    }];
    let (def, created) = e
        .declare_index(&admin(), "doc-by-title", "doc", vec![], sort.clone())
        .await
        .unwrap();
    assert!(created);
    assert_eq!(def.state, tarn_engine::IndexState::Building);
    let q = ListQuery {
        kind: Some("doc".into()),
        sort,
        ..ListQuery::default()
    };
    let r = e.list_items(&alice, &q).await;
    assert!(
        matches!(r, Err(EngineError::IndexBuilding(ref n)) if n == "doc-by-title"),
        "{r:?}"
    );
}

#[tokio::test]
async fn index_declarations_are_for_admins_and_checked() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    let sort = |f: &str| {
        vec![SortField {
            field: f.into(),
            order: Order::Asc,
        }]
    };
    let r = e.declare_index(&alice, "x", "doc", vec![], sort("a")).await;
    assert!(matches!(r, Err(EngineError::Forbidden(_))), "{r:?}");
    for bad in ["", "a..b", ".a", "kind"] {
        let r = e
            .declare_index(&admin(), "x", "doc", vec![], sort(bad))
            .await;
        assert!(
            matches!(r, Err(EngineError::InvalidInput(_))),
            "{bad:?}: {r:?}"
        );
    }
    let (_, created) = e
        .declare_index(&admin(), "x", "doc", vec![], sort("a"))
        .await
        .unwrap();
    assert!(created);
    let (_, created) = e
        .declare_index(&admin(), "x", "doc", vec![], sort("a"))
        .await
        .unwrap();
    assert!(!created, "identical declaration answers the existing index");
    let r = e
        .declare_index(&admin(), "x", "doc", vec![], sort("b"))
        .await;
    assert!(matches!(r, Err(EngineError::Conflict(_))), "{r:?}");
    // Where fields, and text fields, in another order declare the same
    // index (and the default language named, as it always did).
    let pq = |p: &str, q: &str| vec![p.to_string(), q.to_string()];
    let (_, created) = e
        .declare_index(&admin(), "y", "doc", pq("p", "q"), sort("a"))
        .await
        .unwrap();
    assert!(created);
    let (def, created) = e
        .declare_index(&admin(), "y", "doc", pq("q", "p"), sort("a"))
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(def.where_, pq("p", "q"), "the index as declared first");
    let r = e
        .declare_index(&admin(), "y", "doc", pq("q", "r"), sort("a"))
        .await;
    assert!(matches!(r, Err(EngineError::Conflict(_))), "{r:?}");
    let root = admin();
    let declare_text = |fields: &[(&str, f64)], language: Option<&str>| {
        let text = fields
            .iter()
            .map(|(f, w)| tarn_engine::TextField {
                field: f.to_string(),
                weight: *w,
            })
            .collect();
        e.declare_text_index(&root, "t", "doc", vec![], text, language.map(String::from))
    };
    let (_, created) = declare_text(&[("a", 2.0), ("b", 1.0)], None).await.unwrap();
    assert!(created);
    let (_, created) = declare_text(&[("b", 1.0), ("a", 2.0)], Some("english"))
        .await
        .unwrap();
    assert!(!created);
    for (fields, language) in [
        (&[("a", 2.0), ("b", 1.5)][..], None),
        (&[("a", 2.0)][..], None),
        (&[("a", 2.0), ("b", 1.0)][..], Some("french")),
    ] {
        let r = declare_text(fields, language).await;
        assert!(matches!(r, Err(EngineError::Conflict(_))), "{r:?}");
    }
    let r = e.drop_index(&admin(), "_kind").await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
}

#[tokio::test]
async fn bad_input_is_refused() {
    let e = common::memory();
    let (alice, _) = alice_bob(&e).await;
    let r = e
        .create_item(&alice, "Bad Kind", Default::default(), vec![])
        .await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    let big = props(json!({"x": "y".repeat(70 * 1024)}));
    let r = e.create_item(&alice, "doc", big, vec![]).await;
    assert!(matches!(r, Err(EngineError::TooLarge(_))), "{r:?}");
    let item = e
        .create_item(&alice, "doc", Default::default(), vec![])
        .await
        .unwrap();
    let r = e
        .patch_item(&alice, &item.item.id, None, &json!([1]), None)
        .await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    for limit in [0, 1001] {
        let q = ListQuery {
            kind: Some("doc".into()),
            limit,
            ..ListQuery::default()
        };
        assert!(matches!(
            e.list_items(&alice, &q).await,
            Err(EngineError::InvalidInput(_))
        ));
    }
    let q = ListQuery {
        kind: Some("doc".into()),
        cursor: Some("garbage".into()),
        ..ListQuery::default()
    };
    assert!(matches!(
        e.list_items(&alice, &q).await,
        Err(EngineError::InvalidInput(_))
    ));
    let r = sign_up_with(&e, "dave", "short").await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    let r = sign_up_with(&e, "alice", "long enough").await;
    assert!(matches!(r, Err(EngineError::Conflict(_))), "{r:?}");
    let r = sign_up_with(&e, "no pe", "long enough").await;
    assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    // The names of the built-in principals are no one's to take.
    for name in ["everyone", "authenticated"] {
        let r = sign_up_with(&e, name, "long enough").await;
        assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
        let r = e.create_group(&alice, name, None, Default::default()).await;
        assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
    }
    let r = e
        .create_user(
            &Caller::Anonymous,
            tarn_engine::NewUser {
                username: "eve".into(),
                password: "long enough".into(),
                properties: Default::default(),
                admin: false,
            },
            false,
        )
        .await;
    assert!(
        matches!(r, Err(EngineError::Unauthenticated(_))),
        "sign-up closed: {r:?}"
    );
}

async fn sign_up_with(
    e: &Engine,
    name: &str,
    password: &str,
) -> Result<tarn_engine::User, EngineError> {
    e.create_user(
        &Caller::Anonymous,
        tarn_engine::NewUser {
            username: name.into(),
            password: password.into(),
            properties: Default::default(),
            admin: false,
        },
        true,
    )
    .await
}
