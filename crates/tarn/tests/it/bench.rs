//! `tarn bench <workload> --quick` against a server the kit starts: the
//! outputs exist, results.json holds every figure, and nothing answered 5xx.
//! Timings are reported, never asserted.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const TARN: &str = env!("CARGO_BIN_EXE_tarn");

fn check_figures(o: &Value, what: &str) {
    for f in [
        "count",
        "per_second",
        "mean_ms",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "max_ms",
        "under_2s",
    ] {
        assert!(o[f].is_number(), "{what}: {f} missing in {o}");
    }
    assert!(o["count"].as_u64().unwrap() > 0, "{what}: nothing measured");
    assert!(o["p50_ms"].as_f64().unwrap() <= o["p99_ms"].as_f64().unwrap());
}

fn check_run(workload: &str, out: &Path) {
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["workload"], workload);
    assert_eq!(results["quick"], true);
    assert!(results["cores"].as_u64().unwrap() >= 1);
    assert!(results["git_commit"].is_string() && results["tarn_version"].is_string());
    assert_eq!(results["server_errors"], 0, "{workload}: 5xx responses");
    assert_eq!(
        results["transport_errors"], 0,
        "{workload}: failed requests"
    );
    let steps = results["steps"].as_array().unwrap();
    assert!(!steps.is_empty());
    for s in steps {
        let name = s["name"].as_str().unwrap();
        let ops = s["ops"].as_object().unwrap();
        assert!(!ops.is_empty(), "{workload} {name}: no operations");
        // Chat measures posts and deliveries, not requests against a
        // health ceiling (workloads.md): no health figures there.
        let against_health = workload != "chat";
        for (op, o) in ops {
            check_figures(o, &format!("{workload} {name} {op}"));
            if against_health {
                assert!(o["ratio_to_health"].is_number(), "{op}: ratio to health");
            }
            for status in o["statuses"].as_object().unwrap().keys() {
                assert!(
                    !status.starts_with('5'),
                    "{workload} {name} {op}: status {status}"
                );
            }
        }
        if against_health {
            check_figures(&s["health"], &format!("{workload} {name} health"));
        }
        let server = &s["server"];
        assert!(
            server["cpu_cores"].as_f64().unwrap() >= 0.0,
            "{name}: server CPU"
        );
        assert!(
            server["rss_max_mib"].as_f64().unwrap() > 0.0,
            "{name}: server memory"
        );
    }
    assert!(!results["marks"].as_array().unwrap().is_empty());
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<svg"), "plots are inline");
    for p in results["plots"].as_array().unwrap() {
        let stem = p["stem"].as_str().unwrap();
        for ext in ["png", "svg"] {
            let f = out.join(format!("{stem}.{ext}"));
            assert!(
                std::fs::metadata(&f)
                    .map(|m| m.len() > 1000)
                    .unwrap_or(false),
                "{}",
                f.display()
            );
        }
    }
}

/// Runs `tarn bench <workload> --quick` with `extra` arguments, checks its
/// outputs and nothing answered 5xx, and returns results.json.
fn quick_run(workload: &str, extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = Command::new(TARN)
        .args(["bench", workload, "--quick"])
        .args(extra)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{workload}: {}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("0 5xx responses"),
        "{workload} summary: {stdout}"
    );
    check_run(workload, &out);
    serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap()
}

// One test a workload, so that the test threads share them out.

#[test]
fn user_home_runs_quick_with_complete_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let loads = dir.path().join("loads");
    let command = format!("echo loaded >> '{}'", loads.display());
    let results = quick_run(
        "user-home",
        &[
            "--after-load",
            &command,
            "--warmup-seconds",
            "0.2",
            "--step-seconds",
            "0.5",
        ],
    );
    let plots: Vec<&str> = results["plots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["stem"].as_str().unwrap())
        .collect();
    assert!(plots.contains(&"latency-vs-size"), "{plots:?}");
    // The after-load command ran once a pool size: 500 and 5,000 homes.
    let loads = std::fs::read_to_string(&loads).unwrap();
    assert_eq!(loads, "loaded\nloaded\n");
    assert!(results["params"]["after_load"].is_string());
    assert_eq!(results["params"]["warmup_seconds"], 0.2);
}

#[test]
fn kenai_runs_quick_with_complete_outputs() {
    quick_run("kenai", &[]);
}

#[test]
fn upload_storm_runs_quick_with_complete_outputs() {
    quick_run("upload-storm", &[]);
}

#[test]
fn custard_runs_quick_with_complete_outputs() {
    quick_run("custard", &[]);
}

/// With shorter steps than --quick's (each step runs one kind of query,
/// some hundreds of them in half a second): half the time.
#[test]
fn search_runs_quick_with_complete_outputs() {
    quick_run(
        "search",
        &["--step-seconds", "0.5", "--warmup-seconds", "0"],
    );
}

#[test]
fn chat_runs_quick_with_complete_outputs() {
    let results = quick_run("chat", &[]);
    // Every member got every message posted while it was a member, once.
    for s in results["steps"].as_array().unwrap() {
        let p = &s["params"];
        assert!(p["delivered"].as_u64().unwrap() > 0, "{p}");
        assert_eq!(p["missed"], 0, "{p}");
        assert_eq!(p["duplicates"], 0, "{p}");
    }
}

#[test]
fn spans_of_seconds_out_of_range_are_refused() {
    for (flag, value, says) in [
        ("--step-seconds", "0", "0 seconds measure nothing"),
        (
            "--step-seconds",
            "1e-10",
            "0.0000000001 seconds measure nothing",
        ),
        ("--step-seconds", "-1", "-1 is not from 0 to 86400 seconds"),
        (
            "--warmup-seconds",
            "NaN",
            "NaN is not from 0 to 86400 seconds",
        ),
        (
            "--settle-seconds",
            "1e9",
            "1000000000 is not from 0 to 86400 seconds",
        ),
        ("--warmup-seconds", "soon", "\"soon\" is not a number"),
    ] {
        let run = Command::new(TARN)
            .args(["bench", "user-home", "--quick", &format!("{flag}={value}")])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
    }
}

#[test]
fn a_failing_after_load_command_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = Command::new(TARN)
        .args([
            "bench",
            "user-home",
            "--quick",
            "--after-load",
            "exit 3",
            "--out",
        ])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "the run went on: {stderr}");
    assert!(
        stderr.contains("after-load command `exit 3` failed"),
        "{stderr}"
    );
    assert!(!dir.path().join("out").join("results.json").exists());
}
