//! Outputs: `results.json`, plots as PNG and SVG, a self-contained
//! `report.html`, and the terminal summary.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Step, WorkloadRun};

/// A pass mark or headline figure: the old target beside Tarn's figure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Mark {
    /// What is measured.
    pub what: String,
    /// The target (or `-`).
    pub target: String,
    /// Tarn's figure.
    pub tarn: String,
    /// Whether the target is met, when there is one.
    pub pass: Option<bool>,
}

/// A line chart: named series of (x, y) points.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plot {
    /// File name without extension.
    pub stem: String,
    /// Title.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// The series.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// Everything a run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    /// The workload.
    pub workload: String,
    /// Tarn's version.
    pub tarn_version: String,
    /// The git commit of the working directory, if any.
    pub git_commit: String,
    /// The machine's cores.
    pub cores: usize,
    /// When the run started and ended (RFC 3339).
    pub started_at: String,
    /// When the run ended.
    pub finished_at: String,
    /// The server's URL.
    pub url: String,
    /// Whether the kit started the server itself.
    pub spawned_server: bool,
    /// Quick sizes.
    pub quick: bool,
    /// Workload parameters.
    pub params: Value,
    /// Steps in order.
    pub steps: Vec<Step>,
    /// Pass marks and headline figures.
    pub marks: Vec<Mark>,
    /// Responses with a 5xx status, over all steps.
    pub server_errors: u64,
    /// Requests that got no response, over all steps.
    pub transport_errors: u64,
    /// Responses that shed load (503 with Retry-After) and were retried,
    /// over all steps; not errors.
    #[serde(default)]
    pub shed: u64,
    /// The plots.
    pub plots: Vec<Plot>,
}

/// Now, RFC 3339.
pub fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Now, for directory names.
pub fn stamp() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

impl Results {
    /// Results of a finished run.
    pub fn new(
        workload: &str,
        url: &str,
        spawned: bool,
        quick: bool,
        started: String,
        run: WorkloadRun,
    ) -> Results {
        let server_errors = run.steps.iter().map(Step::server_errors).sum();
        let shed = run
            .steps
            .iter()
            .flat_map(|s| s.ops.values())
            .map(|o| o.shed)
            .sum();
        let transport_errors = run
            .steps
            .iter()
            .map(|s| s.transport_errors.values().sum::<u64>())
            .sum();
        let mut plots = standard_plots(&run.steps);
        plots.extend(run.plots);
        Results {
            workload: workload.to_string(),
            tarn_version: env!("CARGO_PKG_VERSION").to_string(),
            git_commit: git_commit(),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            started_at: started,
            finished_at: now(),
            url: url.to_string(),
            spawned_server: spawned,
            quick,
            params: run.params,
            steps: run.steps,
            marks: run.marks,
            server_errors,
            transport_errors,
            shed,
            plots,
        }
    }
}

/// Stems of the plots every workload gets.
pub const STANDARD_PLOTS: [&str; 6] = [
    "latency-vs-users",
    "throughput-vs-users",
    "ratio-to-health-vs-users",
    "ceiling-vs-users",
    "cpu-vs-users",
    "memory-vs-users",
];

/// Re-renders a finished run's plots and report from its results.json (the
/// standard plots recomputed from the steps, the workload's own kept).
pub fn rerender(dir: &Path) -> Result<Results> {
    let text = std::fs::read_to_string(dir.join("results.json"))
        .with_context(|| format!("reading {}/results.json", dir.display()))?;
    let mut r: Results = serde_json::from_str(&text)?;
    let own: Vec<Plot> = r
        .plots
        .drain(..)
        .filter(|p| !STANDARD_PLOTS.contains(&p.stem.as_str()))
        .collect();
    r.plots = standard_plots(&r.steps);
    r.plots.extend(own);
    write(dir, &r)?;
    Ok(r)
}

/// Latency, throughput and server use against users, over steps whose
/// parameters other than `users` are the same (one series per group).
fn standard_plots(steps: &[Step]) -> Vec<Plot> {
    // Group steps by their parameters other than users.
    let mut groups: Vec<(String, Vec<&Step>)> = Vec::new();
    for s in steps {
        let key: Vec<String> = s
            .params
            .iter()
            .filter(|(k, _)| k.as_str() != "users")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let key = key.join(" ");
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(s),
            None => groups.push((key, vec![s])),
        }
    }
    let label = |g: &str, name: &str| {
        if g.is_empty() {
            name.to_string()
        } else {
            format!("{name} ({g})")
        }
    };
    let mut latency = Vec::new();
    let mut throughput = Vec::new();
    let mut ratio = Vec::new();
    let mut ceiling = Vec::new();
    let mut cpu = Vec::new();
    let mut rss = Vec::new();
    for (g, steps) in &groups {
        let ops: std::collections::BTreeSet<&String> =
            steps.iter().flat_map(|s| s.ops.keys()).collect();
        for op in ops {
            for (q, pick) in [("p50", 0), ("p90", 1), ("p99", 2)] {
                let pts = steps
                    .iter()
                    .filter_map(|s| {
                        s.ops
                            .get(op)
                            .map(|o| (s.users as f64, [o.p50_ms, o.p90_ms, o.p99_ms][pick]))
                    })
                    .collect();
                latency.push((label(g, &format!("{op} {q}")), pts));
            }
            let pts: Vec<(f64, f64)> = steps
                .iter()
                .filter_map(|s| s.ops.get(op).map(|o| (s.users as f64, o.per_second)))
                .collect();
            throughput.push((label(g, op), pts));
            let pts: Vec<(f64, f64)> = steps
                .iter()
                .filter_map(|s| {
                    s.ops
                        .get(op)
                        .and_then(|o| o.ratio_to_health.map(|r| (s.users as f64, r)))
                })
                .collect();
            ratio.push((label(g, op), pts));
        }
        let pts: Vec<(f64, f64)> = steps
            .iter()
            .filter_map(|s| s.health.as_ref().map(|h| (s.users as f64, h.per_second)))
            .collect();
        ceiling.push((label(g, "GET /api/v1/health"), pts));
        cpu.push((
            label(g, "server CPU"),
            steps
                .iter()
                .filter_map(|s| s.server.map(|u| (s.users as f64, u.cpu_cores)))
                .collect(),
        ));
        rss.push((
            label(g, "server RSS"),
            steps
                .iter()
                .filter_map(|s| s.server.map(|u| (s.users as f64, u.rss_max_mib)))
                .collect(),
        ));
    }
    let plot = |stem: &str, title: &str, y: &str, series: Vec<(String, Vec<(f64, f64)>)>| Plot {
        stem: stem.into(),
        title: title.into(),
        x_label: "concurrent users".into(),
        y_label: y.into(),
        log_x: true,
        series,
    };
    vec![
        plot(
            "latency-vs-users",
            "Response time percentiles vs users",
            "milliseconds",
            latency,
        ),
        plot(
            "throughput-vs-users",
            "Throughput vs users",
            "responses per second",
            throughput,
        ),
        plot(
            "ratio-to-health-vs-users",
            "Throughput as a share of the health ceiling",
            "x health at the same users",
            ratio,
        ),
        plot(
            "ceiling-vs-users",
            "The ceiling: GET /api/v1/health vs users",
            "responses per second",
            ceiling,
        ),
        plot("cpu-vs-users", "Server CPU vs users", "cores busy", cpu),
        plot(
            "memory-vs-users",
            "Server resident memory vs users",
            "MiB",
            rss,
        ),
    ]
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, p: &Plot) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let pts: Vec<(f64, f64)> = p.series.iter().flat_map(|s| s.1.iter().copied()).collect();
    let (x0, x1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), (x, _)| {
        (a.min(*x), b.max(*x))
    });
    let y1 = pts.iter().fold(0f64, |a, (_, y)| a.max(*y));
    let (x0, x1) = if pts.is_empty() {
        (1.0, 10.0)
    } else if x0 == x1 {
        (x0 * 0.5, x1 * 1.5 + 1.0)
    } else {
        (x0, x1)
    };
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.1 };
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&p.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    macro_rules! body {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(p.x_label.as_str())
                .y_desc(p.y_label.as_str())
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            for (i, (name, points)) in p.series.iter().enumerate() {
                if points.is_empty() {
                    continue;
                }
                let color = Palette99::pick(i).to_rgba();
                chart
                    .draw_series(LineSeries::new(
                        points.iter().copied(),
                        color.stroke_width(2),
                    ))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(points.iter().map(|pt| Circle::new(*pt, 3, color.filled())))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 12))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        }};
    }
    if p.log_x && x0 > 0.0 {
        body!(builder
            .build_cartesian_2d((x0..x1).log_scale(), 0f64..y1)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?);
    } else {
        body!(builder
            .build_cartesian_2d(x0..x1, 0f64..y1)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?);
    }
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// Writes results.json, every plot as PNG and SVG, and report.html.
pub fn write(dir: &Path, r: &Results) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(r)?)?;
    register_font();
    let mut svgs = Vec::new();
    for p in &r.plots {
        let svg_path = dir.join(format!("{}.svg", p.stem));
        draw(
            SVGBackend::new(&svg_path, (960, 540)).into_drawing_area(),
            p,
        )?;
        draw(
            BitMapBackend::new(&dir.join(format!("{}.png", p.stem)), (960, 540))
                .into_drawing_area(),
            p,
        )?;
        svgs.push(std::fs::read_to_string(&svg_path)?);
    }
    std::fs::write(dir.join("report.html"), html(r, &svgs))?;
    Ok(())
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn html(r: &Results, svgs: &[String]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>tarn bench {w}</title><style>\
         body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;margin:1em 0}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}th{{background:#eee}}td:first-child{{text-align:left}}\
         .bad{{background:#fdd;padding:1em;border:2px solid #c00}}.ok{{background:#dfd;padding:.5em}}</style></head><body>\
         <h1>tarn bench {w}</h1><p>{quick}tarn {v}, commit {c}, {cores} cores, server {url} ({spawn}), {s} to {f}</p>",
        w = esc(&r.workload),
        quick = if r.quick { "<b>quick run</b> · " } else { "" },
        v = esc(&r.tarn_version),
        c = esc(&r.git_commit),
        cores = r.cores,
        url = esc(&r.url),
        spawn = if r.spawned_server { "started by the kit" } else { "given" },
        s = esc(&r.started_at),
        f = esc(&r.finished_at),
    );
    if r.server_errors + r.transport_errors > 0 {
        let _ = write!(
            h,
            "<div class=\"bad\"><b>This run had errors:</b> {} responses with a 5xx status, {} requests without a response. See the steps below.</div>",
            r.server_errors, r.transport_errors
        );
    } else {
        h.push_str("<p class=\"ok\">No 5xx responses and no failed requests.</p>");
    }
    if r.shed > 0 {
        let _ = write!(
            h,
            "<p>{} requests were shed (503 with Retry-After: the server refused them at once rather than queue them) and sent again by the kit.</p>",
            r.shed
        );
    }
    h.push_str(
        "<h2>Marks</h2><table><tr><th>what</th><th>target</th><th>tarn</th><th>pass</th></tr>",
    );
    for m in &r.marks {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&m.what),
            esc(&m.target),
            esc(&m.tarn),
            match m.pass {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "",
            }
        );
    }
    h.push_str("</table><h2>Plots</h2>");
    for svg in svgs {
        let body = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
        let _ = write!(h, "<div>{body}</div>");
    }
    let _ = write!(
        h,
        "<h2>Parameters</h2><pre>{}</pre><h2>Steps</h2>",
        esc(&serde_json::to_string_pretty(&r.params).unwrap_or_default())
    );
    for s in &r.steps {
        let _ = write!(
            h,
            "<h3>{}</h3><p>{} users, {:.1} s measured",
            esc(&s.name),
            s.users,
            s.seconds
        );
        if let Some(u) = s.server {
            let _ = write!(
                h,
                "; server {:.2} cores, {:.0} MiB resident",
                u.cpu_cores, u.rss_max_mib
            );
        }
        h.push_str("</p><table><tr><th>operation</th><th>count</th><th>per s</th><th>× health</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>max ms</th><th>statuses</th></tr>");
        let rows = s.ops.iter().map(|(k, o)| (k.as_str(), o));
        for (op, o) in rows.chain(s.health.as_ref().map(|h| ("health (ceiling)", h))) {
            let statuses: Vec<String> = o
                .statuses
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.1}</td><td>{}</td></tr>",
                esc(op),
                o.count,
                o.per_second,
                o.ratio_to_health.map_or("-".into(), |x| format!("{x:.3}")),
                o.p50_ms,
                o.p90_ms,
                o.p99_ms,
                o.max_ms,
                esc(&statuses.join(", "))
            );
        }
        h.push_str("</table>");
        if !s.transport_errors.is_empty() {
            let _ = write!(
                h,
                "<p class=\"bad\">Failed requests: {}</p>",
                esc(&format!("{:?}", s.transport_errors))
            );
        }
        if !s.slow.is_empty() {
            let _ = write!(
                h,
                "<p>{} responses over 1 s, the slowest: {}</p>",
                s.slow.len(),
                esc(&format!("{:?}", s.slow.iter().take(20).collect::<Vec<_>>()))
            );
        }
    }
    h.push_str("</body></html>\n");
    h
}

/// The terminal summary: one table, marks beside Tarn's figures.
pub fn summary(r: &Results, out: &Path) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\ntarn bench {} — {} cores, commit {}",
        r.workload,
        r.cores,
        &r.git_commit[..r.git_commit.len().min(12)]
    );
    let _ = writeln!(
        t,
        "{:<44} {:<16} {:>8} {:>9} {:>8} {:>9} {:>9} {:>6}",
        "step", "operation", "count", "per s", "×health", "p50 ms", "p99 ms", "5xx"
    );
    for s in &r.steps {
        for (op, o) in &s.ops {
            let _ = writeln!(
                t,
                "{:<44} {:<16} {:>8} {:>9.1} {:>8} {:>9.2} {:>9.2} {:>6}",
                trunc(&s.name, 44),
                trunc(op, 16),
                o.count,
                o.per_second,
                o.ratio_to_health.map_or("-".into(), |x| format!("{x:.3}")),
                o.p50_ms,
                o.p99_ms,
                o.server_errors
            );
        }
    }
    if !r.marks.is_empty() {
        let _ = writeln!(
            t,
            "\n{:<52} {:>18} {:>22} {:>5}",
            "mark", "target", "tarn", "pass"
        );
        for m in &r.marks {
            let pass = match m.pass {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "",
            };
            let _ = writeln!(
                t,
                "{:<52} {:>18} {:>22} {:>5}",
                trunc(&m.what, 52),
                m.target,
                m.tarn,
                pass
            );
        }
    }
    let _ = writeln!(
        t,
        "\n{} 5xx responses, {} failed requests, {} shed and retried. Results in {}",
        r.server_errors,
        r.transport_errors,
        r.shed,
        out.display()
    );
    t
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}
