//! Feeds and whole-store scans on Cassandra.
//!
//! # Feeds
//!
//! There is no commit order across a cluster, so a feed is ordered by time:
//! an entry is a row of table `zfeed_<feed>` in partition (time bucket of
//! [`BUCKET_MICROS`], shard of [`SHARDS`]) — so no partition grows without
//! bound and appends spread over the cluster — with clustering key
//! (timestamp, write id, position in the batch), its cursor. Entries go
//! with the batch that appends them (in its logged batch, or with the rest
//! of a guarded batch). A reader merges the shards of each bucket in order
//! and reads only up to [`LAG_MICROS`] behind now, and below the oldest
//! stamp any node still has in flight as its latest mark says
//! (`marks.rs`), so an entry whose write took less than the lag to land,
//! or within `marks::CAP_MICROS` while its node went on marking, is never
//! passed over. One that landed later (the roll-forward of a writer that
//! died between the two steps of a guarded write, or after its node could
//! not write its marks for `marks::HOLD_MICROS`) may be, by a reader
//! already past it. That is the one place Cassandra is weaker than
//! the other backends here. The end a
//! reader starting from now is handed ([`Inner::feed_end`]) is now itself,
//! not the readable end, so that a change committed just before is not
//! handed out again; a write still landing then, stamped before now, is
//! passed over by that reader.
//!
//! # Whole-store scans
//!
//! [`Snapshot::scan_all`](tarn_store::Snapshot::scan_all) walks the table in
//! token order, a page at a time: the rest of the partition it stopped in,
//! then the partitions whose tokens follow. Intents and feeds are skipped.

use std::ops::Bound;

use scylla::value::CqlValue;
use tarn_store::{
    Batch, Direction, Expect, FeedEntry, Key, Op, Row, Scan, StoreError, StoreResult, Table,
};

use crate::error::map_exec;
use crate::schema::KIND_ROW;
use crate::{rows_of, version_u64, wall_micros, Inner};

/// A feed's time bucket, in microseconds: ten minutes.
pub(crate) const BUCKET_MICROS: i64 = 600_000_000;
/// Shards of each bucket.
pub(crate) const SHARDS: u8 = 16;
/// How far behind now a reader stops at least. The marks (`marks.rs`)
/// hold it further back while writes are landing, and by about
/// `marks::MARK_EVERY` otherwise: a reader stops below every node's last
/// mark.
pub(crate) const LAG_MICROS: i64 = 250_000;
/// Prefix of the tables that hold feeds (no table of the engine's has it).
const FEED_PREFIX: &str = "zfeed_";
/// Where each feed's trimmed-through bucket and the store's birth are kept.
pub(crate) const META: &str = "zfeedmeta";

fn feed_table(feed: Table) -> StoreResult<Table> {
    Table::named(&format!("{FEED_PREFIX}{}", feed.name()))
        .ok_or_else(|| StoreError::Invalid(format!("feed name {} is too long", feed.name())))
}

fn meta_key(what: &str) -> StoreResult<Key> {
    let t = Table::named(META).expect("a valid table name");
    Ok(Key::new(t, what.as_bytes().to_vec(), b"b".to_vec()))
}

fn partition(bucket: i64, shard: u8) -> Vec<u8> {
    let mut p = (bucket as u64).to_be_bytes().to_vec();
    p.push(shard);
    p
}

fn cursor_ts(c: &[u8]) -> StoreResult<i64> {
    if c.len() != 18 {
        return Err(StoreError::Invalid("not a cursor of this feed".into()));
    }
    Ok(u64::from_be_bytes(c[..8].try_into().expect("8 bytes")) as i64)
}

/// The ops that append `batch`'s feed entries, at `ts`.
pub(crate) fn append_ops(batch: &Batch, ts: i64) -> StoreResult<Vec<Op>> {
    if batch.appends.is_empty() {
        return Ok(Vec::new());
    }
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).map_err(|e| StoreError::Other(format!("random id: {e}")))?;
    let shard = id[0] % SHARDS;
    let bucket = ts.div_euclid(BUCKET_MICROS);
    let mut ops = Vec::with_capacity(batch.appends.len());
    for (i, a) in batch.appends.iter().enumerate() {
        let mut clus = (ts as u64).to_be_bytes().to_vec();
        clus.extend_from_slice(&id);
        clus.extend_from_slice(&(i as u16).to_be_bytes());
        ops.push(Op::Put {
            key: Key::new(feed_table(a.feed)?, partition(bucket, shard), clus),
            value: a.value.clone(),
            version: 1,
        });
    }
    Ok(ops)
}

impl Inner {
    /// The first bucket that may hold entries of `feed`.
    async fn first_bucket(&self, feed: Table) -> StoreResult<i64> {
        let born = self.get(&meta_key("born")?).await?;
        let trimmed = self
            .get(&meta_key(&format!("trimmed:{}", feed.name()))?)
            .await?;
        let bucket = |r: Option<Row>| {
            r.and_then(|r| r.value.try_into().ok())
                .map_or(0, |b: [u8; 8]| i64::from_be_bytes(b))
        };
        Ok(bucket(born).max(bucket(trimmed)))
    }

    /// See [`Snapshot::read_feed`](tarn_store::Snapshot::read_feed) and
    /// the module's documentation.
    pub(crate) async fn read_feed(
        &self,
        feed: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<Vec<FeedEntry>> {
        let table = feed_table(feed)?;
        let horizon = self.held_horizon(wall_micros() - LAG_MICROS).await?;
        // A cursor at or past the horizon (the end handed out a moment
        // ago, or a faster clock's entry): nothing is readable after it yet.
        if let Some(c) = after {
            if cursor_ts(c)? >= horizon {
                return Ok(Vec::new());
            }
        }
        let upper = Bound::Excluded((horizon as u64).to_be_bytes().to_vec());
        let (mut bucket, lower) = match after {
            Some(c) => (
                cursor_ts(c)?.div_euclid(BUCKET_MICROS),
                Bound::Excluded(c.to_vec()),
            ),
            None => (self.first_bucket(feed).await?, Bound::Unbounded),
        };
        let last = horizon.div_euclid(BUCKET_MICROS);
        let mut out: Vec<FeedEntry> = Vec::new();
        while bucket <= last && out.len() < limit {
            let want = limit - out.len();
            let scans: Vec<Scan> = (0..SHARDS)
                .map(|s| {
                    Scan::partition(table, partition(bucket, s), want)
                        .bounds(lower.clone(), upper.clone())
                        .direction(Direction::Forward)
                })
                .collect();
            let answers =
                futures_util::future::try_join_all(scans.iter().map(|s| self.scan(s))).await?;
            let mut rows: Vec<Row> = answers.into_iter().flatten().collect();
            rows.sort_by(|a, b| a.clustering.cmp(&b.clustering));
            rows.truncate(want);
            out.extend(rows.into_iter().map(|r| FeedEntry {
                cursor: r.clustering,
                value: r.value,
            }));
            bucket += 1;
        }
        Ok(out)
    }

    /// A cursor through which the feed is readable now: after every entry
    /// stamped before the horizon [`Inner::read_feed`] reads up to.
    pub(crate) async fn feed_readable(&self) -> StoreResult<Vec<u8>> {
        let horizon = self.held_horizon(wall_micros() - LAG_MICROS).await?;
        let mut c = ((horizon - 1) as u64).to_be_bytes().to_vec();
        c.extend_from_slice(&[0xFF; 10]);
        Ok(c)
    }

    /// A cursor after every entry written before now, not only those
    /// readable now ([`LAG_MICROS`] behind, or more): a client that asks for the end
    /// after a write is not handed that write again. (An entry still
    /// landing, stamped before now by a writer that began before, is
    /// passed over by a reader starting here; so is one stamped by a
    /// node whose clock runs behind by more than the time between.)
    pub(crate) fn feed_end(&self) -> Vec<u8> {
        let mut c = (self.clock.high() as u64).to_be_bytes().to_vec();
        c.extend_from_slice(&[0xFF; 10]);
        c
    }

    /// See [`Snapshot::scan_all`](tarn_store::Snapshot::scan_all): token
    /// order, resumable.
    pub(crate) async fn scan_all(
        &self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<(Vec<(Key, Row)>, Option<Vec<u8>>)> {
        let limit = limit.clamp(1, tarn_store::MAX_READ_ROWS);
        let mut out = Vec::new();
        let token = match cursor {
            None => i64::MIN,
            Some(c) => {
                if c.len() < 8 {
                    return Err(StoreError::Invalid("not a cursor of scan_all".into()));
                }
                let token = i64::from_be_bytes(c[..8].try_into().expect("8 bytes"));
                let key = tarn_store::decode_row_cursor(&c[8..])?;
                // First the rest of the partition it stopped in.
                let rest = self
                    .scan(
                        &Scan::partition(key.table, key.partition.clone(), limit)
                            .bounds(Bound::Excluded(key.clustering.clone()), Bound::Unbounded),
                    )
                    .await?;
                let full = rest.len() == limit;
                let hidden = key.table.name().starts_with(FEED_PREFIX) || key.table.name() == META;
                for r in rest.into_iter().filter(|_| !hidden) {
                    out.push((
                        Key::new(key.table, key.partition.clone(), r.clustering.clone()),
                        r,
                    ));
                }
                if full && !out.is_empty() {
                    let next = [
                        token.to_be_bytes().to_vec(),
                        tarn_store::encode_row_cursor(&out[out.len() - 1].0),
                    ]
                    .concat();
                    return Ok((out, Some(next)));
                }
                token
            }
        };
        let first = cursor.is_none();
        let stmt = if first {
            &self.st.all_from
        } else {
            &self.st.all_after
        };
        let want = limit - out.len();
        let r = self
            .session
            .execute_unpaged(stmt, (token, want.min(i32::MAX as usize) as i32))
            .await
            .map_err(map_exec)?;
        let rows = rows_of(r)?;
        let raw = rows.len();
        let mut last: Option<(i64, Key)> = None;
        for row in rows {
            let cols: Vec<Option<CqlValue>> = row.columns;
            let text = |v: &Option<CqlValue>| match v {
                Some(CqlValue::Text(s)) => Some(s.clone()),
                _ => None,
            };
            let blob = |v: &Option<CqlValue>| match v {
                Some(CqlValue::Blob(b)) => Some(b.clone()),
                _ => None,
            };
            let (Some(tbl), Some(part), Some(clus)) =
                (text(&cols[0]), blob(&cols[1]), blob(&cols[3]))
            else {
                return Err(StoreError::Corrupt(
                    "a row of scan_all without its key".into(),
                ));
            };
            let kind = match &cols[2] {
                Some(CqlValue::TinyInt(k)) => *k,
                _ => KIND_ROW,
            };
            let tok = match &cols[6] {
                Some(CqlValue::BigInt(t)) => *t,
                _ => {
                    return Err(StoreError::Corrupt(
                        "a row of scan_all without its token".into(),
                    ))
                }
            };
            let table = Table::named(&tbl)
                .ok_or_else(|| StoreError::Corrupt(format!("table name {tbl:?}")))?;
            let key = Key::new(table, part, clus.clone());
            last = Some((tok, key.clone()));
            if kind != KIND_ROW || tbl.starts_with(FEED_PREFIX) || tbl == META {
                continue;
            }
            let value = blob(&cols[4]).unwrap_or_default();
            let version = match &cols[5] {
                Some(CqlValue::BigInt(v)) => version_u64(*v),
                _ => 0,
            };
            out.push((
                key,
                Row {
                    clustering: clus,
                    value,
                    version,
                },
            ));
        }
        let next = match last {
            Some((tok, key)) if raw == want => Some(
                [
                    tok.to_be_bytes().to_vec(),
                    tarn_store::encode_row_cursor(&key),
                ]
                .concat(),
            ),
            _ => None,
        };
        Ok((out, next))
    }
}

impl crate::CassandraStore {
    /// Records the store's birth (the first bucket any feed may use). Nodes
    /// starting together race for it: a lightweight transaction that loses
    /// to theirs (`Conflict`) or times out while they contend
    /// (`Unavailable`) is looked at again, a bounded number of times.
    pub(crate) async fn record_birth(&self) -> StoreResult<()> {
        let key = meta_key("born")?;
        let mut attempt = 0u32;
        loop {
            if self.inner.get(&key).await?.is_some() {
                return Ok(());
            }
            let bucket = (wall_micros() - BUCKET_MICROS).div_euclid(BUCKET_MICROS);
            let mut b = Batch::new();
            b.put(key.clone(), bucket.to_be_bytes().to_vec(), 1)
                .guard(key.clone(), Expect::Absent);
            match tarn_store::Store::write(self, b).await {
                Ok(()) | Err(StoreError::GuardFailed { .. }) => return Ok(()),
                Err(e) if e.is_retryable() && attempt < 8 => {
                    attempt += 1;
                    let pause = 50u64 << attempt.min(5);
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes the oldest entries up to `through`, at most `limit`, with one
    /// range deletion per partition; records where the feed now starts.
    pub(crate) async fn trim(
        &self,
        feed: Table,
        through: &[u8],
        limit: usize,
    ) -> StoreResult<usize> {
        cursor_ts(through)?;
        let inner = &self.inner;
        let entries = inner.read_feed(feed, None, limit).await?;
        let gone: Vec<&FeedEntry> = entries
            .iter()
            .filter(|e| e.cursor.as_slice() <= through)
            .collect();
        let Some(last) = gone.last() else {
            return Ok(0);
        };
        let table = feed_table(feed)?;
        let mut parts: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = Default::default();
        for e in &gone {
            let ts = cursor_ts(&e.cursor)?;
            // The entry's shard is its write id's first byte, modulo.
            let p = partition(ts.div_euclid(BUCKET_MICROS), e.cursor[8] % SHARDS);
            let upto = parts.entry(p).or_default();
            if e.cursor > *upto {
                *upto = e.cursor.clone();
            }
        }
        let ts = inner.clock.next();
        futures_util::future::try_join_all(parts.iter().map(|(p, upto)| {
            inner.session.execute_unpaged(
                &inner.st.feed_trim,
                (ts, table.name(), p.as_slice(), upto.as_slice()),
            )
        }))
        .await
        .map_err(map_exec)?;
        let bucket = cursor_ts(&last.cursor)?.div_euclid(BUCKET_MICROS);
        let mut b = Batch::new();
        b.put(
            meta_key(&format!("trimmed:{}", feed.name()))?,
            bucket.to_be_bytes().to_vec(),
            1,
        );
        tarn_store::Store::write(self, b).await?;
        Ok(gone.len())
    }
}
