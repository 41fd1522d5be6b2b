//! Search, `/changes` and `/events` over HTTP, as api.md writes them.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::TestApp;

async fn text_index(app: &TestApp, admin: &str) {
    app.call(
        Method::PUT,
        "/api/v1/indexes/doc-text",
        Some(admin),
        Some(json!({"kind": "doc", "text": [{"field": "title", "weight": 3}, {"field": "body"}]})),
    )
    .await
    .expect(201);
    app.wait_index(admin, "doc-text").await;
}

#[tokio::test]
async fn search_over_http() {
    let app = TestApp::new().await;
    let admin = app.admin().await;
    let ann = app.user("ann").await;
    let bob = app.user("bob").await;
    text_index(&app, &admin).await;
    let public = json!([{"principal": "everyone", "role": "viewer"}]);
    let tea = app
        .item(
            &ann,
            "doc",
            json!({"title": "Green tea", "body": "brewing notes"}),
            public.clone(),
        )
        .await;
    app.item(
        &ann,
        "doc",
        json!({"title": "Private green tea"}),
        json!([]),
    )
    .await;
    let r = app
        .get("/api/v1/search?q=green%20tea&kind=doc", Some(&bob))
        .await
        .expect(200);
    let items = r.json()["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 1, "never an unreadable item: {items:?}");
    assert_eq!(items[0]["id"], tea["id"]);
    assert!(items[0]["score"].as_f64().unwrap() > 0.0);
    assert!(r.json()["next"].is_null());
    // Analysis, prefix and match modes.
    let count = |q: &str, who: &str| {
        let (app, q, who) = (&app, q.to_string(), who.to_string());
        async move {
            app.get(&format!("/api/v1/search?{q}"), Some(&who))
                .await
                .expect(200)
                .json()["items"]
                .as_array()
                .unwrap()
                .len()
        }
    };
    assert_eq!(count("q=BREWED&kind=doc", &bob).await, 1);
    assert_eq!(count("q=gree&kind=doc&prefix=true", &bob).await, 1);
    // As Python's `params={"prefix": True}` writes it.
    assert_eq!(count("q=gree&kind=doc&prefix=True", &bob).await, 1);
    assert_eq!(count("q=gree&kind=doc&prefix=False", &bob).await, 0);
    assert_eq!(count("q=gree&kind=doc", &bob).await, 0);
    // Typed past the stem: "brewin" is on its way to "brewing" ("brew").
    for typed in ["b", "br", "bre", "brew", "brewi", "brewin", "brewing"] {
        let q = format!("q={typed}&kind=doc&prefix=true");
        assert_eq!(count(&q, &bob).await, 1, "{typed}");
    }
    assert_eq!(count("q=b&kind=doc", &bob).await, 0, "b is no word of it");
    // Invisible format characters inside words (a soft hyphen, a
    // direction mark, an override) fold away, in items and in queries.
    app.item(
        &ann,
        "doc",
        json!({"title": "hy\u{AD}phenate mark\u{200E} \u{202E}evil\u{202C}"}),
        public.clone(),
    )
    .await;
    for q in ["hyphenate", "mark", "evil", "hy%C2%ADphenate"] {
        assert_eq!(count(&format!("q={q}&kind=doc"), &bob).await, 1, "{q}");
    }
    // One letter of another script: "б" on its way to "Бородино".
    app.item(&ann, "doc", json!({"title": "Бородино"}), json!([]))
        .await;
    assert_eq!(count("q=%D0%B1&kind=doc&prefix=true", &ann).await, 1);
    assert_eq!(count("q=brewin&kind=doc", &bob).await, 0);
    // ... but a word that only starts with a term ("note") is no word
    // on its way to it.
    assert_eq!(count("q=notebook&kind=doc&prefix=true", &bob).await, 0);
    assert_eq!(count("q=green%20nothing&kind=doc&match=any", &ann).await, 2);
    assert_eq!(count("q=green%20nothing&kind=doc&match=all", &ann).await, 0);
    assert_eq!(count("q=green", &ann).await, 2, "without a kind");
    // With match=any, an item matching more words comes first, and the
    // scores fall down the page as the items do: one word in a short
    // title outweighs two in a long body, yet shows the lower score.
    let long = format!("oolong jasmine {}", "filler ".repeat(80));
    let both = app
        .item(
            &ann,
            "doc",
            json!({"title": "notes", "body": long}),
            json!([]),
        )
        .await;
    let one = app
        .item(&ann, "doc", json!({"title": "oolong"}), json!([]))
        .await;
    // The premise: by impacts alone, `one` would come first.
    let score_of = |q: &'static str, id: Value| {
        let (app, ann) = (&app, ann.clone());
        async move {
            let page = app
                .get(&format!("/api/v1/search?q={q}&kind=doc"), Some(&ann))
                .await
                .expect(200)
                .json();
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|h| h["id"] == id)
                .unwrap_or_else(|| panic!("{id} in {page}"))["score"]
                .as_f64()
                .unwrap()
        }
    };
    let sum_both = score_of("oolong", both["id"].clone()).await
        + score_of("jasmine", both["id"].clone()).await;
    assert!(score_of("oolong", one["id"].clone()).await > sum_both);
    let page = app
        .get(
            "/api/v1/search?q=oolong%20jasmine&kind=doc&match=any",
            Some(&ann),
        )
        .await
        .expect(200)
        .json();
    let hits = page["items"].as_array().unwrap();
    let ids: Vec<&Value> = hits.iter().map(|h| &h["id"]).collect();
    assert_eq!(ids, [&both["id"], &one["id"]], "{page}");
    let scores: Vec<f64> = hits.iter().map(|h| h["score"].as_f64().unwrap()).collect();
    assert!(scores[0] > scores[1], "{scores:?}");
    // A one-word match scores the same in both modes.
    let alone = |m: &'static str| {
        let app = &app;
        let ann = ann.clone();
        async move {
            app.get(
                &format!("/api/v1/search?q=oolong&kind=doc&match={m}"),
                Some(&ann),
            )
            .await
            .expect(200)
            .json()["items"][0]["score"]
                .as_f64()
                .unwrap()
        }
    };
    assert_eq!(alone("any").await, alone("all").await);
    // Where-fields belong to a kind's text index: without a kind, no
    // index serves them.
    let r = app
        .get("/api/v1/search?q=green&where.project=p1", Some(&ann))
        .await
        .expect(400);
    assert_eq!(r.json()["type"], "no-index", "{}", r.text());
    // The default page is api.md's 50, like every other limit.
    for n in 0..51 {
        app.item(
            &ann,
            "doc",
            json!({"title": format!("pages {n}")}),
            json!([]),
        )
        .await;
    }
    assert_eq!(count("q=pages&kind=doc", &ann).await, 50);
    let r = app
        .get("/api/v1/search?q=pages&kind=doc", Some(&ann))
        .await
        .expect(200);
    let next = r.json()["next"].as_str().unwrap().to_string();
    let r = app
        .get(
            &format!("/api/v1/search?q=pages&kind=doc&cursor={next}"),
            Some(&ann),
        )
        .await
        .expect(200);
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 1);
    // Refusals, all problems, never a 5xx.
    for bad in [
        "/api/v1/search?kind=doc",
        "/api/v1/search?q=&kind=doc",
        "/api/v1/search?q=x&kind=doc&match=some",
        "/api/v1/search?q=x&kind=doc&prefix=yes",
        "/api/v1/search?q=x&kind=doc&limit=0",
        "/api/v1/search?q=x&kind=doc&cursor=%21%21",
        "/api/v1/search?q=x&kind=BAD",
        "/api/v1/search?q=x&nonsense=1",
    ] {
        app.get(bad, Some(&ann)).await.expect(400);
    }
    let long = "a%20".repeat(600);
    let r = app
        .get(&format!("/api/v1/search?q={long}&kind=doc"), Some(&ann))
        .await
        .expect(400);
    assert!(r.json()["detail"].as_str().unwrap().contains("1024"));
    let r = app
        .get("/api/v1/search?q=x&kind=note", Some(&ann))
        .await
        .expect(400);
    assert_eq!(r.json()["type"], "no-index");
    let r = app
        .get("/api/v1/search?q=x&kind=note&where.a..b=1", Some(&ann))
        .await
        .expect(400);
    assert_eq!(r.json()["type"], "invalid-input");
    // The advice for a where-field the kind's text index lacks can be
    // followed as given, request line and body: a new name, the kind's
    // own text fields.
    let r = app
        .get("/api/v1/search?q=x&kind=doc&where.project=p1", Some(&ann))
        .await
        .expect(400);
    let detail = r.json()["detail"].as_str().unwrap().to_string();
    let request = &detail[detail.find("PUT ").expect("a request to send")..];
    let (path, body) = request[4..].split_once(' ').unwrap();
    let advice: Value = serde_json::from_str(body).unwrap();
    assert_eq!(advice["where"], json!(["project"]), "{detail}");
    assert_eq!(advice["text"][1]["field"], "body", "{detail}");
    app.call(Method::PUT, path, Some(&admin), Some(advice))
        .await
        .expect(201);
    // So can a listing's.
    let r = app
        .get("/api/v1/items?kind=doc&sort=-rank", Some(&ann))
        .await
        .expect(400);
    let detail = r.json()["detail"].as_str().unwrap().to_string();
    let request = &detail[detail.find("PUT ").expect("a request to send")..];
    let (path, body) = request[4..].split_once(' ').unwrap();
    app.call(
        Method::PUT,
        path,
        Some(&admin),
        Some(serde_json::from_str(body).unwrap()),
    )
    .await
    .expect(201);
    // Bytes that are no UTF-8 are refused, not read as replacement marks.
    for bad in ["%FF", "%ED%A0%80", "ok%C3"] {
        let r = app
            .get(&format!("/api/v1/search?q={bad}&kind=doc"), Some(&ann))
            .await
            .expect(400);
        assert!(r.text().contains("UTF-8"), "{}", r.text());
    }
    // A link key opens its item, never a search, a listing or the feed:
    // sent along, it is taken and changes nothing.
    let secret = app
        .item(&ann, "doc", json!({"title": "linked oolong"}), json!([]))
        .await;
    let link = app
        .call(
            Method::POST,
            &format!("/api/v1/items/{}/links", secret["id"].as_str().unwrap()),
            Some(&ann),
            Some(json!({"role": "viewer"})),
        )
        .await
        .expect(201)
        .json();
    let key = link["key"].as_str().unwrap();
    for path in [
        format!("/api/v1/search?q=oolong&kind=doc&key={key}"),
        format!("/api/v1/items?kind=doc&key={key}"),
    ] {
        let r = app.get(&path, Some(&bob)).await.expect(200).json();
        assert!(
            !r.to_string().contains(secret["id"].as_str().unwrap()),
            "{path}: {r}"
        );
    }
    app.get(&format!("/api/v1/changes?key={key}"), Some(&bob))
        .await
        .expect(200);
    for odd in ["%F0%9F%8D%B5", "%D7%A9%D7%9C%D7%95%D7%9D", "%00", "e%CC%81"] {
        app.get(&format!("/api/v1/search?q={odd}&kind=doc"), Some(&ann))
            .await
            .expect(200);
    }
    // A text index has no sort.
    app.call(
        Method::PUT,
        "/api/v1/indexes/bad-text",
        Some(&admin),
        Some(json!({"kind": "doc", "text": [{"field": "t"}], "sort": [{"field": "t", "order": "asc"}]})),
    )
    .await
    .expect(400);
    app.call(
        Method::PUT,
        "/api/v1/indexes/bad-lang",
        Some(&admin),
        Some(json!({"kind": "doc", "text": [{"field": "t"}], "language": "klingon"})),
    )
    .await
    .expect(400);
    // `null` is a weight, `where`, `sort` or `language` left out: this is
    // the declaration made above, so it is the same index.
    app.call(
        Method::PUT,
        "/api/v1/indexes/doc-text",
        Some(&admin),
        Some(
            json!({"kind": "doc", "where": null, "sort": null, "language": null,
                    "text": [{"field": "title", "weight": 3}, {"field": "body", "weight": null}]}),
        ),
    )
    .await
    .expect(200);
    // One text index serves a kind's searches with given where fields: a
    // second would never be read.
    let r = app
        .call(
            Method::PUT,
            "/api/v1/indexes/doc-text-2",
            Some(&admin),
            Some(json!({"kind": "doc", "text": [{"field": "summary"}]})),
        )
        .await
        .expect(409);
    assert!(r.text().contains("doc-text"), "{}", r.text());
    // $body is a text field, never a category or a sort.
    for decl in [
        json!({"kind": "doc", "where": ["$body"], "text": [{"field": "t"}]}),
        json!({"kind": "doc", "sort": [{"field": "$body", "order": "asc"}]}),
    ] {
        app.call(
            Method::PUT,
            "/api/v1/indexes/bad-body",
            Some(&admin),
            Some(decl),
        )
        .await
        .expect(400);
    }
}

/// The page of `/changes` after `since` once it holds `at_least` changes
/// (or after 5 s). A committed change appears "within about a second"
/// (api.md): on PostgreSQL the feed is read below the oldest transaction
/// still running anywhere on the server, and other tests write there too.
async fn changes_after(app: &TestApp, token: &str, since: &str, at_least: usize) -> Value {
    let mut page = json!(null);
    for _ in 0..50 {
        page = app
            .get(&format!("/api/v1/changes?since={since}"), Some(token))
            .await
            .expect(200)
            .json();
        if page["changes"].as_array().unwrap().len() >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    page
}

#[tokio::test]
async fn changes_over_http() {
    let app = TestApp::new().await;
    let ann = app.user("ann").await;
    let bob = app.user("bob").await;
    let start = app
        .get("/api/v1/changes", Some(&bob))
        .await
        .expect(200)
        .json();
    assert_eq!(start["changes"], json!([]));
    let since = start["next"].as_str().unwrap().to_string();
    let shared = json!([{"principal": "user:bob", "role": "viewer"}]);
    let item = app.item(&ann, "doc", json!({"t": 1}), shared).await;
    let id = item["id"].as_str().unwrap();
    app.call(
        Method::DELETE,
        &format!("/api/v1/items/{id}"),
        Some(&ann),
        None,
    )
    .await
    .expect(204);
    let page = changes_after(&app, &bob, &since, 2).await;
    let changes = page["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 2, "{page}");
    assert_eq!(changes[0]["op"], "put");
    assert_eq!(changes[0]["item"]["id"], item["id"]);
    assert_eq!(changes[0]["version"], 1);
    assert!(changes[0]["at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(changes[1]["op"], "remove");
    assert!(
        changes[1].get("item").is_none(),
        "a remove says nothing more"
    );
    assert!(page.get("resync").is_none(), "{page}");
    // Bob joining a group: the page that covers it says to re-list.
    let next = page["next"].as_str().unwrap().to_string();
    app.call(
        Method::POST,
        "/api/v1/groups",
        Some(&ann),
        Some(json!({"id": "room"})),
    )
    .await
    .expect(201);
    app.call(
        Method::PUT,
        "/api/v1/groups/room/members/user:bob",
        Some(&ann),
        None,
    )
    .await
    .expect(204);
    // (A store may show a commit to the feed a little later: pull on.)
    let mut next = next;
    let mut resync = false;
    for _ in 0..50 {
        let page = app
            .get(&format!("/api/v1/changes?since={next}"), Some(&bob))
            .await
            .expect(200)
            .json();
        if page["resync"] == true {
            resync = true;
            break;
        }
        assert!(page.get("resync").is_none(), "{page}");
        next = page["next"].as_str().unwrap().to_string();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(resync, "a page said bob's groups changed");
    for bad in [
        "since=%21%21",
        // The shape of the unsealed cursors of long ago: made up now.
        "since=AQAAAAAAAAAF",
        "limit=0",
        "limit=abc",
        "kind=BAD",
        "other=1",
    ] {
        app.get(&format!("/api/v1/changes?{bad}"), Some(&bob))
            .await
            .expect(400);
    }
    // An empty `since` (`since=${next ?? ''}`) starts at the end, as none.
    let r = app
        .get("/api/v1/changes?since=", Some(&bob))
        .await
        .expect(200)
        .json();
    assert_eq!(r["changes"], json!([]));
    assert!(!r["next"].as_str().unwrap().is_empty(), "{r}");
    let r = app
        .get(&format!("/api/v1/changes?since={OLD_CURSOR}"), Some(&bob))
        .await
        .expect(410);
    assert_eq!(r.json()["type"], "resync");
    // Anonymous callers see public items only.
    let anon = app
        .get(&format!("/api/v1/changes?since={since}"), None)
        .await
        .expect(200)
        .json();
    assert_eq!(anon["changes"], json!([]));
}

/// A feed cursor as servers made them before cursors were sealed with the
/// store's key: version 2, a store position and its unkeyed seal.
const OLD_CURSOR: &str = "AgAAAAAAAAAFzUofCA";

/// Reads SSE frames from a streaming body until `n` events (not comments)
/// arrived; returns them as (event, id, data).
async fn events(
    body: &mut (impl futures_util::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin),
    n: usize,
) -> Vec<(String, Option<String>, String)> {
    let mut text = String::new();
    let mut out = Vec::new();
    while out.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("an event within 10 s")
            .expect("the stream goes on")
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let frame: String = text.drain(..end + 2).collect();
            let (mut event, mut id, mut data) = ("message".to_string(), None, String::new());
            let mut comment = true;
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                    comment = false;
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                    comment = false;
                }
            }
            if !comment {
                out.push((event, id, data));
            }
        }
    }
    out
}

#[tokio::test]
async fn events_over_http() {
    let app = TestApp::new().await;
    let ann = app.user("ann").await;
    let bob = app.user("bob").await;
    app.call(
        Method::POST,
        "/api/v1/groups",
        Some(&ann),
        Some(json!({"id": "room"})),
    )
    .await
    .expect(201);
    let open = |since: Option<String>| {
        let mut req = Request::builder()
            .uri("/api/v1/events?kind=message")
            .header("authorization", format!("Bearer {bob}"));
        if let Some(s) = since {
            req = req.header("last-event-id", s);
        }
        app.router.clone().oneshot(req.body(Body::empty()).unwrap())
    };
    let res = open(None).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut body = res.into_body().into_data_stream();
    let room = json!([{"principal": "group:room", "role": "viewer"}]);
    app.call(
        Method::PUT,
        "/api/v1/groups/room/members/user:bob",
        Some(&ann),
        None,
    )
    .await
    .expect(204);
    let first = events(&mut body, 1).await;
    assert_eq!(first[0].0, "resync", "joining a group resyncs");
    assert_eq!(first[0].2, "{}");
    let m1 = app
        .item(&ann, "message", json!({"text": "one"}), room.clone())
        .await;
    app.item(
        &ann,
        "doc",
        json!({}),
        json!([{"principal": "user:bob", "role": "viewer"}]),
    )
    .await;
    let m2 = app
        .item(&ann, "message", json!({"text": "two"}), room.clone())
        .await;
    let got = events(&mut body, 2).await;
    let data: Vec<Value> = got
        .iter()
        .map(|e| serde_json::from_str(&e.2).unwrap())
        .collect();
    assert_eq!(data[0]["item"]["id"], m1["id"]);
    assert_eq!(data[1]["item"]["id"], m2["id"], "other kinds filtered out");
    assert_eq!(
        got[0].1.as_deref(),
        data[0]["cursor"].as_str(),
        "id: is the cursor"
    );
    drop(body);
    // Resuming with Last-Event-ID: nothing lost, nothing repeated.
    let m3 = app
        .item(&ann, "message", json!({"text": "three"}), room.clone())
        .await;
    let res = open(got[0].1.clone()).await.unwrap();
    let mut body = res.into_body().into_data_stream();
    let resumed = events(&mut body, 2).await;
    let ids: Vec<Value> = resumed
        .iter()
        .map(|e| serde_json::from_str::<Value>(&e.2).unwrap()["item"]["id"].clone())
        .collect();
    assert_eq!(ids, vec![m2["id"].clone(), m3["id"].clone()]);
    // A bad cursor is refused before streaming.
    let res = open(Some("%%%".into())).await.unwrap();
    assert_eq!(res.status(), 400);
    // A cursor of an older server (sealed without the key) resyncs, and the
    // stream goes on from the end, as a browser's EventSource needs.
    let res = open(Some(OLD_CURSOR.into())).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body().into_data_stream();
    assert_eq!(events(&mut body, 1).await[0].0, "resync");
    let m4 = app
        .item(&ann, "message", json!({"text": "four"}), room.clone())
        .await;
    let got = events(&mut body, 1).await;
    let v: Value = serde_json::from_str(&got[0].2).unwrap();
    assert_eq!(v["item"]["id"], m4["id"]);
    drop(body);
    // Anonymous streams see public items.
    let req = Request::builder()
        .uri("/api/v1/events")
        .body(Body::empty())
        .unwrap();
    let res = app.router.clone().oneshot(req).await.unwrap();
    let mut body = res.into_body().into_data_stream();
    let public = app
        .item(
            &ann,
            "message",
            json!({}),
            json!([{"principal": "everyone", "role": "viewer"}]),
        )
        .await;
    let got = events(&mut body, 1).await;
    let v: Value = serde_json::from_str(&got[0].2).unwrap();
    assert_eq!(v["id"], public["id"]);
}

/// Regression (hostile probe): properties 126 levels deep were accepted,
/// and the change entry that carries them, nested a few levels further,
/// no longer read back under the JSON reader's limit: `/changes` answered
/// 500 to every caller. Depth is bounded where properties are written.
#[tokio::test]
async fn properties_nested_too_deep_are_refused_and_the_feed_reads_back() {
    let app = TestApp::new().await;
    let ann = app.user("ann").await;
    let bob = app.user("bob").await;
    let since = app
        .get("/api/v1/changes", Some(&bob))
        .await
        .expect(200)
        .json()["next"]
        .as_str()
        .unwrap()
        .to_string();
    // `levels` levels of objects, the properties object included.
    let nested = |levels: usize| {
        let mut v = json!(1);
        for _ in 0..levels {
            v = json!({ "a": v });
        }
        v
    };
    let shared = json!([{"principal": "user:bob", "role": "viewer"}]);
    let deep = app.item(&ann, "doc", nested(64), shared.clone()).await;
    let r = app
        .call(
            Method::POST,
            "/api/v1/items",
            Some(&ann),
            Some(json!({"kind": "doc", "properties": nested(65), "acl": shared})),
        )
        .await
        .expect(400);
    assert!(r.text().contains("64"), "{}", r.text());
    // A patch cannot deepen an item past the limit either.
    let id = deep["id"].as_str().unwrap();
    app.call(
        Method::PATCH,
        &format!("/api/v1/items/{id}"),
        Some(&ann),
        Some(json!({"properties": {"b": nested(64)}})),
    )
    .await
    .expect(400);
    let page = changes_after(&app, &bob, &since, 1).await;
    let changes = page["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{page}");
    assert_eq!(changes[0]["item"]["properties"], deep["properties"]);
}

/// Regression (hostile probe): a stream whose session was signed out went
/// on delivering items for up to 30 s (its periodic check), and later a
/// resync for each group its user joined or left (which tells the
/// session's holder when). Anything now goes out only after the session
/// is checked, so the stream ends at the first change after the sign-out,
/// before sending it.
#[tokio::test]
async fn a_signed_out_stream_gets_nothing_more() {
    let app = TestApp::new().await;
    let ann = app.user("ann").await;
    app.call(
        Method::POST,
        "/api/v1/groups",
        Some(&ann),
        Some(json!({"id": "room"})),
    )
    .await
    .expect(201);
    for (bob, after) in [("bob", "an item"), ("bea", "a join")] {
        let token = app.user(bob).await;
        let req = Request::builder()
            .uri("/api/v1/events")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        let res = app.router.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 200);
        let mut body = res.into_body().into_data_stream();
        let to_bob = json!([{"principal": format!("user:{bob}"), "role": "viewer"}]);
        let before = app.item(&ann, "doc", json!({"n": 1}), to_bob.clone()).await;
        let got = events(&mut body, 1).await;
        let v: Value = serde_json::from_str(&got[0].2).unwrap();
        assert_eq!(v["item"]["id"], before["id"]);
        app.call(
            Method::DELETE,
            "/api/v1/sessions/current",
            Some(&token),
            None,
        )
        .await
        .expect(204);
        if after == "an item" {
            app.item(&ann, "doc", json!({"secret": true}), to_bob).await;
        } else {
            let path = format!("/api/v1/groups/room/members/user:{bob}");
            app.call(Method::PUT, &path, Some(&ann), None)
                .await
                .expect(204);
        }
        // The stream ends without another event (comments may come first).
        let mut text = String::new();
        loop {
            let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
                .await
                .expect("the stream ends within 10 s");
            match chunk {
                None => break,
                Some(Ok(bytes)) => text.push_str(std::str::from_utf8(&bytes).unwrap()),
                Some(Err(_)) => break,
            }
        }
        assert!(
            !text.contains("data:"),
            "delivered after sign-out and {after}: {text}"
        );
    }
}

/// Streams of callers signed in as no one count per client address (per
/// /64 for IPv6): past the per-user limit one address is refused, another
/// is not.
#[tokio::test]
async fn anonymous_streams_count_per_address() {
    let app = TestApp::new().await;
    let open = |addr: std::net::SocketAddr| {
        let mut req = Request::builder()
            .uri("/api/v1/events")
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        app.router.clone().oneshot(req)
    };
    let v4 = |last: u8| std::net::SocketAddr::from(([192, 0, 2, last], 4000));
    let v6 = |host: u16| std::net::SocketAddr::from(([0x2001, 0xdb8, 1, 2, 0, 0, 0, host], 4000));
    let mut held = Vec::new();
    for _ in 0..16 {
        let res = open(v4(1)).await.unwrap();
        assert_eq!(res.status(), 200);
        held.push(res);
    }
    assert_eq!(open(v4(1)).await.unwrap().status(), 429);
    assert_eq!(open(v4(2)).await.unwrap().status(), 200);
    for host in 0..16 {
        let res = open(v6(host)).await.unwrap();
        assert_eq!(res.status(), 200);
        held.push(res);
    }
    assert_eq!(open(v6(99)).await.unwrap().status(), 429, "the same /64");
}
