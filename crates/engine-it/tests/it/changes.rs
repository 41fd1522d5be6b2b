//! The change feed and live subscriptions: what each caller sees, in commit
//! order, exactly once, across membership changes, lag and retention.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tarn_engine::{
    Caller, ChangeOp, Engine, EngineConfig, EngineError, Event, Grant, Principal, Role,
    Subscription,
};

use crate::common::{self, props, sign_up};

fn share(p: Principal) -> Vec<Grant> {
    vec![Grant {
        principal: p,
        role: Role::Viewer,
    }]
}

fn user(n: &str) -> Principal {
    Principal::User(n.into())
}

/// The next event within a generous time, or a failure saying what was
/// awaited.
async fn next(sub: &mut Subscription, what: &str) -> Event {
    match tokio::time::timeout(Duration::from_secs(10), sub.next()).await {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => panic!("{what}: {e:?}"),
        Err(_) => panic!("{what}: no event"),
    }
}

async fn no_event(sub: &mut Subscription) {
    if let Ok(e) = tokio::time::timeout(Duration::from_millis(400), sub.next()).await {
        panic!("expected nothing, got {e:?}");
    }
}

fn put_of(e: Event) -> String {
    match e {
        Event::Change(c) if c.op == ChangeOp::Put => c.id.clone(),
        other => panic!("expected a put, got {other:?}"),
    }
}

fn remove_of(e: Event) -> String {
    match e {
        Event::Change(c) if c.op == ChangeOp::Remove => {
            assert!(c.item.is_none(), "a remove says nothing of the item");
            c.id.clone()
        }
        other => panic!("expected a remove, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_show_each_caller_what_they_may_read() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    let cat = sign_up(&e, "cat").await;
    let start = e.changes(&bob, None, None, 50).await.unwrap();
    assert!(start.changes.is_empty(), "without since: the current end");
    let a = e
        .create_item(&ann, "doc", props(json!({"t": 1})), share(user("bob")))
        .await
        .unwrap()
        .item
        .id;
    let b = e
        .create_item(&ann, "note", props(json!({})), share(Principal::Everyone))
        .await
        .unwrap()
        .item
        .id;
    e.patch_item(&ann, &a, None, &json!({"t": 2}), None)
        .await
        .unwrap();
    // Unshared from bob, then deleted.
    e.set_acl(
        &ann,
        &a,
        None,
        vec![Grant {
            principal: user("ann"),
            role: Role::Manager,
        }],
        None,
    )
    .await
    .unwrap();
    e.delete_item(&ann, &b, None, None).await.unwrap();
    let page = e.changes(&bob, Some(&start.next), None, 50).await.unwrap();
    let seen: Vec<(ChangeOp, String, u64)> = page
        .changes
        .iter()
        .map(|c| (c.op, c.id.clone(), c.version))
        .collect();
    assert_eq!(
        seen,
        vec![
            (ChangeOp::Put, a.clone(), 1),
            (ChangeOp::Put, b.clone(), 1),
            (ChangeOp::Put, a.clone(), 2),
            // A remove carries the last version its reader could read, so
            // an unshare (which made `a` version 3) reads like a delete.
            (ChangeOp::Remove, a.clone(), 2),
            (ChangeOp::Remove, b.clone(), 1),
        ]
    );
    let put = page.changes[2].item.as_ref().unwrap();
    assert_eq!(
        put.item.properties.map()["t"],
        2,
        "a put carries the item at its version"
    );
    assert_eq!(put.role, Role::Viewer);
    // Paging: the same changes two at a time, and caught up at the end.
    let mut cursor = start.next.clone();
    let mut paged = Vec::new();
    loop {
        let p = e.changes(&bob, Some(&cursor), None, 2).await.unwrap();
        paged.extend(p.changes.iter().map(|c| (c.id.clone(), c.version)));
        cursor = p.next;
        if p.changes.len() < 2 {
            break;
        }
    }
    // (Cursors are not compared: no two look alike, even of one change.)
    let all: Vec<_> = page
        .changes
        .iter()
        .map(|c| (c.id.clone(), c.version))
        .collect();
    assert_eq!(paged, all);
    // A kind filter, and a stranger, and anonymous.
    let notes = e
        .changes(&bob, Some(&start.next), Some("note"), 50)
        .await
        .unwrap();
    assert_eq!(notes.changes.len(), 2);
    let cat_sees = e.changes(&cat, Some(&start.next), None, 50).await.unwrap();
    assert_eq!(
        cat_sees.changes.len(),
        2,
        "only the public item: {cat_sees:?}"
    );
    let anon = e
        .changes(&Caller::Anonymous, Some(&start.next), None, 50)
        .await
        .unwrap();
    assert_eq!(anon.changes.len(), 2);
    for bad in ["", "!!", "AQ", "x".repeat(500).as_str(), "AAAA"] {
        assert!(
            matches!(
                e.changes(&bob, Some(bad), None, 50).await,
                Err(EngineError::InvalidInput(_))
            ),
            "{bad:?}"
        );
    }
}

/// A poller was never told when its groups changed: items that came or
/// went with a join or a leave made no change of their own, and its view
/// went stale in silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_say_when_the_callers_groups_changed() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    sign_up(&e, "cat").await;
    for g in ["room", "team", "hall", "club"] {
        e.create_group(&ann, g, None, Default::default())
            .await
            .unwrap();
    }
    let pull = |since: String| {
        let (e, bob) = (e.clone(), bob.clone());
        async move { e.changes(&bob, Some(&since), None, 1).await.unwrap() }
    };
    // A write bob sees, one page each.
    let to_bob = || e.create_item(&ann, "doc", props(json!({})), share(user("bob")));
    let mut at = e.changes(&bob, None, None, 1).await.unwrap().next;
    // Others' memberships: no resync.
    e.add_member(&ann, "room", &user("cat")).await.unwrap();
    to_bob().await.unwrap();
    let page = pull(at).await;
    assert_eq!(page.changes.len(), 1);
    assert!(!page.resync, "cat's join is not bob's");
    at = page.next;
    // A nesting of a group bob joins only later: not his change then.
    let club = Principal::Group("club".into());
    e.add_member(&ann, "hall", &club).await.unwrap();
    to_bob().await.unwrap();
    e.add_member(&ann, "club", &user("bob")).await.unwrap();
    to_bob().await.unwrap();
    let page = pull(at).await;
    assert!(!page.resync, "club joined hall before bob joined club");
    let page = pull(page.next).await;
    assert!(page.resync, "bob's join");
    at = page.next;
    // A group bob is in joins another; bob leaves: each a resync, on the
    // page that covers it and not the next.
    let team = Principal::Group("team".into());
    e.add_member(&ann, "team", &user("bob")).await.unwrap();
    to_bob().await.unwrap();
    e.add_member(&ann, "hall", &team).await.unwrap();
    to_bob().await.unwrap();
    for what in ["join", "nesting"] {
        let page = pull(at).await;
        assert!(page.resync, "{what}");
        at = page.next;
    }
    e.remove_member(&bob, "team", &user("bob")).await.unwrap();
    to_bob().await.unwrap();
    to_bob().await.unwrap();
    let page = pull(at).await;
    assert!(page.resync, "leave");
    at = page.next;
    let page = pull(at).await;
    assert_eq!(page.changes.len(), 1);
    assert!(!page.resync, "a write after the leave");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_follow_memberships() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    e.create_group(&ann, "room", None, Default::default())
        .await
        .unwrap();
    let mut sub = e.subscribe(&bob, None, Some("message")).await.unwrap();
    // Not yet a member: nothing.
    e.create_item(
        &ann,
        "message",
        props(json!({})),
        share(Principal::Group("room".into())),
    )
    .await
    .unwrap();
    no_event(&mut sub).await;
    // Joining: a resync, then the room's messages.
    e.add_member(&ann, "room", &user("bob")).await.unwrap();
    assert!(matches!(next(&mut sub, "join").await, Event::Resync));
    let m = e
        .create_item(
            &ann,
            "message",
            props(json!({"text": "hi"})),
            share(Principal::Group("room".into())),
        )
        .await
        .unwrap()
        .item
        .id;
    assert_eq!(put_of(next(&mut sub, "message").await), m);
    // Other kinds are filtered out.
    e.create_item(&ann, "doc", props(json!({})), share(user("bob")))
        .await
        .unwrap();
    no_event(&mut sub).await;
    // Leaving: a resync, then nothing more from the room.
    e.remove_member(&bob, "room", &user("bob")).await.unwrap();
    assert!(matches!(next(&mut sub, "leave").await, Event::Resync));
    e.create_item(
        &ann,
        "message",
        props(json!({})),
        share(Principal::Group("room".into())),
    )
    .await
    .unwrap();
    no_event(&mut sub).await;
    // Nesting a group bob is in under the room reaches him too.
    e.create_group(&bob, "team", None, Default::default())
        .await
        .unwrap();
    e.add_member(&bob, "team", &user("bob")).await.unwrap();
    assert!(matches!(next(&mut sub, "team").await, Event::Resync));
    e.add_member(&ann, "room", &Principal::Group("team".into()))
        .await
        .unwrap();
    assert!(matches!(next(&mut sub, "nested").await, Event::Resync));
    let m2 = e
        .create_item(
            &ann,
            "message",
            props(json!({})),
            share(Principal::Group("room".into())),
        )
        .await
        .unwrap()
        .item
        .id;
    assert_eq!(put_of(next(&mut sub, "nested message").await), m2);
}

/// Posts a message shared with group `to`; its id.
async fn message_to(e: &Engine, author: &Caller, to: &str) -> String {
    e.create_item(
        author,
        "message",
        props(json!({})),
        share(Principal::Group(to.into())),
    )
    .await
    .unwrap()
    .item
    .id
}

/// A change made before the caller joined the group it names was never
/// the caller's to see: a pull or a stream from an older cursor leaves it
/// out (here a secret, edited away before carol joined), directly or
/// through a nested group, and shows what came after the join.
async fn joiners_see_only_what_came_after_they_joined(e: Engine) {
    let sfx = rand_suffix();
    let ann = sign_up(&e, &format!("ann{sfx}")).await;
    let carol_name = format!("carol{sfx}");
    let carol = sign_up(&e, &carol_name).await;
    let (team, sub) = (format!("team{sfx}"), format!("sub{sfx}"));
    for g in [&team, &sub] {
        e.create_group(&ann, g, None, Default::default())
            .await
            .unwrap();
    }
    e.add_member(&ann, &team, &Principal::Group(sub.clone()))
        .await
        .unwrap();
    let start = e.changes(&carol, None, None, 1).await.unwrap().next;
    let mut ids = Vec::new();
    for to in [&team, &sub] {
        let id = e
            .create_item(
                &ann,
                "doc",
                props(json!({"secret": "s3cr3t"})),
                share(Principal::Group(to.clone())),
            )
            .await
            .unwrap()
            .item
            .id;
        e.patch_item(&ann, &id, None, &json!({"secret": null}), None)
            .await
            .unwrap();
        ids.push(id);
    }
    // carol joins team directly, and sub (inside team) too.
    e.add_member(&ann, &team, &user(&carol_name)).await.unwrap();
    e.add_member(&ann, &sub, &user(&carol_name)).await.unwrap();
    // Added again: still a member since the first time.
    e.add_member(&ann, &team, &user(&carol_name)).await.unwrap();
    for id in &ids {
        e.patch_item(&ann, id, None, &json!({"after": true}), None)
            .await
            .unwrap();
    }
    // A store may show a commit to the feed a little later (on PostgreSQL,
    // while any other transaction of the database that began before it
    // runs, such as another test's): read again until both edits show.
    let mut tries = 0;
    let seen: Vec<(String, u64, bool)> = loop {
        let page = e.changes(&carol, Some(&start), None, 50).await.unwrap();
        let seen: Vec<_> = page
            .changes
            .iter()
            .map(|c| {
                let secret = c
                    .item
                    .as_ref()
                    .is_some_and(|v| v.item.properties.map().contains_key("secret"));
                (c.id.clone(), c.version, secret)
            })
            .collect();
        tries += 1;
        if seen.len() >= 2 || tries == 100 {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        seen,
        vec![(ids[0].clone(), 3, false), (ids[1].clone(), 3, false)],
        "only the edits made after carol joined"
    );
    let mut stream = e.subscribe(&carol, Some(&start), None).await.unwrap();
    for what in ["joined team", "joined sub", "added again"] {
        assert!(matches!(next(&mut stream, what).await, Event::Resync));
    }
    for id in &ids {
        match next(&mut stream, "an edit after the join").await {
            Event::Change(c) => {
                assert_eq!((&c.id, c.version), (id, 3));
            }
            other => panic!("expected the edit, got {other:?}"),
        }
    }
    no_event(&mut stream).await;
}

/// A group reached two ways counts from the earlier join, and so do the
/// groups above it: carol is in hall through sub and team since before the
/// post, and joins team directly only after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_earlier_way_into_a_group_counts_for_the_groups_above_it() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let carol = sign_up(&e, "carol").await;
    for g in ["hall", "sub", "team"] {
        e.create_group(&ann, g, None, Default::default())
            .await
            .unwrap();
    }
    e.add_member(&ann, "hall", &Principal::Group("team".into()))
        .await
        .unwrap();
    e.add_member(&ann, "team", &Principal::Group("sub".into()))
        .await
        .unwrap();
    e.add_member(&ann, "sub", &user("carol")).await.unwrap();
    let start = e.changes(&carol, None, None, 1).await.unwrap().next;
    let post = message_to(&e, &ann, "hall").await;
    e.add_member(&ann, "team", &user("carol")).await.unwrap();
    let page = e.changes(&carol, Some(&start), None, 50).await.unwrap();
    let ids: Vec<&str> = page.changes.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, vec![post.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiners_see_only_what_came_after_they_joined_in_memory() {
    joiners_see_only_what_came_after_they_joined(common::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiners_see_only_what_came_after_they_joined_on_sqlite() {
    let (e, _dir) = common::sqlite();
    joiners_see_only_what_came_after_they_joined(e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiners_see_only_what_came_after_they_joined_on_postgres() {
    joiners_see_only_what_came_after_they_joined(common::postgres().await).await;
}

/// Regression: a stream that read a join after the matching leave had
/// committed took the groups the store held then (no longer in the room)
/// and dropped the room's messages posted in between; `tarn bench chat`
/// on two nodes, where streams lag, counted them as missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_read_after_the_leave_still_delivers_what_came_between() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    e.create_group(&ann, "room", None, Default::default())
        .await
        .unwrap();
    e.create_group(&ann, "hall", None, Default::default())
        .await
        .unwrap();
    // bob reaches hall both directly and through team: leaving hall
    // directly loses nothing.
    e.create_group(&ann, "team", None, Default::default())
        .await
        .unwrap();
    e.add_member(&ann, "team", &user("bob")).await.unwrap();
    e.add_member(&ann, "hall", &Principal::Group("team".into()))
        .await
        .unwrap();
    e.add_member(&ann, "hall", &user("bob")).await.unwrap();
    let start = e.changes(&bob, None, None, 1).await.unwrap().next;
    let post = |to: &'static str| message_to(&e, &ann, to);
    e.add_member(&ann, "room", &user("bob")).await.unwrap();
    let while_member = post("room").await;
    e.remove_member(&bob, "room", &user("bob")).await.unwrap();
    let after_leaving = post("room").await;
    e.remove_member(&ann, "hall", &user("bob")).await.unwrap();
    let still_in_hall = post("hall").await;
    // Everything above has committed before the stream reads its entries.
    let mut sub = e.subscribe(&bob, Some(&start), None).await.unwrap();
    assert!(matches!(next(&mut sub, "join").await, Event::Resync));
    assert_eq!(
        put_of(next(&mut sub, "posted while a member").await),
        while_member
    );
    assert!(matches!(next(&mut sub, "leave").await, Event::Resync));
    assert!(matches!(next(&mut sub, "leave hall").await, Event::Resync));
    let got = put_of(next(&mut sub, "hall, reached through team").await);
    assert_ne!(got, after_leaving, "posted after bob left the room");
    assert_eq!(got, still_in_hall);
    no_event(&mut sub).await;
}

/// ann, and bob in group `team`, itself in group `hall` (both ann's).
async fn bob_in_team_in_hall() -> (Engine, Caller, Caller) {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    for g in ["team", "hall"] {
        e.create_group(&ann, g, None, Default::default())
            .await
            .unwrap();
    }
    e.add_member(&ann, "team", &user("bob")).await.unwrap();
    e.add_member(&ann, "hall", &Principal::Group("team".into()))
        .await
        .unwrap();
    (e, ann, bob)
}

/// A group leaving a group says nothing of who loses what: a stream behind
/// the store narrows its groups to the store's at that entry, so nothing
/// shared with the group left reaches it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_leaving_a_group_narrows_a_lagging_stream() {
    let (e, ann, bob) = bob_in_team_in_hall().await;
    // Subscribed now, read after every write below has committed.
    let mut sub = e.subscribe(&bob, None, None).await.unwrap();
    let post = |to: &'static str| message_to(&e, &ann, to);
    let before = post("hall").await;
    e.remove_member(&ann, "hall", &Principal::Group("team".into()))
        .await
        .unwrap();
    post("hall").await;
    let to_team = post("team").await;
    assert_eq!(put_of(next(&mut sub, "hall, before").await), before);
    assert!(matches!(next(&mut sub, "unnested").await, Event::Resync));
    assert_eq!(put_of(next(&mut sub, "team, not hall").await), to_team);
    no_event(&mut sub).await;
}

/// The same, resumed from a cursor taken before it all: the stream replays
/// from the store past the entry that makes it read its groups again, and
/// still delivers every change after it (it used to jump to the hub's place
/// there and skip the rest of the replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_stream_replays_past_a_group_leaving_a_group() {
    let (e, ann, bob) = bob_in_team_in_hall().await;
    let start = e.changes(&bob, None, None, 1).await.unwrap().next;
    // A stream open before the writes starts the node's hub, whose place
    // is past all of them when bob resumes.
    let _live = e.subscribe(&ann, None, None).await.unwrap();
    let post = |to: &'static str| message_to(&e, &ann, to);
    e.remove_member(&ann, "hall", &Principal::Group("team".into()))
        .await
        .unwrap();
    post("hall").await;
    let to_team = post("team").await;
    let to_bob = e
        .create_item(&ann, "message", props(json!({})), share(user("bob")))
        .await
        .unwrap()
        .item
        .id;
    // The hub reads the feed at least every 50 ms.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut sub = e.subscribe(&bob, Some(&start), None).await.unwrap();
    assert!(matches!(next(&mut sub, "unnested").await, Event::Resync));
    assert_eq!(put_of(next(&mut sub, "team, not hall").await), to_team);
    assert_eq!(put_of(next(&mut sub, "bob's own").await), to_bob);
    no_event(&mut sub).await;
}

/// A group lost and joined again while a resumed stream replays: what
/// came between was not the caller's (the stream used to keep the group
/// from before the loss, with no place it was joined at, and delivered the
/// edit made while the caller was out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_lost_and_joined_again_hides_what_came_between() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    for g in ["team", "hall"] {
        e.create_group(&ann, g, None, Default::default())
            .await
            .unwrap();
    }
    e.add_member(&ann, "team", &user("bob")).await.unwrap();
    let hall = Principal::Group("hall".into());
    let team = Principal::Group("team".into());
    let y = e
        .create_item(&ann, "doc", props(json!({"s": "open"})), share(hall))
        .await
        .unwrap()
        .item
        .id;
    let start = e.changes(&bob, None, None, 1).await.unwrap().next;
    e.add_member(&ann, "hall", &team).await.unwrap();
    e.remove_member(&ann, "hall", &team).await.unwrap();
    e.patch_item(
        &ann,
        &y,
        None,
        &json!({"properties": {"s": "secret"}}),
        None,
    )
    .await
    .unwrap();
    e.add_member(&ann, "hall", &user("bob")).await.unwrap();
    let after = message_to(&e, &ann, "hall").await;
    let mut sub = e.subscribe(&bob, Some(&start), None).await.unwrap();
    loop {
        match next(&mut sub, "the message after the join").await {
            Event::Resync => {}
            Event::Change(c) => {
                assert_ne!(c.id, y, "the edit made while bob was out: {c:?}");
                assert_eq!(c.id, after);
                break;
            }
        }
    }
    no_event(&mut sub).await;
    let page = e.changes(&bob, Some(&start), None, 100).await.unwrap();
    assert!(page.changes.iter().all(|c| c.id != y), "{:?}", page.changes);
    assert!(page.changes.iter().any(|c| c.id == after));
}

/// A change shows the item with the role the caller had then: joining a
/// group that manages it later does not show the old versions as a
/// manager's (with their ACLs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_shows_the_role_the_caller_had_then() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    e.create_group(&ann, "owners", None, Default::default())
        .await
        .unwrap();
    let start = e.changes(&bob, None, None, 1).await.unwrap().next;
    let acl = vec![
        Grant {
            principal: user("bob"),
            role: Role::Viewer,
        },
        Grant {
            principal: Principal::Group("owners".into()),
            role: Role::Manager,
        },
    ];
    let x = e
        .create_item(&ann, "doc", props(json!({})), acl)
        .await
        .unwrap()
        .item
        .id;
    e.add_member(&ann, "owners", &user("bob")).await.unwrap();
    e.patch_item(&ann, &x, None, &json!({"properties": {"v": 2}}), None)
        .await
        .unwrap();
    let page = e.changes(&bob, Some(&start), None, 100).await.unwrap();
    let roles: Vec<Role> = page
        .changes
        .iter()
        .filter(|c| c.id == x)
        .map(|c| c.item.as_ref().expect("a put").role)
        .collect();
    assert_eq!(roles, [Role::Viewer, Role::Manager], "{:?}", page.changes);
    let mut sub = e.subscribe(&bob, Some(&start), None).await.unwrap();
    let mut streamed = Vec::new();
    while streamed.len() < 2 {
        if let Event::Change(c) = next(&mut sub, "both versions").await {
            streamed.push(c.item.expect("a put").role);
        }
    }
    assert_eq!(streamed, [Role::Viewer, Role::Manager]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_from_a_cursor_misses_nothing() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    let start = e.changes(&bob, None, None, 1).await.unwrap().next;
    let mut made = Vec::new();
    for i in 0..5 {
        made.push(
            e.create_item(&ann, "doc", props(json!({ "i": i })), share(user("bob")))
                .await
                .unwrap()
                .item
                .id,
        );
    }
    let mut sub = e.subscribe(&bob, Some(&start), None).await.unwrap();
    for i in 5..8 {
        made.push(
            e.create_item(&ann, "doc", props(json!({ "i": i })), share(user("bob")))
                .await
                .unwrap()
                .item
                .id,
        );
    }
    let mut got = Vec::new();
    for _ in 0..8 {
        got.push(put_of(next(&mut sub, "replay then live").await));
    }
    assert_eq!(got, made, "every change once, in commit order");
    no_event(&mut sub).await;
    // Removal when the item is deleted.
    e.delete_item(&ann, &made[0], None, None).await.unwrap();
    assert_eq!(remove_of(next(&mut sub, "delete").await), made[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_subscriber_catches_up_from_the_store() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    let mut sub = e.subscribe(&bob, None, None).await.unwrap();
    // Far more changes than a subscriber's queue holds, while bob reads
    // nothing.
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (e, ann) = (e.clone(), ann.clone());
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..1500 {
                let v = e
                    .create_item(
                        &ann,
                        "doc",
                        props(json!({ "w": w, "i": i })),
                        share(user("bob")),
                    )
                    .await
                    .unwrap();
                ids.push(v.item.id);
            }
            ids
        }));
    }
    let mut made = std::collections::HashSet::new();
    for t in tasks {
        made.extend(t.await.unwrap());
    }
    let mut got = Vec::new();
    while got.len() < made.len() {
        got.push(put_of(next(&mut sub, "catching up").await));
    }
    let unique: std::collections::HashSet<String> = got.iter().cloned().collect();
    assert_eq!(unique.len(), got.len(), "no change twice");
    assert_eq!(unique, made, "no change missed");
    no_event(&mut sub).await;
}

#[tokio::test]
async fn old_cursors_are_gone_and_streams_are_limited() {
    let e = Engine::new(
        Arc::new(tarn_store::memory::MemoryStore::new()),
        EngineConfig {
            feed_retention: Duration::from_millis(50),
            max_streams_per_user: 2,
            ..common::config()
        },
    );
    let ann = sign_up(&e, "ann").await;
    let start = e.changes(&ann, None, None, 1).await.unwrap().next;
    for _ in 0..5 {
        e.create_item(&ann, "doc", props(json!({})), vec![])
            .await
            .unwrap();
    }
    // The stepping clock moves a millisecond a reading: after a hundred
    // more writes, the first five are old.
    for _ in 0..100 {
        e.create_group(
            &common::admin(),
            &format!("g{}", rand_suffix()),
            None,
            Default::default(),
        )
        .await
        .unwrap();
    }
    assert!(e.trim_changes().await.unwrap() >= 5);
    assert!(matches!(
        e.changes(&ann, Some(&start), None, 10).await,
        Err(EngineError::Gone(_))
    ));
    let mut sub = e.subscribe(&ann, Some(&start), None).await.unwrap();
    assert!(matches!(next(&mut sub, "too old").await, Event::Resync));
    let _second = e.subscribe(&ann, None, None).await.unwrap();
    assert!(matches!(
        e.subscribe(&ann, None, None).await,
        Err(EngineError::RateLimited { .. })
    ));
    drop(sub);
    let _third = e
        .subscribe(&ann, None, None)
        .await
        .expect("a closed stream frees its place");
    // Callers signed in as no one count per client address: one address
    // cannot take every stream of the node.
    let anon = |at: &'static str| e.subscribe_from(&Caller::Anonymous, None, None, Some(at));
    let _a = anon("192.0.2.1").await.unwrap();
    let _b = anon("192.0.2.1").await.unwrap();
    match anon("192.0.2.1").await {
        Err(EngineError::RateLimited { detail, .. }) => assert!(
            detail.contains("from this address"),
            "the refusal names what is counted: {detail}"
        ),
        _ => panic!("a third stream from one address is refused"),
    }
    anon("192.0.2.2").await.expect("another address");
    // A user's streams are the user's, whatever the address.
    match e.subscribe_from(&ann, None, None, Some("192.0.2.3")).await {
        Err(EngineError::RateLimited { detail, .. }) => {
            assert!(detail.contains("for this user"), "{detail}")
        }
        _ => panic!("a user's third stream is refused"),
    }
}

/// A stream that fell behind (its queue overflowed, so it catches up from
/// the store) and finds the entries after its place trimmed away is told
/// to resync: it never goes on as if nothing was missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_behind_the_kept_changes_resyncs() {
    let e = Engine::new(
        Arc::new(tarn_store::memory::MemoryStore::new()),
        EngineConfig {
            feed_retention: Duration::from_millis(50),
            ..common::config()
        },
    );
    let ann = sign_up(&e, "ann").await;
    let mut sub = e.subscribe(&ann, None, None).await.unwrap();
    // More than a stream's queue holds, read by no one.
    let mut made = 0;
    for round in 0..12 {
        for _ in 0..100 {
            e.create_item(&ann, "doc", props(json!({"round": round})), vec![])
                .await
                .unwrap();
            made += 1;
        }
        // The hub reads them as they come (it is not the one behind).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The stepping clock moves a millisecond a reading: all but the last
    // few dozen are old now.
    assert!(e.trim_changes().await.unwrap() >= 1_000);
    let mut puts = 0;
    loop {
        match next(&mut sub, "a resync after the queued changes").await {
            Event::Change(_) => puts += 1,
            Event::Resync => break,
        }
        assert!(puts < made, "every change came, and no resync");
    }
    assert!(puts < made, "{puts} of {made} came before the resync");
    // The stream goes on from the end.
    let id = e
        .create_item(&ann, "doc", props(json!({})), vec![])
        .await
        .unwrap()
        .item
        .id;
    assert_eq!(put_of(next(&mut sub, "after the resync").await), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_on_sqlite_and_a_second_node() {
    // Two engines on one SQLite store stand for two nodes: a change written
    // through one reaches the other's subscribers.
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn tarn_store::Store> =
        Arc::new(tarn_store_sqlite::SqliteStore::open(dir.path()).unwrap());
    let a = common::engine(store.clone());
    let b = common::engine(store);
    let ann = sign_up(&a, "ann").await;
    let bob = sign_up(&a, "bob").await;
    let mut sub = b.subscribe(&bob, None, None).await.unwrap();
    let id = a
        .create_item(&ann, "doc", props(json!({})), share(user("bob")))
        .await
        .unwrap()
        .item
        .id;
    assert_eq!(put_of(next(&mut sub, "from the other node").await), id);
}

fn rand_suffix() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    u64::from_le_bytes(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_on_cassandra_across_two_stores() {
    // Two engines on one keyspace stand for two nodes.
    let store: Arc<dyn tarn_store::Store> = Arc::new(common::cassandra_store().await);
    let a = common::engine(store.clone());
    let b = common::engine(store);
    let ann = sign_up(&a, "ann").await;
    let bob = sign_up(&a, "bob").await;
    // The end handed out after a write comes after it, though the feed
    // shows it only a moment later.
    a.create_item(
        &ann,
        "doc",
        props(json!({"before": true})),
        share(user("bob")),
    )
    .await
    .unwrap();
    let start = b.changes(&bob, None, None, 10).await.unwrap().next;
    let mut sub = b.subscribe(&bob, None, None).await.unwrap();
    let mut made = Vec::new();
    for i in 0..5 {
        made.push(
            a.create_item(&ann, "doc", props(json!({ "i": i })), share(user("bob")))
                .await
                .unwrap()
                .item
                .id,
        );
    }
    // Pulls from just after them, on the other store, get them all, once
    // each, in order (the first waits until the feed shows them, unless a
    // write still landing holds it back longer).
    let mut ids: Vec<String> = Vec::new();
    let mut cursor = start;
    let asked = std::time::Instant::now();
    while ids.len() < made.len() && asked.elapsed() < Duration::from_secs(30) {
        let page = b.changes(&bob, Some(&cursor), None, 50).await.unwrap();
        ids.extend(page.changes.into_iter().map(|c| c.id));
        cursor = page.next;
    }
    assert_eq!(ids, made);
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(put_of(next(&mut sub, "from the other store").await));
    }
    assert_eq!(got, made);
}

/// A store whose feed shows an entry only `shows_after` its write (as
/// Cassandra's does, its lag after it or later while a write lands late),
/// on tokio's clock, over the in-memory store; it says its lag is `lag`.
struct Lagging {
    inner: tarn_store::memory::MemoryStore,
    lag: Duration,
    shows_after: Duration,
    /// When each write landed, and the feed's end after it.
    writes: std::sync::Mutex<Vec<(tokio::time::Instant, Vec<u8>)>>,
}

const LAG: Duration = Duration::from_secs(1);

impl Lagging {
    fn new(lag: Duration, shows_after: Duration) -> Lagging {
        Lagging {
            inner: tarn_store::memory::MemoryStore::new(),
            lag,
            shows_after,
            writes: Default::default(),
        }
    }
}

fn feed() -> tarn_store::Table {
    tarn_store::Table::named("changes").unwrap()
}

#[async_trait::async_trait]
impl tarn_store::Store for Lagging {
    async fn snapshot(&self) -> tarn_store::StoreResult<Box<dyn tarn_store::Snapshot>> {
        let now = tokio::time::Instant::now();
        let shown = self
            .writes
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(at, _)| now.duration_since(*at) >= self.shows_after)
            .map(|(_, end)| end.clone());
        Ok(Box::new(LaggingSnapshot {
            inner: self.inner.snapshot().await?,
            shown,
        }))
    }

    async fn write(&self, batch: tarn_store::Batch) -> tarn_store::StoreResult<()> {
        self.inner.write(batch).await?;
        let end = self.inner.snapshot().await?.feed_end(feed()).await?;
        self.writes
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), end));
        Ok(())
    }

    fn consistency(&self) -> tarn_store::Consistency {
        self.inner.consistency()
    }

    fn feed_lag(&self) -> Duration {
        self.lag
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

/// A snapshot showing feed entries up to `shown` only.
struct LaggingSnapshot {
    inner: Box<dyn tarn_store::Snapshot>,
    shown: Option<Vec<u8>>,
}

#[async_trait::async_trait]
impl tarn_store::Snapshot for LaggingSnapshot {
    async fn read(
        &mut self,
        gets: &[tarn_store::Key],
        scans: &[tarn_store::Scan],
    ) -> tarn_store::StoreResult<tarn_store::ReadResult> {
        self.inner.read(gets, scans).await
    }

    async fn read_feed(
        &mut self,
        feed: tarn_store::Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> tarn_store::StoreResult<Vec<tarn_store::FeedEntry>> {
        let entries = self.inner.read_feed(feed, after, limit).await?;
        let shown = self.shown.as_deref();
        Ok(entries
            .into_iter()
            .take_while(|e| shown.is_some_and(|s| e.cursor.as_slice() <= s))
            .collect())
    }

    async fn scan_all(
        &mut self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> tarn_store::StoreResult<(Vec<(tarn_store::Key, tarn_store::Row)>, Option<Vec<u8>>)> {
        self.inner.scan_all(cursor, limit).await
    }

    async fn feed_end(&mut self, feed: tarn_store::Table) -> tarn_store::StoreResult<Vec<u8>> {
        self.inner.feed_end(feed).await
    }

    async fn feed_readable(
        &mut self,
        _feed: tarn_store::Table,
    ) -> tarn_store::StoreResult<Vec<u8>> {
        // Cursors are never empty: an empty one is before every entry.
        Ok(self.shown.clone().unwrap_or_default())
    }
}

/// On a store whose feed lags, a pull waits out the lag only when it
/// reaches the readable end: full pages of earlier changes are answered at
/// once (every page waited a second, so paging through history on
/// Cassandra took a second a page), and the last page, read again after
/// the lag, holds the changes committed just before it was asked. Time
/// here is tokio's paused clock.
#[tokio::test]
async fn full_pages_do_not_wait_for_a_lagging_feed() {
    let store = Arc::new(Lagging::new(LAG, LAG));
    let e = common::engine(store);
    let ann = sign_up(&e, "ann").await;
    let mut cursor = e.changes(&ann, None, None, 1).await.unwrap().next;
    let create = |n: usize| {
        let (e, ann) = (e.clone(), ann.clone());
        async move {
            e.create_item(&ann, "doc", props(json!({ "n": n })), vec![])
                .await
                .unwrap()
                .item
                .id
        }
    };
    let mut made = Vec::new();
    for n in 0..25 {
        made.push(create(n).await);
    }
    tokio::time::pause();
    tokio::time::advance(2 * LAG).await;
    let start = tokio::time::Instant::now();
    let mut seen = Vec::new();
    for (page, want, waited) in [(1, 10, false), (2, 10, false), (3, 8, true)] {
        if page == 3 {
            // Committed now: the feed shows them a second later.
            for n in 25..28 {
                made.push(create(n).await);
            }
        }
        let got = e.changes(&ann, Some(&cursor), None, 10).await.unwrap();
        assert_eq!(got.changes.len(), want, "page {page}");
        assert_eq!(
            start.elapsed() >= LAG,
            waited,
            "page {page} waited for the lag: {waited}"
        );
        seen.extend(got.changes.into_iter().map(|c| c.id));
        cursor = got.next;
    }
    assert_eq!(seen, made);
}

/// On a store whose feed lags, a pull that reaches the readable end waits
/// until the feed is readable through the moment it was asked, and no
/// longer: the store's lag and the look after the feed showed the change
/// (a pull waited out a fixed lag, a second on Cassandra, whatever the
/// feed), and a second at most while a write landing late holds the feed
/// back; the change then comes on the next poll, not skipped. Time is
/// tokio's paused clock.
#[tokio::test]
async fn a_pull_waits_until_the_feed_is_readable_and_no_longer() {
    let ms = Duration::from_millis;
    for (shows_after, least, most, got) in [
        (ms(300), ms(300), ms(350), 1),
        (Duration::from_secs(10), ms(1000), ms(1050), 0),
    ] {
        let e = common::engine(Arc::new(Lagging::new(ms(250), shows_after)));
        let ann = sign_up(&e, "ann").await;
        let cursor = e.changes(&ann, None, None, 1).await.unwrap().next;
        tokio::time::pause();
        let id = e
            .create_item(&ann, "doc", props(json!({})), vec![])
            .await
            .unwrap()
            .item
            .id;
        let start = tokio::time::Instant::now();
        let page = e.changes(&ann, Some(&cursor), None, 10).await.unwrap();
        let waited = start.elapsed();
        assert!(
            least <= waited && waited <= most,
            "shown after {shows_after:?}: waited {waited:?}"
        );
        assert_eq!(page.changes.len(), got, "shown after {shows_after:?}");
        let page = if got == 0 {
            tokio::time::advance(shows_after).await;
            e.changes(&ann, Some(&page.next), None, 10).await.unwrap()
        } else {
            page
        };
        let ids: Vec<String> = page.changes.into_iter().map(|c| c.id).collect();
        assert_eq!(ids, [id]);
        tokio::time::resume();
    }
}

/// A stream catching up from the store on changes that pass its queue's
/// bytes many times over (forty of 60 KB; it takes them a few at a time)
/// still sends every one, once, in order.
#[tokio::test]
async fn a_stream_catches_up_on_large_changes_a_few_at_a_time() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let start = e.changes(&ann, None, None, 1).await.unwrap().next;
    let mut made = Vec::new();
    for n in 0..40 {
        let big = format!("{n:03}{}", "x".repeat(60_000));
        let item = e
            .create_item(&ann, "doc", props(json!({ "big": big })), vec![])
            .await
            .unwrap();
        made.push(item.item.id);
    }
    let mut sub = e.subscribe(&ann, Some(&start), None).await.unwrap();
    for (n, id) in made.iter().enumerate() {
        assert_eq!(&put_of(next(&mut sub, &format!("change {n}")).await), id);
    }
    no_event(&mut sub).await;
}
