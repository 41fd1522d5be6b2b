//! Export and import: a store moved to another backend answers every
//! listing, search, read, body, link and sign-in exactly as before.

use std::sync::Arc;

use serde_json::json;
use tarn_engine::{
    Caller, Engine, EngineError, Grant, ListQuery, Order, Principal, Record, Role, SearchQuery,
    SortField, TextField,
};

use tarn_store::Store;

use crate::common::{self, admin, props, sign_up};

/// What every caller can see of a store, rendered for comparison.
async fn view(e: &Engine, ids: &[String], link: &str, linked: &str) -> Vec<String> {
    let mut out = Vec::new();
    let callers = [
        common::user("ann"),
        common::user("bob"),
        common::user("cat"),
        Caller::Anonymous,
    ];
    for who in &callers {
        for (kind, sort) in [
            ("doc", vec![]),
            (
                "doc",
                vec![SortField {
                    field: "rank".into(),
                    order: Order::Asc,
                }],
            ),
        ] {
            let page = e
                .list_items(
                    who,
                    &ListQuery {
                        kind: Some(kind.into()),
                        sort,
                        limit: 1000,
                        ..ListQuery::default()
                    },
                )
                .await
                .unwrap();
            out.push(format!(
                "{who:?} list {:?}",
                page.items
                    .iter()
                    .map(|v| (v.item.id.clone(), v.item.version, v.role))
                    .collect::<Vec<_>>()
            ));
        }
        for q in ["green", "tea brew", "gre"] {
            let page = e
                .search(
                    who,
                    &SearchQuery {
                        q: q.into(),
                        kind: Some("doc".into()),
                        prefix: q == "gre",
                        limit: 100,
                        ..SearchQuery::default()
                    },
                )
                .await
                .unwrap();
            out.push(format!(
                "{who:?} search {q} {:?}",
                page.hits
                    .iter()
                    .map(|h| (h.item.item.id.clone(), (h.score * 1000.0) as i64))
                    .collect::<Vec<_>>()
            ));
        }
        for id in ids {
            let r = e.get_item(who, id, None).await;
            out.push(format!(
                "{who:?} get {id} {:?}",
                r.map(|v| (v.item.properties, v.role)).ok()
            ));
            if let Ok((_, Some(mut reader))) = e.open_body(who, id, None).await {
                let mut bytes = Vec::new();
                while let Some(c) = reader.next_chunk().await.unwrap() {
                    bytes.extend_from_slice(&c);
                }
                out.push(format!(
                    "{who:?} body {id} {} bytes, sum {}",
                    bytes.len(),
                    bytes.iter().map(|b| *b as u64).sum::<u64>()
                ));
            }
        }
        let via_link = e
            .get_item(who, linked, Some(link))
            .await
            .map(|v| v.role)
            .ok();
        out.push(format!("{who:?} link {via_link:?}"));
        // What the link's manager sees of it (its id, role and time), and
        // that nobody else sees it.
        let links = e.links(who, linked, None).await.map_err(|e| e.to_string());
        out.push(format!("{who:?} links {links:?}"));
        out.push(format!(
            "{who:?} me {:?}",
            e.me(who).await.map(|m| m.groups).ok()
        ));
    }
    out
}

async fn fill(e: &Engine) -> (Vec<String>, String, String) {
    let ann = sign_up(e, "ann").await;
    sign_up(e, "bob").await;
    sign_up(e, "cat").await;
    e.create_group(&ann, "inner", None, Default::default())
        .await
        .unwrap();
    e.create_group(&ann, "outer", None, Default::default())
        .await
        .unwrap();
    e.add_member(&ann, "inner", &Principal::User("bob".into()))
        .await
        .unwrap();
    e.add_member(&ann, "outer", &Principal::Group("inner".into()))
        .await
        .unwrap();
    e.declare_index(
        &admin(),
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
    e.declare_text_index(
        &admin(),
        "doc-text",
        "doc",
        vec![],
        vec![
            TextField {
                field: "title".into(),
                weight: 2.0,
            },
            TextField {
                field: "$body".into(),
                weight: 1.0,
            },
        ],
        None,
    )
    .await
    .unwrap();
    common::wait_ready(e, "doc-by-rank").await;
    common::wait_ready(e, "doc-text").await;
    let mut ids = Vec::new();
    let shares = [
        vec![],
        vec![Grant {
            principal: Principal::Group("outer".into()),
            role: Role::Editor,
        }],
        vec![Grant {
            principal: Principal::Everyone,
            role: Role::Viewer,
        }],
        vec![Grant {
            principal: Principal::User("cat".into()),
            role: Role::Viewer,
        }],
    ];
    for i in 0..12 {
        let v = e
            .create_item(
                &ann,
                "doc",
                props(json!({"rank": (i * 7) % 5, "title": format!("green tea {i}")})),
                shares[i % 4].clone(),
            )
            .await
            .unwrap();
        ids.push(v.item.id);
    }
    e.patch_item(
        &ann,
        &ids[1],
        None,
        &json!({"title": "brewing notes"}),
        None,
    )
    .await
    .unwrap();
    let body: Vec<u8> = b"brew the tea slowly. ".repeat(40_000);
    let mut up = e
        .begin_body(&ann, &ids[2], None, "text/plain", None)
        .await
        .unwrap();
    up.write(&body).await.unwrap();
    up.finish(None).await.unwrap();
    let link = e
        .create_link(&ann, &ids[0], None, Role::Viewer, None)
        .await
        .unwrap();
    e.delete_item(&ann, &ids[11], None, None).await.unwrap();
    let linked = ids[0].clone();
    (ids, link, linked)
}

async fn move_store(from: &Engine, to: &Engine) -> Vec<String> {
    let mut lines = Vec::new();
    from.export(|r| {
        lines.push(serde_json::to_string(r).unwrap());
        Ok(())
    })
    .await
    .unwrap();
    assert!(to.is_empty().await.unwrap());
    let mut importer = to.importer();
    for l in &lines {
        let r: Record = serde_json::from_str(l).unwrap();
        importer.add(r).await.unwrap();
    }
    importer.finish().await.unwrap();
    assert!(!to.is_empty().await.unwrap());
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_from_memory_to_sqlite_and_back() {
    let source = common::memory();
    let (ids, link, linked) = fill(&source).await;
    let before = view(&source, &ids, &link, &linked).await;
    let (sqlite, _dir) = common::sqlite();
    let lines = move_store(&source, &sqlite).await;
    assert!(
        lines[0].contains("\"type\":\"index\""),
        "declarations first"
    );
    assert!(lines.iter().any(|l| l.contains("\"type\":\"chunk\"")));
    assert!(lines.iter().all(|l| !l.contains("\"type\":\"session\"")));
    assert_eq!(view(&sqlite, &ids, &link, &linked).await, before);
    // Password hashes went across: signing in works on the new store.
    sqlite.sign_in("bob", "bob-password").await.unwrap();
    // Cursors did not: the new store's feed starts afresh, and a cursor of
    // the old one is refused rather than read as a place in the new one.
    let old = source
        .changes(&Caller::Anonymous, None, None, 1)
        .await
        .unwrap()
        .next;
    let r = sqlite
        .changes(&Caller::Anonymous, Some(&old), None, 1)
        .await;
    assert!(
        matches!(r, Err(tarn_engine::EngineError::InvalidInput(_))),
        "{r:?}"
    );
    // And back again.
    let again = common::memory();
    move_store(&sqlite, &again).await;
    assert_eq!(view(&again, &ids, &link, &linked).await, before);
}

/// An import into a store that held only the administrator a server made
/// starts that store's history afresh (found by a black-box audit: a feed
/// cursor handed out before the import still read the changes that
/// administrator had made, as whichever user of the file held it). A node
/// started after the import finds the cursor foreign; a node that ran
/// along, still sealing with the old key, finds those changes trimmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_starts_afresh_the_history_of_a_store_that_held_only_its_admin() {
    let source = common::memory();
    fill(&source).await;
    let lines = exported(&source).await;
    let store: Arc<dyn Store> = Arc::new(tarn_store::memory::MemoryStore::new());
    let along = common::engine(store.clone());
    along.ensure_admin("old-admin-password").await.unwrap();
    let old = along.changes(&admin(), None, None, 10).await.unwrap().next;
    let everyone = vec![Grant {
        principal: Principal::Authenticated,
        role: Role::Viewer,
    }];
    let payroll = along
        .create_item(
            &admin(),
            "secret",
            props(json!({"title": "payroll"})),
            everyone,
        )
        .await
        .unwrap()
        .item
        .id;
    along
        .delete_item(&admin(), &payroll, None, None)
        .await
        .unwrap();
    let read = along.changes(&admin(), Some(&old), None, 10).await.unwrap();
    assert_eq!(read.changes.len(), 2, "the create and the delete, before");
    assert!(
        along.is_empty().await.unwrap(),
        "only the made admin is left"
    );
    let mut imp = along.importer();
    for l in &lines {
        imp.add(serde_json::from_str(l).unwrap()).await.unwrap();
    }
    imp.finish().await.unwrap();
    let started = common::engine(store.clone());
    for caller in [admin(), common::user("ann")] {
        let r = started.changes(&caller, Some(&old), None, 10).await;
        assert!(matches!(r, Err(EngineError::InvalidInput(_))), "{r:?}");
        let r = along.changes(&caller, Some(&old), None, 10).await;
        assert!(matches!(r, Err(EngineError::Gone(_))), "{r:?}");
    }
    let end = started
        .changes(&admin(), None, None, 10)
        .await
        .unwrap()
        .next;
    let read = started
        .changes(&admin(), Some(&end), None, 10)
        .await
        .unwrap();
    assert!(read.changes.is_empty(), "{:?}", read.changes);
    // The store serves the file, and takes no second import.
    assert!(!started.is_empty().await.unwrap());
    let mut again = started.importer();
    let mut refused = None;
    for l in &lines {
        if let Err(e) = again.add(serde_json::from_str(l).unwrap()).await {
            refused = Some(e.to_string());
            break;
        }
    }
    let refused = match refused {
        Some(e) => e,
        None => again.finish().await.unwrap_err().to_string(),
    };
    assert!(refused.contains("import"), "{refused}");
    assert!(
        !started.import_unfinished().await.unwrap(),
        "nothing was written"
    );
}

/// Two imports into one empty store at once: the second is refused at
/// once and writes nothing, and the first goes on (found by a black-box
/// audit on PostgreSQL: both passed the check for an empty store, and the
/// one that answered success left the store marked as holding part of a
/// file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_import_at_once_is_refused() {
    let source = common::memory();
    fill(&source).await;
    let lines = exported(&source).await;
    let target = common::memory();
    let (mut first, mut second) = (target.importer(), target.importer());
    let records = |n: usize| lines[..n].iter().map(|l| serde_json::from_str(l).unwrap());
    // The first record after the declarations makes an importer begin.
    let begins = lines
        .iter()
        .position(|l| !l.contains("\"type\":\"index\""))
        .unwrap()
        + 1;
    for r in records(begins) {
        first.add(r).await.unwrap();
    }
    let mut refused = None;
    for r in records(begins) {
        if let Err(e) = second.add(r).await {
            refused = Some(e.to_string());
        }
    }
    let refused = refused.expect("the second import was refused");
    assert!(refused.contains("under way"), "{refused}");
    assert!(!second.wrote());
    for l in &lines[begins..] {
        first.add(serde_json::from_str(l).unwrap()).await.unwrap();
    }
    first.finish().await.unwrap();
    assert!(!target.import_unfinished().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_to_postgres() {
    let source = common::memory();
    let (ids, link, linked) = fill(&source).await;
    let before = view(&source, &ids, &link, &linked).await;
    let pg = common::postgres().await;
    move_store(&source, &pg).await;
    assert_eq!(view(&pg, &ids, &link, &linked).await, before);
}

#[tokio::test]
async fn imports_refuse_bad_records() {
    let e = common::memory();
    let mut imp = e.importer();
    imp.add(Record::Member {
        group: "g".into(),
        member: Principal::User("u".into()),
    })
    .await
    .unwrap();
    let late = Record::Index {
        index: tarn_engine::IndexDef {
            name: "late".into(),
            kind: Some("doc".into()),
            where_: vec![],
            sort: vec![],
            state: tarn_engine::IndexState::Ready,
            uid: "x".into(),
            since: 1,
            text: vec![],
            language: None,
            ties: tarn_engine::Order::Asc,
            impacts: tarn_engine::Impacts::Milli,
            readers: tarn_engine::Readers::Every,
            heads: tarn_engine::Heads::Two,
            cut: tarn_engine::Cut::Character,
        },
    };
    assert!(imp.add(late).await.is_err(), "declarations come first");
    assert!(imp
        .add(Record::Link {
            item: "i".into(),
            hash: "zz".into(),
            role: Role::Viewer,
            created_at: None,
        })
        .await
        .is_err());
    assert!(imp
        .add(Record::Chunk {
            blob: "b".into(),
            n: 0,
            data: "!!".into()
        })
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_from_sqlite_to_postgres_to_cassandra_and_back_to_sqlite() {
    let (source, _source_dir) = common::sqlite();
    let (ids, link, linked) = fill(&source).await;
    let before = view(&source, &ids, &link, &linked).await;
    let pg = common::postgres().await;
    move_store(&source, &pg).await;
    assert_eq!(view(&pg, &ids, &link, &linked).await, before);
    let cassandra = common::cassandra().await;
    move_store(&pg, &cassandra).await;
    assert_eq!(view(&cassandra, &ids, &link, &linked).await, before);
    let (back, _back_dir) = common::sqlite();
    move_store(&cassandra, &back).await;
    assert_eq!(view(&back, &ids, &link, &linked).await, before);
}

/// Imports `lines` into a fresh store: the first error, from a record or
/// from the check at the end, and whether the store says it holds an
/// unfinished import.
async fn import_lines(lines: &[String]) -> (Option<String>, bool) {
    let e = common::memory();
    let mut imp = e.importer();
    let mut failed = None;
    for l in lines {
        let r: Record = serde_json::from_str(l).unwrap();
        if let Err(err) = imp.add(r).await {
            failed = Some(err.to_string());
            break;
        }
    }
    if failed.is_none() {
        failed = imp.finish().await.err().map(|e| e.to_string());
    }
    (failed, e.import_unfinished().await.unwrap())
}

/// An import checks what it takes: a body against its size and hash, that
/// memberships, ACLs and links name what the file holds, that no user,
/// group or item comes twice and no group contains itself. One that fails
/// leaves the store marked as holding part of a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_refuse_files_that_do_not_hold_together() {
    let source = common::memory();
    fill(&source).await;
    let mut lines = Vec::new();
    source
        .export(|r| {
            lines.push(serde_json::to_string(r).unwrap());
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(import_lines(&lines).await, (None, false), "the file as is");
    let chunks: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains("\"type\":\"chunk\""))
        .collect();
    assert!(chunks.len() >= 2, "a body of several chunks");
    let altered = |i: usize, f: &dyn Fn(&str) -> String| {
        let mut l = lines.clone();
        l[i] = f(&l[i]);
        l
    };
    let appended = |extra: &str| with_record(&lines, extra);
    let first_user = lines
        .iter()
        .position(|l| l.contains("\"type\":\"user\""))
        .unwrap();
    let shared_with_cat = lines
        .iter()
        .position(|l| l.contains("\"type\":\"item\"") && l.contains("user:cat"))
        .unwrap();
    let flip = |l: &str| {
        // One base64url digit of the data changed: the same length, other
        // bytes.
        let at = l.find("\"data\":\"").unwrap() + 20;
        let c = if &l[at..=at] == "A" { "B" } else { "A" };
        format!("{}{c}{}", &l[..at], &l[at + 1..])
    };
    let mut dropped = lines.clone();
    dropped.remove(chunks[1]);
    let first_group = lines
        .iter()
        .position(|l| l.contains("\"type\":\"group\""))
        .unwrap();
    let first_item = lines
        .iter()
        .position(|l| l.contains("\"type\":\"item\""))
        .unwrap();
    let with_body = chunks[0] - 1;
    let first_item_without_body = lines
        .iter()
        .position(|l| l.contains("\"type\":\"item\"") && l.contains("\"body\":null"))
        .unwrap();
    assert!(
        lines[with_body].contains("\"type\":\"item\""),
        "a body's chunks follow its item"
    );
    let first_link = lines
        .iter()
        .position(|l| l.contains("\"type\":\"link\""))
        .unwrap();
    let managers = |l: &str, to: &str| {
        let at = l.find("\"managers\":[").unwrap() + "\"managers\":[".len();
        let end = at + l[at..].find(']').unwrap();
        format!("{}{to}{}", &l[..at], &l[end..])
    };
    let field = |l: &str, name: &str, to: &str| {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let mut v = v;
        let obj = v.as_object_mut().unwrap();
        let inner = obj
            .values_mut()
            .find(|x| x.is_object())
            .unwrap()
            .as_object_mut()
            .unwrap();
        inner.insert(name.into(), serde_json::from_str(to).unwrap());
        v.to_string()
    };
    let last = lines.len() - 1;
    assert!(
        lines[last].contains("\"type\":\"end\""),
        "the end record last"
    );
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "a chunk altered",
            altered(chunks[0], &flip),
            "does not match",
        ),
        ("a chunk missing", dropped, "does not"),
        (
            "a member of no group",
            appended(r#"{"type":"member","group":"nogroup","member":"user:bob"}"#),
            "nogroup",
        ),
        (
            "a member no one is",
            appended(r#"{"type":"member","group":"inner","member":"user:ghost"}"#),
            "ghost",
        ),
        (
            "a cycle",
            appended(r#"{"type":"member","group":"inner","member":"group:outer"}"#),
            "contains itself",
        ),
        (
            "a user twice",
            appended(&lines[first_user].replace("\"admin\":false", "\"admin\":true")),
            "twice",
        ),
        (
            "a link of no item",
            appended(&format!(
                r#"{{"type":"link","item":"nope","hash":"{}","role":"viewer"}}"#,
                "ab".repeat(32)
            )),
            "nope",
        ),
        (
            "an ACL naming no one",
            altered(shared_with_cat, &|l| l.replace("user:cat", "user:ghost")),
            "ghost",
        ),
        (
            "a group managed by no one the file holds",
            altered(first_group, &|l| managers(l, "\"user:ghost\"")),
            "ghost",
        ),
        (
            "a group managed by no one",
            altered(first_group, &|l| managers(l, "")),
            "at least one manager",
        ),
        (
            "a group managed by everyone",
            altered(first_group, &|l| managers(l, "\"everyone\"")),
            "users or groups",
        ),
        (
            "an item made by no one the file holds",
            altered(first_item, &|l| field(l, "createdBy", "\"ghost\"")),
            "ghost",
        ),
        (
            "an item at version 0",
            altered(first_item, &|l| field(l, "version", "0")),
            "version 0",
        ),
        (
            "an item at a version no write reaches",
            altered(first_item, &|l| field(l, "version", "18446744073709551615")),
            "2^53",
        ),
        (
            "an item id no read finds",
            altered(first_item, &|l| field(l, "id", "\"a/b c.d\"")),
            "item id",
        ),
        (
            "an item changed past the year 9999",
            altered(first_item, &|l| {
                field(l, "modifiedAt", "9223372036854775807")
            }),
            "between 1970 and 9999",
        ),
        (
            "a user named as a built-in principal",
            altered(first_user, &|l| field(l, "username", "\"everyone\"")),
            "built-in principal",
        ),
        (
            "a body whose chunks are not of its chunk size",
            altered(with_body, &|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                let chunk = &mut v["item"]["body"]["chunk"];
                *chunk = (chunk.as_u64().unwrap() * 2).into();
                v.to_string()
            }),
            "chunk size",
        ),
        (
            "a link that manages",
            altered(first_link, &|l| {
                l.replace("\"role\":\"viewer\"", "\"role\":\"manager\"")
                    .replace("\"role\":\"editor\"", "\"role\":\"manager\"")
            }),
            "viewer or editor",
        ),
        (
            "a link made before 1970",
            altered(first_link, &|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                assert!(v["createdAt"].is_i64(), "{l}");
                v["createdAt"] = (-5).into();
                v.to_string()
            }),
            "not between 1970 and 9999",
        ),
        (
            "a password kept in plain text",
            altered(first_user, &|l| field(l, "passwordHash", "\"hunter22\"")),
            "Argon2id",
        ),
        (
            "the end record missing",
            lines[..last].to_vec(),
            "cut short",
        ),
        (
            // After an item without a body (each body's chunks follow its
            // item): the records so far hold together, the end is missing.
            "the file cut after its first items",
            lines[..=first_item_without_body].to_vec(),
            "cut short",
        ),
        (
            "a record after the end",
            {
                let mut l = lines.clone();
                l.push(lines[first_user].clone());
                l
            },
            "after the end",
        ),
        (
            "an end that counts otherwise",
            altered(last, &|l| l.replace("\"user\":", "\"user\":1")),
            "end record counts",
        ),
    ];
    for (what, file, says) in cases {
        let (failed, unfinished) = import_lines(&file).await;
        let failed = failed.unwrap_or_else(|| panic!("{what}: imported"));
        assert!(failed.contains(says), "{what}: {failed}");
        assert!(unfinished, "{what}: the store says it holds part of a file");
    }
    // A declaration no administrator could make is refused before anything
    // is written.
    let (failed, unfinished) = import_lines(&altered(0, &|l| {
        field(&field(l, "sort", "[]"), "text", "[]")
    }))
    .await;
    assert!(
        failed
            .as_deref()
            .is_some_and(|f| f.contains("at least one field")),
        "{failed:?}"
    );
    assert!(!unfinished, "nothing written");
    // So is an index declared twice (it was refused after the store was
    // marked, and the command line said nothing was written).
    let mut twice = lines.clone();
    twice.insert(1, twice[0].clone());
    let (failed, unfinished) = import_lines(&twice).await;
    assert!(
        failed.as_deref().is_some_and(|f| f.contains("twice")),
        "{failed:?}"
    );
    assert!(!unfinished, "nothing written");
}

/// Declarations carry the encodings their rows hold: one made today (ties
/// reversed under a descending first field, wide impact codes) keeps them
/// across a move, and one from an older export (without those fields)
/// keeps the older ones (ids ascending in ties, impacts saturating at
/// 65.535), which its rows in an older store were written with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarations_keep_the_encodings_of_their_rows() {
    let source = common::memory();
    source
        .declare_index(
            &admin(),
            "doc-by-rank-desc",
            "doc",
            vec![],
            vec![SortField {
                field: "rank".into(),
                order: Order::Desc,
            }],
        )
        .await
        .unwrap();
    source
        .declare_text_index(
            &admin(),
            "doc-text",
            "doc",
            vec![],
            vec![TextField {
                field: "title".into(),
                weight: 100.0,
            }],
            None,
        )
        .await
        .unwrap();
    common::wait_ready(&source, "doc-by-rank-desc").await;
    common::wait_ready(&source, "doc-text").await;
    let mut lines = Vec::new();
    source
        .export(|r| {
            lines.push(serde_json::to_string(r).unwrap());
            Ok(())
        })
        .await
        .unwrap();
    let older: Vec<String> = lines
        .iter()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["type"] == "index" {
                let index = v["index"].as_object_mut().unwrap();
                let ties = index.remove("ties").is_some();
                let impacts = index.remove("impacts").is_some();
                assert!(ties || impacts, "one or the other declared today: {l}");
                assert!(index.remove("readers").is_some(), "declared today: {l}");
                let heads = index.remove("heads").is_some();
                assert_eq!(heads, index.contains_key("text"), "text indexes: {l}");
            }
            v.to_string()
        })
        .collect();
    for (file, now) in [(&lines, true), (&older, false)] {
        let e = common::memory();
        let mut imp = e.importer();
        for l in file {
            imp.add(serde_json::from_str(l).unwrap()).await.unwrap();
        }
        imp.finish().await.unwrap();
        for name in ["doc-by-rank-desc", "doc-text"] {
            let readers = e.get_index(&admin(), name).await.unwrap().readers;
            let want = if now {
                tarn_engine::Readers::Widest
            } else {
                tarn_engine::Readers::Every
            };
            assert_eq!(readers, want, "{name}, now={now}");
        }
        let heads = e.get_index(&admin(), "doc-text").await.unwrap().heads;
        let want = if now {
            tarn_engine::Heads::Syllable
        } else {
            tarn_engine::Heads::Two
        };
        assert_eq!(heads, want, "now={now}");
        let ann = sign_up(&e, "ann").await;
        let mut ids = Vec::new();
        for _ in 0..3 {
            let p = props(json!({"rank": 1, "title": "tea"}));
            let everyone = vec![Grant {
                principal: Principal::Everyone,
                role: Role::Viewer,
            }];
            ids.push(
                e.create_item(&ann, "doc", p, everyone)
                    .await
                    .unwrap()
                    .item
                    .id,
            );
        }
        ids.sort();
        let q = ListQuery {
            kind: Some("doc".into()),
            sort: vec![SortField {
                field: "rank".into(),
                order: Order::Desc,
            }],
            limit: 10,
            ..ListQuery::default()
        };
        let listed: Vec<String> = e
            .list_items(&ann, &q)
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|v| v.item.id)
            .collect();
        let mut want = ids.clone();
        if now {
            want.reverse();
        }
        assert_eq!(listed, want, "ties, now={now}");
        let hits = e
            .search(
                &ann,
                &SearchQuery {
                    q: "tea".into(),
                    kind: Some("doc".into()),
                    ..SearchQuery::default()
                },
            )
            .await
            .unwrap()
            .hits;
        assert_eq!(hits.len(), 3);
        // A one-word title of weight 100: 165.66, or saturated.
        let score = hits[0].score;
        if now {
            assert!(score > 160.0, "{score}");
        } else {
            assert_eq!(score, 65.535);
        }
    }
}

/// The lines of an export of `e`.
async fn exported(e: &Engine) -> Vec<String> {
    let mut lines = Vec::new();
    e.export(|r| {
        lines.push(serde_json::to_string(r).unwrap());
        Ok(())
    })
    .await
    .unwrap();
    lines
}

/// `lines` with the record at `at` changed by `f` (as JSON).
fn edited(lines: &[String], at: usize, f: impl Fn(&mut serde_json::Value)) -> Vec<String> {
    let mut l = lines.to_vec();
    let mut v: serde_json::Value = serde_json::from_str(&l[at]).unwrap();
    f(&mut v);
    l[at] = v.to_string();
    l
}

/// `lines` with `extra` before the end record, and counted there.
fn with_record(lines: &[String], extra: &str) -> Vec<String> {
    let mut l = lines.to_vec();
    let kind = serde_json::from_str::<serde_json::Value>(extra).unwrap()["type"]
        .as_str()
        .unwrap()
        .to_string();
    let mut end: serde_json::Value = serde_json::from_str(l.last().unwrap()).unwrap();
    let n = end["records"][&kind].as_u64().unwrap_or(0);
    end["records"][&kind] = (n + 1).into();
    *l.last_mut().unwrap() = end.to_string();
    l.insert(l.len() - 1, extra.to_string());
    l
}

/// Ids of the hits of `q` in `doc` for an anonymous caller (the body's
/// item is shared with everyone).
async fn hits(e: &Engine, q: &str) -> Vec<String> {
    e.search(
        &Caller::Anonymous,
        &SearchQuery {
            q: q.into(),
            kind: Some("doc".into()),
            ..SearchQuery::default()
        },
    )
    .await
    .unwrap()
    .hits
    .into_iter()
    .map(|h| h.item.item.id)
    .collect()
}

/// An import takes nothing the API would refuse, and rebuilds what it
/// derives. A body's words come from its bytes, not from the file: a word
/// list naming a word the body lacks made its item a hit for that word,
/// and an empty one hid the body's words. Properties of users and groups
/// keep the API's limits; a body's `Content-Type` is a media type; no
/// item was modified before it was created; a membership or a link comes
/// once (a second was taken and dropped); an ACL names a principal once
/// and one text index serves a kind's searches (both were taken). A store
/// holding only index declarations is no import's target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_take_nothing_the_api_would_refuse() {
    let source = common::memory();
    let (ids, _, _) = fill(&source).await;
    let lines = exported(&source).await;
    let body_item = lines
        .iter()
        .position(|l| l.contains("\"type\":\"item\"") && l.contains("\"words\""))
        .unwrap();
    for words in [json!([["zebraword", 3]]), json!([])] {
        let forged = edited(&lines, body_item, |v| {
            v["item"]["body"]["words"] = words.clone()
        });
        let e = common::memory();
        let mut imp = e.importer();
        for l in &forged {
            imp.add(serde_json::from_str(l).unwrap()).await.unwrap();
        }
        imp.finish().await.unwrap();
        assert!(hits(&e, "zebraword").await.is_empty(), "{words}");
        assert_eq!(hits(&e, "slowly").await, vec![ids[2].clone()], "{words}");
    }
    let refused = |l: Vec<String>, why: &'static str, says: &'static str| async move {
        let (failed, _) = import_lines(&l).await;
        let failed = failed.unwrap_or_else(|| panic!("{why}: imported"));
        assert!(failed.contains(says), "{why}: {failed}");
    };
    let big = "x".repeat(70 * 1024);
    let mut deep = json!(1);
    for _ in 0..70 {
        deep = json!({ "d": deep });
    }
    let first = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(&format!("\"type\":\"{what}\"")))
            .unwrap()
    };
    let (user, group, member, link) = (
        first("user"),
        first("group"),
        first("member"),
        first("link"),
    );
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "user properties over 64 KiB",
            edited(&lines, user, |v| {
                v["user"]["properties"] = json!({ "big": big })
            }),
            "properties",
        ),
        (
            "user properties 70 levels deep",
            edited(&lines, user, |v| {
                v["user"]["properties"] = json!({ "deep": deep })
            }),
            "levels deep",
        ),
        (
            "group properties over 64 KiB",
            edited(&lines, group, |v| {
                v["group"]["properties"] = json!({ "big": big })
            }),
            "properties",
        ),
        (
            "a group title over 1024 bytes",
            edited(&lines, group, |v| {
                v["group"]["title"] = json!("t".repeat(1025))
            }),
            "title",
        ),
        (
            "a Content-Type that is no media type",
            edited(&lines, body_item, |v| {
                v["item"]["body"]["contentType"] = json!("not a content type")
            }),
            "media type",
        ),
        (
            "modified before it was created",
            edited(&lines, body_item, |v| v["item"]["modifiedAt"] = json!(1)),
            "modified before",
        ),
        (
            "a membership twice",
            with_record(&lines, &lines[member]),
            "twice",
        ),
        ("a link twice", with_record(&lines, &lines[link]), "twice"),
        (
            "an ACL naming a principal twice",
            edited(&lines, body_item, |v| {
                let acl = v["item"]["acl"].as_array_mut().unwrap();
                let again = json!({"principal": acl[0]["principal"], "role": "viewer"});
                acl.push(again);
            }),
            "twice",
        ),
        (
            "a second text index for the same searches",
            {
                let text = lines
                    .iter()
                    .position(|l| l.contains("\"name\":\"doc-text\""))
                    .unwrap();
                let twin = edited(&lines, text, |v| v["index"]["name"] = json!("doc-text-2"))[text]
                    .clone();
                // Declarations come first: the twin right after its first.
                let mut l = lines.clone();
                l.insert(text + 1, twin);
                let end = l.len() - 1;
                edited(&l, end, |v| {
                    v["records"]["index"] = (v["records"]["index"].as_u64().unwrap() + 1).into()
                })
            },
            "already serves searches",
        ),
    ];
    for (why, file, says) in cases {
        refused(file, why, says).await;
    }
    // An item whose body's chunks filled a write of their own, then an item
    // of the same id: refused (both were written, the first one's index
    // rows left behind).
    let big = common::memory();
    let ann = sign_up(&big, "ann").await;
    let id = big
        .create_item(&ann, "doc", props(json!({"title": "big"})), vec![])
        .await
        .unwrap()
        .item
        .id;
    let mut up = big
        .begin_body(&ann, &id, None, "text/plain", None)
        .await
        .unwrap();
    up.write(&b"tea ".repeat(800_000)).await.unwrap();
    up.finish(None).await.unwrap();
    let big_lines = exported(&big).await;
    let item = big_lines
        .iter()
        .position(|l| l.contains("\"type\":\"item\""))
        .unwrap();
    let last_chunk = big_lines
        .iter()
        .rposition(|l| l.contains("\"type\":\"chunk\""))
        .unwrap();
    assert!(last_chunk > item + 8, "a body of more than 2 MiB of chunks");
    let again = edited(&big_lines, item, |v| v["item"]["body"] = json!(null))[item].clone();
    let mut twice = big_lines.clone();
    twice.insert(last_chunk + 1, again);
    let end = twice.len() - 1;
    let twice = edited(&twice, end, |v| {
        v["records"]["item"] = (v["records"]["item"].as_u64().unwrap() + 1).into()
    });
    refused(twice, "an item twice, a big body between", "twice").await;
    let e = common::memory();
    e.declare_index(
        &admin(),
        "other",
        "misc",
        vec![],
        vec![SortField {
            field: "x".into(),
            order: Order::Asc,
        }],
    )
    .await
    .unwrap();
    assert!(!e.is_empty().await.unwrap(), "a declaration is something");
}
