//! `custard`: thirty people start at the same instant on fifty shared items —
//! edit with If-Match, share and unshare, reply, list, read.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Result;
use hyper::Method;
use serde_json::{json, Value};

use crate::{Http, Kit, Mark, Recorder, Rng, Vu, WorkloadRun};

const PEOPLE: usize = 30;
const ITEMS: usize = 50;

fn name(u: usize) -> String {
    format!("custard-u{u}")
}

#[derive(Clone, Copy)]
enum Op {
    Edit,
    Share,
    Reply,
    List,
    Read,
}

struct Person {
    http: Http,
    token: String,
    me: usize,
    items: Arc<Vec<String>>,
    rng: Rng,
}

impl Person {
    fn item(&mut self) -> String {
        self.items[self.rng.below(self.items.len())].clone()
    }
}

impl Vu for Person {
    fn step<'a>(
        &'a mut self,
        rec: &'a mut Recorder,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            let op = self.rng.weighted(&[
                (Op::Edit, 30),
                (Op::Share, 10),
                (Op::Reply, 20),
                (Op::List, 20),
                (Op::Read, 20),
            ]);
            let http = self.http.clone();
            let token = self.token.clone();
            let t = Some(token.as_str());
            match op {
                Op::Edit => {
                    let path = format!("/api/v1/items/{}", self.item());
                    let mut read = rec
                        .time("edit: read", http.json(Method::GET, &path, t, None))
                        .await;
                    // 412 is expected under contention: read again and retry.
                    for _ in 0..10 {
                        let Some(etag) = read.as_ref().and_then(|r| r.etag.clone()) else {
                            return;
                        };
                        let body = json!({"properties": {"last": name(self.me), "n": self.rng.below(1000)}}).to_string();
                        let w = rec
                            .time(
                                "edit: write",
                                http.send(
                                    Method::PATCH,
                                    &path,
                                    t,
                                    Some("application/json"),
                                    body.into(),
                                    &[("if-match", etag.as_str())],
                                ),
                            )
                            .await;
                        if w.map(|w| w.status) != Some(412) {
                            return;
                        }
                        read = rec
                            .time("edit: read", http.json(Method::GET, &path, t, None))
                            .await;
                    }
                }
                Op::Share => {
                    let path = format!("/api/v1/items/{}/acl", self.item());
                    let mut acl = vec![json!({"principal": "group:custard", "role": "manager"})];
                    if self.rng.below(2) == 0 {
                        acl.push(json!({"principal": format!("user:{}", name(self.rng.below(PEOPLE))), "role": "editor"}));
                    }
                    rec.time(
                        "share/unshare",
                        http.json(Method::PUT, &path, t, Some(&json!({"acl": acl}))),
                    )
                    .await;
                }
                Op::Reply => {
                    let topic = self.item();
                    let body = json!({"kind": "reply", "properties": {"topic": topic, "text": "me too"},
                        "acl": [{"principal": "group:custard", "role": "viewer"}]});
                    rec.time(
                        "reply",
                        http.json(Method::POST, "/api/v1/items", t, Some(&body)),
                    )
                    .await;
                }
                Op::List => {
                    rec.time(
                        "list",
                        http.json(Method::GET, "/api/v1/items?kind=bug&limit=25", t, None),
                    )
                    .await;
                }
                Op::Read => {
                    let path = format!("/api/v1/items/{}", self.item());
                    rec.time("read", http.json(Method::GET, &path, t, None))
                        .await;
                }
            }
        })
    }
}

pub async fn run(kit: &Kit) -> Result<WorkloadRun> {
    let mut tokens = Vec::new();
    for u in 0..PEOPLE {
        tokens.push(kit.user(&name(u), &format!("custard-password-{u}")).await?);
    }
    let r = kit
        .http
        .json(
            Method::POST,
            "/api/v1/groups",
            Some(&tokens[0]),
            Some(&json!({"id": "custard"})),
        )
        .await?;
    anyhow::ensure!(r.status == 201 || r.status == 409, "group: {}", r.status);
    for u in 0..PEOPLE {
        kit.http
            .expect(
                Method::PUT,
                &format!("/api/v1/groups/custard/members/user:{}", name(u)),
                Some(&tokens[0]),
                None,
                204,
            )
            .await?;
    }
    let (http, owner) = (kit.http.clone(), Arc::new(tokens[0].clone()));
    let items = Arc::new(
        kit.load("shared items", ITEMS, 10, move |i| {
            let (http, owner) = (http.clone(), owner.clone());
            Box::pin(async move {
                let body = json!({"kind": "bug", "properties": {"title": format!("bug {i}")},
                    "acl": [{"principal": "group:custard", "role": "manager"}]});
                http.create_item(&owner, &body).await
            })
        })
        .await?,
    );
    let seconds = kit.seconds(if kit.quick { 10.0 } else { 60.0 });
    let vus: Vec<Box<dyn Vu>> = (0..PEOPLE)
        .map(|u| {
            Box::new(Person {
                http: kit.http.clone(),
                token: tokens[u].clone(),
                me: u,
                items: items.clone(),
                rng: Rng::new(7 + u as u64),
            }) as Box<dyn Vu>
        })
        .collect();
    let mut params = BTreeMap::new();
    params.insert("users".to_string(), Value::from(PEOPLE));
    // Everyone starts at the same instant: no warm-up.
    let step = kit
        .step_timed(
            format!("{PEOPLE} people at once, {seconds} s"),
            params,
            vus,
            0.0,
            seconds,
        )
        .await;
    let all = step.all.clone();
    let mut marks = vec![Mark {
        what: "5xx responses".into(),
        target: "0".into(),
        tarn: step.server_errors().to_string(),
        pass: Some(step.server_errors() == 0),
    }];
    if let Some(a) = &all {
        marks.push(Mark {
            what: "p99, all responses".into(),
            target: "-".into(),
            tarn: format!("{:.1} ms", a.p99_ms),
            pass: None,
        });
        marks.push(Mark {
            what: "longest response".into(),
            target: "-".into(),
            tarn: format!("{:.1} ms", a.max_ms),
            pass: None,
        });
    }
    marks.push(Mark {
        what: "responses over 1 s".into(),
        target: "0".into(),
        tarn: step.slow.len().to_string(),
        pass: Some(step.slow.is_empty()),
    });
    let conflicts: u64 = step
        .ops
        .get("edit: write")
        .and_then(|o| o.statuses.get("412"))
        .copied()
        .unwrap_or(0);
    marks.push(Mark {
        what: "edits answered 412 (expected, retried)".into(),
        target: "-".into(),
        tarn: conflicts.to_string(),
        pass: None,
    });
    Ok(WorkloadRun {
        params: json!({"people": PEOPLE, "items": ITEMS, "seconds": seconds,
            "mix": "edit 30%, share/unshare 10%, reply 20%, list 20%, read 20%"}),
        steps: vec![step],
        marks,
        plots: Vec::new(),
    })
}
