//! CassandraStore against a real 3-node Cassandra cluster: the shared
//! conformance suite, each test in a keyspace of its own, then what only a
//! distributed store has to prove (several stores on one keyspace,
//! roll-forward of a writer that died, a node going down).
//! `scripts/with-cassandra.sh` (or `make test-cassandra`) starts the cluster
//! and sets TARN_TEST_CASSANDRA and TARN_TEST_CASSANDRA_CTL.

mod faults;
mod guards;
mod nodes;
mod roll_forward;

use std::sync::Arc;

use tarn_store::Store;
use tarn_store_cassandra::{CassandraOptions, CassandraStore};
use tokio::sync::{RwLock, RwLockReadGuard};

/// Tests that stop a node take this for writing, every other test for
/// reading: no test runs while a node is down on purpose.
static CLUSTER: RwLock<()> = RwLock::const_new(());

const HOW: &str = "run the tests through scripts/with-cassandra.sh \
                   (or `make test-cassandra`), which starts a 3-node cluster";

/// The test cluster's URL, with a fresh keyspace.
pub fn fresh_url() -> String {
    let base = std::env::var("TARN_TEST_CASSANDRA")
        .unwrap_or_else(|_| panic!("TARN_TEST_CASSANDRA is not set: {HOW}"));
    let (hosts, rest) = base
        .strip_prefix("cassandra://")
        .and_then(|r| r.split_once('/'))
        .unwrap_or_else(|| panic!("TARN_TEST_CASSANDRA {base:?} is not a cassandra:// URL"));
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    let sep = if query.is_empty() { "" } else { "?" };
    format!(
        "cassandra://{hosts}/t_{:016x}{sep}{query}",
        u64::from_le_bytes(b)
    )
}

/// Options for tests: the defaults, with a sweeper that runs often.
pub fn options() -> CassandraOptions {
    CassandraOptions {
        sweep_interval: Some(std::time::Duration::from_millis(500)),
        ..CassandraOptions::default()
    }
}

/// A store on `url` with `options`, or a panic saying how to run the tests.
pub async fn connect(url: &str, options: CassandraOptions) -> CassandraStore {
    CassandraStore::connect_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}; {HOW}"))
}

async fn fresh() -> (Arc<dyn Store>, RwLockReadGuard<'static, ()>) {
    let guard = CLUSTER.read().await;
    let store = connect(&pooled_url().await, options()).await;
    (Arc::new(store) as Arc<dyn Store>, guard)
}

/// An emptied keyspace of the cluster's pool (`tarn_store_cassandra::pool`),
/// held until the test's thread ends: for tests that need an empty store,
/// not a keyspace made for them.
pub async fn pooled_url() -> String {
    let base = std::env::var("TARN_TEST_CASSANDRA")
        .unwrap_or_else(|_| panic!("TARN_TEST_CASSANDRA is not set: {HOW}"));
    tarn_store_cassandra::pool::for_test(&base, "t")
        .await
        .unwrap_or_else(|e| panic!("cannot lease a keyspace: {e}; {HOW}"))
}

tarn_store::conformance_tests!(fresh());

/// The test cluster indexes partition rows every 4 KiB, as Tarn asks of
/// every node: newest-first listings are reversed slices, which read a
/// partition without a row index whole.
#[tokio::test]
async fn the_cluster_indexes_partition_rows_every_4_kib() {
    let _g = CLUSTER.read().await;
    let s = connect(&fresh_url(), options()).await;
    assert_eq!(
        s.column_index_size().await.unwrap().as_deref(),
        Some("4KiB")
    );
}

/// The store's table compacts leveled, so that a listing reads a few
/// sstables however much was written (see the crate docs).
#[tokio::test]
async fn the_table_compacts_leveled() {
    let _g = CLUSTER.read().await;
    let s = connect(&fresh_url(), options()).await;
    assert_eq!(
        s.compaction_class().await.unwrap(),
        "org.apache.cassandra.db.compaction.LeveledCompactionStrategy"
    );
}
