//! `CassandraStore`: Tarn's store contract on Apache Cassandra 5, through the
//! `scylla` driver, for pools larger than one database machine.
//!
//! # Layout
//!
//! One CQL table holds every contract table:
//!
//! ```text
//! rows (tbl text, part blob, kind tinyint, clus blob, value blob, version bigint, intent_at bigint,
//!       PRIMARY KEY ((tbl, part), kind, clus))
//! ```
//!
//! A contract partition `(table, partition)` is one Cassandra partition, so
//! contract tables are data, not schema, and no DDL ever runs after start.
//! Contract rows have `kind = 0` and are ordered by `clus`, a `blob`, which
//! Cassandra compares bytewise exactly as the contract orders clustering
//! keys. `kind = 1` rows are *intents* (below): they sort after every
//! contract row of their partition and every read names `kind = 0`, so no
//! clustering key is reserved and readers never see an intent. Versions are
//! stored as `bigint` bit for bit (`u64` ↔ `i64`). A storage-attached index
//! on `intent_at` (set on intents only, so the index stays tiny) lets the
//! roll-forward find intents without scanning the table.
//!
//! # Operations
//!
//! Statements are prepared once; the driver routes each to a replica of its
//! partition (token-aware). Reads and writes run at `QUORUM`, lightweight
//! transactions at `SERIAL`.
//!
//! - **Snapshots** are [`Consistency::PerRead`]: there is no snapshot. One
//!   [`Snapshot::read`] sends all its point reads and scans at once (at
//!   most [`CassandraOptions::read_concurrency`] in flight), each at
//!   `QUORUM`. A scan is one clustering slice, `ORDER BY … ASC|DESC LIMIT n`,
//!   with `>=`/`>`/`<=`/`<` or no bound on either side.
//! - **A write without guards** is one logged batch at `QUORUM`, every
//!   statement carrying one client timestamp; ops are deduplicated first
//!   (the last op on a key wins; Cassandra would otherwise resolve two
//!   writes of one cell at one timestamp by comparing values). A batch
//!   larger than [`CassandraOptions::max_batch_bytes`] is split into several
//!   logged batches, sent together: each is atomic, the whole is not (a
//!   crash in between leaves some pieces applied). The engine's largest
//!   batches (1 MiB of body chunks) are far below the default limit. A batch
//!   on one partition skips the batchlog (Cassandra does so by itself).
//! - **A write with guards** on partition P:
//!   1. one conditional batch (a Paxos lightweight transaction) on P checks
//!      every guard (`IF version = ?`, `IF version = null` for absent) and
//!      applies the ops that fall in P, plus an intent row in P under a
//!      fresh random 16-byte write id holding the ops on other partitions
//!      and the timestamp they will be written at;
//!   2. those ops are applied at that timestamp, one unlogged batch per
//!      partition (atomic and isolated within it), all at once at `QUORUM`;
//!      then the intent is deleted. `write` returns `Ok` after both.
//!
//!   Step 2 needs no batchlog: the intent, committed by Paxos on a quorum,
//!   already guarantees that the ops get applied, so a logged batch would
//!   only add a round trip and, when a node dies, ten to twenty seconds of
//!   `BATCH_LOG` timeouts until the others mark it down.
//!
//!   A failed condition applies nothing; the `[applied]` answer carries the
//!   current versions of the guarded rows, from which the first failing
//!   guard's index is computed ([`StoreError::GuardFailed`]). An outcome the
//!   driver cannot know (a `WriteTimeout` of type CAS, a broken connection
//!   or a client-side timeout after sending, `Unavailable` mid-Paxos) is
//!   resolved by a `SERIAL` read of the intent row: present means applied
//!   (go on with step 2), absent means not applied — a `SERIAL` read
//!   finishes or supersedes any proposal in flight, so the lost attempt can
//!   no longer be applied later. If that read fails too, the answer is
//!   [`StoreError::Unavailable`]; a CAS timeout resolved as not applied is
//!   [`StoreError::Conflict`] (it is how Cassandra reports contention).
//!   Nothing is ever guessed.
//! - **Roll-forward.** If the writer dies (or step 2 keeps failing) between
//!   the steps, the intent stays in P. Every store runs a sweeper
//!   ([`CassandraOptions::sweep_interval`]) that finds intents older than
//!   [`CassandraOptions::intent_grace`] through the index, in pages of 64,
//!   and completes each exactly as step 2 does: the writer's values at the
//!   writer's timestamp, so completing twice, or after later writes of the
//!   same rows, changes nothing (later writes carry later timestamps and
//!   win), then deletes the intent at a timestamp above the intent's own.
//!   [`CassandraStore::roll_forward`] runs one sweep. Readers of P do not
//!   complete intents themselves: noticing one would cost every read of
//!   every partition a second query, and the window it would close is
//!   already bounded by `intent_grace` plus one sweep.
//! - **Retries.** Every write outside the transaction carries an explicit
//!   timestamp, so sending it twice is sending it once: timeouts,
//!   unavailability and broken connections are retried with backoff for
//!   up to [`CassandraOptions::write_retry_window`] (long enough to ride
//!   out the failure detector after a node dies). Reads are retried once
//!   on another replica by the driver. The transaction is never resent.
//!
//! # What Cassandra guarantees under this mapping
//!
//! - **Guards are linearizable.** Every guarded write is a Paxos round on
//!   its partition: of N batches guarded on one version of a row, at most
//!   one applies; a guard sees every write acknowledged before it.
//! - **All or nothing, eventually.** A batch without guards is applied
//!   entirely or not at all by the batchlog (within
//!   [`CassandraOptions::max_batch_bytes`]). A guarded batch whose
//!   transaction applied is completed by its writer or by the roll-forward,
//!   never half-applied forever; one whose guard failed, or whose
//!   transaction was resolved as not applied, applies nothing.
//! - **Visibility.** Once `write` returns `Ok`, every later `QUORUM` read
//!   from any process sees the whole batch.
//! - **No snapshot isolation, no isolation across partitions.** Two reads
//!   of one snapshot may see different states. A reader may see one
//!   partition of a multi-partition batch before another: while a logged
//!   batch is being applied, and, for a guarded batch, between its two
//!   steps — a guarded partition may briefly be ahead of its other
//!   partitions (for up to `intent_grace` plus one sweep if the writer
//!   crashed in between). Within one partition a batch is isolated.
//! - **Last write wins by timestamp.** Writes to other partitions carry the
//!   writing process's clock (made monotonic per store); the guarded
//!   partition's ops carry the Paxos ballot's. Ordering between writers of
//!   one row therefore assumes the clocks of clients and nodes are
//!   synchronised (NTP), as every Cassandra deployment does; guards are not
//!   affected.
//! - **What a crash leaves.** A writer dying after step 1, or during step
//!   2: P's ops and the intent, possibly some of the other partitions;
//!   the roll-forward applies all of them and removes the intent. Dying
//!   during an unguarded batch: the batchlog completes it (or nothing of it
//!   was written). Dying during a batch split in pieces: some pieces may be
//!   applied and others not — the one case where all-or-nothing is lost. A
//!   Cassandra node dying: nothing, at replication factor 3 and `QUORUM`;
//!   it catches up by hints and read repair when it is back.
//! - **Timeouts may hide success.** When `write` answers
//!   [`StoreError::Unavailable`] after step 1 succeeded (step 2 kept
//!   failing, or the outcome could not be learnt), the batch may yet be
//!   applied in full by the roll-forward: as with any Cassandra timeout,
//!   retry by re-reading, not by assuming.
//!
//! # Cluster requirements
//!
//! `batch_size_fail_threshold` (default 50 KiB!) must be at least
//! [`CassandraOptions::max_batch_bytes`], and `commitlog_segment_size` at
//! least twice it; storage-attached indexes must be enabled (the default in
//! 5.0). `scripts/with-cassandra.sh` runs such a cluster.
//!
//! The URL is `cassandra://host:port[,host:port...]/keyspace?replication=N`:
//! the keyspace (created with `SimpleStrategy` and replication factor `N`,
//! default 3, when missing) and the table are created at connect time by
//! whichever process gets there first; the table's id is derived from the
//! keyspace name so that concurrent creators agree.

#![warn(missing_docs)]

mod error;
mod intent;
mod schema;
mod url;

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt, TryStreamExt};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::retry::FallthroughRetryPolicy;
use scylla::response::query_result::QueryResult;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch as CqlBatch, BatchType};
use scylla::statement::{Consistency as Cl, SerialConsistency};
use scylla::value::CqlValue;
use tarn_store::{
    check_read, Batch, Consistency, Expect, Guard, Key, Op, ReadResult, Row, Scan, Snapshot, Store,
    StoreError, StoreResult,
};

use crate::error::{classify_lwt, map_exec, map_session, LwtFailure};
use crate::schema::{scan_index, Cond, Statements, KIND_ROW};

/// Settings of a [`CassandraStore`].
#[derive(Clone, Debug)]
pub struct CassandraOptions {
    /// Largest batch sent as one logged batch (and largest guarded batch
    /// accepted), in bytes of keys and values. The cluster's
    /// `batch_size_fail_threshold` must be at least this. At least one
    /// maximal row ([`tarn_store::MAX_VALUE_LEN`] plus keys).
    pub max_batch_bytes: usize,
    /// Most requests one [`Snapshot::read`] keeps in flight.
    pub read_concurrency: usize,
    /// How long the driver waits for any one request.
    pub request_timeout: Duration,
    /// How long a write without guards (or the second step of a guarded
    /// one) keeps retrying timeouts and unavailability before it answers
    /// [`StoreError::Unavailable`]. Retrying is safe: every such write
    /// carries its timestamp, so applying it twice is applying it once.
    pub write_retry_window: Duration,
    /// How often the sweeper looks for intents to roll forward; `None` runs
    /// no sweeper in this store (another process's must then).
    pub sweep_interval: Option<Duration>,
    /// How old an intent must be before the roll-forward completes it: far
    /// longer than a writer needs between its two steps, so that the
    /// sweeper does not race live writers (harmless, but wasted work), and
    /// the bound on how long a writer may take to learn the outcome of its
    /// transaction.
    pub intent_grace: Duration,
}

impl Default for CassandraOptions {
    fn default() -> Self {
        CassandraOptions {
            max_batch_bytes: 6 * 1024 * 1024,
            read_concurrency: 128,
            request_timeout: Duration::from_secs(12),
            write_retry_window: Duration::from_secs(30),
            sweep_interval: Some(Duration::from_secs(5)),
            intent_grace: Duration::from_secs(30),
        }
    }
}

/// Counters reported by [`Store::counters`].
#[derive(Default)]
struct Counters {
    point_reads: AtomicU64,
    scans: AtomicU64,
    batches: AtomicU64,
    split_batches: AtomicU64,
    lwt_attempts: AtomicU64,
    lwt_applied: AtomicU64,
    lwt_guard_failed: AtomicU64,
    lwt_unknown: AtomicU64,
    unknown_resolved_applied: AtomicU64,
    unknown_resolved_not_applied: AtomicU64,
    unknown_unresolved: AtomicU64,
    write_retries: AtomicU64,
    guard_rereads: AtomicU64,
    completion_failures: AtomicU64,
    intents_rolled_forward: AtomicU64,
    intents_removed: AtomicU64,
    sweep_errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Microseconds since the epoch, strictly increasing per store: two writes
/// of one store never share a timestamp, and a later write of this store
/// always wins over an earlier one.
struct Clock {
    last: AtomicI64,
}

fn wall_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl Clock {
    fn next(&self) -> i64 {
        let now = wall_micros();
        let prev = self
            .last
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| Some(now.max(p + 1)))
            .expect("always Some");
        now.max(prev + 1)
    }
}

struct Inner {
    session: Session,
    st: Statements,
    options: CassandraOptions,
    clock: Clock,
    counters: Counters,
}

/// The Cassandra store. Cheap to clone: clones share one driver session
/// (and its connection pools) and one sweeper.
#[derive(Clone)]
pub struct CassandraStore {
    inner: Arc<Inner>,
}

/// Values of one statement of a batch.
type Values<'a> = Box<dyn SerializeRow + Send + Sync + 'a>;

impl CassandraStore {
    /// Connects to `url` (see the crate docs), creating the keyspace, the
    /// table and its index if needed, with default options.
    pub async fn connect(url: &str) -> StoreResult<CassandraStore> {
        CassandraStore::connect_with(url, CassandraOptions::default()).await
    }

    /// Connects with options.
    pub async fn connect_with(url: &str, options: CassandraOptions) -> StoreResult<CassandraStore> {
        let target = url::parse(url)?;
        if options.max_batch_bytes < tarn_store::MAX_VALUE_LEN + 3 * tarn_store::MAX_KEY_LEN {
            return Err(StoreError::Invalid(
                "max_batch_bytes must hold one maximal row".into(),
            ));
        }
        let profile = ExecutionProfile::builder()
            .consistency(Cl::Quorum)
            .serial_consistency(Some(SerialConsistency::Serial))
            .request_timeout(Some(options.request_timeout))
            .build();
        let session = SessionBuilder::new()
            .known_nodes(&target.hosts)
            .default_execution_profile_handle(profile.into_handle())
            .connection_timeout(Duration::from_secs(5))
            .build()
            .await
            .map_err(map_session)?;
        schema::ensure(&session, &target).await?;
        let st = Statements::prepare(&session, &target.keyspace).await?;
        let inner = Arc::new(Inner {
            session,
            st,
            options,
            clock: Clock {
                last: AtomicI64::new(0),
            },
            counters: Counters::default(),
        });
        if let Some(every) = inner.options.sweep_interval {
            spawn_sweeper(Arc::downgrade(&inner), every);
        }
        Ok(CassandraStore { inner })
    }

    /// Completes every intent older than [`CassandraOptions::intent_grace`]
    /// (see the crate docs), in pages of 64; returns how many it completed.
    /// The sweeper calls this every [`CassandraOptions::sweep_interval`].
    pub async fn roll_forward(&self) -> StoreResult<usize> {
        self.inner.roll_forward().await
    }

    /// How many intents (guarded batches not yet completed) exist, up to
    /// `limit`: 0 in a quiet cluster. Scans the intent index.
    pub async fn pending_intents(&self, limit: usize) -> StoreResult<usize> {
        let limit = i32::try_from(limit.max(1)).unwrap_or(i32::MAX);
        let r = self
            .inner
            .session
            .execute_unpaged(&self.inner.st.sweep, (i64::MAX, limit))
            .await
            .map_err(map_exec)?;
        Ok(rows_of(r)?.len())
    }

    /// Test hook: runs only step 1 of a guarded write (the transaction
    /// with the intent), as a writer that dies before step 2 would.
    #[cfg(feature = "test-hooks")]
    pub async fn write_first_step_only(&self, batch: Batch) -> StoreResult<()> {
        batch.validate()?;
        if batch.guards.is_empty() {
            return Err(StoreError::Invalid("the hook needs a guarded batch".into()));
        }
        let ops = dedup(&batch.ops);
        self.inner
            .write_guarded(&batch.guards, ops, Mode::FirstStepOnly)
            .await
    }

    /// Test hook: a guarded write whose transaction's answer is lost (as in
    /// a timeout or a broken connection after sending), so that its outcome
    /// has to be learnt from the intent.
    #[cfg(feature = "test-hooks")]
    pub async fn write_losing_the_answer(&self, batch: Batch) -> StoreResult<()> {
        batch.validate()?;
        if batch.guards.is_empty() {
            return Err(StoreError::Invalid("the hook needs a guarded batch".into()));
        }
        let ops = dedup(&batch.ops);
        self.inner
            .write_guarded(&batch.guards, ops, Mode::LoseAnswer)
            .await
    }
}

/// How much of a guarded write runs: all of it, except in test hooks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Full,
    /// The transaction only, as a writer dying before step 2.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    FirstStepOnly,
    /// The transaction's answer is dropped and learnt from the intent.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    LoseAnswer,
}

/// The last op on each key, in key order.
fn dedup(ops: &[Op]) -> Vec<&Op> {
    let mut last: BTreeMap<&Key, &Op> = BTreeMap::new();
    for op in ops {
        last.insert(op.key(), op);
    }
    last.into_values().collect()
}

fn rows_of(r: QueryResult) -> StoreResult<Vec<scylla::value::Row>> {
    let rows = r
        .into_rows_result()
        .map_err(|e| StoreError::Other(format!("expected rows: {e}")))?;
    rows.rows::<scylla::value::Row>()
        .map_err(|e| StoreError::Other(format!("result columns: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Corrupt(format!("result row: {e}")))
}

fn spawn_sweeper(inner: Weak<Inner>, every: Duration) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            // The store is gone: so is its sweeper.
            let Some(inner) = inner.upgrade() else { break };
            if let Err(e) = inner.roll_forward().await {
                bump(&inner.counters.sweep_errors);
                tracing::warn!(error = %e, "cassandra store: roll-forward of intents failed; will retry");
            }
        }
    });
}

fn version_i64(v: u64) -> i64 {
    v as i64
}

fn version_u64(v: i64) -> u64 {
    v as u64
}

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

/// One put or delete, borrowed from an [`Op`] or a decoded intent.
#[derive(Clone, Copy)]
struct RowOp<'a> {
    table: &'a str,
    partition: &'a [u8],
    clustering: &'a [u8],
    /// `Some((value, version))` for a put.
    put: Option<(&'a [u8], u64)>,
}

impl<'a> RowOp<'a> {
    fn of(op: &'a Op) -> RowOp<'a> {
        let key = op.key();
        RowOp {
            table: key.table.name(),
            partition: &key.partition,
            clustering: &key.clustering,
            put: match op {
                Op::Put { value, version, .. } => Some((value.as_slice(), *version)),
                Op::Delete { .. } => None,
            },
        }
    }

    fn of_intent(op: &'a intent::IntentOp) -> RowOp<'a> {
        RowOp {
            table: &op.table,
            partition: &op.partition,
            clustering: &op.clustering,
            put: op.put.as_ref().map(|(v, ver)| (v.as_slice(), *ver)),
        }
    }
}

impl Inner {
    async fn get(&self, key: &Key) -> StoreResult<Option<Row>> {
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

    async fn scan(&self, scan: &Scan) -> StoreResult<Vec<Row>> {
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

    /// Adds a plain put or delete at `ts` to a batch.
    fn push_op<'a>(&self, b: &mut CqlBatch, values: &mut Vec<Values<'a>>, op: RowOp<'a>, ts: i64) {
        let RowOp {
            table,
            partition,
            clustering,
            put,
        } = op;
        match put {
            Some((value, version)) => {
                b.append_statement(self.st.put.clone());
                values.push(Box::new((
                    table,
                    partition,
                    clustering,
                    value,
                    version_i64(version),
                    ts,
                )));
            }
            None => {
                b.append_statement(self.st.delete.clone());
                values.push(Box::new((ts, table, partition, clustering)));
            }
        }
    }

    /// Runs one batch at QUORUM. Every statement carries an explicit
    /// timestamp, so the batch is idempotent and the driver may retry it.
    ///
    /// Timeouts and unavailability are retried with backoff for up to
    /// [`CassandraOptions::write_retry_window`]: when a node dies, a logged
    /// batch over several partitions fails (`WriteTimeout` of type
    /// `BATCH_LOG`) until the others mark it down, about 10–20 s.
    async fn run_batch(&self, mut b: CqlBatch, values: Vec<Values<'_>>) -> StoreResult<()> {
        b.set_consistency(Cl::Quorum);
        b.set_is_idempotent(true);
        bump(&self.counters.batches);
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            match self.session.batch(&b, &values).await {
                Ok(_) => return Ok(()),
                Err(e)
                    if error::worth_retrying(&e)
                        && started.elapsed() + pause < self.options.write_retry_window =>
                {
                    bump(&self.counters.write_retries);
                    tracing::debug!(error = %e, "cassandra store: retrying a batch");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(map_exec(e)),
            }
        }
    }

    /// A batch without guards: one logged batch, or several if it is larger
    /// than `max_batch_bytes` (then atomic per piece only).
    async fn write_plain(&self, ops: Vec<&Op>) -> StoreResult<()> {
        let ts = self.clock.next();
        let mut pieces: Vec<Vec<&Op>> = vec![Vec::new()];
        let mut size = 0;
        for op in ops {
            let s = intent::op_size(op);
            if size + s > self.options.max_batch_bytes && !pieces.last().unwrap().is_empty() {
                pieces.push(Vec::new());
                size = 0;
            }
            size += s;
            pieces.last_mut().unwrap().push(op);
        }
        if pieces.len() > 1 {
            bump(&self.counters.split_batches);
        }
        futures_util::future::try_join_all(pieces.iter().map(|piece| {
            let mut b = CqlBatch::new(BatchType::Logged);
            let mut values = Vec::with_capacity(piece.len());
            for op in piece {
                self.push_op(&mut b, &mut values, RowOp::of(op), ts);
            }
            self.run_batch(b, values)
        }))
        .await?;
        Ok(())
    }

    /// A guarded batch: the transaction on the guarded partition, then the
    /// completion (see the crate docs).
    async fn write_guarded(&self, guards: &[Guard], ops: Vec<&Op>, mode: Mode) -> StoreResult<()> {
        let home = &guards[0].key;
        let (table, partition) = (home.table.name(), home.partition.as_slice());
        let (local, remote): (Vec<&Op>, Vec<&Op>) = ops
            .into_iter()
            .partition(|op| op.key().table == home.table && op.key().partition == home.partition);
        // One condition per guarded row; two different expectations of one
        // row can never both hold.
        let mut conds: BTreeMap<&[u8], Expect> = BTreeMap::new();
        for g in guards {
            if let Some(prev) = conds.insert(&g.key.clustering, g.expect) {
                if prev != g.expect {
                    return Err(self.first_failing_guard(guards).await);
                }
            }
        }
        let mut write_id = [0u8; 16];
        getrandom::fill(&mut write_id)
            .map_err(|e| StoreError::Other(format!("random write id: {e}")))?;
        let ts = self.clock.next();
        let intent = intent::encode(&write_id, ts, &remote);
        let size = local.iter().map(|op| intent::op_size(op)).sum::<usize>() + intent.len();
        if size > self.options.max_batch_bytes {
            return Err(StoreError::Invalid(format!(
                "a guarded batch of {size} bytes exceeds max_batch_bytes ({})",
                self.options.max_batch_bytes
            )));
        }

        let mut b = CqlBatch::new(BatchType::Logged);
        let mut values: Vec<Values<'_>> = Vec::new();
        for op in &local {
            let c = op.key().clustering.as_slice();
            let (cond, expected) = match conds.remove(c) {
                None => (Cond::None, None),
                Some(Expect::Absent) => (Cond::Absent, None),
                Some(Expect::Version(v)) => (Cond::Version, Some(version_i64(v))),
            };
            match op {
                Op::Put { value, version, .. } => {
                    b.append_statement(self.st.cas_put[cond as usize].clone());
                    let v = (value.as_slice(), version_i64(*version), table, partition, c);
                    match expected {
                        Some(e) => values.push(Box::new((v.0, v.1, v.2, v.3, v.4, e))),
                        None => values.push(Box::new(v)),
                    }
                }
                Op::Delete { .. } => {
                    b.append_statement(self.st.cas_delete[cond as usize].clone());
                    match expected {
                        Some(e) => values.push(Box::new((table, partition, c, e))),
                        None => values.push(Box::new((table, partition, c))),
                    }
                }
            }
        }
        for (c, expect) in conds {
            match expect {
                Expect::Version(v) => {
                    b.append_statement(self.st.check_version.clone());
                    values.push(Box::new((
                        version_i64(v),
                        table,
                        partition,
                        c,
                        version_i64(v),
                    )));
                }
                Expect::Absent => {
                    b.append_statement(self.st.check_absent.clone());
                    values.push(Box::new((table, partition, c)));
                }
            }
        }
        b.append_statement(self.st.intent_put.clone());
        values.push(Box::new((
            table,
            partition,
            write_id.as_slice(),
            intent.as_slice(),
            ts,
        )));
        b.set_consistency(Cl::Quorum);
        b.set_serial_consistency(Some(SerialConsistency::Serial));
        b.set_is_idempotent(false);
        // Never resent blindly: an outcome the driver cannot know is learnt
        // from the intent below.
        b.set_retry_policy(Some(Arc::new(FallthroughRetryPolicy::new())));

        bump(&self.counters.lwt_attempts);
        let answer = match self.session.batch(&b, values).await {
            Ok(_) if mode == Mode::LoseAnswer => Err(LwtFailure::Unknown {
                contention: false,
                cause: "answer dropped by a test hook".into(),
            }),
            Ok(r) => Ok(r),
            Err(e) => Err(classify_lwt(e)),
        };
        match answer {
            Ok(r) => {
                let (applied, current) = lwt_answer(r)?;
                if !applied {
                    bump(&self.counters.lwt_guard_failed);
                    return Err(match first_failing(guards, &current) {
                        Some(guard) => StoreError::GuardFailed { guard },
                        None => self.first_failing_guard(guards).await,
                    });
                }
            }
            Err(LwtFailure::NotApplied(err)) => return Err(err),
            Err(LwtFailure::Unknown { contention, cause }) => {
                bump(&self.counters.lwt_unknown);
                self.resolve(table, partition, &write_id, ts, contention, &cause)
                    .await?;
            }
        }
        bump(&self.counters.lwt_applied);
        if mode == Mode::FirstStepOnly {
            return Ok(());
        }
        self.complete(table, partition, &write_id, ts, &remote)
            .await
    }

    /// Learns whether a transaction with an unknown outcome applied, by a
    /// SERIAL read of its intent: `Ok` if it did.
    async fn resolve(
        &self,
        table: &str,
        partition: &[u8],
        write_id: &[u8; 16],
        ts: i64,
        contention: bool,
        cause: &str,
    ) -> StoreResult<()> {
        let mut last = String::new();
        for attempt in 0..4u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
            }
            // After the grace period the roll-forward may have completed and
            // removed the intent: its absence would prove nothing.
            let age = Duration::from_micros(wall_micros().saturating_sub(ts).max(0) as u64);
            if age > self.options.intent_grace / 2 {
                break;
            }
            match self
                .session
                .execute_unpaged(
                    &self.st.intent_serial,
                    (table, partition, write_id.as_slice()),
                )
                .await
            {
                Ok(r) => {
                    if rows_of(r)?.is_empty() {
                        bump(&self.counters.unknown_resolved_not_applied);
                        let msg = format!("lightweight transaction not applied: {cause}");
                        return Err(if contention {
                            StoreError::Conflict(msg)
                        } else {
                            StoreError::Unavailable(msg)
                        });
                    }
                    bump(&self.counters.unknown_resolved_applied);
                    return Ok(());
                }
                Err(e) => last = e.to_string(),
            }
        }
        bump(&self.counters.unknown_unresolved);
        Err(StoreError::Unavailable(format!(
            "outcome of a guarded write unknown ({cause}; then {last}); it may yet be applied"
        )))
    }

    /// Applies ops at `ts`, one unlogged batch per partition (atomic and
    /// isolated within it), all partitions at once. No batchlog: the caller
    /// holds an intent that completes the rest if this stops midway.
    async fn apply_by_partition(&self, ops: &[RowOp<'_>], ts: i64) -> StoreResult<()> {
        let mut groups: BTreeMap<(&str, &[u8]), Vec<RowOp<'_>>> = BTreeMap::new();
        for op in ops {
            groups
                .entry((op.table, op.partition))
                .or_default()
                .push(*op);
        }
        let batches: Vec<BoxFuture<'_, StoreResult<()>>> = groups
            .into_values()
            .map(|group| {
                let mut b = CqlBatch::new(BatchType::Unlogged);
                let mut values = Vec::with_capacity(group.len());
                for op in group {
                    self.push_op(&mut b, &mut values, op, ts);
                }
                self.run_batch(b, values).boxed()
            })
            .collect();
        futures_util::stream::iter(batches)
            .buffer_unordered(self.options.read_concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// Deletes an intent at `ts`, which must be later than the write that
    /// created it (its transaction's ballot), or the delete is shadowed.
    async fn remove_intent(
        &self,
        table: &str,
        partition: &[u8],
        write_id: &[u8],
        ts: i64,
    ) -> StoreResult<()> {
        self.session
            .execute_unpaged(&self.st.intent_delete, (ts, table, partition, write_id))
            .await
            .map_err(map_exec)
            .map(|_| ())
    }

    /// Step 2: the ops on other partitions at the intent's timestamp (each
    /// batch retried within the write retry window, since the transaction
    /// has committed the batch already), then the intent's removal.
    async fn complete(
        &self,
        table: &str,
        partition: &[u8],
        write_id: &[u8; 16],
        ts: i64,
        remote: &[&Op],
    ) -> StoreResult<()> {
        let ops: Vec<RowOp<'_>> = remote.iter().map(|op| RowOp::of(op)).collect();
        if let Err(e) = self.apply_by_partition(&ops, ts).await {
            bump(&self.counters.completion_failures);
            return Err(StoreError::Unavailable(format!(
                "guarded batch committed but not yet applied to its other partitions ({e}); \
                 the roll-forward will complete it"
            )));
        }
        // The batch is complete; an intent left behind by a failure here is
        // only work for the roll-forward.
        if let Err(e) = self
            .remove_intent(table, partition, write_id, self.clock.next())
            .await
        {
            bump(&self.counters.completion_failures);
            tracing::warn!(error = %e, "cassandra store: could not remove an intent; the roll-forward will");
        }
        Ok(())
    }

    /// Reads the guarded rows at SERIAL and names the first guard that does
    /// not hold; a [`StoreError::Conflict`] if all hold by then (the state
    /// moved on between the transaction and this read).
    async fn first_failing_guard(&self, guards: &[Guard]) -> StoreError {
        bump(&self.counters.guard_rereads);
        let home = &guards[0].key;
        let mut keys: Vec<&[u8]> = guards.iter().map(|g| g.key.clustering.as_slice()).collect();
        keys.sort();
        keys.dedup();
        let r = match self
            .session
            .execute_unpaged(
                &self.st.guards_serial,
                (home.table.name(), home.partition.as_slice(), keys),
            )
            .await
        {
            Ok(r) => r,
            Err(e) => return map_exec(e),
        };
        let current = match rows_of(r) {
            Ok(rows) => rows
                .into_iter()
                .filter_map(|row| {
                    let mut cols = row.columns.into_iter();
                    match (cols.next().flatten(), cols.next().flatten()) {
                        (Some(CqlValue::Blob(c)), Some(CqlValue::BigInt(v))) => {
                            Some((c, version_u64(v)))
                        }
                        _ => None,
                    }
                })
                .collect(),
            Err(e) => return e,
        };
        match first_failing(guards, &current) {
            Some(guard) => StoreError::GuardFailed { guard },
            None => StoreError::Conflict("guards changed while checked; retry".into()),
        }
    }

    async fn roll_forward(&self) -> StoreResult<usize> {
        const PAGE: usize = 64;
        const PAGES_PER_SWEEP: usize = 16;
        let cutoff = wall_micros() - self.options.intent_grace.as_micros() as i64;
        let mut done = 0;
        let mut failed = None;
        for _ in 0..PAGES_PER_SWEEP {
            let r = self
                .session
                .execute_unpaged(&self.st.sweep, (cutoff, PAGE as i32))
                .await
                .map_err(map_exec)?;
            let rows = rows_of(r)?;
            let n = rows.len();
            let mut progress = false;
            for row in rows {
                match self.complete_intent(row).await {
                    Ok(()) => {
                        done += 1;
                        progress = true;
                    }
                    // One intent that cannot be completed now must not
                    // hold up the others.
                    Err(e) => {
                        bump(&self.counters.sweep_errors);
                        tracing::warn!(error = %e, "cassandra store: could not roll an intent forward");
                        failed = Some(e);
                    }
                }
            }
            // A short page is the last; a page of failures would come back.
            if n < PAGE || !progress {
                break;
            }
        }
        match failed {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// Completes one intent found by the sweep: its ops at its writer's
    /// timestamp, then its removal.
    async fn complete_intent(&self, row: scylla::value::Row) -> StoreResult<()> {
        let mut cols = row.columns.into_iter();
        let (
            Some(CqlValue::Text(table)),
            Some(CqlValue::Blob(partition)),
            Some(CqlValue::Blob(id)),
            Some(CqlValue::Blob(value)),
            Some(CqlValue::BigInt(written)),
        ) = (
            cols.next().flatten(),
            cols.next().flatten(),
            cols.next().flatten(),
            cols.next().flatten(),
            cols.next().flatten(),
        )
        else {
            return Err(StoreError::Corrupt(
                "intent row with missing columns".into(),
            ));
        };
        let intent = intent::decode(&value)?;
        if intent.write_id.as_slice() != id.as_slice() {
            return Err(StoreError::Corrupt(
                "intent stored under another write id".into(),
            ));
        }
        let ops: Vec<RowOp<'_>> = intent.ops.iter().map(RowOp::of_intent).collect();
        self.apply_by_partition(&ops, intent.timestamp).await?;
        self.remove_intent(&table, &partition, &id, self.clock.next().max(written + 1))
            .await?;
        if intent.ops.is_empty() {
            bump(&self.counters.intents_removed);
        } else {
            bump(&self.counters.intents_rolled_forward);
            tracing::info!(
                ops = intent.ops.len(),
                "cassandra store: rolled a guarded batch forward"
            );
        }
        Ok(())
    }
}

/// The answer of a conditional batch: whether it applied, and (when not)
/// the current versions of the guarded rows that exist.
fn lwt_answer(r: QueryResult) -> StoreResult<(bool, BTreeMap<Vec<u8>, u64>)> {
    let rows = r
        .into_rows_result()
        .map_err(|e| StoreError::Other(format!("conditional batch answer: {e}")))?;
    let specs = rows.column_specs();
    let col = |name: &str| specs.get_by_name(name).map(|(i, _)| i);
    let (applied_at, kind_at, clus_at, version_at) =
        (col("[applied]"), col("kind"), col("clus"), col("version"));
    let mut applied = None;
    let mut current = BTreeMap::new();
    for row in rows
        .rows::<scylla::value::Row>()
        .map_err(|e| StoreError::Other(format!("conditional batch answer: {e}")))?
    {
        let row = row.map_err(|e| StoreError::Corrupt(format!("conditional batch answer: {e}")))?;
        let get = |i: Option<usize>| i.and_then(|i| row.columns.get(i).cloned().flatten());
        if let Some(CqlValue::Boolean(a)) = get(applied_at) {
            applied = Some(applied.unwrap_or(true) && a);
        }
        let is_row = matches!(get(kind_at), Some(CqlValue::TinyInt(KIND_ROW)));
        if let (true, Some(CqlValue::Blob(c)), Some(CqlValue::BigInt(v))) =
            (is_row, get(clus_at), get(version_at))
        {
            current.insert(c, version_u64(v));
        }
    }
    let applied = applied
        .ok_or_else(|| StoreError::Other("conditional batch answered no [applied]".into()))?;
    Ok((applied, current))
}

/// The index of the first guard that does not hold against `current`
/// (clustering → version of the guarded rows that exist).
fn first_failing(guards: &[Guard], current: &BTreeMap<Vec<u8>, u64>) -> Option<usize> {
    guards.iter().position(|g| {
        let holds = match (g.expect, current.get(&g.key.clustering)) {
            (Expect::Absent, None) => true,
            (Expect::Version(want), Some(have)) => want == *have,
            _ => false,
        };
        !holds
    })
}

/// Reads of a [`CassandraStore`]: no state of its own, every read at
/// QUORUM ([`Consistency::PerRead`]).
struct CassandraSnapshot {
    inner: Arc<Inner>,
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
}

#[async_trait::async_trait]
impl Store for CassandraStore {
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>> {
        Ok(Box::new(CassandraSnapshot {
            inner: self.inner.clone(),
        }))
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        let ops = dedup(&batch.ops);
        if batch.guards.is_empty() {
            self.inner.write_plain(ops).await
        } else {
            self.inner
                .write_guarded(&batch.guards, ops, Mode::Full)
                .await
        }
    }

    fn consistency(&self) -> Consistency {
        Consistency::PerRead
    }

    /// Shared partitions are split in 16: a Cassandra partition should stay
    /// well below a few hundred MB, and a listing merges 16 small reads at
    /// about the cost of one.
    fn partition_split(&self) -> u32 {
        16
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("cassandra_point_reads_total", get(&c.point_reads)),
            ("cassandra_scans_total", get(&c.scans)),
            ("cassandra_batches_total", get(&c.batches)),
            ("cassandra_split_batches_total", get(&c.split_batches)),
            ("cassandra_lwt_attempts_total", get(&c.lwt_attempts)),
            ("cassandra_lwt_applied_total", get(&c.lwt_applied)),
            ("cassandra_lwt_guard_failed_total", get(&c.lwt_guard_failed)),
            ("cassandra_lwt_unknown_total", get(&c.lwt_unknown)),
            (
                "cassandra_unknown_resolved_applied_total",
                get(&c.unknown_resolved_applied),
            ),
            (
                "cassandra_unknown_resolved_not_applied_total",
                get(&c.unknown_resolved_not_applied),
            ),
            (
                "cassandra_unknown_unresolved_total",
                get(&c.unknown_unresolved),
            ),
            (
                "cassandra_completion_failures_total",
                get(&c.completion_failures),
            ),
            (
                "cassandra_intents_rolled_forward_total",
                get(&c.intents_rolled_forward),
            ),
            ("cassandra_intents_removed_total", get(&c.intents_removed)),
            ("cassandra_sweep_errors_total", get(&c.sweep_errors)),
            ("cassandra_write_retries_total", get(&c.write_retries)),
            ("cassandra_guard_rereads_total", get(&c.guard_rereads)),
        ]
    }
}
