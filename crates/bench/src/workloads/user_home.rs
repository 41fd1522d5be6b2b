//! `user-home`: all user homes sorted by a last name deep in each item, over
//! a pool that grows from a thousand to six hundred thousand homes.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Result;
use hyper::Method;
use serde_json::{json, Value};

use crate::workloads::last_name;
use crate::{Http, Kit, Mark, Plot, Recorder, Rng, Step, Vu, WorkloadRun};

const FIELD: &str = "public.authprofile.basic.elements.lastName";

struct Reader {
    http: Http,
    token: Arc<String>,
}

impl Vu for Reader {
    fn step<'a>(
        &'a mut self,
        rec: &'a mut Recorder,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            let t = Some(self.token.as_str());
            rec.time(
                "Q1 newest",
                self.http.json(
                    Method::GET,
                    "/api/v1/items?kind=user-home&limit=25",
                    t,
                    None,
                ),
            )
            .await;
            let q2 = format!("/api/v1/items?kind=user-home&limit=25&sort={FIELD}");
            let Some(r) = rec
                .time("Q2 by last name", self.http.json(Method::GET, &q2, t, None))
                .await
            else {
                return;
            };
            if let Some(next) = r.json()["next"].as_str() {
                let q3 = format!("{q2}&cursor={next}");
                rec.time("Q3 next page", self.http.json(Method::GET, &q3, t, None))
                    .await;
            }
        })
    }
}

/// Adds homes and as many `other` items until there are `h` of each.
async fn grow(kit: &Kit, owner: &Arc<String>, from: usize, h: usize) -> Result<()> {
    let http = kit.http.clone();
    let owner = owner.clone();
    kit.load(
        &format!("homes {from}..{h}"),
        2 * (h - from),
        32,
        move |i| {
            let http = http.clone();
            let owner = owner.clone();
            Box::pin(async move {
                let n = from + i / 2;
                let mut rng = Rng::new(n as u64);
                let body = if i % 2 == 0 {
                    json!({"kind": "user-home",
                    "properties": {"public": {"authprofile": {"basic": {"elements": {
                        "lastName": last_name(&mut rng), "firstName": format!("user{n}")}}}}},
                    "acl": [{"principal": "everyone", "role": "viewer"}]})
                } else {
                    json!({"kind": "other", "properties": {"n": n},
                    "acl": [{"principal": "everyone", "role": "viewer"}]})
                };
                http.create_item(&owner, &body).await?;
                Ok(())
            })
        },
    )
    .await?;
    Ok(())
}

pub async fn run(kit: &Kit) -> Result<WorkloadRun> {
    let sizes: &[usize] = if kit.quick {
        &[500, 5_000]
    } else {
        &[1_000, 6_000, 60_000, 600_000]
    };
    let users: &[usize] = if kit.quick {
        &[1, 4, 16]
    } else {
        &[1, 4, 16, 64, 200]
    };
    kit.index(
        "user-home-by-last-name",
        json!({"kind": "user-home", "sort": [{"field": FIELD, "order": "asc"}]}),
    )
    .await?;
    let owner = Arc::new(kit.user("bench-owner", "bench-owner-password").await?);
    let reader = Arc::new(kit.user("bench-reader", "bench-reader-password").await?);
    let mut steps = Vec::new();
    let mut have = 0;
    for &h in sizes {
        grow(kit, &owner, have, h).await?;
        have = h;
        kit.settle().await?;
        for &u in users {
            let vus = (0..u)
                .map(|_| {
                    Box::new(Reader {
                        http: kit.http.clone(),
                        token: reader.clone(),
                    }) as Box<dyn Vu>
                })
                .collect();
            let mut params = BTreeMap::new();
            params.insert("homes".to_string(), Value::from(h));
            params.insert("users".to_string(), Value::from(u));
            steps.push(kit.step(format!("H={h} users={u}"), params, vus).await);
        }
    }
    let (marks, plots) = flatness(&steps, sizes, users);
    Ok(WorkloadRun {
        params: json!({"sizes": sizes, "users": users, "page": 25, "index": FIELD,
                       "settle_seconds": kit.settle_seconds,
                       "warmup_seconds": kit.warmup_seconds,
                       "after_load": kit.after_load}),
        steps,
        marks,
        plots,
    })
}

/// The most a query's p50 may grow from the smallest pool to the largest
/// and still count as flat.
const FLAT: f64 = 1.2;

fn flatness(steps: &[Step], sizes: &[usize], users: &[usize]) -> (Vec<Mark>, Vec<Plot>) {
    let find = |h: usize, u: usize| {
        steps
            .iter()
            .find(|s| s.params["homes"] == h && s.params["users"] == u)
    };
    let (small, large) = (sizes[0], sizes[sizes.len() - 1]);
    let mut marks = Vec::new();
    let mut series = Vec::new();
    for op in ["Q1 newest", "Q2 by last name", "Q3 next page"] {
        for &u in users {
            let (Some(a), Some(b)) = (find(small, u), find(large, u)) else {
                continue;
            };
            let (Some(a), Some(b)) = (a.ops.get(op), b.ops.get(op)) else {
                continue;
            };
            let ratio = b.p50_ms / a.p50_ms.max(1e-9);
            marks.push(Mark {
                what: format!("{op}, {u} users: p50 at H={large} / at H={small}"),
                target: "≤ 1.2 (flat)".into(),
                tarn: format!("{ratio:.2} ({:.2} / {:.2} ms)", b.p50_ms, a.p50_ms),
                pass: Some(ratio <= FLAT),
            });
        }
        let mid = users[users.len() / 2];
        for (q, pick) in [("p50", 0usize), ("p99", 1)] {
            let pts = sizes
                .iter()
                .filter_map(|&h| {
                    find(h, mid)
                        .and_then(|s| s.ops.get(op))
                        .map(|o| (h as f64, [o.p50_ms, o.p99_ms][pick]))
                })
                .collect();
            series.push((format!("{op} {q} ({mid} users)"), pts));
        }
    }
    let plot = Plot {
        stem: "latency-vs-size".into(),
        title: "Latency vs number of user homes".into(),
        x_label: "user homes (plus as many other items)".into(),
        y_label: "milliseconds".into(),
        log_x: true,
        series,
    };
    (marks, vec![plot])
}
