//! The server under test: spawned from the `tarn` binary on a fresh temp
//! directory and a free loopback port, and watched through `/proc`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// A `tarn serve` the kit started; stopped and its data removed on drop.
pub struct SpawnedServer {
    child: Child,
    /// Its base URL.
    pub url: String,
    _dir: tempfile::TempDir,
}

impl SpawnedServer {
    /// Starts `exe serve` on a fresh directory and a free port.
    pub fn start(
        exe: &std::path::Path,
        admin_password: &str,
        extra_env: &[(&str, &str)],
    ) -> Result<SpawnedServer> {
        let dir = tempfile::tempdir()?;
        let mut cmd = Command::new(exe);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path().join("data"))
            .env("TARN_ADMIN_PASSWORD", admin_password)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("reading the server's first line")?;
        let Some(addr) = line.trim().strip_prefix("tarn listening on ") else {
            let _ = child.kill();
            bail!("the server did not start: {line:?}");
        };
        Ok(SpawnedServer {
            url: addr.to_string(),
            child,
            _dir: dir,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the server process used during a step.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct ServerUse {
    /// CPU time over wall time: cores kept busy.
    pub cpu_cores: f64,
    /// Largest resident memory seen, MiB.
    pub rss_max_mib: f64,
}

/// Samples processes' CPU time and memory while a step runs (summed over
/// the processes: several nodes on one machine count together).
pub struct ProcSampler {
    pids: Vec<u32>,
    start_ticks: u64,
    start: Instant,
    rss_max_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

fn total_ticks(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| cpu_ticks(*p)).sum()
}

fn total_rss(pids: &[u32]) -> Option<u64> {
    let all: Vec<u64> = pids.iter().filter_map(|p| rss_kib(*p)).collect();
    (!all.is_empty()).then(|| all.iter().sum())
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: state is 3rd.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Clock ticks per second of `/proc/*/stat` (USER_HZ: 100 on Linux).
const TICKS: f64 = 100.0;

impl ProcSampler {
    /// Starts sampling the processes every 100 ms.
    pub fn start(pids: Vec<u32>) -> ProcSampler {
        let rss_max_kib = Arc::new(AtomicU64::new(total_rss(&pids).unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, p) = (rss_max_kib.clone(), stop.clone(), pids.clone());
        tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                if let Some(kib) = total_rss(&p) {
                    r.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        ProcSampler {
            start_ticks: total_ticks(&pids),
            pids,
            start: Instant::now(),
            rss_max_kib,
            stop,
        }
    }

    /// Stops and reports.
    pub fn finish(self) -> ServerUse {
        self.stop.store(true, Ordering::Relaxed);
        let ticks = total_ticks(&self.pids).saturating_sub(self.start_ticks);
        ServerUse {
            cpu_cores: ticks as f64 / TICKS / self.start.elapsed().as_secs_f64(),
            rss_max_mib: self.rss_max_kib.load(Ordering::Relaxed) as f64 / 1024.0,
        }
    }
}
