//! `tarn bench`: the load kit that proves Tarn stays fluid under load.
//!
//! Six workloads (`../docs/workloads.md`): `user-home`, `kenai`,
//! `upload-storm`, `custard`, `search`, `chat`. Each loads its data through the public API
//! only, runs closed-loop virtual users with no think time in steps, one after
//! another with a warm-up each, and measures every step's operations in HDR
//! histograms beside `GET /api/v1/health` at the same concurrency (the
//! server's own ceiling). Without `--url` the kit starts `tarn serve` itself
//! and reads its CPU and memory from `/proc`. Everything measured goes to
//! `results.json`, `report.html` and plots in PNG and SVG.

pub mod client;
pub mod measure;
pub mod report;
pub mod server;
mod workloads;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hyper::Method;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{json, Value};

pub use client::{EventStream, Http, Reply, SseEvent};
pub use measure::{OpStats, Recorder, Vu};
pub use report::{Mark, Plot, Results};
use server::{ProcSampler, ServerUse, SpawnedServer};

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Sorting on a property deep inside each item, over growing pools.
    UserHome,
    /// A project-hosting site's daily mix, 80% reads.
    Kenai,
    /// Twelve uploaders beside readers.
    UploadStorm,
    /// Thirty people start at once on fifty shared items.
    Custard,
    /// Words, relevance and sharing at once, over growing pools.
    Search,
    /// Rooms, posts and live event streams.
    Chat,
}

impl Workload {
    /// The workload's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::UserHome => "user-home",
            Workload::Kenai => "kenai",
            Workload::UploadStorm => "upload-storm",
            Workload::Custard => "custard",
            Workload::Search => "search",
            Workload::Chat => "chat",
        }
    }
}

/// How to run.
pub struct Options {
    /// Which workload.
    pub workload: Workload,
    /// A running server to target; without it the kit starts one.
    pub url: Option<String>,
    /// The admin password of the server at `url` (to declare indexes).
    pub admin_password: Option<String>,
    /// Where to write results.
    pub out: Option<PathBuf>,
    /// Small sizes and short steps, for CI.
    pub quick: bool,
    /// The `tarn` binary to start as the server.
    pub server_exe: PathBuf,
    /// Overrides the measured seconds of each step.
    pub step_seconds: Option<f64>,
    /// Overrides the warm-up seconds of each step's users, in the
    /// workloads that warm up (not custard's burst, nor chat).
    pub warmup_seconds: Option<f64>,
    /// Seconds to wait after loading each pool size (user-home).
    pub settle_seconds: f64,
    /// A shell command run after loading each pool size, before the settle
    /// (user-home): say, flushing the database's memtables, so that every
    /// size is read from the same kind of storage.
    pub after_load: Option<String>,
    /// Server processes on this machine to sample when `url` is given.
    pub server_pids: Vec<u32>,
}

/// A step's figures.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Step {
    /// What the step is.
    pub name: String,
    /// Its parameters (users, data size, ...).
    pub params: BTreeMap<String, Value>,
    /// Concurrent virtual users.
    pub users: usize,
    /// Seconds measured.
    pub seconds: f64,
    /// Figures by operation.
    pub ops: BTreeMap<String, OpStats>,
    /// `GET /api/v1/health` at the same concurrency.
    pub health: Option<OpStats>,
    /// Server CPU and memory during the step (spawned servers only).
    pub server: Option<ServerUse>,
    /// Requests that got no response, by message.
    pub transport_errors: BTreeMap<String, u64>,
    /// Responses over one second: operation, milliseconds (at most 1000).
    pub slow: Vec<(String, f64)>,
    /// Latency percentiles over all operations.
    pub all: Option<OpStats>,
}

impl Step {
    /// Responses with a 5xx status.
    pub fn server_errors(&self) -> u64 {
        self.ops.values().map(|o| o.server_errors).sum()
    }
}

/// A small, fast, seeded random source (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A source from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// One of the items, by weight.
    pub fn weighted<T: Copy>(&mut self, choices: &[(T, u32)]) -> T {
        let total: u32 = choices.iter().map(|c| c.1).sum();
        let mut pick = (self.next_u64() % u64::from(total)) as u32;
        for (c, w) in choices {
            if pick < *w {
                return *c;
            }
            pick -= w;
        }
        choices[choices.len() - 1].0
    }
}

/// Everything a workload needs: the client, the admin token, the server.
pub struct Kit {
    /// The client.
    pub http: Http,
    /// An administrator's token.
    pub admin: String,
    /// Small sizes and short steps.
    pub quick: bool,
    server: Option<SpawnedServer>,
    /// Processes sampled for server CPU and memory.
    pub(crate) pids: Vec<u32>,
    step_seconds: Option<f64>,
    /// Overrides the warm-up of each step's users (`Kit::step`).
    pub warmup_seconds: Option<f64>,
    /// Seconds to wait after a load before measuring.
    pub settle_seconds: f64,
    /// A shell command run after a load, before the settle.
    pub after_load: Option<String>,
}

type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T>> + Send>>;

impl Kit {
    /// The seconds a step measures: the override, else `default`.
    pub fn seconds(&self, default: f64) -> f64 {
        self.step_seconds.unwrap_or(default)
    }

    /// Between a load and its measurement: the `after_load` command, which
    /// must succeed, then `settle_seconds` of waiting.
    pub async fn settle(&self) -> Result<()> {
        if let Some(cmd) = &self.after_load {
            let status = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .status()
                .await
                .with_context(|| format!("running the after-load command `{cmd}`"))?;
            if !status.success() {
                bail!("the after-load command `{cmd}` failed: {status}");
            }
        }
        if self.settle_seconds > 0.0 {
            let settle = self.settle_seconds.min(86_400.0);
            tokio::time::sleep(Duration::from_secs_f64(settle)).await;
        }
        Ok(())
    }

    /// Warm-up and measured durations of a step.
    pub fn durations(&self) -> (Duration, Duration) {
        let measure = self
            .step_seconds
            .unwrap_or(if self.quick { 1.5 } else { 10.0 });
        let warmup = if self.quick { 0.5 } else { 2.0 };
        (
            Duration::from_secs_f64(warmup),
            Duration::from_secs_f64(measure),
        )
    }

    /// Runs a step: the users, warmed up for `--warmup-seconds` when given,
    /// then health at the same concurrency.
    pub async fn step(
        &self,
        name: String,
        params: BTreeMap<String, Value>,
        users: Vec<Box<dyn Vu>>,
    ) -> Step {
        let (warmup, measure) = self.durations();
        let users_warmup = self.warmup_seconds.map_or(warmup, Duration::from_secs_f64);
        self.run_step(name, params, users, users_warmup, warmup, measure)
            .await
    }

    /// [`Kit::step`] with its own warm-up and measured seconds (the measured
    /// ones overridden by `--step-seconds`), whatever `--warmup-seconds` says.
    pub async fn step_timed(
        &self,
        name: String,
        params: BTreeMap<String, Value>,
        users: Vec<Box<dyn Vu>>,
        warmup: f64,
        measure: f64,
    ) -> Step {
        let warmup = Duration::from_secs_f64(warmup);
        let measure = Duration::from_secs_f64(measure);
        self.run_step(name, params, users, warmup, warmup, measure)
            .await
    }

    async fn run_step(
        &self,
        name: String,
        params: BTreeMap<String, Value>,
        users: Vec<Box<dyn Vu>>,
        users_warmup: Duration,
        warmup: Duration,
        measure: Duration,
    ) -> Step {
        let n = users.len();
        let measure = self.step_seconds.map_or(measure, Duration::from_secs_f64);
        let bar = progress_timer(&name, users_warmup + measure);
        let sampler = (!self.pids.is_empty()).then(|| ProcSampler::start(self.pids.clone()));
        let rec = measure::closed_loop(users, users_warmup, measure).await;
        let server = sampler.map(ProcSampler::finish);
        bar.set_message(format!("{name}: health ceiling"));
        let health_users: Vec<Box<dyn Vu>> = (0..n)
            .map(|_| Box::new(HealthVu(self.http.clone())) as Box<dyn Vu>)
            .collect();
        let health_rec = measure::closed_loop(health_users, warmup, measure).await;
        bar.finish_and_clear();
        let secs = measure.as_secs_f64();
        let health = health_rec.stats(secs).remove("health");
        let mut ops = rec.stats(secs);
        if let Some(h) = &health {
            for o in ops.values_mut() {
                o.ratio_to_health = Some(o.per_second / h.per_second.max(1e-9));
            }
        }
        let all = rec.all().map(|h| {
            let mut all = measure::op_stats(&h, secs);
            all.server_errors = ops.values().map(|o| o.server_errors).sum();
            all.ratio_to_health = health
                .as_ref()
                .map(|hh| all.per_second / hh.per_second.max(1e-9));
            all
        });
        let mut slow = rec.slow().to_vec();
        slow.truncate(1000);
        Step {
            name,
            params,
            users: n,
            seconds: secs,
            ops,
            health,
            server,
            transport_errors: rec.errors().clone(),
            slow,
            all,
        }
    }

    /// Runs `make(i)` for `i` in `0..n`, `concurrency` at a time, with a
    /// progress bar; answers in index order.
    pub async fn load<T, F>(
        &self,
        label: &str,
        n: usize,
        concurrency: usize,
        make: F,
    ) -> Result<Vec<T>>
    where
        T: Send + 'static,
        F: Fn(usize) -> BoxFut<T> + Send + Sync + 'static,
    {
        let bar = ProgressBar::new(n as u64).with_style(
            ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
                .expect("template")
                .progress_chars("=> "),
        );
        bar.set_message(label.to_string());
        let next = Arc::new(AtomicUsize::new(0));
        let make = Arc::new(make);
        let mut tasks = Vec::new();
        for _ in 0..concurrency.max(1) {
            let (next, make, bar) = (next.clone(), make.clone(), bar.clone());
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, anyhow::Error>(out);
                    }
                    out.push((i, make(i).await.with_context(|| format!("loading #{i}"))?));
                    bar.inc(1);
                }
            }));
        }
        let mut all = Vec::with_capacity(n);
        for t in tasks {
            all.extend(t.await??);
        }
        bar.finish_and_clear();
        all.sort_by_key(|(i, _)| *i);
        Ok(all.into_iter().map(|(_, t)| t).collect())
    }

    /// Signs a user up (ignoring "exists") and in; answers the token.
    pub async fn user(&self, name: &str, password: &str) -> Result<String> {
        let r = self
            .http
            .json(
                Method::POST,
                "/api/v1/users",
                Some(&self.admin),
                Some(&json!({"username": name, "password": password})),
            )
            .await?;
        anyhow::ensure!(
            r.status == 201 || r.status == 409,
            "sign-up of {name}: {}",
            r.status
        );
        sign_in(&self.http, name, password).await
    }

    /// Declares an index and waits until it is ready.
    pub async fn index(&self, name: &str, decl: Value) -> Result<()> {
        let path = format!("/api/v1/indexes/{name}");
        let r = self
            .http
            .json(Method::PUT, &path, Some(&self.admin), Some(&decl))
            .await?;
        anyhow::ensure!(
            r.status == 200 || r.status == 201,
            "declaring {name}: {}",
            r.status
        );
        for _ in 0..600 {
            let r = self
                .http
                .expect(Method::GET, &path, Some(&self.admin), None, 200)
                .await?;
            if r.json()["state"] == "ready" {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("index {name} did not become ready")
    }
}

/// Signs in; answers the token.
pub async fn sign_in(http: &Http, name: &str, password: &str) -> Result<String> {
    let r = http
        .expect(
            Method::POST,
            "/api/v1/sessions",
            None,
            Some(&json!({"username": name, "password": password})),
            201,
        )
        .await?;
    r.str("token").context("a token")
}

fn progress_timer(name: &str, total: Duration) -> ProgressBar {
    let bar = ProgressBar::new(total.as_millis() as u64).with_style(
        ProgressStyle::with_template("{msg:>40} [{bar:30}] {elapsed}/{duration}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_message(name.to_string());
    let b = bar.clone();
    tokio::spawn(async move {
        let start = std::time::Instant::now();
        while !b.is_finished() && start.elapsed() < total + Duration::from_secs(60) {
            b.set_position(start.elapsed().as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    bar
}

struct HealthVu(Http);

impl Vu for HealthVu {
    fn step<'a>(
        &'a mut self,
        rec: &'a mut Recorder,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            rec.time(
                "health",
                self.0.json(Method::GET, "/api/v1/health", None, None),
            )
            .await;
        })
    }
}

/// Runs a workload and writes its outputs; answers the results.
pub async fn run(opts: Options) -> Result<(Results, PathBuf)> {
    let started = report::now();
    let admin_password = opts.admin_password.clone().unwrap_or_else(|| {
        format!(
            "bench-{:016x}",
            Rng::new(std::process::id() as u64 ^ 0x5eed).next_u64()
        )
    });
    let (server, url) = match &opts.url {
        Some(u) => (None, u.clone()),
        None => {
            let s = SpawnedServer::start(&opts.server_exe, &admin_password, &[])?;
            let url = s.url.clone();
            (Some(s), url)
        }
    };
    let http = Http::new(&url);
    let admin = sign_in(&http, "admin", &admin_password)
        .await
        .context("signing in as admin (with --url, give --admin-password)")?;
    let pids = match &server {
        Some(s) => vec![s.pid()],
        None => opts.server_pids.clone(),
    };
    let kit = Kit {
        http,
        admin,
        quick: opts.quick,
        server,
        pids,
        step_seconds: opts.step_seconds,
        warmup_seconds: opts.warmup_seconds,
        settle_seconds: opts.settle_seconds,
        after_load: opts.after_load,
    };
    let run = match opts.workload {
        Workload::UserHome => workloads::user_home::run(&kit).await?,
        Workload::Kenai => workloads::kenai::run(&kit).await?,
        Workload::UploadStorm => workloads::upload_storm::run(&kit).await?,
        Workload::Custard => workloads::custard::run(&kit).await?,
        Workload::Search => workloads::search::run(&kit).await?,
        Workload::Chat => workloads::chat::run(&kit).await?,
    };
    let results = Results::new(
        opts.workload.name(),
        &url,
        kit.server.is_some(),
        opts.quick,
        started,
        run,
    );
    let out = opts.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "bench-results/{}-{}",
            opts.workload.name(),
            report::stamp()
        ))
    });
    drop(kit);
    report::write(&out, &results)?;
    Ok((results, out))
}

/// What a workload hands back.
pub struct WorkloadRun {
    /// Its parameters.
    pub params: Value,
    /// Its steps in order.
    pub steps: Vec<Step>,
    /// Pass marks and headline figures.
    pub marks: Vec<Mark>,
    /// Plots beyond the standard ones.
    pub plots: Vec<Plot>,
}
