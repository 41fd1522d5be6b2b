//! Reads: point reads and clustering slices at QUORUM, all of one call at
//! once.

use std::ops::Bound;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt, TryStreamExt};
use scylla::value::CqlValue;
use tarn_store::{check_read, Key, ReadResult, Row, Scan, Snapshot, StoreError, StoreResult};

use crate::error::map_exec;
use crate::schema::scan_index;
use crate::{bump, version_u64, Inner};

/// Whether a scan's bounds can hold any key (Cassandra refuses some
/// inverted slices instead of answering nothing).
fn bounds_nonempty(scan: &Scan) -> bool {
    match (&scan.lower, &scan.upper) {
        (Bound::Included(l), Bound::Included(u)) => l <= u,
        (Bound::Included(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u))
        | (Bound::Excluded(l), Bound::Excluded(u)) => l < u,
        _ => true,
    }
}

impl Inner {
    /// One row at QUORUM, if it exists.
    pub(crate) async fn get(&self, key: &Key) -> StoreResult<Option<Row>> {
        bump(&self.counters.point_reads);
        let r = self
            .session
            .execute_unpaged(
                &self.st.get,
                (key.table.name(), &key.partition, &key.clustering),
            )
            .await
            .map_err(map_exec)?;
        let rows = r
            .into_rows_result()
            .map_err(|e| StoreError::Other(format!("expected rows: {e}")))?;
        let row = rows
            .maybe_first_row::<(Vec<u8>, i64)>()
            .map_err(|e| StoreError::Corrupt(format!("row of {key:?}: {e}")))?;
        Ok(row.map(|(value, version)| Row {
            clustering: key.clustering.clone(),
            value,
            version: version_u64(version),
        }))
    }

    pub(crate) async fn scan(&self, scan: &Scan) -> StoreResult<Vec<Row>> {
        if scan.limit == 0 || !bounds_nonempty(scan) {
            return Ok(Vec::new());
        }
        bump(&self.counters.scans);
        let kind = |b: &Bound<Vec<u8>>| match b {
            Bound::Unbounded => 0,
            Bound::Included(_) => 1,
            Bound::Excluded(_) => 2,
        };
        let stmt = &self.st.scans[scan_index(kind(&scan.lower), kind(&scan.upper), scan.direction)];
        let mut values: Vec<CqlValue> = vec![
            CqlValue::Text(scan.table.name().to_string()),
            CqlValue::Blob(scan.partition.clone()),
        ];
        for b in [&scan.lower, &scan.upper] {
            if let Bound::Included(k) | Bound::Excluded(k) = b {
                values.push(CqlValue::Blob(k.clone()));
            }
        }
        // check_read bounds every limit by MAX_READ_ROWS, far below i32::MAX.
        values.push(CqlValue::Int(scan.limit.min(i32::MAX as usize) as i32));
        let r = self
            .session
            .execute_unpaged(stmt, values)
            .await
            .map_err(map_exec)?;
        let rows = r
            .into_rows_result()
            .map_err(|e| StoreError::Other(format!("expected rows: {e}")))?;
        let out = rows
            .rows::<(Vec<u8>, Vec<u8>, i64)>()
            .map_err(|e| StoreError::Corrupt(format!("scan columns: {e}")))?
            .map(|r| {
                r.map(|(clustering, value, version)| Row {
                    clustering,
                    value,
                    version: version_u64(version),
                })
                .map_err(|e| StoreError::Corrupt(format!("scan row: {e}")))
            })
            .collect::<StoreResult<Vec<Row>>>()?;
        Ok(out)
    }
}

/// Reads of a [`CassandraStore`]: no state of its own, every read at
/// QUORUM ([`Consistency::PerRead`]).
pub(crate) struct CassandraSnapshot {
    pub(crate) inner: Arc<Inner>,
}

#[async_trait::async_trait]
impl Snapshot for CassandraSnapshot {
    async fn read(&mut self, gets: &[Key], scans: &[Scan]) -> StoreResult<ReadResult> {
        check_read(gets, scans)?;
        let inner = &*self.inner;
        let n = inner.options.read_concurrency.max(1);
        // Point reads and scans go out together; `buffered` keeps answers
        // in request order while at most `n` of each are in flight.
        // Boxed so that the futures' lifetimes are plain for async_trait.
        let gets: Vec<BoxFuture<'_, StoreResult<Option<Row>>>> =
            gets.iter().map(|k| inner.get(k).boxed()).collect();
        let scans: Vec<BoxFuture<'_, StoreResult<Vec<Row>>>> =
            scans.iter().map(|s| inner.scan(s).boxed()).collect();
        let rows = futures_util::stream::iter(gets)
            .buffered(n)
            .try_collect::<Vec<_>>();
        let scans = futures_util::stream::iter(scans)
            .buffered(n)
            .try_collect::<Vec<_>>();
        let (rows, scans) = futures_util::future::try_join(rows, scans).await?;
        Ok(ReadResult { rows, scans })
    }

    async fn read_feed(
        &mut self,
        feed: tarn_store::Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<Vec<tarn_store::FeedEntry>> {
        self.inner
            .read_feed(feed, after, limit.min(tarn_store::MAX_READ_ROWS))
            .await
    }

    async fn feed_end(&mut self, _feed: tarn_store::Table) -> StoreResult<Vec<u8>> {
        Ok(self.inner.feed_end())
    }

    async fn feed_readable(&mut self, _feed: tarn_store::Table) -> StoreResult<Vec<u8>> {
        self.inner.feed_readable().await
    }

    async fn scan_all(
        &mut self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<(Vec<(Key, Row)>, Option<Vec<u8>>)> {
        self.inner.scan_all(cursor, limit).await
    }
}
