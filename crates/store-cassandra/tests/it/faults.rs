//! One node of three down: QUORUM reads, writes and guarded writes go on
//! without a single error, and the node catches up when it is back.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tarn_store::{Batch, Expect, Key, Scan, SnapshotExt, Store, Table};

use crate::{connect, fresh_url, options, CLUSTER, HOW};

const T: Table = Table::new("fault");

/// Runs the cluster's control script (`stop N`, `start N`).
async fn ctl(args: &[&str]) {
    let script = std::env::var("TARN_TEST_CASSANDRA_CTL")
        .unwrap_or_else(|_| panic!("TARN_TEST_CASSANDRA_CTL is not set: {HOW}"));
    let status = tokio::process::Command::new(&script)
        .args(args)
        .status()
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    assert!(status.success(), "{script} {args:?} failed");
}

/// Starts node 2 again when dropped while armed: if the test fails with the
/// node down, the tests after it still find three nodes.
struct Restart(bool);

impl Drop for Restart {
    fn drop(&mut self) {
        if self.0 {
            if let Ok(script) = std::env::var("TARN_TEST_CASSANDRA_CTL") {
                let _ = std::process::Command::new(script)
                    .args(["start", "2"])
                    .status();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_node_down_quorum_reads_and_writes_keep_succeeding() {
    // No other test runs while a node is down.
    let _g = CLUSTER.write().await;
    let s = connect(&fresh_url(), options()).await;
    let n = 100u32;
    let mut w = Batch::new();
    for i in 0..n {
        w.put(Key::new(T, b"rows", i.to_be_bytes()), vec![0], 1);
    }
    w.put(Key::new(T, b"ctr", b"n"), 0u64.to_be_bytes().to_vec(), 1);
    s.write(w).await.unwrap();

    ctl(&["stop", "2"]).await;
    let mut restart = Restart(true);
    let started = Instant::now();
    let (mut ops, mut errors) = (0u32, Vec::new());
    let mut expected_ctr = 0u64;
    // The slowest operation of each kind, to tell a stall from an error.
    let mut slowest: BTreeMap<&str, Duration> = BTreeMap::new();
    let mut timed = |kind: &'static str, since: Instant| {
        let took = since.elapsed();
        let worst = slowest.entry(kind).or_default();
        *worst = (*worst).max(took);
    };
    for round in 0..60u32 {
        // A point read, a guarded increment touching a second partition, a
        // scan, and a write of five rows and of a row elsewhere (a logged
        // batch over two partitions): 4 operations a round.
        let mut snap = s.snapshot().await.unwrap();
        ops += 1;
        let t = Instant::now();
        let read = snap.get(&Key::new(T, b"ctr", b"n")).await;
        timed("point read", t);
        match read {
            Ok(Some(row)) => {
                let v = u64::from_be_bytes(row.value.as_slice().try_into().unwrap());
                let mut w = Batch::new();
                w.put(
                    Key::new(T, b"ctr", b"n"),
                    (v + 1).to_be_bytes().to_vec(),
                    row.version + 1,
                )
                .put(Key::new(T, b"log", round.to_be_bytes()), vec![1], 1)
                .guard(Key::new(T, b"ctr", b"n"), Expect::Version(row.version));
                ops += 1;
                let t = Instant::now();
                let written = s.write(w).await;
                timed("guarded write", t);
                match written {
                    Ok(()) => expected_ctr = v + 1,
                    Err(e) => errors.push(format!("guarded write: {e}")),
                }
            }
            Ok(None) => errors.push("counter row missing".into()),
            Err(e) => errors.push(format!("read: {e}")),
        }
        ops += 1;
        let t = Instant::now();
        let scanned = snap
            .scan(&Scan::partition(T, b"rows".to_vec(), n as usize))
            .await;
        timed("scan", t);
        match scanned {
            Ok(rows) if rows.len() == n as usize => {}
            Ok(rows) => errors.push(format!("scan saw {} rows", rows.len())),
            Err(e) => errors.push(format!("scan: {e}")),
        }
        let mut w = Batch::new();
        for j in 0..5 {
            let i = (round * 5 + j) % n;
            w.put(Key::new(T, b"rows", i.to_be_bytes()), vec![1], 2);
        }
        w.put(Key::new(T, b"plain", round.to_be_bytes()), vec![1], 1);
        ops += 1;
        let t = Instant::now();
        let written = s.write(w).await;
        timed("logged batch", t);
        if let Err(e) = written {
            errors.push(format!("write: {e}"));
        }
    }
    let down_for = started.elapsed();
    assert!(
        errors.is_empty(),
        "{} of {ops} operations failed with a node down: {errors:?}",
        errors.len()
    );
    eprintln!(
        "one node down: {ops} operations in {down_for:?}, 0 errors; slowest of each kind: {slowest:?}"
    );
    assert!(ops >= 200);

    ctl(&["start", "2"]).await;
    restart.0 = false;
    // Back with three nodes: everything written meanwhile is there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut snap = s.snapshot().await.unwrap();
    loop {
        let ctr = snap.get(&Key::new(T, b"ctr", b"n")).await;
        let rows = snap
            .scan(&Scan::partition(T, b"rows".to_vec(), n as usize))
            .await;
        match (ctr, rows) {
            (Ok(Some(c)), Ok(rows)) => {
                assert_eq!(c.value, expected_ctr.to_be_bytes());
                assert_eq!(rows.len(), n as usize);
                assert!(rows.iter().all(|r| r.version == 2));
                break;
            }
            (a, b) => {
                assert!(
                    Instant::now() < deadline,
                    "no answer after the restart: {a:?} {b:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let logged = snap
        .read(
            &(0..60u32)
                .map(|r| Key::new(T, b"log", r.to_be_bytes()))
                .collect::<Vec<_>>(),
            &[],
        )
        .await
        .unwrap();
    assert!(
        logged.rows.iter().all(|r| r.is_some()),
        "every guarded write's other row"
    );
    let counters: HashMap<_, _> = s.counters().into_iter().collect();
    eprintln!("counters: {counters:?}");
}
