//! `upload-storm`: twelve people upload 256 KiB files, each with its own
//! sharing, while readers list and read. Writers must not stall readers.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Result;
use bytes::Bytes;
use hyper::Method;
use serde_json::{json, Value};

use crate::{Http, Kit, Mark, Recorder, Rng, Vu, WorkloadRun};

const WRITERS: usize = 12;
const BODY: usize = 256 * 1024;
const USERS: usize = 24;
const GROUPS: usize = 4;

struct Reader {
    http: Http,
    token: Arc<String>,
    docs: Arc<Vec<String>>,
    rng: Rng,
}

impl Vu for Reader {
    fn step<'a>(
        &'a mut self,
        rec: &'a mut Recorder,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            let t = Some(self.token.as_str());
            if self.rng.below(2) == 0 {
                rec.time(
                    "reader: list",
                    self.http
                        .json(Method::GET, "/api/v1/items?kind=doc&limit=25", t, None),
                )
                .await;
            } else {
                let id = &self.docs[self.rng.below(self.docs.len())];
                rec.time(
                    "reader: read",
                    self.http
                        .json(Method::GET, &format!("/api/v1/items/{id}"), t, None),
                )
                .await;
            }
        })
    }
}

struct Writer {
    http: Http,
    token: String,
    me: usize,
    rng: Rng,
    body: Bytes,
}

impl Vu for Writer {
    fn step<'a>(
        &'a mut self,
        rec: &'a mut Recorder,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            // Each upload gets its own mix of users and groups.
            let mut acl = vec![
                json!({"principal": format!("group:storm-g{}", self.rng.below(GROUPS)), "role": "viewer"}),
            ];
            for _ in 0..self.rng.below(4) {
                acl.push(json!({"principal": format!("user:storm-u{}", self.rng.below(USERS)), "role": "viewer"}));
            }
            if self.rng.below(3) == 0 {
                acl.push(json!({"principal": "authenticated", "role": "viewer"}));
            }
            let t = Some(self.token.as_str());
            let create = json!({"kind": "file", "properties": {"name": format!("upload by {}", self.me)}, "acl": acl});
            let Some(r) = rec
                .time(
                    "writer: create",
                    self.http
                        .json(Method::POST, "/api/v1/items", t, Some(&create)),
                )
                .await
            else {
                return;
            };
            let Some(id) = r.str("id") else { return };
            rec.time(
                "writer: upload 256 KiB",
                self.http.send(
                    Method::PUT,
                    &format!("/api/v1/items/{id}/body"),
                    t,
                    Some("application/octet-stream"),
                    self.body.clone(),
                    &[],
                ),
            )
            .await;
        })
    }
}

pub async fn run(kit: &Kit) -> Result<WorkloadRun> {
    let readers = if kit.quick { 8 } else { 16 };
    let mut tokens = Vec::new();
    for u in 0..USERS {
        tokens.push(
            kit.user(&format!("storm-u{u}"), &format!("storm-password-{u}"))
                .await?,
        );
    }
    for g in 0..GROUPS {
        let id = format!("storm-g{g}");
        let r = kit
            .http
            .json(
                Method::POST,
                "/api/v1/groups",
                Some(&tokens[0]),
                Some(&json!({"id": id})),
            )
            .await?;
        anyhow::ensure!(r.status == 201 || r.status == 409, "group: {}", r.status);
        for u in (g..USERS).step_by(GROUPS) {
            kit.http
                .expect(
                    Method::PUT,
                    &format!("/api/v1/groups/{id}/members/user:storm-u{u}"),
                    Some(&tokens[0]),
                    None,
                    204,
                )
                .await?;
        }
    }
    let http = kit.http.clone();
    let owner = Arc::new(tokens[0].clone());
    let o = owner.clone();
    let docs = Arc::new(
        kit.load("documents", 200, 16, move |i| {
            let (http, owner) = (http.clone(), o.clone());
            Box::pin(async move {
                let acl = if i % 2 == 0 {
                    json!([{"principal": "everyone", "role": "viewer"}])
                } else {
                    json!([{"principal": format!("group:storm-g{}", i % GROUPS), "role": "viewer"}])
                };
                let body = json!({"kind": "doc", "properties": {"n": i}, "acl": acl});
                http.create_item(&owner, &body).await
            })
        })
        .await?,
    );
    let reader_token = Arc::new(tokens[1].clone());
    let make_readers = || -> Vec<Box<dyn Vu>> {
        (0..readers)
            .map(|r| {
                Box::new(Reader {
                    http: kit.http.clone(),
                    token: reader_token.clone(),
                    docs: docs.clone(),
                    rng: Rng::new(r as u64),
                }) as Box<dyn Vu>
            })
            .collect()
    };
    let mut params = BTreeMap::new();
    params.insert("writers".to_string(), Value::from(0));
    let alone = kit
        .step(format!("{readers} readers alone"), params, make_readers())
        .await;
    let payload = Bytes::from((0..BODY).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let mut vus = make_readers();
    for w in 0..WRITERS {
        vus.push(Box::new(Writer {
            http: kit.http.clone(),
            token: tokens[w % USERS].clone(),
            me: w,
            rng: Rng::new(100 + w as u64),
            body: payload.clone(),
        }));
    }
    let mut params = BTreeMap::new();
    params.insert("writers".to_string(), Value::from(WRITERS));
    let storm = kit
        .step(
            format!("{readers} readers + {WRITERS} uploaders"),
            params,
            vus,
        )
        .await;

    let mut marks = Vec::new();
    for op in ["reader: list", "reader: read"] {
        if let (Some(a), Some(b)) = (alone.ops.get(op), storm.ops.get(op)) {
            for (q, x, y) in [("p50", a.p50_ms, b.p50_ms), ("p99", a.p99_ms, b.p99_ms)] {
                marks.push(Mark {
                    what: format!("{op} {q}: with uploads / without"),
                    target: "small (readers not stalled)".into(),
                    tarn: format!("{:.2} ({y:.2} / {x:.2} ms)", y / x.max(1e-9)),
                    pass: None,
                });
            }
        }
    }
    if let Some(up) = storm.ops.get("writer: upload 256 KiB") {
        marks.push(Mark {
            what: "uploads: items a second".into(),
            target: "-".into(),
            tarn: format!("{:.1}", up.per_second),
            pass: None,
        });
        marks.push(Mark {
            what: "uploads: MiB a second".into(),
            target: "-".into(),
            tarn: format!("{:.1}", up.per_second * BODY as f64 / (1024.0 * 1024.0)),
            pass: None,
        });
    }
    Ok(WorkloadRun {
        params: json!({"writers": WRITERS, "readers": readers, "body_bytes": BODY, "users": USERS, "groups": GROUPS, "documents": 200}),
        steps: vec![alone, storm],
        marks,
        plots: Vec::new(),
    })
}
