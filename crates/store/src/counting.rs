//! A store wrapper that counts what is read, so tests can prove costs by
//! counting rows instead of timing.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Batch, Key, Row, Scan, Store, StoreResult};

/// Counts of reads through a [`CountingStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Rows returned by point reads and scans.
    pub rows: u64,
    /// Point reads asked for (each key of `get_many` counts).
    pub gets: u64,
    /// Scans asked for (each scan of `scan_many` counts).
    pub scans: u64,
}

/// Wraps a store and counts rows read and calls made.
pub struct CountingStore<S> {
    inner: S,
    rows: AtomicU64,
    gets: AtomicU64,
    scans: AtomicU64,
}

impl<S: Store> CountingStore<S> {
    /// Wraps `inner` with all counts at zero.
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            rows: AtomicU64::new(0),
            gets: AtomicU64::new(0),
            scans: AtomicU64::new(0),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> ReadCounts {
        ReadCounts {
            rows: self.rows.load(Ordering::Relaxed),
            gets: self.gets.load(Ordering::Relaxed),
            scans: self.scans.load(Ordering::Relaxed),
        }
    }

    /// Sets every count back to zero.
    pub fn reset(&self) {
        self.rows.store(0, Ordering::Relaxed);
        self.gets.store(0, Ordering::Relaxed);
        self.scans.store(0, Ordering::Relaxed);
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for CountingStore<S> {
    async fn get(&self, key: Key) -> StoreResult<Option<Row>> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        let row = self.inner.get(key).await?;
        self.rows.fetch_add(row.is_some() as u64, Ordering::Relaxed);
        Ok(row)
    }

    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Row>>> {
        self.gets.fetch_add(keys.len() as u64, Ordering::Relaxed);
        let rows = self.inner.get_many(keys).await?;
        let found = rows.iter().filter(|r| r.is_some()).count();
        self.rows.fetch_add(found as u64, Ordering::Relaxed);
        Ok(rows)
    }

    async fn scan(&self, scan: Scan) -> StoreResult<Vec<Row>> {
        self.scans.fetch_add(1, Ordering::Relaxed);
        let rows = self.inner.scan(scan).await?;
        self.rows.fetch_add(rows.len() as u64, Ordering::Relaxed);
        Ok(rows)
    }

    async fn scan_many(&self, scans: Vec<Scan>) -> StoreResult<Vec<Vec<Row>>> {
        self.scans.fetch_add(scans.len() as u64, Ordering::Relaxed);
        let out = self.inner.scan_many(scans).await?;
        let n: usize = out.iter().map(|r| r.len()).sum();
        self.rows.fetch_add(n as u64, Ordering::Relaxed);
        Ok(out)
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        self.inner.write(batch).await
    }
}
