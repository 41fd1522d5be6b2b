//! End-to-end scenarios: sessions, nested groups, bodies, declared indexes
//! with where-fields, backfill and drop, concurrent edits.

use std::sync::Arc;

use serde_json::json;
use tarn_engine::{
    BodyRange, Caller, EngineError, Grant, IndexState, ListQuery, Order, Principal, Role, SortField,
};
use tarn_store::memory::MemoryStore;

use crate::common::{self, admin, props, sign_up};

/// An address that keeps failing across accounts is refused whatever it
/// sends next, names no account can have counted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_failing_across_accounts_is_refused() {
    let (e, _dir) = common::sqlite();
    sign_up(&e, "alice").await;
    let from = Some("192.0.2.7");
    for i in 0..tarn_engine::ADDRESS_FAILURES {
        // Upper case, a space: no account has such a name.
        let name = if i % 2 == 0 {
            format!("Nobody{i}")
        } else {
            format!("no one {i}")
        };
        let r = e.sign_in_throttled(&name, "some-password", from).await;
        assert!(matches!(r, Err(EngineError::Unauthenticated(_))), "{r:?}");
    }
    let r = e.sign_in_throttled("alice", "alice-password", from).await;
    assert!(matches!(r, Err(EngineError::RateLimited { .. })), "{r:?}");
    let r = e.sign_in_throttled("Nobody", "x", from).await;
    assert!(matches!(r, Err(EngineError::RateLimited { .. })), "{r:?}");
    // Another address is not affected.
    e.sign_in_throttled("alice", "alice-password", Some("192.0.2.8"))
        .await
        .unwrap();
}

/// An account failing from one address is slowed there, never refused:
/// the right password still signs in, after the delay. On tokio's paused
/// clock, which moves only as timers fire: no wall-clock time is measured.
#[tokio::test(start_paused = true)]
async fn an_account_failing_from_one_address_is_slowed_not_refused() {
    let e = tarn_engine::Engine::new(Arc::new(MemoryStore::new()), common::config());
    sign_up(&e, "alice").await;
    let from = Some("192.0.2.9");
    let failures = tarn_engine::PAIR_FAILURES + 5;
    for _ in 0..failures {
        let r = e.sign_in_throttled("alice", "wrong-password", from).await;
        assert!(matches!(r, Err(EngineError::Unauthenticated(_))), "{r:?}");
    }
    let delay = tarn_engine::sign_in_delay(failures, e.config().max_sign_in_delay);
    assert!(!delay.is_zero());
    let started = tokio::time::Instant::now();
    e.sign_in_throttled("alice", "alice-password", from)
        .await
        .unwrap();
    assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
}

/// A burst of sign-ups, a class joining at once, is served: each waits its
/// turn at the one hasher instead of being refused (40 at once on two
/// cores met 22 refusals when 16 could wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_sign_ups_is_served() {
    let e = tarn_engine::Engine::new(
        Arc::new(MemoryStore::new()),
        tarn_engine::EngineConfig {
            // A hash of some milliseconds, one at a time, the default queue.
            password_cost: tarn_engine::PasswordCost {
                memory_kib: 8 * 1024,
                iterations: 4,
            },
            password_hashers: 1,
            password_queue: tarn_engine::PASSWORD_QUEUE_PER_HASHER,
            ..common::config()
        },
    );
    let burst: Vec<_> = (0..40)
        .map(|i| {
            let e = e.clone();
            let user = tarn_engine::NewUser {
                username: format!("student{i}"),
                password: format!("student{i}-password"),
                properties: Default::default(),
                admin: false,
            };
            tokio::spawn(async move { e.create_user(&Caller::Anonymous, user, true).await })
        })
        .collect();
    for (i, b) in burst.into_iter().enumerate() {
        b.await
            .unwrap()
            .unwrap_or_else(|err| panic!("student{i}: {err:?}"));
    }
}

/// A flood of sign-ups fills only their own queue for a hasher: sign-ins
/// still get through, a name that is taken is answered at once (no hash
/// spent on it), and so is a token that is no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_sign_ups_leaves_sign_ins_their_places() {
    let e = tarn_engine::Engine::new(
        Arc::new(MemoryStore::new()),
        tarn_engine::EngineConfig {
            // A hash of some milliseconds, one at a time, two may wait.
            password_cost: tarn_engine::PasswordCost {
                memory_kib: 8 * 1024,
                iterations: 4,
            },
            password_hashers: 1,
            password_queue: 2,
            ..common::config()
        },
    );
    sign_up(&e, "alice").await;
    let new = |name: String| tarn_engine::NewUser {
        password: format!("{name}-password"),
        username: name,
        properties: Default::default(),
        admin: false,
    };
    let flood: Vec<_> = (0..40)
        .map(|i| {
            let (e, user) = (e.clone(), new(format!("flood{i}")));
            tokio::spawn(async move { e.create_user(&Caller::Anonymous, user, true).await })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for _ in 0..3 {
        e.sign_in("alice", "alice-password")
            .await
            .expect("a sign-in beside the flood");
        let r = e
            .create_user(&Caller::Anonymous, new("alice".into()), true)
            .await;
        assert!(matches!(r, Err(EngineError::Conflict(_))), "{r:?}");
    }
    let mut refused = 0;
    for f in flood {
        match f.await.unwrap() {
            Ok(_) => {}
            Err(EngineError::Unavailable(_)) => refused += 1,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(refused > 0, "the flood was answered, not queued");
    let r = e
        .create_user(
            &Caller::Token("alice.not-a-session".into()),
            new("carol".into()),
            true,
        )
        .await;
    assert!(matches!(r, Err(EngineError::Unauthenticated(_))), "{r:?}");
    let r = e
        .get_user(&Caller::Token("alice.not-a-session".into()), "alice")
        .await;
    assert!(matches!(r, Err(EngineError::Unauthenticated(_))), "{r:?}");
    assert_eq!(
        e.get_user(&Caller::Anonymous, "alice")
            .await
            .unwrap()
            .username,
        "alice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_open_hold_and_end() {
    let (e, _dir) = common::sqlite();
    sign_up(&e, "alice").await;
    let r = e.sign_in("alice", "wrong password").await;
    assert!(matches!(r, Err(EngineError::Unauthenticated(_))));
    let r = e.sign_in("nobody", "alice-password").await;
    assert!(matches!(r, Err(EngineError::Unauthenticated(_))));
    let (token, user) = e.sign_in("alice", "alice-password").await.unwrap();
    assert_eq!(user.username, "alice");
    assert!(token.len() >= 22, "at least 128 bits");
    assert!(token.starts_with("alice."), "a token names its user");
    let tok = |t: &str| Caller::Token(t.to_string());
    assert_eq!(e.me(&tok(&token)).await.unwrap().user.username, "alice");
    let (second, _) = e.sign_in("alice", "alice-password").await.unwrap();
    e.sign_out(&tok(&token)).await.unwrap();
    assert!(matches!(
        e.me(&tok(&token)).await,
        Err(EngineError::Unauthenticated(_))
    ));
    assert!(e.me(&tok(&second)).await.is_ok(), "other sessions live on");
    // A token for another user with a real secret is refused.
    let forged = format!("bob.{}", second.rsplit_once('.').unwrap().1);
    assert!(matches!(
        e.me(&tok(&forged)).await,
        Err(EngineError::Unauthenticated(_))
    ));
    // A password reset ends every session.
    e.set_password("alice", "a new password", None, false)
        .await
        .unwrap();
    assert!(e.me(&tok(&second)).await.is_err());
    assert!(e.sign_in("alice", "alice-password").await.is_err());
    e.sign_in("alice", "a new password").await.unwrap();
    // The admin user.
    let a = e.ensure_admin("admin password").await.unwrap();
    assert!(a.admin);
    let (t, _) = e.sign_in("admin", "admin password").await.unwrap();
    assert!(e.me(&tok(&t)).await.unwrap().user.admin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_expire() {
    let store = Arc::new(MemoryStore::new());
    let e = tarn_engine::Engine::new(
        store.clone(),
        tarn_engine::EngineConfig {
            session_ttl: std::time::Duration::from_millis(5),
            ..common::config()
        },
    );
    sign_up(&e, "alice").await;
    let before = store.len();
    let (token, _) = e.sign_in("alice", "alice-password").await.unwrap();
    assert_eq!(store.len(), before + 2, "a session is two rows");
    // The stepping clock moves 1 ms per reading.
    for _ in 0..10 {
        e.get_user(&Caller::Anonymous, "alice").await.unwrap();
        let _ = e
            .create_group(&common::user("alice"), "tick", None, Default::default())
            .await;
    }
    assert!(matches!(
        e.me(&Caller::Token(token.clone())).await,
        Err(EngineError::Unauthenticated(_))
    ));
    // The request that found it expired removed its rows: what is left is
    // the user, the group made while the clock ran, and the creator's
    // group-creation window.
    for _ in 0..100 {
        if store.len() == before + 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(
        store.len(),
        before + 2,
        "the expired session's rows are gone"
    );
}

#[tokio::test]
async fn me_lists_nested_groups() {
    let e = common::memory();
    let alice = sign_up(&e, "alice").await;
    for g in ["inner", "outer", "other"] {
        e.create_group(&alice, g, Some(g.to_uppercase()), Default::default())
            .await
            .unwrap();
    }
    e.add_member(&alice, "inner", &Principal::User("alice".into()))
        .await
        .unwrap();
    e.add_member(&alice, "outer", &Principal::Group("inner".into()))
        .await
        .unwrap();
    let me = e.me(&alice).await.unwrap();
    assert_eq!(me.groups, vec!["inner".to_string(), "outer".to_string()]);
    let page = e.list_members(&alice, "outer", 10, None).await.unwrap();
    assert_eq!(page.members, vec![Principal::Group("inner".into())]);
    assert!(page.next.is_none());
    for i in 0..5 {
        let name = format!("m{i}");
        sign_up(&e, &name).await;
        e.add_member(&alice, "other", &Principal::User(name))
            .await
            .unwrap();
    }
    let p1 = e.list_members(&alice, "other", 3, None).await.unwrap();
    let p2 = e
        .list_members(&alice, "other", 3, p1.next.as_deref())
        .await
        .unwrap();
    assert_eq!(p1.members.len() + p2.members.len(), 5);
    assert!(p2.next.is_none());
}

async fn read_all(mut r: tarn_engine::BodyReader) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(c) = r.next_chunk().await.unwrap() {
        assert!(c.len() <= 4 * 256 * 1024, "bounded pieces");
        out.extend_from_slice(&c);
    }
    out
}

/// Waits for background clean-up to bring the store to `want` rows.
async fn settle_rows(store: &MemoryStore, want: usize) {
    for _ in 0..200 {
        if store.len() == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(store.len(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_in_and_out_with_ranges() {
    let store = Arc::new(MemoryStore::new());
    // No grace: replaced bytes go at the next sweep.
    let e = tarn_engine::Engine::new(
        store.clone(),
        tarn_engine::EngineConfig {
            body_grace: std::time::Duration::ZERO,
            ..common::config()
        },
    );
    let alice = sign_up(&e, "alice").await;
    let bob = sign_up(&e, "bob").await;
    let before_item = store.len();
    let bob_views = vec![Grant {
        principal: Principal::User("bob".into()),
        role: Role::Viewer,
    }];
    let item = e
        .create_item(&alice, "file", Default::default(), bob_views)
        .await
        .unwrap();
    let id = item.item.id.clone();
    let with_item = store.len();
    // 2.5 MiB in uneven pieces: ten full chunks of 256 KiB and a partial one.
    let data: Vec<u8> = (0..(5 * 512 * 1024 + 123))
        .map(|i: u32| (i % 251) as u8)
        .collect();
    let mut up = e
        .begin_body(&alice, &id, None, "application/octet-stream", None)
        .await
        .unwrap();
    for piece in data.chunks(100_003) {
        up.write(piece).await.unwrap();
    }
    let view = up.finish(Some(1)).await.unwrap();
    assert_eq!(store.len(), with_item + 11, "eleven chunks");
    let meta = view.item.body.clone().unwrap();
    assert_eq!(meta.size, data.len() as u64);
    assert_eq!(view.item.version, 2);
    use sha2::Digest;
    let want_sha: String = sha2::Sha256::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(meta.sha256, want_sha);

    let (_, reader) = e.open_body(&bob, &id, None).await.unwrap();
    assert_eq!(read_all(reader.unwrap()).await, data);
    let len = data.len() as u64;
    for (start, end) in [
        (0u64, 1u64),
        (262_143, 262_145),
        (1_000_000, 2_500_000),
        (len - 5, len),
    ] {
        let (_, reader) = e.open_body(&bob, &id, None).await.unwrap();
        let mut reader = reader.unwrap();
        reader.seek(BodyRange { start, end });
        assert_eq!(
            read_all(reader).await,
            &data[start as usize..end as usize],
            "{start}-{end}"
        );
    }
    // A viewer cannot upload; a stale upload is refused and its chunks go.
    assert!(matches!(
        e.begin_body(&bob, &id, None, "text/plain", None).await,
        Err(EngineError::Forbidden(_))
    ));
    let mut up = e
        .begin_body(&alice, &id, None, "text/plain", None)
        .await
        .unwrap();
    up.write(b"small").await.unwrap();
    let stale = up.finish(Some(1)).await;
    assert!(
        matches!(stale, Err(EngineError::VersionMismatch { .. })),
        "{stale:?}"
    );
    settle_rows(&store, with_item + 11).await;
    // Replacing the body buries the old chunks; the sweep removes them.
    let mut up = e
        .begin_body(&alice, &id, None, "text/plain", None)
        .await
        .unwrap();
    up.write(b"small").await.unwrap();
    up.finish(None).await.unwrap();
    let (view, reader) = e.open_body(&bob, &id, None).await.unwrap();
    assert_eq!(view.item.body.unwrap().content_type, "text/plain");
    assert_eq!(read_all(reader.unwrap()).await, b"small");
    assert_eq!(
        store.len(),
        with_item + 11 + 1 + 1,
        "old chunks wait in the graveyard"
    );
    e.sweep_from(0).await.unwrap();
    assert_eq!(store.len(), with_item + 1);
    // Deleting the item removes everything it had, its body at the sweep.
    e.delete_item(&alice, &id, None, None).await.unwrap();
    e.sweep_from(0).await.unwrap();
    // All but the stamp row the kind bucket's first create wrote.
    assert_eq!(store.len(), before_item + 1);
}

/// Uploads rest at their place in proportion to their work while the node
/// serves other requests, and not at all when they are alone or their
/// share is the whole time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_rest_only_beside_other_requests() {
    let requests = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let engine = |share: f64| {
        tarn_engine::Engine::new(
            Arc::new(MemoryStore::new()),
            tarn_engine::EngineConfig {
                upload_share: share,
                requests_in_flight: Some(requests.clone()),
                ..common::config()
            },
        )
    };
    let data = vec![7u8; 2 * 1024 * 1024 + 5];
    async fn upload(e: &tarn_engine::Engine, who: &str, data: &[u8]) {
        let alice = sign_up(e, who).await;
        let item = e
            .create_item(&alice, "file", Default::default(), vec![])
            .await
            .unwrap();
        let mut up = e
            .begin_body(
                &alice,
                &item.item.id,
                None,
                "application/octet-stream",
                None,
            )
            .await
            .unwrap();
        for piece in data.chunks(64 * 1024) {
            up.write(piece).await.unwrap();
        }
        up.finish(None).await.unwrap();
    }
    let set = |n: i64| requests.store(n, std::sync::atomic::Ordering::Relaxed);

    // Alone: the only request being served is the upload itself.
    let e = engine(0.25);
    set(1);
    upload(&e, "alice", &data).await;
    assert_eq!(e.upload_rest(), std::time::Duration::ZERO, "alone");
    // Beside four other requests, it rests.
    set(5);
    upload(&e, "bob", &data).await;
    assert!(e.upload_rest() > std::time::Duration::ZERO, "beside others");
    // Its share the whole time: never.
    let e = engine(1.0);
    upload(&e, "alice", &data).await;
    assert_eq!(e.upload_rest(), std::time::Duration::ZERO, "share 1");
}

/// An upload dropped before its first chunk was stored leaves nothing; one
/// dropped after leaves nothing once its clean-up ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_uploads_leave_nothing() {
    let store = Arc::new(MemoryStore::new());
    let e = common::engine(store.clone());
    let alice = sign_up(&e, "alice").await;
    let item = e
        .create_item(&alice, "file", Default::default(), vec![])
        .await
        .unwrap();
    let id = item.item.id.clone();
    let rows = store.len();
    let mut up = e
        .begin_body(&alice, &id, None, "text/plain", None)
        .await
        .unwrap();
    up.write(b"not yet stored").await.unwrap();
    drop(up);
    assert_eq!(store.len(), rows, "nothing was written");
    let mut up = e
        .begin_body(&alice, &id, None, "text/plain", None)
        .await
        .unwrap();
    up.write(&vec![1u8; 1024 * 1024 + 1]).await.unwrap();
    assert_eq!(store.len(), rows + 5, "four chunks and the graveyard entry");
    drop(up);
    settle_rows(&store, rows).await;
}

/// Regression: replacing or deleting a body removed its chunks at once,
/// breaking downloads in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_in_progress_survive_replace_and_delete() {
    let store = Arc::new(MemoryStore::new());
    let e = common::engine(store.clone());
    let alice = sign_up(&e, "alice").await;
    let id = e
        .create_item(&alice, "file", Default::default(), vec![])
        .await
        .unwrap()
        .item
        .id;
    let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    let mut up = e
        .begin_body(&alice, &id, None, "application/octet-stream", None)
        .await
        .unwrap();
    up.write(&data).await.unwrap();
    up.finish(None).await.unwrap();
    let (_, reader) = e.open_body(&alice, &id, None).await.unwrap();
    let mut reader = reader.unwrap();
    let mut got = reader.next_chunk().await.unwrap().unwrap();
    assert!(got.len() < data.len(), "the download is under way");
    // Meanwhile the body is replaced, then the item deleted, and a sweep runs.
    let mut up = e
        .begin_body(&alice, &id, None, "text/plain", None)
        .await
        .unwrap();
    up.write(b"new").await.unwrap();
    up.finish(None).await.unwrap();
    e.delete_item(&alice, &id, None, None).await.unwrap();
    e.sweep_from(0).await.unwrap();
    while let Some(c) = reader.next_chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert_eq!(got, data, "the download reads the body it started on");
}

#[tokio::test]
async fn where_indexes_and_backfill() {
    let e = common::memory();
    let alice = sign_up(&e, "alice").await;
    let bob = sign_up(&e, "bob").await;
    let share_bob = vec![Grant {
        principal: Principal::User("bob".into()),
        role: Role::Viewer,
    }];
    // Items first, index after: the build must pick them up.
    let mut made = Vec::new();
    for (i, team) in ["red", "blue", "red", "red", "green", "blue"]
        .iter()
        .enumerate()
    {
        let acl = if i % 2 == 0 {
            share_bob.clone()
        } else {
            vec![]
        };
        let v = e
            .create_item(
                &alice,
                "member",
                props(json!({"team": team, "profile": {"last": format!("n{}", 9 - i)}})),
                acl,
            )
            .await
            .unwrap();
        made.push(v.item.id);
    }
    e.create_item(&alice, "other", props(json!({"team": "red"})), vec![])
        .await
        .unwrap();
    let sort = vec![SortField {
        field: "profile.last".into(),
        order: Order::Asc,
    }];
    e.declare_index(
        &admin(),
        "members-by-team",
        "member",
        vec!["team".into()],
        sort.clone(),
    )
    .await
    .unwrap();
    common::wait_ready(&e, "members-by-team").await;
    let q = |team: &str| ListQuery {
        kind: Some("member".into()),
        where_: vec![("team".into(), json!(team))],
        sort: sort.clone(),
        limit: 2,
        ..ListQuery::default()
    };
    let ids = |p: &tarn_engine::Page| {
        p.items
            .iter()
            .map(|v| v.item.id.clone())
            .collect::<Vec<_>>()
    };
    let p1 = e.list_items(&alice, &q("red")).await.unwrap();
    // Red: items 0, 2, 3 with last names n9, n7, n6: sorted n6, n7, n9.
    assert_eq!(ids(&p1), vec![made[3].clone(), made[2].clone()]);
    let p2 = e
        .list_items(
            &alice,
            &ListQuery {
                cursor: p1.next.clone(),
                ..q("red")
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&p2), vec![made[0].clone()]);
    assert!(p2.next.is_none());
    let bob_red = e.list_items(&bob, &q("red")).await.unwrap();
    assert_eq!(ids(&bob_red), vec![made[2].clone(), made[0].clone()]);
    // A listing with a where-field the index lacks has no index.
    let r = e
        .list_items(
            &alice,
            &ListQuery {
                where_: vec![],
                ..q("red")
            },
        )
        .await;
    assert!(matches!(r, Err(EngineError::NoIndex { .. })), "{r:?}");
    // Edits move items between partitions.
    e.patch_item(&alice, &made[0], None, &json!({"team": "blue"}), None)
        .await
        .unwrap();
    let red = e
        .list_items(
            &alice,
            &ListQuery {
                limit: 10,
                ..q("red")
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&red), vec![made[3].clone(), made[2].clone()]);
    // Dropping removes the index and its rows.
    // Its name is free at once; its declaration waits, under another
    // name, until its rows are gone.
    e.drop_index(&admin(), "members-by-team").await.unwrap();
    assert!(matches!(
        e.get_index(&admin(), "members-by-team").await,
        Err(EngineError::NotFound(_))
    ));
    let r = e.list_items(&alice, &q("red")).await;
    assert!(matches!(r, Err(EngineError::NoIndex { .. })), "{r:?}");
    let dropping = || async {
        e.list_indexes(&admin())
            .await
            .unwrap()
            .into_iter()
            .filter(|d| d.state == IndexState::Dropping)
            .count()
    };
    assert!(dropping().await <= 1);
    for _ in 0..200 {
        if dropping().await == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(dropping().await, 0, "the rows never went");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_if_match_edits_have_one_winner_per_version() {
    let (e, _dir) = common::sqlite();
    one_winner_per_version(e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_if_match_edits_on_postgres() {
    one_winner_per_version(common::postgres().await).await;
}

async fn one_winner_per_version(e: tarn_engine::Engine) {
    let alice = sign_up(&e, "alice").await;
    let item = e
        .create_item(&alice, "doc", Default::default(), vec![])
        .await
        .unwrap();
    let id = item.item.id;
    for version in 1..=5u64 {
        let mut tasks = Vec::new();
        for w in 0..8 {
            let e = e.clone();
            let id = id.clone();
            let alice = alice.clone();
            tasks.push(tokio::spawn(async move {
                e.patch_item(&alice, &id, None, &json!({ "w": w }), Some(version))
                    .await
            }));
        }
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(v) => {
                    ok += 1;
                    assert_eq!(v.item.version, version + 1);
                }
                Err(EngineError::VersionMismatch { .. }) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(ok, 1, "version {version}");
    }
}

/// Holds the first write that opens a session until released, so a test
/// can land a password reset between a sign-in's check and its write.
struct HoldFirstSession {
    inner: MemoryStore,
    arrived: tokio::sync::Notify,
    release: tokio::sync::Notify,
    held: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl tarn_store::Store for HoldFirstSession {
    async fn snapshot(&self) -> tarn_store::StoreResult<Box<dyn tarn_store::Snapshot>> {
        self.inner.snapshot().await
    }

    async fn write(&self, batch: tarn_store::Batch) -> tarn_store::StoreResult<()> {
        let opens = batch.ops.iter().any(
            |op| matches!(op, tarn_store::Op::Put { key, .. } if key.table.name() == "sessions"),
        );
        if opens && !self.held.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.arrived.notify_one();
            self.release.notified().await;
        }
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

/// Regression: a sign-in checked the old password, then a reset changed
/// it and ended every session it found, then the sign-in wrote its
/// session: a session opened with the old password outlived the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_racing_a_sign_in_leaves_no_session_with_the_old_password() {
    let store = Arc::new(HoldFirstSession {
        inner: MemoryStore::new(),
        arrived: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
        held: false.into(),
    });
    let e = common::engine(store.clone());
    sign_up(&e, "ann").await;
    let signing_in = {
        let e = e.clone();
        tokio::spawn(async move { e.sign_in("ann", "ann-password").await })
    };
    store.arrived.notified().await;
    e.reset_password(&admin(), "ann", "a-brand-new-password")
        .await
        .unwrap();
    store.release.notify_one();
    let r = signing_in.await.unwrap();
    assert!(
        matches!(r, Err(EngineError::Unauthenticated(_))),
        "the old password opened a session after the reset: {:?}",
        r.map(|(t, _)| t)
    );
    assert!(e.sign_in("ann", "a-brand-new-password").await.is_ok());
}
