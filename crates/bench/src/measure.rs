//! Closed-loop virtual users and what they record.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::client::Reply;

/// One virtual user: performs one transaction per call, with no think time.
pub trait Vu: Send + 'static {
    /// Runs one transaction, timing its requests into `rec`.
    fn step<'a>(
        &'a mut self,
        rec: &'a mut Recorder,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
}

/// What one virtual user measured (merged over users at the end of a step).
pub struct Recorder {
    active: bool,
    ops: BTreeMap<String, Histogram<u64>>,
    /// Responses by status, per operation.
    statuses: BTreeMap<(String, u16), u64>,
    /// Transport failures by message.
    errors: BTreeMap<String, u64>,
    /// Responses that shed load and were retried, per operation.
    shed: BTreeMap<String, u64>,
    /// Responses over one second: operation and milliseconds.
    slow: Vec<(String, f64)>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            active: true,
            ops: BTreeMap::new(),
            statuses: BTreeMap::new(),
            errors: BTreeMap::new(),
            shed: BTreeMap::new(),
            slow: Vec::new(),
        }
    }
}

impl Recorder {
    /// Times one request. Returns the reply whatever its status; `None` if
    /// the request failed to get one.
    pub async fn time<F>(&mut self, op: &str, request: F) -> Option<Reply>
    where
        F: Future<Output = anyhow::Result<Reply>>,
    {
        let start = Instant::now();
        let result = request.await;
        self.record(op, start, result)
    }

    /// Times a request that the server may shed: a `503` with `Retry-After`
    /// is counted as shed, waited out (at most `max_wait` each time) and
    /// sent again, up to `attempts` times; the time recorded is the whole
    /// wait, as the user sees it.
    pub async fn time_shed<F, Fut>(
        &mut self,
        op: &str,
        attempts: u32,
        max_wait: std::time::Duration,
        mut request: F,
    ) -> Option<Reply>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<Reply>>,
    {
        let start = Instant::now();
        for _ in 1..attempts {
            match request().await {
                Ok(r) if r.status == 503 && r.retry_after.is_some() => {
                    if self.active {
                        *self.shed.entry(op.to_string()).or_default() += 1;
                    }
                    let wait = std::time::Duration::from_secs(r.retry_after.unwrap_or(1));
                    tokio::time::sleep(wait.min(max_wait)).await;
                }
                other => return self.record(op, start, other),
            }
        }
        let last = request().await;
        self.record(op, start, last)
    }

    fn record(&mut self, op: &str, start: Instant, result: anyhow::Result<Reply>) -> Option<Reply> {
        let micros = start.elapsed().as_micros() as u64;
        if !self.active {
            return result.ok();
        }
        match result {
            Ok(reply) => {
                self.ops
                    .entry(op.to_string())
                    .or_insert_with(histogram)
                    .saturating_record(micros.max(1));
                *self
                    .statuses
                    .entry((op.to_string(), reply.status))
                    .or_default() += 1;
                if micros > 1_000_000 {
                    self.slow.push((op.to_string(), micros as f64 / 1000.0));
                }
                Some(reply)
            }
            Err(e) => {
                *self.errors.entry(format!("{op}: {e:#}")).or_default() += 1;
                None
            }
        }
    }

    fn merge(&mut self, other: Recorder) {
        for (op, h) in other.ops {
            self.ops
                .entry(op)
                .or_insert_with(histogram)
                .add(&h)
                .expect("same bounds");
        }
        for (k, n) in other.statuses {
            *self.statuses.entry(k).or_default() += n;
        }
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
        for (k, n) in other.shed {
            *self.shed.entry(k).or_default() += n;
        }
        self.slow.extend(other.slow);
    }

    /// Figures per operation for a window of `secs` seconds.
    pub fn stats(&self, secs: f64) -> BTreeMap<String, OpStats> {
        self.ops
            .iter()
            .map(|(op, h)| {
                let statuses: BTreeMap<String, u64> = self
                    .statuses
                    .iter()
                    .filter(|((o, _), _)| o == op)
                    .map(|((_, s), n)| (s.to_string(), *n))
                    .collect();
                let server_errors = statuses
                    .iter()
                    .filter(|(s, _)| s.starts_with('5'))
                    .map(|(_, n)| n)
                    .sum();
                let mut stats = op_stats(h, secs);
                stats.server_errors = server_errors;
                stats.shed = self.shed.get(op).copied().unwrap_or(0);
                stats.statuses = statuses;
                (op.clone(), stats)
            })
            .collect()
    }

    /// Transport failures.
    pub fn errors(&self) -> &BTreeMap<String, u64> {
        &self.errors
    }

    /// Responses slower than one second.
    pub fn slow(&self) -> &[(String, f64)] {
        &self.slow
    }

    /// All latencies merged over every operation.
    pub fn all(&self) -> Option<Histogram<u64>> {
        let mut all = histogram();
        for h in self.ops.values() {
            all.add(h).ok()?;
        }
        Some(all)
    }
}

/// Figures of a histogram of microseconds over a window of `secs` seconds.
pub fn op_stats(h: &Histogram<u64>, secs: f64) -> OpStats {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    OpStats {
        count: h.len(),
        per_second: h.len() as f64 / secs,
        mean_ms: h.mean() / 1000.0,
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        max_ms: h.max() as f64 / 1000.0,
        under_2s: h.count_between(0, 2_000_000) as f64 / h.len().max(1) as f64,
        statuses: BTreeMap::new(),
        server_errors: 0,
        shed: 0,
        ratio_to_health: None,
    }
}

/// Figures of one operation in one step.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpStats {
    /// Responses measured.
    pub count: u64,
    /// Responses per second.
    pub per_second: f64,
    /// Mean latency.
    pub mean_ms: f64,
    /// Median latency.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Longest.
    pub max_ms: f64,
    /// Share of responses under 2 s.
    pub under_2s: f64,
    /// Responses by status.
    pub statuses: BTreeMap<String, u64>,
    /// Responses with a 5xx status.
    pub server_errors: u64,
    /// Responses that shed load (`503` with `Retry-After`), waited out and
    /// retried by the kit (not counted in `server_errors`).
    #[serde(default)]
    pub shed: u64,
    /// Throughput over the health ceiling's at the same concurrency.
    pub ratio_to_health: Option<f64>,
}

/// Runs the users together: `warmup` unrecorded, then `measure` recorded.
/// Users stop by themselves once the time is up.
pub async fn closed_loop(users: Vec<Box<dyn Vu>>, warmup: Duration, measure: Duration) -> Recorder {
    let start = Instant::now();
    let end = warmup + measure;
    let tasks: Vec<_> = users
        .into_iter()
        .map(|mut vu| {
            tokio::spawn(async move {
                let mut rec = Recorder::default();
                loop {
                    let now = start.elapsed();
                    if now >= end {
                        break;
                    }
                    rec.active = now >= warmup;
                    vu.step(&mut rec).await;
                }
                rec
            })
        })
        .collect();
    let mut all = Recorder::default();
    for t in tasks {
        if let Ok(rec) = t.await {
            all.merge(rec);
        }
    }
    all
}
