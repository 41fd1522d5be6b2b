//! `search`: words, relevance and sharing at once.
//!
//! Documents whose title (weight 3) and description (20–200 words) are
//! drawn from a Zipf-distributed vocabulary of 20,000 words, each shared
//! with one or two of 200 groups (a tenth public); every reader is in 1–5
//! groups. Queries of one to three words by frequency (`match=all`),
//! search-as-you-type prefixes of 2–5 letters, and `match=any`, while the
//! pool grows tenfold and a hundredfold. Also measured: what the text index
//! costs writes (store rows per document, creates a second with and
//! without it).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hyper::Method;
use serde_json::{json, Value};

use crate::{Http, Kit, Mark, Plot, Recorder, Rng, Step, Vu, WorkloadRun};

const VOCABULARY: usize = 20_000;
const GROUPS: usize = 200;
const READERS: usize = 16;

/// A pronounceable word for each rank: the same on every run.
fn word(rank: usize) -> String {
    const ONSET: [&str; 16] = [
        "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v",
    ];
    const VOWEL: [&str; 5] = ["a", "e", "i", "o", "u"];
    let mut n = rank + 1;
    let mut w = String::new();
    while n > 0 {
        w.push_str(ONSET[n % 16]);
        n /= 16;
        w.push_str(VOWEL[n % 5]);
        n /= 5;
    }
    // A closing consonant keeps stemmers from shortening words into
    // one another.
    w.push('x');
    w
}

/// Zipf(1) over the vocabulary by inverse transform on the harmonic sums.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: usize) -> Zipf {
        let mut c = Vec::with_capacity(n);
        let mut s = 0.0;
        for k in 1..=n {
            s += 1.0 / k as f64;
            c.push(s);
        }
        Zipf { cumulative: c }
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let total = *self.cumulative.last().expect("non-empty");
        let x = (rng.next_u64() as f64 / u64::MAX as f64) * total;
        self.cumulative
            .partition_point(|c| *c < x)
            .min(self.cumulative.len() - 1)
    }
}

fn document(n: usize, zipf: &Zipf) -> Value {
    let mut rng = Rng::new(0xD0C + n as u64);
    let title: Vec<String> = (0..3 + rng.below(5))
        .map(|_| word(zipf.sample(&mut rng)))
        .collect();
    let len = 20 + rng.below(181);
    let description: Vec<String> = (0..len).map(|_| word(zipf.sample(&mut rng))).collect();
    let mut acl =
        vec![json!({"principal": format!("group:sg{}", rng.below(GROUPS)), "role": "viewer"})];
    if rng.below(2) == 0 {
        acl.push(json!({"principal": format!("group:sg{}", rng.below(GROUPS)), "role": "viewer"}));
    }
    if rng.below(10) == 0 {
        acl.push(json!({"principal": "everyone", "role": "viewer"}));
    }
    json!({"kind": "document", "properties": {
        "title": title.join(" "), "description": description.join(" ")}, "acl": acl})
}

/// One reader running one kind of query.
struct Searcher {
    http: Http,
    token: Arc<String>,
    kind: QueryKind,
    rng: Rng,
}

#[derive(Clone, Copy)]
enum QueryKind {
    All,
    Prefix,
    Any,
}

impl QueryKind {
    fn name(self) -> &'static str {
        match self {
            QueryKind::All => "match=all",
            QueryKind::Prefix => "prefix",
            QueryKind::Any => "match=any",
        }
    }
}

/// A word of a frequency band: common (rank < 100), medium (< 2,000) or
/// rare.
fn banded(rng: &mut Rng) -> String {
    let rank = match rng.below(3) {
        0 => rng.below(100),
        1 => 100 + rng.below(1_900),
        _ => 2_000 + rng.below(VOCABULARY - 2_000),
    };
    word(rank)
}

impl Vu for Searcher {
    fn step<'a>(
        &'a mut self,
        rec: &'a mut Recorder,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            let q = match self.kind {
                QueryKind::All | QueryKind::Any => {
                    let n = 1 + self.rng.below(3);
                    (0..n)
                        .map(|_| banded(&mut self.rng))
                        .collect::<Vec<_>>()
                        .join("%20")
                }
                QueryKind::Prefix => {
                    let w = word(self.rng.below(2_000));
                    let n = (2 + self.rng.below(4)).min(w.len());
                    w[..n].to_string()
                }
            };
            let extra = match self.kind {
                QueryKind::All => "",
                QueryKind::Prefix => "&prefix=true",
                QueryKind::Any => "&match=any",
            };
            let path = format!("/api/v1/search?kind=document&limit=20&q={q}{extra}");
            rec.time(
                self.kind.name(),
                self.http.json(Method::GET, &path, Some(&self.token), None),
            )
            .await;
        })
    }
}

/// Creates documents `from..to` (the loading clock runs over these).
async fn grow(
    kit: &Kit,
    owner: &Arc<String>,
    zipf: &Arc<Zipf>,
    from: usize,
    to: usize,
) -> Result<f64> {
    let http = kit.http.clone();
    let (owner, zipf) = (owner.clone(), zipf.clone());
    let start = Instant::now();
    kit.load(
        &format!("documents {from}..{to}"),
        to - from,
        32,
        move |i| {
            let (http, owner, zipf) = (http.clone(), owner.clone(), zipf.clone());
            Box::pin(async move {
                http.create_item(&owner, &document(from + i, &zipf)).await?;
                Ok(())
            })
        },
    )
    .await?;
    Ok((to - from) as f64 / start.elapsed().as_secs_f64())
}

/// Rows the store has written, from the server's metrics, if it says.
async fn rows_written(kit: &Kit) -> Option<f64> {
    let r = kit
        .http
        .json(Method::GET, "/metrics", None, None)
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find(|l| l.starts_with("tarn_store_sqlite_rows_written_total "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

pub async fn run(kit: &Kit) -> Result<WorkloadRun> {
    let sizes: &[usize] = if kit.quick {
        &[1_000, 5_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let users: &[usize] = if kit.quick { &[1, 4] } else { &[1, 4, 16, 64] };
    let zipf = Arc::new(Zipf::new(VOCABULARY));
    // The administrator makes the groups (past any one user's hourly
    // allowance); readers are in 1–5 of them.
    let owner = Arc::new(kit.user("search-owner", "search-owner-password").await?);
    let admin = Arc::new(kit.admin.clone());
    {
        let http = kit.http.clone();
        let owner = admin.clone();
        kit.load("groups", GROUPS, 16, move |g| {
            let (http, owner) = (http.clone(), owner.clone());
            Box::pin(async move {
                let r = http
                    .json(
                        Method::POST,
                        "/api/v1/groups",
                        Some(&owner),
                        Some(&json!({"id": format!("sg{g}")})),
                    )
                    .await?;
                anyhow::ensure!(r.status == 201 || r.status == 409, "group: {}", r.status);
                Ok(())
            })
        })
        .await?;
    }
    let mut readers = Vec::new();
    for r in 0..READERS {
        let name = format!("searcher{r}");
        let token = kit.user(&name, "searcher-password").await?;
        let mut rng = Rng::new(0x5EA4 + r as u64);
        for _ in 0..1 + rng.below(5) {
            let path = format!("/api/v1/groups/sg{}/members/user:{name}", rng.below(GROUPS));
            kit.http
                .expect(Method::PUT, &path, Some(&admin), None, 204)
                .await?;
        }
        readers.push(Arc::new(token));
    }
    // Write cost: documents without a text index, then with one.
    let probe = if kit.quick { 300 } else { 2_000 };
    let rows0 = rows_written(kit).await;
    let plain = grow(kit, &owner, &zipf, 0, probe).await?;
    let rows1 = rows_written(kit).await;
    kit.index(
        "document-text",
        json!({"kind": "document", "text": [{"field": "title", "weight": 3}, {"field": "description"}]}),
    )
    .await
    .context("declaring the text index")?;
    let rows2 = rows_written(kit).await;
    let indexed = grow(kit, &owner, &zipf, probe, 2 * probe).await?;
    let rows3 = rows_written(kit).await;
    let per_doc = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a) / probe as f64);
    let rows_plain = per_doc(rows0, rows1);
    let rows_text = per_doc(rows2, rows3);
    let mut have = 2 * probe;
    let mut steps: Vec<Step> = Vec::new();
    for &d in sizes {
        if d > have {
            grow(kit, &owner, &zipf, have, d).await?;
            have = d;
        }
        for &u in users {
            for kind in [QueryKind::All, QueryKind::Prefix, QueryKind::Any] {
                let vus = (0..u)
                    .map(|i| {
                        Box::new(Searcher {
                            http: kit.http.clone(),
                            token: readers[i % readers.len()].clone(),
                            kind,
                            rng: Rng::new((d * 1000 + u * 10 + i) as u64),
                        }) as Box<dyn Vu>
                    })
                    .collect();
                let mut params = BTreeMap::new();
                params.insert("documents".to_string(), Value::from(d));
                params.insert("users".to_string(), Value::from(u));
                params.insert("query".to_string(), Value::from(kind.name()));
                steps.push(
                    kit.step(format!("D={d} users={u} {}", kind.name()), params, vus)
                        .await,
                );
            }
        }
    }
    let mut marks = flatness(&steps, sizes, users);
    if let Some(s) = steps.iter().find(|s| {
        s.params["documents"] == sizes[sizes.len() - 1]
            && s.users == 1
            && s.params["query"] == "match=all"
    }) {
        if let Some(o) = s.ops.get("match=all") {
            marks.push(Mark {
                what: format!(
                    "one client, match=all (1–3 words), p50 at D={}",
                    sizes[sizes.len() - 1]
                ),
                target: "≤ 2 ms".into(),
                tarn: format!("{:.2} ms", o.p50_ms),
                pass: Some(o.p50_ms <= 2.0),
            });
        }
    }
    if let Some(&u16s) = users.iter().find(|&&u| u == 16).or(users.last()) {
        if let Some(o) = steps
            .iter()
            .find(|s| {
                s.params["documents"] == sizes[sizes.len() - 1]
                    && s.users == u16s
                    && s.params["query"] == "match=all"
            })
            .and_then(|s| s.ops.get("match=all"))
        {
            let r = o.ratio_to_health.unwrap_or(0.0);
            marks.push(Mark {
                what: format!("{u16s} clients, match=all throughput / health"),
                target: "≥ 0.1".into(),
                tarn: format!("{r:.3} ({:.0}/s)", o.per_second),
                pass: Some(r >= 0.1),
            });
        }
    }
    marks.push(Mark {
        what: "creates a second with the text index / without".into(),
        target: "≥ 0.5".into(),
        tarn: format!(
            "{:.2} ({indexed:.0} / {plain:.0})",
            indexed / plain.max(1e-9)
        ),
        pass: Some(indexed / plain.max(1e-9) >= 0.5),
    });
    if let (Some(p), Some(t)) = (rows_plain, rows_text) {
        marks.push(Mark {
            what: "store rows written per document, without / with the text index".into(),
            target: "bounded".into(),
            tarn: format!("{p:.0} / {t:.0}"),
            pass: None,
        });
    }
    let plots = vec![latency_plot(&steps, sizes, users)];
    Ok(WorkloadRun {
        params: json!({"sizes": sizes, "users": users, "vocabulary": VOCABULARY, "groups": GROUPS,
            "readers": READERS, "creates_per_second_plain": plain, "creates_per_second_indexed": indexed,
            "rows_per_document_plain": rows_plain, "rows_per_document_indexed": rows_text}),
        steps,
        marks,
        plots,
    })
}

fn find<'a>(steps: &'a [Step], d: usize, u: usize, kind: &str) -> Option<&'a Step> {
    steps
        .iter()
        .find(|s| s.params["documents"] == d && s.users == u && s.params["query"] == kind)
}

fn flatness(steps: &[Step], sizes: &[usize], users: &[usize]) -> Vec<Mark> {
    let (small, large) = (sizes[0], sizes[sizes.len() - 1]);
    let mut marks = Vec::new();
    for kind in ["match=all", "prefix", "match=any"] {
        for &u in users {
            let (Some(a), Some(b)) = (find(steps, small, u, kind), find(steps, large, u, kind))
            else {
                continue;
            };
            let (Some(a), Some(b)) = (a.ops.get(kind), b.ops.get(kind)) else {
                continue;
            };
            let ratio = b.p50_ms / a.p50_ms.max(1e-9);
            marks.push(Mark {
                what: format!("{kind}, {u} clients: p50 at D={large} / at D={small}"),
                target: "≤ 1.2".into(),
                tarn: format!("{ratio:.2} ({:.2} / {:.2} ms)", b.p50_ms, a.p50_ms),
                pass: Some(ratio <= 1.2),
            });
        }
    }
    marks
}

fn latency_plot(steps: &[Step], sizes: &[usize], users: &[usize]) -> Plot {
    let mid = users[users.len() / 2];
    let mut series = Vec::new();
    for kind in ["match=all", "prefix", "match=any"] {
        let pts = sizes
            .iter()
            .filter_map(|&d| {
                find(steps, d, mid, kind)
                    .and_then(|s| s.ops.get(kind))
                    .map(|o| (d as f64, o.p50_ms))
            })
            .collect();
        series.push((format!("{kind} p50 ({mid} clients)"), pts));
    }
    Plot {
        stem: "latency-vs-size".into(),
        title: "Search latency vs number of documents".into(),
        x_label: "documents".into(),
        y_label: "milliseconds".into(),
        log_x: true,
        series,
    }
}
