//! Prometheus metrics from plain atomic counters: no lock on the request path.
//!
//! Every series is allocated at start (routes come from the route table), so
//! recording a request is a handful of relaxed atomic adds.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tarn_store::{
    Batch, Consistency, FeedEntry, Key, ReadResult, Scan, Snapshot, Store, StoreError, StoreResult,
    Table,
};

/// Upper bounds of latency buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

const STATUS_CLASSES: usize = 5;

struct RouteSeries {
    method: String,
    route: String,
    /// Requests by exact status, index `status - 100`.
    statuses: Box<[AtomicU64; 500]>,
    /// Latency by status class (1xx..5xx).
    latency: [Histogram; STATUS_CLASSES],
}

const STORE_OPS: [&str; 3] = ["snapshot", "read", "write"];

/// All the server's metrics.
pub struct Metrics {
    routes: Vec<RouteSeries>,
    in_flight: Arc<AtomicI64>,
    connections: AtomicI64,
    store: [Histogram; STORE_OPS.len()],
    store_errors: [AtomicU64; STORE_OPS.len()],
}

impl Metrics {
    /// Series for these routes (method, path), plus one for unmatched requests.
    pub fn new(routes: &[(String, String)]) -> Metrics {
        let mut series: Vec<RouteSeries> = routes
            .iter()
            .chain([&("ANY".to_string(), "unmatched".to_string())])
            .map(|(m, r)| RouteSeries {
                method: m.clone(),
                route: r.clone(),
                statuses: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
                latency: Default::default(),
            })
            .collect();
        series.shrink_to_fit();
        Metrics {
            routes: series,
            in_flight: Arc::new(AtomicI64::new(0)),
            connections: AtomicI64::new(0),
            store: Default::default(),
            store_errors: Default::default(),
        }
    }

    /// The index of the unmatched series.
    pub fn unmatched(&self) -> usize {
        self.routes.len() - 1
    }

    /// The gauge of requests being served.
    pub fn in_flight(&self) -> Arc<AtomicI64> {
        self.in_flight.clone()
    }

    /// Marks a request as started; the guard marks it finished.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Records a finished request.
    pub fn record(&self, route: usize, status: u16, latency: Duration) {
        let r = &self.routes[route.min(self.routes.len() - 1)];
        let s = usize::from(status.clamp(100, 599)) - 100;
        r.statuses[s].fetch_add(1, Ordering::Relaxed);
        r.latency[s / 100].observe(latency);
    }

    /// The Prometheus text exposition, with the engine's retries and the
    /// store backend's own counters.
    pub fn render(
        &self,
        retries: u64,
        upload_rest: Duration,
        store: &[(&'static str, u64)],
    ) -> String {
        let mut out = String::with_capacity(16 * 1024);
        out.push_str("# HELP tarn_http_requests_total Requests answered, by route and status.\n");
        out.push_str("# TYPE tarn_http_requests_total counter\n");
        for r in &self.routes {
            for (i, c) in r.statuses.iter().enumerate() {
                let n = c.load(Ordering::Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "tarn_http_requests_total{{method=\"{}\",route=\"{}\",status=\"{}\"}} {n}",
                        r.method,
                        r.route,
                        i + 100
                    );
                }
            }
        }
        out.push_str(
            "# HELP tarn_http_request_duration_seconds Latency by route and status class.\n",
        );
        out.push_str("# TYPE tarn_http_request_duration_seconds histogram\n");
        for r in &self.routes {
            for (class, h) in r.latency.iter().enumerate() {
                if h.count.load(Ordering::Relaxed) > 0 {
                    let labels = format!(
                        "method=\"{}\",route=\"{}\",status=\"{}xx\"",
                        r.method,
                        r.route,
                        class + 1
                    );
                    h.render(&mut out, "tarn_http_request_duration_seconds", &labels);
                }
            }
        }
        out.push_str("# HELP tarn_http_requests_in_flight Requests being served.\n");
        out.push_str("# TYPE tarn_http_requests_in_flight gauge\n");
        let _ = writeln!(
            out,
            "tarn_http_requests_in_flight {}",
            self.in_flight.load(Ordering::Relaxed)
        );
        out.push_str("# HELP tarn_http_open_connections Client connections open.\n");
        out.push_str("# TYPE tarn_http_open_connections gauge\n");
        let _ = writeln!(
            out,
            "tarn_http_open_connections {}",
            self.connections.load(Ordering::Relaxed)
        );
        out.push_str("# HELP tarn_store_operation_duration_seconds Store calls by operation.\n");
        out.push_str("# TYPE tarn_store_operation_duration_seconds histogram\n");
        for (op, h) in STORE_OPS.iter().zip(&self.store) {
            h.render(
                &mut out,
                "tarn_store_operation_duration_seconds",
                &format!("op=\"{op}\""),
            );
        }
        out.push_str("# HELP tarn_store_errors_total Store calls that failed, by operation.\n");
        out.push_str("# TYPE tarn_store_errors_total counter\n");
        for (op, c) in STORE_OPS.iter().zip(&self.store_errors) {
            let _ = writeln!(
                out,
                "tarn_store_errors_total{{op=\"{op}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        out.push_str(
            "# HELP tarn_engine_retries_total Operations run again after a store conflict.\n",
        );
        out.push_str("# TYPE tarn_engine_retries_total counter\n");
        let _ = writeln!(out, "tarn_engine_retries_total {retries}");
        out.push_str(
            "# HELP tarn_engine_upload_rest_seconds_total Time uploads rested so that readers keep their CPU.\n",
        );
        out.push_str("# TYPE tarn_engine_upload_rest_seconds_total counter\n");
        let _ = writeln!(
            out,
            "tarn_engine_upload_rest_seconds_total {}",
            upload_rest.as_secs_f64()
        );
        for (name, value) in store {
            let _ = writeln!(
                out,
                "# TYPE tarn_store_{name} {}",
                if name.ends_with("_total") {
                    "counter"
                } else {
                    "gauge"
                }
            );
            let _ = writeln!(out, "tarn_store_{name} {value}");
        }
        out
    }

    fn store_call<T>(&self, op: usize, start: Instant, r: &StoreResult<T>) {
        self.store[op].observe(start.elapsed());
        // A guard that does not hold is the store's answer (a name taken,
        // a version moved on), not its failure.
        if r.as_ref()
            .is_err_and(|e| !matches!(e, StoreError::GuardFailed { .. }))
        {
            self.store_errors[op].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Decrements the in-flight gauge when dropped.
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A store that times every call into the metrics.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> MeteredStore {
        MeteredStore { inner, metrics }
    }
}

#[async_trait::async_trait]
impl Store for MeteredStore {
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>> {
        let t = Instant::now();
        let r = self.inner.snapshot().await;
        self.metrics.store_call(0, t, &r);
        Ok(Box::new(MeteredSnapshot {
            inner: r?,
            metrics: self.metrics.clone(),
        }))
    }
    async fn write(&self, batch: Batch) -> StoreResult<()> {
        let t = Instant::now();
        let r = self.inner.write(batch).await;
        self.metrics.store_call(2, t, &r);
        r
    }
    fn consistency(&self) -> Consistency {
        self.inner.consistency()
    }
    async fn trim_feed(&self, feed: Table, through: &[u8], limit: usize) -> StoreResult<usize> {
        let t = Instant::now();
        let r = self.inner.trim_feed(feed, through, limit).await;
        self.metrics.store_call(2, t, &r);
        r
    }
    fn partition_split(&self) -> u32 {
        self.inner.partition_split()
    }
    fn feed_lag(&self) -> std::time::Duration {
        self.inner.feed_lag()
    }
    fn connections(&self) -> Option<usize> {
        self.inner.connections()
    }
    async fn stop(&self) {
        self.inner.stop().await
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.inner.counters()
    }
}

/// A snapshot that times every read into the metrics.
struct MeteredSnapshot {
    inner: Box<dyn Snapshot>,
    metrics: Arc<Metrics>,
}

#[async_trait::async_trait]
impl Snapshot for MeteredSnapshot {
    async fn read(&mut self, gets: &[Key], scans: &[Scan]) -> StoreResult<ReadResult> {
        let t = Instant::now();
        let r = self.inner.read(gets, scans).await;
        self.metrics.store_call(1, t, &r);
        r
    }
    async fn read_feed(
        &mut self,
        feed: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<Vec<FeedEntry>> {
        let t = Instant::now();
        let r = self.inner.read_feed(feed, after, limit).await;
        self.metrics.store_call(1, t, &r);
        r
    }
    async fn scan_all(
        &mut self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<(Vec<(Key, tarn_store::Row)>, Option<Vec<u8>>)> {
        self.inner.scan_all(cursor, limit).await
    }
    async fn feed_end(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        let t = Instant::now();
        let r = self.inner.feed_end(feed).await;
        self.metrics.store_call(1, t, &r);
        r
    }
    async fn feed_readable(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        let t = Instant::now();
        let r = self.inner.feed_readable(feed).await;
        self.metrics.store_call(1, t, &r);
        r
    }
}

/// One connection, counted open (`tarn_http_open_connections`) while
/// this lives.
pub struct Open(Arc<Metrics>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Counts a connection open until the answer is dropped.
    pub fn open_connection(self: &Arc<Self>) -> Open {
        self.connections.fetch_add(1, Ordering::Relaxed);
        Open(self.clone())
    }
}
