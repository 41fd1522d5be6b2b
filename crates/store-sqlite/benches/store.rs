//! Micro-benchmarks of SqliteStore: point read, 25-row scan and a 10-row
//! atomic write, alone and with concurrent writers (group commit).
//!
//! Run: `cargo bench -p tarn-store-sqlite --bench store`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tarn_store::{Batch, Key, Scan, SnapshotExt, Store, Table};
use tarn_store_sqlite::SqliteStore;

const T: Table = Table::new("bench");

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn ten_row_batch(n: u64) -> Batch {
    let mut b = Batch::new();
    for j in 0..10u64 {
        b.put(
            Key::new(
                T,
                (n % 97).to_be_bytes(),
                [n.to_be_bytes(), j.to_be_bytes()].concat(),
            ),
            vec![7u8; 200],
            1,
        );
    }
    b
}

fn benches(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path()).unwrap());
    rt.block_on(async {
        for p in 0..100u64 {
            let mut b = Batch::new();
            for i in 0..100u64 {
                b.put(
                    Key::new(T, p.to_be_bytes(), i.to_be_bytes()),
                    vec![1u8; 200],
                    1,
                );
            }
            store.write(b).await.unwrap();
        }
    });

    let mut g = c.benchmark_group("sqlite");
    g.throughput(Throughput::Elements(1));
    let mut i = 0u64;
    g.bench_function("point_read", |b| {
        b.to_async(&rt).iter(|| {
            i = i.wrapping_add(7919);
            let key = Key::new(T, (i % 100).to_be_bytes(), ((i / 100) % 100).to_be_bytes());
            let store = store.clone();
            async move {
                let mut snap = store.snapshot().await.unwrap();
                snap.get(&key).await.unwrap().unwrap()
            }
        })
    });
    g.bench_function("scan_25", |b| {
        b.to_async(&rt).iter(|| {
            i = i.wrapping_add(13);
            let scan = Scan::partition(T, (i % 100).to_be_bytes().to_vec(), 25);
            let store = store.clone();
            async move {
                let mut snap = store.snapshot().await.unwrap();
                assert_eq!(snap.scan(&scan).await.unwrap().len(), 25)
            }
        })
    });
    let mut n = 1_000_000u64;
    g.bench_function("write_10_rows_single", |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            let store = store.clone();
            async move { store.write(ten_row_batch(n)).await.unwrap() }
        })
    });
    for writers in [4u64, 16, 64] {
        g.throughput(Throughput::Elements(writers));
        g.bench_function(format!("write_10_rows_{writers}_concurrent"), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let store = store.clone();
                n += iters * writers;
                let base = n;
                async move {
                    let start = Instant::now();
                    let mut tasks = Vec::new();
                    for w in 0..writers {
                        let store = store.clone();
                        tasks.push(tokio::spawn(async move {
                            for k in 0..iters {
                                store
                                    .write(ten_row_batch(base + w * iters + k))
                                    .await
                                    .unwrap();
                            }
                        }));
                    }
                    for t in tasks {
                        t.await.unwrap();
                    }
                    start.elapsed()
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = store;
    config = Criterion::default().measurement_time(Duration::from_secs(4)).sample_size(20);
    targets = benches
}
criterion_main!(store);
