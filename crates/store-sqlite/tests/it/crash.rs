//! Crash safety: a child process makes acknowledged writes and is killed with
//! SIGKILL at a random moment; after reopening, every acknowledged batch is
//! there and no batch is half applied. SIGKILL leaves the kernel's page
//! cache intact, so this shows nothing about fsyncs (power loss).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::ops::Bound;

use tarn_store::{Batch, Key, Scan, SnapshotExt, Store, StoreError, Table};
use tarn_store_sqlite::SqliteStore;

const TABLE: Table = Table::new("crash");
const ROWS_PER_BATCH: u64 = 5;
const PARTITIONS: u64 = 7;
const CHILD_ENV: &str = "TARN_CRASH_CHILD_DIR";
const ROUND_ENV: &str = "TARN_CRASH_ROUND";

/// Rows of batch `id`: spread over partitions so a batch crosses several.
fn batch_keys(id: u64) -> Vec<Key> {
    (0..ROWS_PER_BATCH)
        .map(|j| {
            let part = (id + j) % PARTITIONS;
            let mut clus = id.to_be_bytes().to_vec();
            clus.push(j as u8);
            Key::new(TABLE, part.to_be_bytes(), clus)
        })
        .collect()
}

/// The key the last writer of the child overwrites with every batch, with a
/// value past the size that goes to the value file: each overwrite frees the
/// last one's range, which later ones reuse.
fn large_key() -> Key {
    Key::new(TABLE, b"large".to_vec(), b"value".to_vec())
}

/// The large value of batch `id`: its id, then bytes that depend on it.
fn large_value(id: u64) -> Vec<u8> {
    let mut v = id.to_be_bytes().to_vec();
    v.extend((0..70_000u64).map(|i| ((i ^ id).wrapping_mul(0x9e37_79b9) >> 7) as u8));
    v
}

/// Not a test on its own: the child process's body, run by `crash_rounds`
/// with `--ignored`. Ignored, so a plain test run never counts it as passed.
#[test]
#[ignore = "the child process of crash_rounds, which runs it"]
fn crash_child() {
    let dir = std::env::var(CHILD_ENV).expect("run by crash_rounds, which sets the directory");
    let round: u64 = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // A small WAL bound, so the WAL is restarted while the child dies.
        let options = tarn_store_sqlite::SqliteOptions {
            checkpoint_every: std::time::Duration::from_millis(10),
            checkpoint_pages: 64,
            ..Default::default()
        };
        let store = Arc::new(SqliteStore::open_with(&dir, options).unwrap());
        let mut writers = Vec::new();
        for w in 0..6u64 {
            let store = store.clone();
            writers.push(tokio::spawn(async move {
                // Bounded: the parent kills the child long before this ends.
                for i in 0..200_000u64 {
                    let id = (round << 40) | (w << 32) | i;
                    let mut b = Batch::new();
                    for key in batch_keys(id) {
                        b.put(key, id.to_be_bytes().repeat(50), 1);
                    }
                    if w == 5 {
                        b.put(large_key(), large_value(id), 1);
                    }
                    store.write(b).await.unwrap();
                    println!("ACK {id}");
                }
            }));
        }
        for w in writers {
            w.await.unwrap();
        }
    });
}

fn next_random(state: &mut u64) -> u64 {
    // xorshift64*: enough to spread kill moments.
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn crash_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut total_acked = 0usize;
    let mut large_checked = 0usize;
    for round in 0..20u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash::crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .env(ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(id) = line.strip_prefix("ACK ") {
                    let _ = tx.send(id.parse().unwrap());
                }
            }
        });
        // Wait for the first acknowledgement, then let it run a random while.
        let first = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("child writes");
        if round == 0 {
            match SqliteStore::open(dir.path()) {
                Err(StoreError::Unavailable(msg)) => assert!(msg.contains("in use")),
                Err(e) => panic!("unexpected {e}"),
                Ok(_) => panic!("a second process must be refused the directory"),
            }
        }
        let wait = Duration::from_millis(next_random(&mut seed) % 400);
        let start = Instant::now();
        while start.elapsed() < wait {
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        let mut acked: Vec<u64> = rx.try_iter().collect();
        acked.push(first);
        total_acked += acked.len();

        let store = SqliteStore::open(dir.path()).expect("reopen after kill");
        rt.block_on(async {
            let mut snap = store.snapshot().await.unwrap();
            for id in &acked {
                let rows = snap.get_many(&batch_keys(*id)).await.unwrap();
                assert!(
                    rows.iter().all(|r| r.is_some()),
                    "round {round}: acknowledged batch {id} lost"
                );
            }
            // Every batch present at all is present whole.
            let mut seen = std::collections::HashMap::<u64, u64>::new();
            for part in 0..PARTITIONS {
                let mut after = Bound::Unbounded;
                loop {
                    let rows = snap
                        .scan(
                            &Scan::partition(TABLE, part.to_be_bytes().to_vec(), 10_000)
                                .bounds(after, Bound::Unbounded),
                        )
                        .await
                        .unwrap();
                    let Some(last) = rows.last() else { break };
                    after = Bound::Excluded(last.clustering.clone());
                    for r in rows {
                        let id = u64::from_be_bytes(r.clustering[..8].try_into().unwrap());
                        *seen.entry(id).or_default() += 1;
                    }
                }
            }
            for (id, n) in seen {
                assert_eq!(n, ROWS_PER_BATCH, "round {round}: batch {id} half applied");
            }
            // The large value is whole, and at least as new as the last
            // batch of its writer that was acknowledged.
            let last_large = acked.iter().filter(|id| (*id >> 32) & 0xff == 5).max();
            if let Some(last) = last_large {
                large_checked += 1;
                let got = snap
                    .get(&large_key())
                    .await
                    .unwrap()
                    .expect("the large value");
                let id = u64::from_be_bytes(got.value[..8].try_into().unwrap());
                assert!(
                    id >= *last,
                    "round {round}: large value of {id}, {last} acknowledged"
                );
                assert!(
                    got.value == large_value(id),
                    "round {round}: large value {id} not whole"
                );
            }
        });
    }
    assert!(total_acked >= 20);
    assert!(large_checked > 0, "no round checked the large value");
}
