//! Full-text search: analysis, ranking, match modes, prefixes, access,
//! consistency, categories, bodies, paging and refusals; and a model test
//! against a brute-force search over random shares, joins, leaves, edits and
//! deletes.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::json;
use tarn_engine::{
    Caller, Engine, EngineError, Grant, Principal, Role, SearchPage, SearchQuery, TextField,
};

use crate::common::{self, admin, props, sign_up};

fn tf(field: &str, weight: f64) -> TextField {
    TextField {
        field: field.into(),
        weight,
    }
}

async fn text_index(e: &Engine, name: &str, kind: &str, where_: &[&str], fields: Vec<TextField>) {
    e.declare_text_index(
        &admin(),
        name,
        kind,
        where_.iter().map(|s| s.to_string()).collect(),
        fields,
        None,
    )
    .await
    .unwrap();
    common::wait_ready(e, name).await;
}

/// The text index most tests search: `doc`'s title (weight 3) and
/// description.
async fn title_and_description(e: &Engine) {
    let fields = vec![tf("title", 3.0), tf("description", 1.0)];
    text_index(e, "doc-text", "doc", &[], fields).await;
}

fn q(text: &str) -> SearchQuery {
    SearchQuery {
        q: text.into(),
        kind: Some("doc".into()),
        ..SearchQuery::default()
    }
}

/// Creates a `doc` and answers its id.
async fn doc(
    e: &Engine,
    who: &Caller,
    p: serde_json::Map<String, serde_json::Value>,
    acl: Vec<Grant>,
) -> String {
    e.create_item(who, "doc", p, acl).await.unwrap().item.id
}

async fn ids(e: &Engine, who: &Caller, query: SearchQuery) -> Vec<String> {
    all_pages(e, who, query)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Every page of a search, as (id, score).
async fn all_pages(e: &Engine, who: &Caller, mut query: SearchQuery) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    loop {
        let page: SearchPage = e.search(who, &query).await.unwrap();
        out.extend(page.hits.iter().map(|h| (h.item.item.id.clone(), h.score)));
        match page.next {
            Some(n) => query.cursor = Some(n),
            None => return out,
        }
    }
}

fn everyone() -> Vec<Grant> {
    vec![Grant {
        principal: Principal::Everyone,
        role: Role::Viewer,
    }]
}

/// A field of the heaviest weight allowed still ranks by its words: a
/// short title with more matches below it beats a long one (impacts used
/// to saturate their two bytes at weight 30 or so, and tie).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_weights_rank_by_their_words() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let fields = vec![tf("title", 100.0), tf("description", 100.0)];
    text_index(&e, "doc-text", "doc", &[], fields).await;
    let mut made = Vec::new();
    for (title, desc) in [
        ("long title with many words and then tea at the end", ""),
        ("tea", "tea tea tea"),
        ("tea", ""),
        ("tea pot", "tea"),
    ] {
        let p = props(json!({"title": title, "description": desc}));
        made.push(doc(&e, &ann, p, everyone()).await);
    }
    let got = all_pages(&e, &ann, q("tea")).await;
    let order: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        order,
        [&made[1], &made[3], &made[2], &made[0]].map(String::as_str),
        "{got:?}"
    );
    let scores: Vec<f64> = got.iter().map(|(_, s)| *s).collect();
    assert!(scores.windows(2).all(|w| w[0] > w[1]), "{scores:?}");
    // A one-word search pages from its cursor: no repeats, none skipped.
    let mut paged = Vec::new();
    let mut query = q("tea");
    query.limit = 1;
    loop {
        let page = e.search(&ann, &query).await.unwrap();
        paged.extend(page.hits.iter().map(|h| h.item.item.id.clone()));
        match page.next {
            Some(c) => query.cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(paged, order, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn words_are_analysed_ranked_and_matched() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    title_and_description(&e).await;
    let mk = |title: &str, desc: &str| {
        let (e, ann) = (e.clone(), ann.clone());
        let p = props(json!({"title": title, "description": desc}));
        async move { doc(&e, &ann, p, everyone()).await }
    };
    let tea_title = mk("Green tea", "a note on brewing").await;
    let tea_desc = mk("Kettles", "green tea, green tea and more green tea").await;
    let cafe = mk("Café culture", "espresso").await;
    let other = mk("Nothing", "to see").await;
    let anon = Caller::Anonymous;
    // match=all: both words; the title (weight 3) outranks the description.
    let got = all_pages(&e, &anon, q("green TEA")).await;
    assert_eq!(
        got.iter().map(|h| h.0.clone()).collect::<Vec<_>>(),
        vec![tea_title.clone(), tea_desc.clone()]
    );
    assert!(got[0].1 > got[1].1 && got[1].1 > 0.0, "{got:?}");
    // Stemming and folding.
    assert_eq!(ids(&e, &anon, q("Brewed")).await, vec![tea_title.clone()]);
    assert_eq!(ids(&e, &anon, q("cafe")).await, vec![cafe.clone()]);
    assert_eq!(ids(&e, &anon, q("CAFÉS")).await, vec![cafe.clone()]);
    // match=all needs every word; match=any puts more matched words first.
    assert!(ids(&e, &anon, q("green espresso")).await.is_empty());
    let any = ids(
        &e,
        &anon,
        SearchQuery {
            all: false,
            ..q("green espresso tea")
        },
    )
    .await;
    assert_eq!(any.len(), 3);
    assert!(any[..2].contains(&tea_title) && any[..2].contains(&tea_desc));
    assert_eq!(any[2], cafe);
    // Prefix: search as you type.
    let typed = ids(
        &e,
        &anon,
        SearchQuery {
            prefix: true,
            ..q("green te")
        },
    )
    .await;
    assert_eq!(typed, vec![tea_title.clone(), tea_desc.clone()]);
    assert_eq!(
        ids(
            &e,
            &anon,
            SearchQuery {
                prefix: true,
                ..q("esp")
            }
        )
        .await,
        vec![cafe.clone()]
    );
    assert!(
        ids(&e, &anon, q("esp")).await.is_empty(),
        "without prefix: whole words"
    );
    // Words that are no words find nothing, cleanly.
    for odd in ["🍵", "\u{301}", "!!!", "שלום", "a\u{0}b"] {
        e.search(&anon, &q(odd)).await.unwrap();
    }
    let _ = other;
}

/// Long lists: words in more items than a first read takes, so scores
/// come from forward rows as well as from the rows read; every item with
/// both words is found, in score order, and an item's score is the sum of
/// its words' scores found alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lists_score_alike_from_rows_and_forward_rows() {
    long_lists(150, |i| {
        // How often each word occurs varies so impacts differ.
        let elm = i % 3 == 0;
        let mut words = vec!["oak"; 1 + i % 5];
        if elm {
            words.extend(vec!["elm"; 1 + i % 7]);
        }
        words.extend(vec!["filler"; i % 11]);
        (format!("t{i}"), words.join(" "), elm)
    })
    .await;
}

/// The same with both words' lists longer than a search reads before its
/// first forward row (rows read per word go 8, 24, 56, 120, 248, 504 at
/// this page size), so forward rows are read while both words are still
/// open, and with impacts scattered (either word in some titles, counts
/// and lengths mixed): a candidate ruled out by a bound below its true
/// best would be missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_longer_than_the_deferred_reads_score_alike() {
    long_lists(900, |i| {
        let h = (i as u64).wrapping_mul(2_654_435_761) % (1 << 32);
        let pick = |shift: u32, n: u64| ((h >> shift) % n) as usize;
        let elm = pick(3, 3) != 0;
        let mut title = format!("t{i}");
        if pick(7, 9) == 0 {
            title.push_str(" oak");
        }
        if elm && pick(11, 9) == 0 {
            title.push_str(" elm");
        }
        let mut words = vec!["oak"; 1 + pick(0, 6)];
        if elm {
            words.extend(vec!["elm"; 1 + pick(15, 9)]);
        }
        words.extend(vec!["filler"; pick(19, 60)]);
        (title, words.join(" "), elm)
    })
    .await;
}

/// `n` items made by `item(i)`: a title, a description with "oak", and
/// whether it has "elm" too.
async fn long_lists(n: usize, item: fn(usize) -> (String, String, bool)) {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    title_and_description(&e).await;
    let mut both = BTreeSet::new();
    for i in 0..n {
        let (title, description, elm) = item(i);
        let p = props(json!({"title": title, "description": description}));
        let id = doc(&e, &ann, p, vec![]).await;
        if elm {
            both.insert(id);
        }
    }
    let single = |w: &'static str| {
        let (e, ann) = (e.clone(), ann.clone());
        async move {
            let hits = all_pages(
                &e,
                &ann,
                SearchQuery {
                    q: w.into(),
                    limit: 7,
                    ..q("")
                },
            )
            .await;
            hits.into_iter()
                .map(|(id, s)| (id, milli(s)))
                .collect::<BTreeMap<_, _>>()
        }
    };
    let (oak, elm) = (single("oak").await, single("elm").await);
    assert_eq!(oak.len(), n);
    assert_eq!(elm.len(), both.len());
    for all in [true, false] {
        let got = all_pages(
            &e,
            &ann,
            SearchQuery {
                q: "oak elm".into(),
                all,
                limit: 7,
                ..q("")
            },
        )
        .await;
        let ids: BTreeSet<String> = got.iter().map(|h| h.0.clone()).collect();
        assert_eq!(got.len(), ids.len(), "no hit twice");
        if all {
            assert_eq!(ids, both);
        } else {
            assert_eq!(ids.len(), n);
        }
        for (id, score) in &got {
            let sum = oak.get(id).unwrap_or(&0) + elm.get(id).unwrap_or(&0);
            let matched = u64::from(oak.contains_key(id)) + u64::from(elm.contains_key(id));
            assert_eq!(milli(*score), shown(sum, matched, all), "{id}, all={all}");
        }
        // Best first; with match=any, both words before one, and the
        // scores fall as the hits do.
        let key = |(id, s): &(String, f64)| (both.contains(id) || all, milli(*s));
        assert!(got.windows(2).all(|w| key(&w[0]) >= key(&w[1])), "{got:?}");
        assert!(got.windows(2).all(|w| w[0].1 >= w[1].1), "{got:?}");
    }
}

/// A prefix finds every term that starts with it, also when each term is
/// held by more items than one read of the expansion takes (each read then
/// finds one term more: twelve terms take twelve reads, where eight were
/// once all it made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_expands_past_terms_held_by_many_items() {
    let (e, _dir) = common::sqlite();
    let ann = sign_up(&e, "ann").await;
    text_index(&e, "doc-text", "doc", &[], vec![tf("title", 1.0)]).await;
    let words = [
        "zorba", "zorbo", "zorca", "zordo", "zorfo", "zorgo", "zorha", "zorja", "zorka", "zorla",
        "zorma", "zorna",
    ];
    let mut all = BTreeSet::new();
    for w in words {
        for i in 0..20 {
            let p = props(json!({"title": format!("{w} t{i}")}));
            all.insert(doc(&e, &ann, p, everyone()).await);
        }
    }
    let got = ids(
        &e,
        &ann,
        SearchQuery {
            q: "zor".into(),
            prefix: true,
            limit: 25,
            ..q("")
        },
    )
    .await;
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), all);
    let got = ids(
        &e,
        &ann,
        SearchQuery {
            q: "zord".into(),
            prefix: true,
            limit: 25,
            ..q("")
        },
    )
    .await;
    assert_eq!(got.len(), 20);
}

/// A prefix that starts more terms than it expands to ([`MAX_EXPANSION`])
/// still matches, after another word, the items of that word with a term
/// it starts, which their forward rows tell: `bobs jq` finds `jqzzz bobs`
/// past forty `jqa..` terms. (Alone, `jq` finds the items of the terms it
/// expanded to.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_past_its_expansion_still_matches_after_another_word() {
    let (e, _dir) = common::sqlite();
    let ann = sign_up(&e, "ann").await;
    text_index(&e, "doc-text", "doc", &[], vec![tf("title", 1.0)]).await;
    for i in 0..40 {
        let p = props(json!({"title": format!("jqa{i:02}")}));
        doc(&e, &ann, p, everyone()).await;
    }
    let both = doc(&e, &ann, props(json!({"title": "jqzzz bobs"})), everyone()).await;
    let one = doc(&e, &ann, props(json!({"title": "bobs alone"})), everyone()).await;
    let search = |all: bool| SearchQuery {
        q: "bobs jq".into(),
        prefix: true,
        all,
        limit: 10,
        ..q("")
    };
    let hits = all_pages(&e, &ann, search(true)).await;
    assert_eq!(
        hits.iter().map(|(id, _)| id).collect::<Vec<_>>(),
        vec![&both]
    );
    // A term the prefix left out counts 0.001, however the item was found.
    let bobs = all_pages(
        &e,
        &ann,
        SearchQuery {
            limit: 10,
            ..q("bobs")
        },
    )
    .await;
    let alone = bobs.iter().find(|(id, _)| *id == both).unwrap().1;
    assert_eq!(
        ((hits[0].1 - alone) * 1000.0).round(),
        1.0,
        "{hits:?} {bobs:?}"
    );
    // Any word: the item with both first, then those with one.
    let any = ids(&e, &ann, search(false)).await;
    assert_eq!(any.first(), Some(&both), "{any:?}");
    assert!(any.contains(&one), "{any:?}");
    let alone = SearchQuery {
        q: "jq".into(),
        prefix: true,
        limit: 100,
        ..q("")
    };
    assert_eq!(ids(&e, &ann, alone).await.len(), tarn_engine::MAX_EXPANSION);
}

/// Every prefix of a word finds it as it is typed, also where its stem
/// spells its last letters otherwise than the word (`dying` is `die`,
/// `skies` is `sky`, `crying` is `cri`) or ends before them (`brew`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_prefix_of_a_word_finds_it() {
    let (e, _dir) = common::sqlite();
    let ann = sign_up(&e, "ann").await;
    text_index(&e, "doc-text", "doc", &[], vec![tf("title", 1.0)]).await;
    let words = [
        "Brewing", "dying", "skies", "crying", "studies", "happily", "making", "hoping",
    ];
    let mut items = Vec::new();
    for w in words {
        items.push(doc(&e, &ann, props(json!({"title": w})), everyone()).await);
    }
    for (w, item) in words.iter().zip(&items) {
        for end in 1..=w.len() {
            let typed = &w[..end];
            let got = ids(
                &e,
                &ann,
                SearchQuery {
                    q: typed.into(),
                    prefix: true,
                    limit: 10,
                    ..q("")
                },
            )
            .await;
            assert!(got.contains(item), "{typed} does not find {w}: {got:?}");
        }
    }
}

/// Every prefix of a word of an alphabet beyond Latin, Cyrillic and Greek
/// finds it, its first letter (or Hangul syllable) too: before, one letter
/// of these found only a word of that letter alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_prefix_of_a_word_of_other_alphabets_finds_it() {
    let (e, _dir) = common::sqlite();
    let ann = sign_up(&e, "ann").await;
    text_index(&e, "doc-text", "doc", &[], vec![tf("title", 1.0)]).await;
    let words = [
        "مرحبا",
        "حاسوب",
        "پنجره",
        "שלום",
        "בָּרוּךְ",
        "բարեւ",
        "გამარჯობა",
        "タワー",
        "काम",
        "क़िला",
        "বাংলা",
        "தமிழ்",
        "සිංහල",
        "ਪੰਜਾਬ",
        "আৰু",
        "എൻ്റെ",
        "ג׳ירפה",
        "검색어",
        "한국어",
    ];
    let mut items = Vec::new();
    for w in words {
        items.push(doc(&e, &ann, props(json!({"title": w})), everyone()).await);
    }
    let find = |typed: String| {
        let (e, ann) = (&e, ann.clone());
        async move {
            let query = SearchQuery {
                q: typed,
                prefix: true,
                limit: 20,
                ..q("")
            };
            ids(e, &ann, query).await
        }
    };
    for (w, item) in words.iter().zip(&items) {
        let chars: Vec<char> = w.chars().collect();
        for end in 1..=chars.len() {
            let typed: String = chars[..end].iter().collect();
            let got = find(typed.clone()).await;
            assert!(got.contains(item), "{typed} does not find {w}: {got:?}");
        }
    }
}

/// A term the caller's own partition lacks is still read from the
/// partitions that hold it: only a partition read to its end, without the
/// term, is passed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_reads_each_term_where_it_is() {
    let (e, _dir) = common::sqlite();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    e.create_group(&bob, "club", None, Default::default())
        .await
        .unwrap();
    e.add_member(&bob, "club", &Principal::User("ann".into()))
        .await
        .unwrap();
    text_index(&e, "doc-text", "doc", &[], vec![tf("title", 1.0)]).await;
    let mut want = BTreeSet::new();
    let own = props(json!({"title": "zoqa"}));
    want.insert(doc(&e, &ann, own, vec![]).await);
    let club = vec![Grant {
        principal: Principal::Group("club".into()),
        role: Role::Viewer,
    }];
    for i in 0..12 {
        let p = props(json!({"title": format!("zorbix t{i}")}));
        want.insert(doc(&e, &bob, p, club.clone()).await);
    }
    let got = ids(
        &e,
        &ann,
        SearchQuery {
            q: "zo".into(),
            prefix: true,
            limit: 5,
            ..q("")
        },
    )
    .await;
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_respects_sharing_and_sees_every_change() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    let cat = sign_up(&e, "cat").await;
    text_index(&e, "doc-text", "doc", &[], vec![tf("title", 1.0)]).await;
    e.create_group(&ann, "club", None, Default::default())
        .await
        .unwrap();
    let club = vec![Grant {
        principal: Principal::Group("club".into()),
        role: Role::Viewer,
    }];
    let mine = e
        .create_item(&ann, "doc", props(json!({"title": "secret plan"})), vec![])
        .await
        .unwrap()
        .item
        .id;
    let shared = e
        .create_item(
            &ann,
            "doc",
            props(json!({"title": "club plan"})),
            club.clone(),
        )
        .await
        .unwrap()
        .item
        .id;
    assert_eq!(ids(&e, &ann, q("plan")).await.len(), 2);
    assert!(
        ids(&e, &bob, q("plan")).await.is_empty(),
        "never an item one may not read"
    );
    // Scores are the item's own: items bob cannot read never move his.
    e.add_member(&ann, "club", &Principal::User("bob".into()))
        .await
        .unwrap();
    let before = all_pages(&e, &bob, q("plan")).await;
    assert_eq!(
        before.iter().map(|h| h.0.clone()).collect::<Vec<_>>(),
        vec![shared.clone()]
    );
    for i in 0..20 {
        e.create_item(
            &cat,
            "doc",
            props(json!({"title": format!("plan plan plan {i}")})),
            vec![],
        )
        .await
        .unwrap();
    }
    assert_eq!(
        all_pages(&e, &bob, q("plan")).await,
        before,
        "scores unmoved"
    );
    // Edits, unshares, group changes and deletes show on the next search.
    e.patch_item(&ann, &shared, None, &json!({"title": "club party"}), None)
        .await
        .unwrap();
    assert!(ids(&e, &bob, q("plan")).await.is_empty());
    assert_eq!(ids(&e, &bob, q("party")).await, vec![shared.clone()]);
    e.remove_member(&bob, "club", &Principal::User("bob".into()))
        .await
        .unwrap();
    assert!(ids(&e, &bob, q("party")).await.is_empty());
    e.set_acl(
        &ann,
        &mine,
        None,
        vec![
            Grant {
                principal: Principal::User("ann".into()),
                role: Role::Manager,
            },
            Grant {
                principal: Principal::User("bob".into()),
                role: Role::Viewer,
            },
        ],
        None,
    )
    .await
    .unwrap();
    assert_eq!(ids(&e, &bob, q("secret")).await, vec![mine.clone()]);
    e.delete_item(&ann, &mine, None, None).await.unwrap();
    assert!(ids(&e, &bob, q("secret")).await.is_empty());
    assert!(ids(&e, &ann, q("secret")).await.is_empty());
    // Links never make an item appear.
    let linked = e
        .create_item(&ann, "doc", props(json!({"title": "linked page"})), vec![])
        .await
        .unwrap()
        .item
        .id;
    e.create_link(&ann, &linked, None, Role::Viewer, None)
        .await
        .unwrap();
    assert!(ids(&e, &bob, q("linked")).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn categories_bodies_paging_and_refusals() {
    let e = common::memory();
    let ann = sign_up(&e, "ann").await;
    text_index(&e, "msg-text", "message", &["room"], vec![tf("text", 1.0)]).await;
    for room in ["a", "b"] {
        for i in 0..7 {
            e.create_item(
                &ann,
                "message",
                props(json!({"room": room, "text": format!("hello number {i}")})),
                vec![],
            )
            .await
            .unwrap();
        }
    }
    let in_room = |room: &str, limit: usize| SearchQuery {
        q: "hello".into(),
        kind: Some("message".into()),
        where_: vec![("room".into(), json!(room))],
        limit,
        ..SearchQuery::default()
    };
    let a = ids(&e, &ann, in_room("a", 3)).await;
    assert_eq!(a.len(), 7, "paging by 3 sees all seven, once each");
    assert_eq!(a.iter().collect::<BTreeSet<_>>().len(), 7);
    assert_eq!(
        ids(&e, &ann, in_room("a", 100)).await,
        a,
        "pages join into the whole"
    );
    assert_eq!(ids(&e, &ann, in_room("c", 3)).await.len(), 0);
    // No index without the where-field: it names one to declare.
    let r = e
        .search(
            &ann,
            &SearchQuery {
                q: "hello".into(),
                kind: Some("message".into()),
                ..SearchQuery::default()
            },
        )
        .await;
    assert!(matches!(r, Err(EngineError::NoIndex { .. })), "{r:?}");
    // Bodies.
    text_index(
        &e,
        "file-text",
        "file",
        &[],
        vec![tf("name", 2.0), tf("$body", 1.0)],
    )
    .await;
    let f = e
        .create_item(&ann, "file", props(json!({"name": "notes"})), vec![])
        .await
        .unwrap()
        .item
        .id;
    let mut up = e
        .begin_body(&ann, &f, None, "text/plain; charset=utf-8", None)
        .await
        .unwrap();
    up.write("Minutes: the committee discussed porcupines.".as_bytes())
        .await
        .unwrap();
    up.finish(None).await.unwrap();
    let body_q = |w: &str| SearchQuery {
        q: w.into(),
        kind: Some("file".into()),
        ..SearchQuery::default()
    };
    assert_eq!(ids(&e, &ann, body_q("porcupine")).await, vec![f.clone()]);
    assert_eq!(ids(&e, &ann, body_q("notes")).await, vec![f.clone()]);
    // The first MiB is indexed, to a word ending at its last byte; not a
    // word the MiB's end splits, nor one after it.
    let mib = 1024 * 1024;
    for (text, within, past) in [
        (
            format!("{}edgeword tailword", " ".repeat(mib - 8)),
            "edgeword",
            "tailword",
        ),
        (
            format!("{}lastword splitword", " ".repeat(mib - 13)),
            "lastword",
            "splitword",
        ),
    ] {
        let mut up = e
            .begin_body(&ann, &f, None, "text/plain", None)
            .await
            .unwrap();
        up.write(text.as_bytes()).await.unwrap();
        up.finish(None).await.unwrap();
        assert_eq!(
            ids(&e, &ann, body_q(within)).await,
            vec![f.clone()],
            "{within}"
        );
        assert!(ids(&e, &ann, body_q(past)).await.is_empty(), "{past}");
    }
    // A body is read in the charset its type names.
    let mut up = e
        .begin_body(&ann, &f, None, "text/plain; charset=iso-8859-1", None)
        .await
        .unwrap();
    up.write(b"caf\xe9 cr\xe8me").await.unwrap();
    up.finish(None).await.unwrap();
    assert_eq!(ids(&e, &ann, body_q("café crème")).await, vec![f.clone()]);
    // A binary body adds no words.
    let mut up = e
        .begin_body(&ann, &f, None, "application/octet-stream", None)
        .await
        .unwrap();
    up.write(b"porcupines").await.unwrap();
    up.finish(None).await.unwrap();
    assert!(ids(&e, &ann, body_q("porcupine")).await.is_empty());
    // Refusals.
    for bad in ["", "   "] {
        assert!(matches!(
            e.search(&ann, &body_q(bad)).await,
            Err(EngineError::InvalidInput(_))
        ));
    }
    let long = "a".repeat(tarn_engine::MAX_QUERY + 1);
    match e.search(&ann, &body_q(&long)).await {
        Err(EngineError::InvalidInput(m)) => assert!(m.contains("1024"), "{m}"),
        other => panic!("{other:?}"),
    }
    let many: Vec<String> = (0..20).map(|i| format!("w{i}")).collect();
    match e.search(&ann, &body_q(&many.join(" "))).await {
        Err(EngineError::InvalidInput(m)) => assert!(m.contains("16"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        e.search(
            &ann,
            &SearchQuery {
                cursor: Some("!!".into()),
                ..body_q("x")
            }
        )
        .await,
        Err(EngineError::InvalidInput(_))
    ));
    assert!(matches!(
        e.search(
            &ann,
            &SearchQuery {
                q: "x".into(),
                kind: None,
                where_: vec![("room".into(), json!("a"))],
                ..SearchQuery::default()
            }
        )
        .await,
        Err(EngineError::NoIndex { .. })
    ));
    // Without a kind: every text index without where-fields.
    let all = e
        .search(
            &ann,
            &SearchQuery {
                q: "notes".into(),
                kind: None,
                ..SearchQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(all.hits.len(), 1);
}

// The model: random documents from a small vocabulary, random shares,
// memberships, edits and deletes; every user's search must equal a brute
// force over what the user may read.

const VOCAB: [&str; 6] = ["red", "blue", "owl", "fig", "map", "sun"];
const USERS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Create {
        by: usize,
        words: Vec<usize>,
        share: Vec<Who>,
    },
    Edit {
        item: usize,
        words: Vec<usize>,
    },
    Share {
        item: usize,
        share: Vec<Who>,
    },
    Delete {
        item: usize,
    },
    Join {
        user: usize,
    },
    Leave {
        user: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    User(usize),
    Group,
    Authenticated,
    Everyone,
}

fn who() -> impl Strategy<Value = Who> {
    prop_oneof![
        (0..USERS).prop_map(Who::User),
        Just(Who::Group),
        Just(Who::Authenticated),
        Just(Who::Everyone)
    ]
}

fn text() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..VOCAB.len(), 1..5)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..USERS, text(), prop::collection::vec(who(), 0..3))
            .prop_map(|(by, words, share)| Op::Create { by, words, share }),
        2 => (any::<usize>(), text()).prop_map(|(item, words)| Op::Edit { item, words }),
        2 => (any::<usize>(), prop::collection::vec(who(), 0..3)).prop_map(|(item, share)| Op::Share { item, share }),
        1 => any::<usize>().prop_map(|item| Op::Delete { item }),
        1 => (0..USERS).prop_map(|user| Op::Join { user }),
        1 => (0..USERS).prop_map(|user| Op::Leave { user }),
    ]
}

struct Doc {
    id: String,
    by: usize,
    words: Vec<usize>,
    share: Vec<Who>,
    gone: bool,
}

fn grants(by: usize, share: &[Who]) -> Vec<Grant> {
    let mut g: Vec<Grant> = share
        .iter()
        .map(|w| Grant {
            principal: match w {
                Who::User(u) => Principal::User(format!("u{u}")),
                Who::Group => Principal::Group("g".into()),
                Who::Authenticated => Principal::Authenticated,
                Who::Everyone => Principal::Everyone,
            },
            role: Role::Viewer,
        })
        .collect();
    g.push(Grant {
        principal: Principal::User(format!("u{by}")),
        role: Role::Manager,
    });
    g
}

/// Runs `ops` on `e` and checks every user's searches against the model.
/// When `full`, also an anonymous caller's and one-letter prefixes: what
/// they add is the engine's alone (whose principals a caller has, how
/// many heads a prefix reads), so the Cassandra variant, whose reads wait
/// on round trips, leaves them to the others. There a one-letter prefix
/// reads some fifty heads in each of 34 partitions, and these took 60% of
/// the variant's time (the HTTP suite's `search_over_http` still types
/// one letter on Cassandra).
async fn run_model(e: Engine, ops: Vec<Op>, full: bool) {
    for u in 0..USERS {
        sign_up(&e, &format!("u{u}")).await;
    }
    e.create_group(&admin(), "g", None, Default::default())
        .await
        .unwrap();
    text_index(&e, "doc-text", "doc", &[], vec![tf("body", 1.0)]).await;
    let mut docs: Vec<Doc> = Vec::new();
    let mut members: BTreeSet<usize> = BTreeSet::new();
    let text = |w: &[usize]| w.iter().map(|i| VOCAB[*i]).collect::<Vec<_>>().join(" ");
    for op in &ops {
        if docs.is_empty() && matches!(op, Op::Edit { .. } | Op::Share { .. } | Op::Delete { .. }) {
            continue;
        }
        match op {
            Op::Create { by, words, share } => {
                let v = e
                    .create_item(
                        &common::user(&format!("u{by}")),
                        "doc",
                        props(json!({"body": text(words)})),
                        grants(*by, share),
                    )
                    .await
                    .unwrap();
                docs.push(Doc {
                    id: v.item.id,
                    by: *by,
                    words: words.clone(),
                    share: share.clone(),
                    gone: false,
                });
            }
            Op::Edit { item, words } => {
                let n = docs.len();
                let d = &mut docs[item % n];
                if d.gone {
                    continue;
                }
                e.patch_item(
                    &common::user(&format!("u{}", d.by)),
                    &d.id,
                    None,
                    &json!({"body": text(words)}),
                    None,
                )
                .await
                .unwrap();
                d.words = words.clone();
            }
            Op::Share { item, share } => {
                let n = docs.len();
                let d = &mut docs[item % n];
                if d.gone {
                    continue;
                }
                e.set_acl(
                    &common::user(&format!("u{}", d.by)),
                    &d.id,
                    None,
                    grants(d.by, share),
                    None,
                )
                .await
                .unwrap();
                d.share = share.clone();
            }
            Op::Delete { item } => {
                let n = docs.len();
                let d = &mut docs[item % n];
                if d.gone {
                    continue;
                }
                e.delete_item(&common::user(&format!("u{}", d.by)), &d.id, None, None)
                    .await
                    .unwrap();
                d.gone = true;
            }
            Op::Join { user } => {
                e.add_member(&admin(), "g", &Principal::User(format!("u{user}")))
                    .await
                    .unwrap();
                members.insert(*user);
            }
            Op::Leave { user } => {
                e.remove_member(&admin(), "g", &Principal::User(format!("u{user}")))
                    .await
                    .unwrap();
                members.remove(user);
            }
        }
    }
    // Every user and an anonymous caller, every one- and two-word
    // query, both match modes; the callers at once (on Cassandra the
    // queries wait on round trips).
    let docs = std::sync::Arc::new(docs);
    let members = std::sync::Arc::new(members);
    let mut checks = tokio::task::JoinSet::new();
    let anonymous = full.then_some(None);
    for u in (0..USERS).map(Some).chain(anonymous) {
        let (e, docs, members) = (e.clone(), docs.clone(), members.clone());
        checks.spawn(async move { check_user(&e, u, &docs, &members, full).await });
    }
    while let Some(done) = checks.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// Every one- and two-word query of user `u` (`None`: an anonymous
/// caller), both match modes, and the first two letters of each word as a
/// prefix (the first one too when `one_letter`), against the model's
/// `docs` and group `members`.
async fn check_user(
    e: &Engine,
    u: Option<usize>,
    docs: &[Doc],
    members: &BTreeSet<usize>,
    one_letter: bool,
) {
    let reads = |d: &Doc| {
        !d.gone
            && (Some(d.by) == u
                || d.share.iter().any(|w| match w {
                    Who::User(x) => Some(*x) == u,
                    Who::Group => u.is_some_and(|u| members.contains(&u)),
                    Who::Authenticated => u.is_some(),
                    Who::Everyone => true,
                }))
    };
    let caller = match u {
        Some(u) => common::user(&format!("u{u}")),
        None => Caller::Anonymous,
    };
    // Each word's score in each item, in thousandths: a query's score
    // is the sum of its matched words' (whether an item's impacts come
    // from the rows read or from its forward row).
    let mut single: Vec<BTreeMap<String, u64>> = Vec::new();
    for w in VOCAB {
        let hits = all_pages(
            e,
            &caller,
            SearchQuery {
                q: w.to_string(),
                limit: 3,
                ..q("")
            },
        )
        .await;
        single.push(hits.into_iter().map(|(id, s)| (id, milli(s))).collect());
    }
    // Search as you type: the first two letters of each word, and the
    // first alone when `one_letter` (no two words of the vocabulary start
    // alike).
    let typed_letters: &[usize] = if one_letter { &[1, 2] } else { &[2] };
    for (i, w) in VOCAB.iter().enumerate() {
        for typed in typed_letters.iter().map(|n| &w[..*n]) {
            let query = SearchQuery {
                q: typed.to_string(),
                prefix: true,
                limit: 2,
                ..q("")
            };
            let got: BTreeSet<String> = ids(e, &caller, query).await.into_iter().collect();
            let want: BTreeSet<String> = docs
                .iter()
                .filter(|d| reads(d) && d.words.contains(&i))
                .map(|d| d.id.clone())
                .collect();
            assert_eq!(got, want, "{u:?} prefix {typed}");
        }
    }
    #[allow(clippy::needless_range_loop)]
    for a in 0..VOCAB.len() {
        for b in a..VOCAB.len() {
            for all in [true, false] {
                let words: BTreeSet<usize> = [a, b].into_iter().collect();
                let want: BTreeMap<String, usize> = docs
                    .iter()
                    .filter(|d| reads(d))
                    .filter_map(|d| {
                        let hit = words.iter().filter(|w| d.words.contains(w)).count();
                        let ok = if all { hit == words.len() } else { hit > 0 };
                        ok.then(|| (d.id.clone(), hit))
                    })
                    .collect();
                let query = SearchQuery {
                    q: format!("{} {}", VOCAB[a], VOCAB[b]),
                    all,
                    limit: 2,
                    ..q("")
                };
                let got = all_pages(e, &caller, query).await;
                for (id, score) in &got {
                    let sum: u64 = words.iter().filter_map(|w| single[*w].get(id)).sum();
                    let matched = words
                        .iter()
                        .filter(|w| single[**w].contains_key(id))
                        .count();
                    assert_eq!(
                        milli(*score),
                        shown(sum, matched as u64, all),
                        "{id}: {words:?} all={all}"
                    );
                }
                let got_ids: BTreeSet<String> = got.iter().map(|h| h.0.clone()).collect();
                assert_eq!(got.len(), got_ids.len(), "no hit twice");
                assert_eq!(
                    got_ids,
                    want.keys().cloned().collect::<BTreeSet<_>>(),
                    "{u:?} {:?} all={all}",
                    words
                );
                if !all {
                    // More matched words first.
                    let matched: Vec<usize> = got.iter().map(|h| want[&h.0]).collect();
                    assert!(matched.windows(2).all(|w| w[0] >= w[1]), "{matched:?}");
                } else {
                    assert!(
                        got.windows(2).all(|w| w[0].1 >= w[1].1),
                        "best first: {got:?}"
                    );
                }
            }
        }
    }
}

fn milli(score: f64) -> u64 {
    (score * 1000.0).round() as u64
}

/// The score a hit shows, in thousandths, from the sum of its words'
/// impacts and how many words it matched: with `match=any`, 67,108.864
/// more for each word matched past the first (README, Search).
fn shown(sum: u64, matched: u64, all: bool) -> u64 {
    if all {
        sum
    } else {
        sum + matched.saturating_sub(1) * (1 << 26)
    }
}

fn cases() -> u32 {
    std::env::var("TARN_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
    // On Cassandra's layout, its 16 buckets of `everyone` and
    // `authenticated` (SQLite's one partition below).
    #[test]
    fn search_model_memory(ops in prop::collection::vec(op(), 1..30)) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(run_model(common::memory_split(), ops, true));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases() / 3, ..ProptestConfig::default() })]
    #[test]
    fn search_model_sqlite(ops in prop::collection::vec(op(), 1..30)) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (e, _dir) = common::sqlite();
        rt.block_on(run_model(e, ops, true));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_on_postgres() {
    let e = common::postgres().await;
    let ann = sign_up(&e, "ann").await;
    text_index(&e, "doc-text", "doc", &[], vec![tf("title", 1.0)]).await;
    let id = e
        .create_item(
            &ann,
            "doc",
            props(json!({"title": "Green tea brewing"})),
            vec![],
        )
        .await
        .unwrap()
        .item
        .id;
    assert_eq!(ids(&e, &ann, q("brew green")).await, vec![id.clone()]);
    assert_eq!(
        ids(
            &e,
            &ann,
            SearchQuery {
                prefix: true,
                ..q("gre")
            }
        )
        .await,
        vec![id]
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: (cases() / 8).max(2), ..ProptestConfig::default() })]
    #[test]
    fn search_model_cassandra(ops in prop::collection::vec(op(), 1..20)) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async { run_model(common::cassandra().await, ops, false).await });
    }
}

#[tokio::test]
async fn a_cursor_serves_only_its_own_search() {
    let e = common::memory();
    title_and_description(&e).await;
    let ann = sign_up(&e, "ann").await;
    for n in 0..3 {
        let p = props(json!({"title": format!("apple pear {n}")}));
        doc(&e, &ann, p, vec![]).await;
    }
    let page = |text: &str, all: bool, cursor: Option<String>| SearchQuery {
        all,
        limit: 2,
        cursor,
        ..q(text)
    };
    // A cursor of one search, taken by another, started it at a foreign
    // place instead of being refused.
    let first = e.search(&ann, &page("apple", true, None)).await.unwrap();
    let c = first.next.expect("a second page");
    let rest = e
        .search(&ann, &page("apple", true, Some(c.clone())))
        .await
        .unwrap();
    assert_eq!(rest.hits.len(), 1);
    // Other words, match mode, prefix or kind: refused.
    let others = [
        page("pear", true, Some(c.clone())),
        page("apple", false, Some(c.clone())),
        page("apple pear", true, Some(c.clone())),
        SearchQuery {
            prefix: true,
            ..page("apple", true, Some(c.clone()))
        },
        SearchQuery {
            kind: None,
            ..page("apple", true, Some(c.clone()))
        },
    ];
    for other in others {
        let r = e.search(&ann, &other).await;
        assert!(
            matches!(r, Err(EngineError::InvalidInput(_))),
            "{other:?}: {r:?}"
        );
    }
}

/// The rows a store holds in the partitions of index `name`.
async fn index_rows(e: &Engine, store: &tarn_store::memory::MemoryStore, name: &str) -> usize {
    use tarn_store::Store;
    let uid = e.get_index(&admin(), name).await.unwrap().uid;
    let mut prefix = Vec::new();
    tarn_engine::keys::encode_str(&mut prefix, &uid);
    let mut snap = store.snapshot().await.unwrap();
    let (mut n, mut from) = (0, None);
    loop {
        let (rows, next) = snap.scan_all(from.as_deref(), 1000).await.unwrap();
        n += rows
            .iter()
            .filter(|(k, _)| k.table.name() == "idx" && k.partition.starts_with(&prefix))
            .count();
        match next {
            Some(c) => from = Some(c),
            None => return n,
        }
    }
}

fn grant(p: Principal, role: Role) -> Grant {
    Grant { principal: p, role }
}

/// An item shared with `everyone` (or `authenticated`) keeps its rows in
/// that partition alone, which every (signed-in) caller reads: four
/// readers' rows were written before for a word that one row serves.
#[tokio::test]
async fn a_public_item_keeps_its_rows_in_the_widest_partition_only() {
    let store = std::sync::Arc::new(tarn_store::memory::MemoryStore::new());
    let e = common::engine(store.clone());
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    let cat = sign_up(&e, "cat").await;
    e.create_group(&admin(), "g", None, Default::default())
        .await
        .unwrap();
    e.add_member(&admin(), "g", &Principal::User("bob".into()))
        .await
        .unwrap();
    title_and_description(&e).await;
    let anyone = Caller::Anonymous;
    let finds = |who: &Caller| {
        let (e, who) = (&e, who.clone());
        async move { ids(e, &who, q("green tea")).await.len() }
    };
    let id = doc(
        &e,
        &ann,
        props(json!({"title": "Green tea", "description": "with jasmine"})),
        vec![
            grant(Principal::Group("g".into()), Role::Viewer),
            grant(Principal::Everyone, Role::Viewer),
        ],
    )
    .await;
    // Four terms, once each (not for ann, g and everyone: twelve).
    assert_eq!(index_rows(&e, &store, "doc-text").await, 4);
    for who in [&ann, &bob, &cat, &anyone] {
        assert_eq!(finds(who).await, 1, "{who:?}");
    }
    let set = |acl: Vec<Grant>| {
        let (e, ann, id) = (&e, ann.clone(), id.clone());
        async move {
            let mut acl = acl;
            acl.push(grant(Principal::User("ann".into()), Role::Manager));
            e.set_acl(&ann, &id, None, acl, None).await.unwrap();
        }
    };
    // Signed-in callers only: the rows move to `authenticated`.
    set(vec![
        grant(Principal::Group("g".into()), Role::Viewer),
        grant(Principal::Authenticated, Role::Viewer),
    ])
    .await;
    assert_eq!(index_rows(&e, &store, "doc-text").await, 4);
    for (who, n) in [(&ann, 1), (&bob, 1), (&cat, 1), (&anyone, 0)] {
        assert_eq!(finds(who).await, n, "{who:?}");
    }
    // The group alone: the rows of ann and of g, and no others left.
    set(vec![grant(Principal::Group("g".into()), Role::Viewer)]).await;
    assert_eq!(index_rows(&e, &store, "doc-text").await, 8);
    for (who, n) in [(&ann, 1), (&bob, 1), (&cat, 0), (&anyone, 0)] {
        assert_eq!(finds(who).await, n, "{who:?}");
    }
    set(vec![grant(Principal::Everyone, Role::Viewer)]).await;
    assert_eq!(index_rows(&e, &store, "doc-text").await, 4);
    e.delete_item(&ann, &id, None, None).await.unwrap();
    assert_eq!(index_rows(&e, &store, "doc-text").await, 0);
}

/// A text index declared before the widest partition was enough keeps a
/// row for every reader, which its rows were written with, and finds
/// and removes them so (declarations travel with it through export and
/// import).
#[tokio::test]
async fn an_older_index_keeps_a_row_for_every_reader() {
    let store = std::sync::Arc::new(tarn_store::memory::MemoryStore::new());
    let e = common::engine(store.clone());
    let mut imp = e.importer();
    imp.add(tarn_engine::Record::Index {
        index: tarn_engine::IndexDef {
            name: "doc-text".into(),
            kind: Some("doc".into()),
            where_: vec![],
            sort: vec![],
            state: tarn_engine::IndexState::Ready,
            uid: "old".into(),
            since: 1,
            text: vec![tf("title", 1.0)],
            language: Some("english".into()),
            ties: tarn_engine::Order::Asc,
            impacts: tarn_engine::Impacts::Stepped,
            readers: tarn_engine::Readers::Every,
            heads: tarn_engine::Heads::Two,
            cut: tarn_engine::Cut::Character,
        },
    })
    .await
    .unwrap();
    imp.add(tarn_engine::Record::End {
        records: [("index".to_string(), 1)].into_iter().collect(),
    })
    .await
    .unwrap();
    imp.finish().await.unwrap();
    common::wait_ready(&e, "doc-text").await;
    assert_eq!(
        e.get_index(&admin(), "doc-text").await.unwrap().readers,
        tarn_engine::Readers::Every
    );
    let ann = sign_up(&e, "ann").await;
    let bob = sign_up(&e, "bob").await;
    let acl = |more: Vec<Grant>| {
        let mut acl = more;
        acl.push(grant(Principal::User("ann".into()), Role::Manager));
        acl
    };
    let id = doc(
        &e,
        &ann,
        props(json!({"title": "Green tea"})),
        acl(vec![
            grant(Principal::User("bob".into()), Role::Viewer),
            grant(Principal::Everyone, Role::Viewer),
        ]),
    )
    .await;
    assert_eq!(
        index_rows(&e, &store, "doc-text").await,
        6,
        "ann, bob, everyone"
    );
    e.patch_item(&ann, &id, None, &json!({"title": "Green coffee"}), None)
        .await
        .unwrap();
    assert_eq!(index_rows(&e, &store, "doc-text").await, 6);
    assert!(
        ids(&e, &bob, q("tea")).await.is_empty(),
        "no row left behind"
    );
    assert_eq!(
        ids(&e, &Caller::Anonymous, q("coffee")).await,
        std::slice::from_ref(&id)
    );
    // Its Hangul terms sit under two syllables, as it wrote them: found
    // from the second syllable typed on.
    let korean = doc(&e, &ann, props(json!({"title": "검색어"})), acl(vec![])).await;
    let typed = |t: &str| SearchQuery {
        q: t.into(),
        prefix: true,
        ..q("")
    };
    assert!(ids(&e, &ann, typed("검")).await.is_empty());
    assert_eq!(ids(&e, &ann, typed("검색")).await, vec![korean.clone()]);
    assert_eq!(ids(&e, &ann, typed("검색어")).await, vec![korean.clone()]);
    e.delete_item(&ann, &korean, None, None).await.unwrap();
    e.set_acl(&ann, &id, None, acl(vec![]), None).await.unwrap();
    assert_eq!(index_rows(&e, &store, "doc-text").await, 2);
    assert!(ids(&e, &bob, q("coffee")).await.is_empty());
    e.delete_item(&ann, &id, None, None).await.unwrap();
    assert_eq!(index_rows(&e, &store, "doc-text").await, 0);
}
