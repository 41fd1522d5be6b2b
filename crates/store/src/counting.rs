//! A store wrapper that counts what is read, so tests can prove costs by
//! counting rows and round trips instead of timing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{
    Batch, Consistency, FeedEntry, Key, ReadResult, Scan, Snapshot, Store, StoreResult, Table,
};

/// Counts of reads through a [`CountingStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Snapshots opened.
    pub snapshots: u64,
    /// [`Snapshot::read`] calls: round trips to the backend.
    pub calls: u64,
    /// Rows returned by point reads and scans.
    pub rows: u64,
    /// Point reads asked for.
    pub gets: u64,
    /// Scans asked for.
    pub scans: u64,
    /// Writes.
    pub writes: u64,
}

#[derive(Default)]
struct Counters {
    snapshots: AtomicU64,
    calls: AtomicU64,
    rows: AtomicU64,
    gets: AtomicU64,
    scans: AtomicU64,
    writes: AtomicU64,
}

/// Wraps a store and counts snapshots, calls, rows read and writes.
pub struct CountingStore<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S: Store> CountingStore<S> {
    /// Wraps `inner` with all counts at zero.
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            counters: Arc::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> ReadCounts {
        let c = &self.counters;
        ReadCounts {
            snapshots: c.snapshots.load(Ordering::Relaxed),
            calls: c.calls.load(Ordering::Relaxed),
            rows: c.rows.load(Ordering::Relaxed),
            gets: c.gets.load(Ordering::Relaxed),
            scans: c.scans.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
        }
    }

    /// Sets every count back to zero.
    pub fn reset(&self) {
        let c = &self.counters;
        for n in [
            &c.snapshots,
            &c.calls,
            &c.rows,
            &c.gets,
            &c.scans,
            &c.writes,
        ] {
            n.store(0, Ordering::Relaxed);
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

struct CountingSnapshot {
    inner: Box<dyn Snapshot>,
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl Snapshot for CountingSnapshot {
    async fn read(&mut self, gets: &[Key], scans: &[Scan]) -> StoreResult<ReadResult> {
        let c = &self.counters;
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.gets.fetch_add(gets.len() as u64, Ordering::Relaxed);
        c.scans.fetch_add(scans.len() as u64, Ordering::Relaxed);
        let out = self.inner.read(gets, scans).await?;
        let n = out.rows.iter().filter(|r| r.is_some()).count()
            + out.scans.iter().map(Vec::len).sum::<usize>();
        c.rows.fetch_add(n as u64, Ordering::Relaxed);
        Ok(out)
    }

    async fn read_feed(
        &mut self,
        feed: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<Vec<FeedEntry>> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let out = self.inner.read_feed(feed, after, limit).await?;
        self.counters
            .rows
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(out)
    }

    async fn scan_all(
        &mut self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<(Vec<(Key, crate::Row)>, Option<Vec<u8>>)> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.scan_all(cursor, limit).await
    }

    async fn feed_end(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.feed_end(feed).await
    }

    async fn feed_readable(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.feed_readable(feed).await
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for CountingStore<S> {
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>> {
        self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(CountingSnapshot {
            inner: self.inner.snapshot().await?,
            counters: self.counters.clone(),
        }))
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.write(batch).await
    }

    fn consistency(&self) -> Consistency {
        self.inner.consistency()
    }

    fn feed_lag(&self) -> std::time::Duration {
        self.inner.feed_lag()
    }
    fn connections(&self) -> Option<usize> {
        self.inner.connections()
    }

    async fn stop(&self) {
        self.inner.stop().await
    }

    async fn trim_feed(&self, feed: Table, through: &[u8], limit: usize) -> StoreResult<usize> {
        self.inner.trim_feed(feed, through, limit).await
    }

    fn partition_split(&self) -> u32 {
        self.inner.partition_split()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.inner.counters()
    }
}
