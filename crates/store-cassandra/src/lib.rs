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
//!   on another replica by the driver. The transaction is never resent
//!   once it may have run. A node that does not know the keyspace or
//!   table yet (it was down when they were made and takes clients before
//!   gossip has brought them) refuses every statement before running it;
//!   such a statement goes to the next node, up to twice, and is
//!   [`StoreError::Unavailable`] if they refuse too (`retry.rs`), which the
//!   engine retries as it does every unavailability before it answers 503.
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
//! - **Feeds** are ordered by the writing process's clock, and read a lag
//!   behind now and below every write still in flight, as each process's
//!   latest *mark* says: an entry that lands within 30 s of its stamp while
//!   its writer goes on marking is read late, never passed over (`feed.rs`,
//!   `marks.rs`).
//! - **Timeouts may hide success.** When `write` answers
//!   [`StoreError::Unavailable`] after step 1 succeeded (step 2 kept
//!   failing, or the outcome could not be learnt), the batch may yet be
//!   applied in full by the roll-forward: as with any Cassandra timeout,
//!   retry by re-reading, not by assuming.
//!
//! # Costs
//!
//! - A point read or a scan: one request, answered by two replicas of
//!   three. The reads of one call go out together.
//! - A write without guards: one batch; over several partitions it first
//!   writes the batchlog on two other nodes.
//! - A write with guards: one Paxos round (two round trips to a quorum with
//!   `paxos_variant: v2`, four with v1), then one request per other
//!   partition, in parallel, then the intent's removal. Each leaves a
//!   tombstone in its partition's intent range, which no read's slice
//!   touches.
//! - Feed marks: a process that writes feed entries writes one row every
//!   100 ms; a feed read also reads the marks' partition (a row a process).
//! - The sweeper: one query of the intent index per
//!   [`CassandraOptions::sweep_interval`] and store, answered by every
//!   node; it also passes over index entries of removed intents that
//!   compaction has not dropped yet.
//!
//! # Cluster requirements
//!
//! `batch_size_fail_threshold` (default 50 KiB!) must be at least
//! [`CassandraOptions::max_batch_bytes`], and `commitlog_segment_size` at
//! least twice it (a mutation may fill half a segment), and
//! `native_transport_max_frame_size` (16 MiB by default) above it;
//! storage-attached indexes must be enabled (the default in 5.0).
//! `scripts/with-cassandra.sh` runs such a cluster.
//!
//! The URL is `cassandra://host:port[,host:port...]/keyspace?replication=N`:
//! the keyspace (created with `SimpleStrategy` and replication factor `N`,
//! default 3, when missing) and the table are created at connect time by
//! whichever process gets there first; the table's id is derived from the
//! keyspace name so that concurrent creators agree. The table compacts
//! leveled (`LeveledCompactionStrategy`), which keeps a partition in at most
//! one sstable a level, so a listing's slices read a few sstables however
//! much was written; the store warns at connect about a table that compacts
//! otherwise. An existing keyspace is
//! used as it is: create it yourself, with `NetworkTopologyStrategy`, to
//! span datacenters (`QUORUM` then spans them too).

#![warn(missing_docs)]

mod error;
mod feed;
mod intent;
mod marks;
#[cfg(feature = "test-pool")]
pub mod pool;
mod read;
mod retry;
mod schema;
mod sweep;
mod url;
mod write;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::response::query_result::QueryResult;
use scylla::statement::{Consistency as Cl, SerialConsistency};
use tarn_store::{Batch, Consistency, Op, Snapshot, Store, StoreError, StoreResult};

use crate::error::{map_exec, map_session};
use crate::read::CassandraSnapshot;
use crate::schema::Statements;
use crate::sweep::spawn_sweeper;
use crate::write::{dedup, Mode};

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
    /// The latest stamp given, or now if later: every later stamp is
    /// after it.
    fn high(&self) -> i64 {
        (wall_micros() - 1).max(self.last.load(Ordering::SeqCst))
    }

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
    session: Arc<Session>,
    keyspace: String,
    st: Statements,
    options: CassandraOptions,
    clock: Clock,
    /// This store's writes in flight, for its feed marks.
    flights: marks::Flights,
    counters: Counters,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.retire_mark();
    }
}

/// The Cassandra store. Cheap to clone: clones share one driver session
/// (and its connection pools) and one sweeper.
#[derive(Clone)]
pub struct CassandraStore {
    inner: Arc<Inner>,
}

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
            .retry_policy(Arc::new(retry::StorePolicy::or_default()))
            .build();
        let session = SessionBuilder::new()
            .known_nodes(&target.hosts)
            .default_execution_profile_handle(profile.into_handle())
            .connection_timeout(Duration::from_secs(5))
            .build()
            .await
            .map_err(map_session)?;
        schema::ensure(&session, &target).await?;
        // Advisory: the store works either way (see `COLUMN_INDEX_BYTES`).
        match schema::column_index_size(&session).await {
            Ok(v) => {
                if let Some(advice) = schema::column_index_advice(v.as_deref()) {
                    tracing::warn!("cassandra store: {advice}");
                }
            }
            Err(e) => tracing::debug!(error = %e, "cassandra store: cannot read column_index_size"),
        }
        match schema::compaction_class(&session, &target.keyspace).await {
            Ok(class) => {
                if let Some(advice) = schema::compaction_advice(&target.keyspace, &class) {
                    tracing::warn!("cassandra store: {advice}");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "cassandra store: cannot read the table's compaction")
            }
        }
        let st = Statements::prepare(&session, &target.keyspace).await?;
        let inner = Arc::new(Inner {
            session: Arc::new(session),
            keyspace: target.keyspace.clone(),
            st,
            options,
            clock: Clock {
                last: AtomicI64::new(0),
            },
            flights: marks::Flights::new()?,
            counters: Counters::default(),
        });
        if let Some(every) = inner.options.sweep_interval {
            spawn_sweeper(Arc::downgrade(&inner), every);
        }
        marks::spawn_marker(Arc::downgrade(&inner));
        let store = CassandraStore { inner };
        store.record_birth().await?;
        Ok(store)
    }

    /// Completes every intent older than [`CassandraOptions::intent_grace`]
    /// (see the crate docs), in pages of 64; returns how many it completed.
    /// The sweeper calls this every [`CassandraOptions::sweep_interval`].
    pub async fn roll_forward(&self) -> StoreResult<usize> {
        self.inner.roll_forward().await
    }

    /// The `column_index_size` setting of the node that answers (`None`:
    /// unset). Tarn wants at most 4 KiB on every node: a reversed slice
    /// (a newest-first listing) of a partition without a row index reads
    /// the whole partition; the store warns at connect when it is larger.
    pub async fn column_index_size(&self) -> StoreResult<Option<String>> {
        schema::column_index_size(&self.inner.session).await
    }

    /// The compaction class of the store's table (fully qualified, as
    /// Cassandra's schema names it): `LeveledCompactionStrategy` for a table
    /// the store made; the store warns at connect when it is another.
    pub async fn compaction_class(&self) -> StoreResult<String> {
        schema::compaction_class(&self.inner.session, &self.inner.keyspace).await
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

impl CassandraStore {
    /// [`Store::write`]; with `delay`, the batch is sent that long after its
    /// feed entries were stamped (a test hook's slow write).
    async fn write_after(&self, batch: Batch, delay: Option<Duration>) -> StoreResult<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        // Feed entries are rows of their own, written with the batch; the
        // store's marks hold readers back until they land (`marks.rs`).
        let mut flight = if batch.appends.is_empty() {
            None
        } else {
            // The store's first mark, before its first stamp: after it,
            // one every `MARK_EVERY`.
            self.inner.first_mark().await?;
            Some(self.inner.flights.begin(&self.inner.clock)?)
        };
        let appends = match flight.as_mut().map(|f| (f.stamp, f)) {
            Some((stamp, f)) => match feed::append_ops(&batch, stamp) {
                Ok(a) => a,
                Err(e) => {
                    f.settle();
                    return Err(e);
                }
            },
            None => Vec::new(),
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let all: Vec<Op> = batch.ops.iter().cloned().chain(appends).collect();
        let ops = dedup(&all);
        let written = if batch.guards.is_empty() {
            self.inner.write_plain(ops).await
        } else {
            self.inner
                .write_guarded(&batch.guards, ops, Mode::Full)
                .await
        };
        // Landed, or applied nothing and never will. Otherwise (an unknown
        // outcome, or the caller gone mid-write) the stamp stays counted
        // for a while: the entry may yet land (`marks.rs`).
        // (A plain batch split in pieces may have some applied when
        // another is refused.)
        let guarded = !batch.guards.is_empty();
        let settled = match &written {
            Ok(()) | Err(StoreError::GuardFailed { .. }) | Err(StoreError::Conflict(_)) => true,
            Err(StoreError::Invalid(_)) => guarded,
            Err(_) => false,
        };
        if let (Some(f), true) = (flight.as_mut(), settled) {
            f.settle();
        }
        written
    }

    /// Test hook: whether a write of this store with changes may still
    /// land (stamped, and not yet landed or refused).
    #[cfg(feature = "test-hooks")]
    pub fn writes_in_flight(&self) -> bool {
        !self.inner.flights.settled(&self.inner.clock)
    }

    /// Test hook: a write whose batch is sent `delay` after its feed
    /// entries were stamped, as one that keeps retrying would land.
    #[cfg(feature = "test-hooks")]
    pub async fn write_landing_late(&self, batch: Batch, delay: Duration) -> StoreResult<()> {
        self.write_after(batch, Some(delay)).await
    }
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

fn version_i64(v: u64) -> i64 {
    v as i64
}

fn version_u64(v: i64) -> u64 {
    v as u64
}

#[async_trait::async_trait]
impl Store for CassandraStore {
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>> {
        Ok(Box::new(CassandraSnapshot {
            inner: self.inner.clone(),
        }))
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        self.write_after(batch, None).await
    }

    fn consistency(&self) -> Consistency {
        Consistency::PerRead
    }

    /// Its feed mark ends and is removed (`marks.rs`).
    async fn stop(&self) {
        self.inner.stop_marking().await
    }

    /// The lag; marks hold the feed back further (`marks.rs`).
    fn feed_lag(&self) -> Duration {
        Duration::from_micros(feed::LAG_MICROS as u64)
    }
    fn connections(&self) -> Option<usize> {
        None
    }

    async fn trim_feed(
        &self,
        feed: tarn_store::Table,
        through: &[u8],
        limit: usize,
    ) -> StoreResult<usize> {
        self.trim(feed, through, limit).await
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
