//! Keyspaces for tests, used again rather than made anew (feature
//! `test-pool`).
//!
//! Making a keyspace on a three-node cluster takes 1.2–2 s of the nodes'
//! time: three schema changes (keyspace, table, index), each agreed by
//! every node. Emptying one with `TRUNCATE` takes about a tenth of that.
//! So tests that each want an empty store lease one of a pool of
//! keyspaces, `<base>_p0`, `<base>_p1`, ...: slot `N` is held by an
//! advisory lock on the file `slot-N` in a directory that every test
//! process on one cluster shares, for as long as the lease lives, so no
//! two tests (in one process or in two) ever share a keyspace. A leased
//! keyspace is emptied before the lease is given, before any store
//! connects to it (a store writes at connect).
//!
//! The locks hold only among processes that use one directory for one
//! cluster: [`for_test`] leases only when `TARN_TEST_CASSANDRA_DIR` names
//! the cluster's own directory, as `scripts/with-cassandra.sh` sets it,
//! and otherwise makes a fresh keyspace, so that runs against a cluster
//! of one's own never empty each other's keyspaces.
//!
//! A lease must outlive everything that writes to its keyspace: a write
//! still in flight when the next test empties it would land in that
//! test's store. [`lease_for_this_thread`] keeps it until the thread ends,
//! which for a test is after its runtime, and every task on it, is gone.

use std::cell::RefCell;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::time::Duration;

use scylla::client::session_builder::SessionBuilder;
use scylla::statement::{Consistency, Statement};
use tarn_store::{StoreError, StoreResult};

use crate::error::{map_exec, map_session};
use crate::schema::TABLE;

/// A keyspace held for one test: its slot's lock and its store URL.
pub struct Lease {
    _lock: File,
    url: String,
}

impl Lease {
    /// The store URL of the leased keyspace (the base URL's hosts and
    /// replication).
    pub fn url(&self) -> &str {
        &self.url
    }
}

thread_local! {
    static HELD: RefCell<Vec<Lease>> = const { RefCell::new(Vec::new()) };
}

/// The store URL of an empty keyspace for a test on the cluster of `base`
/// (a store URL): a leased one ([`lease_for_this_thread`], its locks in
/// `TARN_TEST_CASSANDRA_DIR/pool`) when that variable is set, else a
/// fresh keyspace `<prefix>_<random>`.
pub async fn for_test(base: &str, prefix: &str) -> StoreResult<String> {
    if let Some(dir) = std::env::var_os("TARN_TEST_CASSANDRA_DIR") {
        return lease_for_this_thread(base, &Path::new(&dir).join("pool")).await;
    }
    let target = crate::url::parse(base)?;
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| StoreError::Other(format!("random: {e}")))?;
    Ok(format!(
        "cassandra://{}/{prefix}_{:016x}?replication={}",
        target.hosts.join(","),
        u64::from_le_bytes(b),
        target.replication
    ))
}

/// Leases an empty keyspace of the pool of `base` (a store URL whose
/// keyspace names the pool), with its slots' locks in `dir`; the lease is
/// held until this thread ends. Returns its store URL.
pub async fn lease_for_this_thread(base: &str, dir: &Path) -> StoreResult<String> {
    let lease = lease(base, dir).await?;
    let url = lease.url.clone();
    HELD.with(|h| h.borrow_mut().push(lease));
    Ok(url)
}

/// Leases an empty keyspace of the pool of `base`, with its slots' locks
/// in `dir` (created if missing).
pub async fn lease(base: &str, dir: &Path) -> StoreResult<Lease> {
    let target = crate::url::parse(base)?;
    let io = |what: &str, e: std::io::Error| StoreError::Other(format!("test pool: {what}: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| io(&dir.display().to_string(), e))?;
    for n in 0u32.. {
        let keyspace = format!("{}_p{n}", target.keyspace);
        if keyspace.len() > 48 {
            return Err(StoreError::Invalid(format!(
                "test pool: {keyspace} is longer than Cassandra's 48 characters"
            )));
        }
        let path = dir.join(format!("slot-{n}"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io(&path.display().to_string(), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Error(e)) => return Err(io(&path.display().to_string(), e)),
        }
        empty(&target.hosts, &keyspace).await?;
        let url = format!(
            "cassandra://{}/{keyspace}?replication={}",
            target.hosts.join(","),
            target.replication
        );
        return Ok(Lease { _lock: lock, url });
    }
    unreachable!("a slot past u32::MAX")
}

/// Empties the store table of `keyspace`, if it exists.
async fn empty(hosts: &[String], keyspace: &str) -> StoreResult<()> {
    let session = SessionBuilder::new()
        .known_nodes(hosts)
        .build()
        .await
        .map_err(map_session)?;
    crate::schema::agree(&session).await?;
    let mut q = Statement::new(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?",
    );
    q.set_consistency(Consistency::One);
    let found = session
        .query_unpaged(q, (keyspace, TABLE))
        .await
        .map_err(map_exec)?
        .into_rows_result()
        .map_err(|e| StoreError::Other(format!("schema query: {e}")))?
        .rows_num();
    if found == 0 {
        return Ok(());
    }
    // TRUNCATE needs every node up: one a test has just restarted may take
    // some seconds to be seen again. Only that is waited out.
    let truncate = format!("TRUNCATE {keyspace}.{TABLE}");
    let mut attempt = 0;
    loop {
        match session
            .query_unpaged(truncate.as_str(), ())
            .await
            .map_err(map_exec)
        {
            Ok(_) => return Ok(()),
            Err(StoreError::Unavailable(m)) if attempt < 30 => {
                attempt += 1;
                tracing::warn!("test pool: emptying {keyspace}: {m}; again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}
