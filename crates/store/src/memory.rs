//! An in-memory reference store: ordered maps behind one lock, with a
//! version history per row so that snapshots are real snapshots.
//!
//! It exists for tests and as the executable meaning of the contract; the one
//! lock makes it simple and obviously serialisable, and unfit for serving.
//! Old row versions are never collected: a test store lives for one test.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use crate::{
    check_read, Batch, Consistency, Direction, Expect, FeedEntry, Key, Op, ReadResult, Row, Scan,
    Snapshot, Store, StoreError, StoreResult, Table,
};

/// Every version of one row: `(commit number, value and version or deleted)`,
/// oldest first.
type History = Vec<(u64, Option<(Vec<u8>, u64)>)>;
type Partition = BTreeMap<Vec<u8>, History>;

#[derive(Default)]
struct State {
    rows: BTreeMap<(Table, Vec<u8>), Partition>,
    /// Number of the last commit.
    commit: u64,
    /// Feeds: entries by sequence number, each with the commit that
    /// added it.
    feeds: BTreeMap<Table, BTreeMap<u64, (u64, Vec<u8>)>>,
    /// Last sequence number given, per feed.
    sequence: u64,
    /// The last sequence number trimmed away, per feed: a feed's end is
    /// never before it, so a cursor taken at the end of a feed trimmed
    /// empty is not older than what was trimmed.
    trimmed: BTreeMap<Table, u64>,
}

/// Rows in nested ordered maps: `(table, partition) -> clustering -> history`.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<RwLock<State>>,
    split: u32,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::with_split(1)
    }

    /// An empty store that asks its clients to split shared partitions in
    /// `split` buckets (as a distributed backend does), for tests of that
    /// layout.
    pub fn with_split(split: u32) -> MemoryStore {
        MemoryStore {
            state: Arc::default(),
            split: split.max(1),
        }
    }

    /// How many live rows the store holds, over all tables.
    pub fn len(&self) -> usize {
        let s = self.state.read().unwrap();
        s.rows
            .values()
            .flat_map(|p| p.values())
            .filter(|h| h.last().is_some_and(|(_, v)| v.is_some()))
            .count()
    }

    /// Whether the store holds no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn visible(h: &History, at: u64) -> Option<&(Vec<u8>, u64)> {
    h.iter()
        .rev()
        .find(|(c, _)| *c <= at)
        .and_then(|(_, v)| v.as_ref())
}

fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Unbounded => Bound::Unbounded,
        Bound::Included(v) => Bound::Included(v.as_slice()),
        Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
    }
}

/// A snapshot of the memory store: the commit number of its first read.
struct MemorySnapshot {
    state: Arc<RwLock<State>>,
    at: Option<u64>,
}

impl MemorySnapshot {
    fn scan(&self, s: &State, at: u64, scan: &Scan) -> Vec<Row> {
        if scan.limit == 0 || !bounds_nonempty(scan) {
            return Vec::new();
        }
        let Some(part) = s.rows.get(&(scan.table, scan.partition.clone())) else {
            return Vec::new();
        };
        let range = part.range::<[u8], _>((bound_ref(&scan.lower), bound_ref(&scan.upper)));
        let to_row = |(k, h): (&Vec<u8>, &History)| {
            visible(h, at).map(|(v, ver)| Row {
                clustering: k.clone(),
                value: v.clone(),
                version: *ver,
            })
        };
        match scan.direction {
            Direction::Forward => range.filter_map(to_row).take(scan.limit).collect(),
            Direction::Reverse => range.rev().filter_map(to_row).take(scan.limit).collect(),
        }
    }
}

#[async_trait::async_trait]
impl Snapshot for MemorySnapshot {
    async fn read(&mut self, gets: &[Key], scans: &[Scan]) -> StoreResult<ReadResult> {
        check_read(gets, scans)?;
        let s = self.state.read().unwrap();
        let at = *self.at.get_or_insert(s.commit);
        let rows = gets
            .iter()
            .map(|k| {
                s.rows
                    .get(&(k.table, k.partition.clone()))
                    .and_then(|p| p.get(&k.clustering))
                    .and_then(|h| visible(h, at))
                    .map(|(v, ver)| Row {
                        clustering: k.clustering.clone(),
                        value: v.clone(),
                        version: *ver,
                    })
            })
            .collect();
        let scans = scans.iter().map(|sc| self.scan(&s, at, sc)).collect();
        Ok(ReadResult { rows, scans })
    }

    async fn read_feed(
        &mut self,
        feed: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<Vec<FeedEntry>> {
        let s = self.state.read().unwrap();
        let at = *self.at.get_or_insert(s.commit);
        let from = match after {
            None => 0,
            Some(c) => cursor_seq(c)? + 1,
        };
        let Some(entries) = s.feeds.get(&feed) else {
            return Ok(Vec::new());
        };
        Ok(entries
            .range(from..)
            .filter(|(_, (commit, _))| *commit <= at)
            .take(limit)
            .map(|(seq, (_, v))| FeedEntry {
                cursor: seq.to_be_bytes().to_vec(),
                value: v.clone(),
            })
            .collect())
    }

    async fn scan_all(
        &mut self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<(Vec<(Key, Row)>, Option<Vec<u8>>)> {
        let s = self.state.read().unwrap();
        let at = *self.at.get_or_insert(s.commit);
        let after = cursor.map(crate::decode_row_cursor).transpose()?;
        let mut out = Vec::new();
        for ((table, part), rows) in &s.rows {
            for (clus, h) in rows {
                let key = Key::new(*table, part.clone(), clus.clone());
                if after.as_ref().is_some_and(|a| key <= *a) {
                    continue;
                }
                if let Some((v, ver)) = visible(h, at) {
                    out.push((
                        key,
                        Row {
                            clustering: clus.clone(),
                            value: v.clone(),
                            version: *ver,
                        },
                    ));
                    if out.len() == limit {
                        let next = crate::encode_row_cursor(&out[limit - 1].0);
                        return Ok((out, Some(next)));
                    }
                }
            }
        }
        Ok((out, None))
    }

    async fn feed_end(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        let s = self.state.read().unwrap();
        let at = *self.at.get_or_insert(s.commit);
        let last = s
            .feeds
            .get(&feed)
            .and_then(|f| f.iter().rev().find(|(_, (c, _))| *c <= at).map(|(q, _)| *q))
            .unwrap_or(0)
            .max(s.trimmed.get(&feed).copied().unwrap_or(0));
        Ok(last.to_be_bytes().to_vec())
    }

    /// The feed does not lag: readable through its end.
    async fn feed_readable(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        self.feed_end(feed).await
    }
}

fn cursor_seq(c: &[u8]) -> StoreResult<u64> {
    c.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Invalid("not a cursor of this feed".into()))
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>> {
        Ok(Box::new(MemorySnapshot {
            state: self.state.clone(),
            at: None,
        }))
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        batch.validate()?;
        let mut s = self.state.write().unwrap();
        let now = s.commit;
        for (i, g) in batch.guards.iter().enumerate() {
            let current = s
                .rows
                .get(&(g.key.table, g.key.partition.clone()))
                .and_then(|p| p.get(&g.key.clustering))
                .and_then(|h| visible(h, now))
                .map(|(_, v)| *v);
            let holds = match (g.expect, current) {
                (Expect::Absent, None) => true,
                (Expect::Version(want), Some(have)) => want == have,
                _ => false,
            };
            if !holds {
                return Err(StoreError::GuardFailed { guard: i });
            }
        }
        if batch.ops.is_empty() && batch.appends.is_empty() {
            return Ok(());
        }
        let commit = now + 1;
        s.commit = commit;
        for a in batch.appends {
            s.sequence += 1;
            let seq = s.sequence;
            s.feeds
                .entry(a.feed)
                .or_default()
                .insert(seq, (commit, a.value));
        }
        for op in batch.ops {
            let (key, new) = match op {
                Op::Put {
                    key,
                    value,
                    version,
                } => (key, Some((value, version))),
                Op::Delete { key } => (key, None),
            };
            let h = s
                .rows
                .entry((key.table, key.partition))
                .or_default()
                .entry(key.clustering)
                .or_default();
            // A later op of the same batch on the same row replaces the
            // earlier one: one version per row and commit.
            if h.last().is_some_and(|(c, _)| *c == commit) {
                h.pop();
            }
            h.push((commit, new));
        }
        Ok(())
    }

    fn consistency(&self) -> Consistency {
        Consistency::Snapshot
    }

    fn feed_lag(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    fn connections(&self) -> Option<usize> {
        None
    }

    async fn trim_feed(&self, feed: Table, through: &[u8], limit: usize) -> StoreResult<usize> {
        let through = cursor_seq(through)?;
        let mut s = self.state.write().unwrap();
        let Some(entries) = s.feeds.get_mut(&feed) else {
            return Ok(0);
        };
        let gone: Vec<u64> = entries
            .range(..=through)
            .take(limit)
            .map(|(q, _)| *q)
            .collect();
        for q in &gone {
            entries.remove(q);
        }
        if let Some(last) = gone.last() {
            let mark = s.trimmed.entry(feed).or_default();
            *mark = (*mark).max(*last);
        }
        Ok(gone.len())
    }

    fn partition_split(&self) -> u32 {
        self.split
    }
}

/// Whether the bounds can hold any key at all; `BTreeMap::range` panics on
/// inverted bounds, and every backend must answer them with nothing.
pub(crate) fn bounds_nonempty(scan: &Scan) -> bool {
    match (&scan.lower, &scan.upper) {
        (Bound::Included(l), Bound::Included(u)) => l <= u,
        (Bound::Included(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u))
        | (Bound::Excluded(l), Bound::Excluded(u)) => l < u,
        _ => true,
    }
}
