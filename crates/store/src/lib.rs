//! The storage contract: the only way Tarn's engine touches data.
//!
//! Everything Tarn keeps — items, ACLs, index rows, groups, sessions, bodies —
//! is written by the engine as rows of this contract, so every backend only has
//! to provide this small set of operations, and one conformance suite
//! ([`conformance`], feature `conformance`) proves that each backend does.
//!
//! # Data model
//!
//! A row is addressed by `(table, partition, clustering)`: a [`Table`] name and
//! two byte strings. It holds a value (bytes) and a version (`u64`, chosen by
//! the writer). Rows of one partition are ordered by their clustering key,
//! compared as plain bytes (`memcmp`, a shorter key before any longer key it
//! is a prefix of). Both keys are 1 to [`MAX_KEY_LEN`] bytes, never empty. Rows of different partitions have no
//! order relative to each other: nothing in the contract reads across
//! partitions.
//!
//! # Operations
//!
//! - [`Store::snapshot`]: opens a read [`Snapshot`]; every read goes
//!   through one. [`Snapshot::read`] takes point reads and ordered scans of
//!   single partitions (between two clustering bounds, forward or reverse,
//!   with a limit) together, as one round trip.
//! - [`Store::write`]: an atomic [`Batch`] of puts and deletes over any tables
//!   and partitions, optionally guarded by conditions on rows of **one**
//!   partition. A failed guard applies nothing and names the guard.
//! - Feeds: a batch may [`Batch::append`] entries to a feed (a log named by
//!   a table), atomically with its changes; the store gives each entry a
//!   cursor when it commits. [`Snapshot::read_feed`] reads a feed in cursor
//!   order from a cursor, never passing over an entry a later commit could
//!   still add before it; [`Store::trim_feed`] removes the oldest entries.
//!   The change feed, live events, export and re-indexing all read it.
//!
//! An engine operation opens one snapshot, reads everything it needs
//! through it (as few calls as its data dependencies allow), drops it, and
//! ends in at most one write guarded on what it read. So "how many round
//! trips does this request make" is answered by reading one function.
//!
//! # How each backend maps the contract
//!
//! | contract | SQLite | PostgreSQL | Cassandra |
//! | --- | --- | --- | --- |
//! | row | `rows(tbl, part BLOB, clus BLOB, value, version, big)`, primary key `(tbl, part, clus)`, `WITHOUT ROWID`; a value that would spill onto overflow pages lives in `big(id INTEGER PRIMARY KEY, value)` instead, so no b-tree descent reads it | one table, primary key `(tbl, part bytea, clus bytea)` (bytea compares bytewise) | one table, `PRIMARY KEY ((tbl, part), kind, clus)`: contract rows are `kind = 0`, intents `kind = 1`, so no key is reserved; `blob` clustering columns compare bytewise |
//! | snapshot | a read connection checked out of a pool, one read transaction (WAL: sees the state of its first read), every call run on the calling thread — no hand-off | one `REPEATABLE READ READ ONLY` transaction on one pooled connection; the reads of a call are pipelined | no snapshot ([`Consistency::PerRead`]): every read at QUORUM, the reads of a call sent at once |
//! | point read | `SELECT … WHERE tbl=? AND part=? AND clus=?` | the same, prepared | `SELECT … WHERE tbl=? AND part=? AND kind=0 AND clus=?` |
//! | scan | `… AND clus >[=] ? AND clus <[=] ? ORDER BY clus ASC/DESC LIMIT ?` | the same | the same CQL: clustering slices with `ORDER BY` and `LIMIT` are native |
//! | `write` without guards | one transaction (group commit: one fsync for every write queued meanwhile) | one transaction | one logged batch, every statement at one client timestamp (split only above a size limit) |
//! | `write` with guards | every guard checked before any op, in the group commit's one transaction; a write that fails after changing rows makes the group run again with a `SAVEPOINT` per write | `SELECT … FOR UPDATE` on the guarded rows, then the ops, in one transaction; serialization failures map to [`StoreError::Conflict`] | a conditional (LWT) batch on the guarded partition, carrying the rest of the batch as an intent row, then the rest (one unlogged batch per partition, at the intent's timestamp) and the intent's removal; a sweeper rolls forward the intents of writers that died in between |
//! | feed | `feed(tbl, seq)` (large entries in `big`, as large values): the single writer numbers entries as it commits them, so cursors are commit order | `tarn_feed(tbl, xid, seq)`: the writing transaction's id and a sequence; read only below the oldest transaction still running in this database, so a transaction that started first and commits last is never passed over | time-bucketed, sharded partitions, merged and read up to a small lag behind now |
//!
//! Guards are restricted to one partition because that is the largest unit
//! Cassandra can update conditionally; keys are never empty because
//! Cassandra cannot store an empty partition key. The contract never asks a
//! backend for more than every backend can give.

#![warn(missing_docs)]

mod counting;
pub mod memory;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use counting::{CountingStore, ReadCounts};

use std::ops::Bound;
use std::sync::Arc;

/// Largest partition or clustering key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// Largest value accepted, in bytes. The engine stores bodies in chunks well
/// below this.
pub const MAX_VALUE_LEN: usize = 4 * 1024 * 1024;

/// The name of a logical table: lower-case ASCII letters, digits and `_`,
/// 1 to 32 characters. Backends may turn it into a physical table name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Table(&'static str);

impl Table {
    /// A table name; panics (at compile time in a `const`) on an invalid name.
    pub const fn new(name: &'static str) -> Table {
        let b = name.as_bytes();
        assert!(!b.is_empty() && b.len() <= 32, "table name length");
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            assert!(
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_',
                "table name characters"
            );
            i += 1;
        }
        Table(name)
    }

    /// The table's name.
    pub const fn name(self) -> &'static str {
        self.0
    }

    /// A table by a name known only at run time (read back from a store
    /// or a cursor): valid names only; each distinct name is kept for the
    /// process's lifetime, and there are few.
    pub fn named(name: &str) -> Option<Table> {
        use std::collections::BTreeMap;
        use std::sync::Mutex;
        static NAMES: Mutex<BTreeMap<String, &'static str>> = Mutex::new(BTreeMap::new());
        let b = name.as_bytes();
        let valid = !b.is_empty()
            && b.len() <= 32
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_');
        if !valid {
            return None;
        }
        let mut names = NAMES.lock().expect("table names");
        let s = *names
            .entry(name.to_string())
            .or_insert_with(|| Box::leak(name.to_string().into_boxed_str()));
        Some(Table(s))
    }
}

/// The address of one row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The logical table.
    pub table: Table,
    /// The partition key.
    pub partition: Vec<u8>,
    /// The clustering key: orders rows within the partition.
    pub clustering: Vec<u8>,
}

impl Key {
    /// A key from its three parts.
    pub fn new(table: Table, partition: impl Into<Vec<u8>>, clustering: impl Into<Vec<u8>>) -> Key {
        Key {
            table,
            partition: partition.into(),
            clustering: clustering.into(),
        }
    }
}

/// One row as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The row's clustering key (its table and partition are the caller's).
    pub clustering: Vec<u8>,
    /// The stored bytes.
    pub value: Vec<u8>,
    /// The version its last writer gave it.
    pub version: u64,
}

/// The direction of a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Ascending clustering keys.
    Forward,
    /// Descending clustering keys.
    Reverse,
}

/// An ordered read of one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// The table.
    pub table: Table,
    /// The partition to read.
    pub partition: Vec<u8>,
    /// The lower clustering bound, whatever the direction.
    pub lower: Bound<Vec<u8>>,
    /// The upper clustering bound, whatever the direction.
    pub upper: Bound<Vec<u8>>,
    /// `Forward` starts at `lower`, `Reverse` at `upper`.
    pub direction: Direction,
    /// The most rows to return.
    pub limit: usize,
}

impl Scan {
    /// A scan of the whole partition, forward, with a limit.
    pub fn partition(table: Table, partition: impl Into<Vec<u8>>, limit: usize) -> Scan {
        Scan {
            table,
            partition: partition.into(),
            lower: Bound::Unbounded,
            upper: Bound::Unbounded,
            direction: Direction::Forward,
            limit,
        }
    }

    /// This scan with another direction.
    pub fn direction(mut self, direction: Direction) -> Scan {
        self.direction = direction;
        self
    }

    /// This scan with other bounds.
    pub fn bounds(mut self, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>) -> Scan {
        self.lower = lower;
        self.upper = upper;
        self
    }

    /// Whether `clustering` lies within the bounds.
    pub fn contains(&self, clustering: &[u8]) -> bool {
        let above = match &self.lower {
            Bound::Unbounded => true,
            Bound::Included(l) => clustering >= l.as_slice(),
            Bound::Excluded(l) => clustering > l.as_slice(),
        };
        let below = match &self.upper {
            Bound::Unbounded => true,
            Bound::Included(u) => clustering <= u.as_slice(),
            Bound::Excluded(u) => clustering < u.as_slice(),
        };
        above && below
    }
}

/// One change of a [`Batch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create or replace the row.
    Put {
        /// The row.
        key: Key,
        /// Its new value.
        value: Vec<u8>,
        /// Its new version.
        version: u64,
    },
    /// Remove the row; removing an absent row is not an error.
    Delete {
        /// The row.
        key: Key,
    },
}

impl Op {
    /// The row this op changes.
    pub fn key(&self) -> &Key {
        match self {
            Op::Put { key, .. } | Op::Delete { key } => key,
        }
    }
}

/// What a [`Guard`] expects of its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The row does not exist.
    Absent,
    /// The row exists with exactly this version.
    Version(u64),
}

/// A condition a [`Batch`] needs to hold before it applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    /// The row checked.
    pub key: Key,
    /// What it must be.
    pub expect: Expect,
}

/// An entry to add to a feed (see [`Snapshot::read_feed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Append {
    /// The feed.
    pub feed: Table,
    /// The entry.
    pub value: Vec<u8>,
}

/// A set of changes applied all or nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Changes, applied in order: a later op on the same row wins.
    pub ops: Vec<Op>,
    /// Conditions, all on rows of one partition of one table.
    pub guards: Vec<Guard>,
    /// Feed entries added with the changes, in this order.
    pub appends: Vec<Append>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds a put.
    pub fn put(&mut self, key: Key, value: Vec<u8>, version: u64) -> &mut Batch {
        self.ops.push(Op::Put {
            key,
            value,
            version,
        });
        self
    }

    /// Adds a delete.
    pub fn delete(&mut self, key: Key) -> &mut Batch {
        self.ops.push(Op::Delete { key });
        self
    }

    /// Adds a guard.
    pub fn guard(&mut self, key: Key, expect: Expect) -> &mut Batch {
        self.guards.push(Guard { key, expect });
        self
    }

    /// Adds a feed entry.
    pub fn append(&mut self, feed: Table, value: Vec<u8>) -> &mut Batch {
        self.appends.push(Append { feed, value });
        self
    }

    /// Whether the batch has no ops, no guards and no appends.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.guards.is_empty() && self.appends.is_empty()
    }

    /// Checks the limits every backend enforces: key and value sizes, and all
    /// guards on one partition. Backends call this before touching data.
    pub fn validate(&self) -> Result<(), StoreError> {
        for op in &self.ops {
            check_key(op.key())?;
            if let Op::Put { value, .. } = op {
                if value.len() > MAX_VALUE_LEN {
                    return Err(StoreError::Invalid(format!(
                        "value of {} bytes exceeds {MAX_VALUE_LEN}",
                        value.len()
                    )));
                }
            }
        }
        for a in &self.appends {
            if a.value.len() > MAX_VALUE_LEN {
                return Err(StoreError::Invalid(format!(
                    "feed entry of {} bytes exceeds {MAX_VALUE_LEN}",
                    a.value.len()
                )));
            }
        }
        if let Some(first) = self.guards.first() {
            for g in &self.guards {
                check_key(&g.key)?;
                if g.key.table != first.key.table || g.key.partition != first.key.partition {
                    return Err(StoreError::Invalid(
                        "all guards of a batch must be on one partition".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Checks a row key: neither part empty (a distributed backend cannot
/// store an empty partition key, and the contract asks no backend for what
/// one cannot give), neither longer than [`MAX_KEY_LEN`].
pub fn check_key(key: &Key) -> Result<(), StoreError> {
    check_partition(&key.partition)?;
    if key.clustering.is_empty() || key.clustering.len() > MAX_KEY_LEN {
        return Err(StoreError::Invalid(format!(
            "a clustering key has 1 to {MAX_KEY_LEN} bytes"
        )));
    }
    Ok(())
}

/// Checks a partition key: 1 to [`MAX_KEY_LEN`] bytes.
pub fn check_partition(partition: &[u8]) -> Result<(), StoreError> {
    if partition.is_empty() || partition.len() > MAX_KEY_LEN {
        return Err(StoreError::Invalid(format!(
            "a partition key has 1 to {MAX_KEY_LEN} bytes"
        )));
    }
    Ok(())
}

/// What can go wrong in a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another transaction got in the way; retrying the whole operation may
    /// succeed.
    #[error("conflict with a concurrent transaction: {0}")]
    Conflict(String),
    /// The store cannot be reached or cannot serve now; retrying later may
    /// succeed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The guard at this index of [`Batch::guards`] did not hold; nothing was
    /// applied.
    #[error("guard {guard} of the batch did not hold")]
    GuardFailed {
        /// Index into [`Batch::guards`].
        guard: usize,
    },
    /// Stored data is damaged.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// The request breaks the contract (sizes, guards on several partitions).
    #[error("invalid store request: {0}")]
    Invalid(String),
    /// Anything else.
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// Whether retrying the whole operation may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Conflict(_) | StoreError::Unavailable(_))
    }
}

/// Result of store operations.
pub type StoreResult<T> = Result<T, StoreError>;

/// Most point reads in one [`Snapshot::read`] call.
pub const MAX_READ_KEYS: usize = 4096;
/// Most rows one [`Snapshot::read`] call may ask for: the sum of its scans'
/// limits. Together with [`MAX_READ_KEYS`] this bounds the work of one call,
/// which on the embedded store runs on the calling thread (about 1–3 ms of
/// one core at the bound).
pub const MAX_READ_ROWS: usize = 16_384;

/// What a backend's snapshots guarantee.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Every read of one snapshot sees the same committed state: the state as
    /// of the snapshot's first read (SQLite: one read transaction;
    /// PostgreSQL: one `REPEATABLE READ` read-only transaction; memory).
    Snapshot,
    /// Each read sees every write acknowledged before that read started, but
    /// two reads of one snapshot may see different states (Cassandra at
    /// QUORUM). The engine orders its reads so that this is enough.
    PerRead,
}

/// The storage contract. Every method is safe to call concurrently from many
/// tasks; implementations keep no lock across calls that callers could see.
///
/// Visibility: once [`Store::write`] returns `Ok`, every snapshot opened
/// afterwards on any handle of the same store (any node, for shared
/// backends) sees the write. A read never sees part of a batch.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Opens a read snapshot: the one way to read. An engine operation opens
    /// one, does every read of the request through it, and drops it before
    /// it writes. What it guarantees is [`Store::consistency`]. A snapshot
    /// holds backend resources (a connection): keep it for one request.
    ///
    /// Fails with [`StoreError::Unavailable`] when the backend is saturated
    /// (every connection busy for longer than a short wait): overload is
    /// answered, not queued.
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>>;

    /// Applies the batch atomically: all of it or none of it, and only if
    /// every guard holds at the moment of applying. Returns `Ok` only once the
    /// batch is durable. A failed guard returns
    /// [`StoreError::GuardFailed`] with the index of the first failing guard
    /// and changes nothing. Concurrent writes are serialisable: of N batches
    /// guarded on the same row version, at most one succeeds.
    ///
    /// Fails with [`StoreError::Unavailable`] at once when the backend's
    /// write queue is full.
    async fn write(&self, batch: Batch) -> StoreResult<()>;

    /// What this backend's snapshots guarantee.
    fn consistency(&self) -> Consistency;

    /// The least time after its write an entry takes to become readable
    /// by [`Snapshot::read_feed`] (zero: at once). It may take longer: a
    /// backend may hold back the entries after an older write still
    /// landing, so that it is not passed over (Cassandra does, for a
    /// bounded time); [`Snapshot::feed_readable`] says how far the feed is
    /// readable now. No default: a wrapper that
    /// forgot to forward it would make a lagging feed look immediate.
    fn feed_lag(&self) -> std::time::Duration;

    /// How many calls this handle serves at once, when that is bounded
    /// (a pool's connections; `None`: no bound worth sharing out).
    /// Index builds and drops keep to half of them, so that requests keep
    /// the rest. No default: a wrapper that forgot to
    /// forward it would let a build take every connection.
    fn connections(&self) -> Option<usize>;

    /// Removes at most `limit` of the oldest entries of `feed`, none after
    /// the cursor `through`; answers how many it removed (fewer than
    /// `limit`: none is left up to `through`).
    async fn trim_feed(&self, feed: Table, through: &[u8], limit: usize) -> StoreResult<usize>;

    /// Into how many buckets a client should split a partition that every
    /// reader shares (1: partitions may grow large; a distributed backend
    /// answers more). A layout choice, made once when a store is created.
    fn partition_split(&self) -> u32 {
        1
    }

    /// The node stops: called once, as its requests end (a request that
    /// outlived the grace may still write). A backend lets go of what it
    /// holds for other nodes: Cassandra refuses writes with feed entries
    /// from then (`Unavailable`), waits a few seconds for those in flight
    /// to land, and removes its feed mark, which the other nodes' feeds
    /// would otherwise wait out. Nothing by default.
    async fn stop(&self) {}

    /// The backend's own counters, for metrics (`name`, value): commits,
    /// fsyncs, queue refusals, ... Names are lower-case with `_`.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// A read view of the store (see [`Store::snapshot`]).
///
/// Every call is one round trip to the backend at most: its point reads and
/// scans are independent of each other and a backend may run them together.
/// Calls over [`MAX_READ_KEYS`] keys or [`MAX_READ_ROWS`] rows are refused
/// with [`StoreError::Invalid`].
#[async_trait::async_trait]
pub trait Snapshot: Send {
    /// Reads `gets` (answers in their order, `None` for an absent row) and
    /// runs `scans` (answers in their order; each returns at most `limit`
    /// rows of one partition whose clustering keys lie within the bounds, in
    /// ascending byte order for `Forward`, starting at the lower bound, or
    /// descending for `Reverse`, starting at the upper bound).
    async fn read(&mut self, gets: &[Key], scans: &[Scan]) -> StoreResult<ReadResult>;

    /// At most `limit` entries of `feed` whose cursors come after `after`
    /// (from the first entry when `None`), in cursor order.
    ///
    /// Only entries that no write can still precede are returned: an entry
    /// whose write commits later never gets a cursor below one already
    /// returned (to any reader, on any node). So a reader that remembers
    /// the last cursor it read and polls from it never misses an entry,
    /// whatever order transactions commit in. Writes that touch a common
    /// row have their entries in commit order; entries of independent
    /// concurrent writes are in some serial order of them.
    async fn read_feed(
        &mut self,
        feed: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<Vec<FeedEntry>>;

    /// At most `limit` rows of every table, in an order of the backend's,
    /// after the opaque `cursor` of a previous call (from the first row
    /// when `None`); answers the rows with their keys and the cursor to go
    /// on from (`None`: no row is left). Feeds are not included. For
    /// moving whole stores in bounded batches (export); never on a
    /// request's path.
    async fn scan_all(
        &mut self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<(Vec<(Key, Row)>, Option<Vec<u8>>)>;

    /// A cursor at the current end of `feed`: every entry
    /// [`Snapshot::read_feed`] could return now comes at or before it,
    /// and every later one after it. Never before an entry trimmed away
    /// ([`Store::trim_feed`]), also when trimming left the feed empty.
    async fn feed_end(&mut self, feed: Table) -> StoreResult<Vec<u8>>;

    /// A cursor through which `feed` is readable now: every entry at or
    /// before it that [`Snapshot::read_feed`] will ever return, it returns
    /// now, and later entries come after it. At [`Snapshot::feed_end`] on a
    /// backend whose feed does not lag ([`Store::feed_lag`] zero); on one
    /// that lags, a caller that took the end waits until this reaches it
    /// to read every entry written before. (On Cassandra, as far as its
    /// clocks allow: see its crate's documentation.) No default: a wrapper
    /// that forgot to forward it would make a lagging feed look caught up.
    async fn feed_readable(&mut self, feed: Table) -> StoreResult<Vec<u8>>;
}

/// One entry of a feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedEntry {
    /// Where the entry is: opaque, ordered bytewise, never empty.
    pub cursor: Vec<u8>,
    /// The entry as appended.
    pub value: Vec<u8>,
}

/// The answers of one [`Snapshot::read`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadResult {
    /// One answer per key asked for, in order.
    pub rows: Vec<Option<Row>>,
    /// One answer per scan asked for, in order.
    pub scans: Vec<Vec<Row>>,
}

/// Conveniences over [`Snapshot::read`]; each is one call.
#[async_trait::async_trait]
pub trait SnapshotExt: Snapshot {
    /// One point read.
    async fn get(&mut self, key: &Key) -> StoreResult<Option<Row>> {
        let mut r = self.read(std::slice::from_ref(key), &[]).await?;
        Ok(r.rows.pop().flatten())
    }

    /// Several point reads.
    async fn get_many(&mut self, keys: &[Key]) -> StoreResult<Vec<Option<Row>>> {
        Ok(self.read(keys, &[]).await?.rows)
    }

    /// One scan.
    async fn scan(&mut self, scan: &Scan) -> StoreResult<Vec<Row>> {
        let mut r = self.read(&[], std::slice::from_ref(scan)).await?;
        Ok(r.scans.pop().unwrap_or_default())
    }

    /// Several scans.
    async fn scan_many(&mut self, scans: &[Scan]) -> StoreResult<Vec<Vec<Row>>> {
        Ok(self.read(&[], scans).await?.scans)
    }
}

impl<T: Snapshot + ?Sized> SnapshotExt for T {}

/// A resumable position of [`Snapshot::scan_all`] for backends that order
/// rows by key: the key, length-prefixed.
pub fn encode_row_cursor(key: &Key) -> Vec<u8> {
    let mut c = Vec::with_capacity(key.partition.len() + key.clustering.len() + 48);
    for part in [key.table.name().as_bytes(), &key.partition, &key.clustering] {
        c.extend_from_slice(&(part.len() as u32).to_be_bytes());
        c.extend_from_slice(part);
    }
    c
}

/// The key of an [`encode_row_cursor`] cursor.
pub fn decode_row_cursor(c: &[u8]) -> StoreResult<Key> {
    let bad = || StoreError::Invalid("not a cursor of scan_all".into());
    let mut parts = Vec::new();
    let mut rest = c;
    for _ in 0..3 {
        let n = u32::from_be_bytes(rest.get(..4).ok_or_else(bad)?.try_into().expect("4")) as usize;
        parts.push(rest.get(4..4 + n).ok_or_else(bad)?.to_vec());
        rest = &rest[4 + n..];
    }
    let name = String::from_utf8(parts.remove(0)).map_err(|_| bad())?;
    // Table names are 'static; a cursor names a table this process knows
    // only by its text, so it is leaked once per distinct name (a handful).
    let table = Table::named(&name).ok_or_else(bad)?;
    Ok(Key::new(table, parts.remove(0), parts.remove(0)))
}

/// Checks a read call against the contract's bounds; backends call this
/// before touching data.
pub fn check_read(gets: &[Key], scans: &[Scan]) -> StoreResult<()> {
    if gets.len() > MAX_READ_KEYS {
        return Err(StoreError::Invalid(format!(
            "{} point reads in one call; at most {MAX_READ_KEYS}",
            gets.len()
        )));
    }
    let rows = scans.iter().fold(0usize, |n, s| n.saturating_add(s.limit));
    if rows > MAX_READ_ROWS {
        return Err(StoreError::Invalid(format!(
            "scans asking for {rows} rows in one call; at most {MAX_READ_ROWS}"
        )));
    }
    for k in gets {
        check_key(k)?;
    }
    for s in scans {
        check_partition(&s.partition)?;
    }
    Ok(())
}

#[async_trait::async_trait]
impl<S: Store + ?Sized> Store for Arc<S> {
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>> {
        (**self).snapshot().await
    }
    async fn write(&self, batch: Batch) -> StoreResult<()> {
        (**self).write(batch).await
    }
    fn consistency(&self) -> Consistency {
        (**self).consistency()
    }
    fn feed_lag(&self) -> std::time::Duration {
        (**self).feed_lag()
    }
    fn connections(&self) -> Option<usize> {
        (**self).connections()
    }
    async fn trim_feed(&self, feed: Table, through: &[u8], limit: usize) -> StoreResult<usize> {
        (**self).trim_feed(feed, through, limit).await
    }
    fn partition_split(&self) -> u32 {
        (**self).partition_split()
    }
    async fn stop(&self) {
        (**self).stop().await
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        (**self).counters()
    }
}
