//! Feed marks: how far back each node's feed entries may still be landing.
//!
//! A feed entry is stamped with its node's clock before its batch is sent,
//! and lands when the batch does: for a guarded batch, after the
//! transaction. Readers stop [`LAG_MICROS`](crate::feed::LAG_MICROS) behind
//! now, which covers every write that lands within that; one that takes
//! longer (a write retrying while a Cassandra node goes down) would be
//! passed over by a reader already past its stamp.
//!
//! So each node keeps the stamps of its writes still in flight and
//! publishes its *mark* before its first feed write is stamped (a write
//! is refused while that mark cannot be written), then every
//! [`MARK_EVERY`]: one
//! row of its own holding `W` — its oldest stamp in flight, or the time of
//! the mark when none is — and that time `t`. Every entry the node stamped
//! before `W` has landed, or its write ended applying nothing. A write
//! whose outcome is not known when it ends (it answered `Unavailable`, or
//! its caller went away mid-write) stays counted as in flight: it may yet
//! land, by a retry of Cassandra's or the roll-forward. `W` is never more
//! than [`CAP_MICROS`] (30 s, as long as a writer retries) behind `t`, so
//! no one write holds the feed back for longer than that.
//!
//! A reader stops below the `W` of every mark made in the last
//! [`HOLD_MICROS`]: a write slower than the lag holds every reader back
//! until it lands, so it is read late, not passed over. As `W` is at most
//! `t`, the feed is readable about `MARK_EVERY` behind now while nothing
//! is landing late (the lag is the least). Clocks: a marking node's
//! stamps are never below its marks, however its clock runs; but a node
//! whose clock runs behind the readers' by more than the lag when it
//! writes its first mark (it starts, or restarts) can stamp entries
//! below where readers already are. A node that dies holds readers back
//! for at most `HOLD` after its last mark; a store that stops
//! ([`Store::stop`](tarn_store::Store::stop)), or is dropped while its
//! runtime goes on, removes its mark unless a write of its may still land.
//! What is left
//! uncovered: an entry that lands more than `CAP` after its stamp (the
//! roll-forward of a writer that died or of a write that gave up, which
//! comes at least 30 s after the write began), or
//! after its node stopped marking for longer than `HOLD` (its marks could
//! not be written either).
//!
//! Cost: a write with feed entries takes one of [`STRIPES`] locks twice,
//! for an insert and a removal; a marking node writes one row every
//! `MARK_EVERY`, one attempt each, not retried (the next mark is fresher);
//! a feed read reads the marks' partition (one row a node).

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use tarn_store::{Key, Op, Scan, StoreError, StoreResult, Table};

use crate::{wall_micros, Clock, Inner};

/// How often a node that writes feed entries publishes its mark.
pub(crate) const MARK_EVERY: Duration = Duration::from_millis(100);
/// How long a mark holds readers back after it was made.
pub(crate) const HOLD_MICROS: i64 = 5_000_000;
/// How far behind its time a mark's `W` may be: as long as a writer
/// retries a write (`CassandraOptions::write_retry_window`'s default).
pub(crate) const CAP_MICROS: i64 = 30_000_000;
/// How long one mark's write (or a look for dead nodes' marks) may take
/// before it is given up.
const MARK_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the store's first mark, which every feed write waits for, is
/// tried (a write retries for longer: `CassandraOptions::write_retry_window`).
const FIRST_MARK_TRIES: Duration = Duration::from_secs(5);
/// How long a stopping store waits for its writes in flight to land
/// before it lets go of its mark.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a stopping store's removal of its mark may take.
const RETIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// Marks older than this are removed by the live nodes (their nodes died).
const FORGET_MICROS: i64 = 60_000_000;
/// The marker looks for such marks every this many marks (about a minute).
const FORGET_EVERY: u32 = 600;
/// Locks the stamps in flight are spread over.
const STRIPES: usize = 16;
/// Marks a reader reads at a time: nodes marking at once, and the dead
/// ones of the last [`FORGET_MICROS`].
const MARKS_READ: usize = 1_000;

fn marks_table() -> Table {
    Table::named(crate::feed::META).expect("a valid table name")
}

const MARKS: &[u8] = b"marks";

/// The stamps of this store's writes whose feed entries may not have
/// landed yet.
pub(crate) struct Flights {
    stripes: [Mutex<BTreeSet<i64>>; STRIPES],
    /// Stamps of writes that ended without a known outcome, until they
    /// are [`CAP_MICROS`] old.
    unsure: Mutex<BTreeSet<i64>>,
    next: AtomicUsize,
    /// Set once the store's first mark is written (before its first feed
    /// write is stamped): marks go on from then.
    used: AtomicBool,
    /// Taken to write the first mark; when the last try at it failed.
    first_mark: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Set as the node stops: feed writes are refused from then.
    stopped: AtomicBool,
    /// Set once a stopped store has let go of its mark: marks end.
    ended: AtomicBool,
    /// This store's mark: its clustering key in the marks' partition.
    pub(crate) node: [u8; 16],
}

/// A write in flight. Dropped, it leaves the flights: at once if
/// settled, else once [`CAP_MICROS`] old.
pub(crate) struct Flight<'a> {
    flights: &'a Flights,
    stripe: usize,
    pub(crate) stamp: i64,
    /// Whether the write's outcome is known: landed, or nothing applied.
    settled: bool,
}

impl Flight<'_> {
    /// The write landed, or applied nothing and never will.
    pub(crate) fn settle(&mut self) {
        self.settled = true;
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        // Into `unsure` before out of its stripe, as [`Flights::mark`]
        // reads the stripes before `unsure`: a mark sees it in one of them.
        if !self.settled {
            self.flights
                .unsure
                .lock()
                .expect("flights")
                .insert(self.stamp);
        }
        self.flights.stripes[self.stripe]
            .lock()
            .expect("flights")
            .remove(&self.stamp);
    }
}

impl Flights {
    pub(crate) fn new() -> StoreResult<Flights> {
        let mut node = [0u8; 16];
        getrandom::fill(&mut node).map_err(|e| StoreError::Other(format!("random id: {e}")))?;
        Ok(Flights {
            stripes: std::array::from_fn(|_| Mutex::new(BTreeSet::new())),
            unsure: Mutex::new(BTreeSet::new()),
            next: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            first_mark: tokio::sync::Mutex::new(None),
            stopped: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            node,
        })
    }

    /// Stamps a write and records it as in flight; refused once the store
    /// is stopping. The stamp is taken under the stripe's lock, so a mark
    /// that reads the clock after it finds it in its stripe, and so does a
    /// stop that set its flag before it ([`Flights::settled`]).
    pub(crate) fn begin<'a>(&'a self, clock: &Clock) -> StoreResult<Flight<'a>> {
        let stripe = self.next.fetch_add(1, Ordering::Relaxed) % STRIPES;
        let mut set = self.stripes[stripe].lock().expect("flights");
        if self.stopped.load(Ordering::SeqCst) {
            return Err(stopping());
        }
        let stamp = clock.next();
        set.insert(stamp);
        Ok(Flight {
            flights: self,
            stripe,
            stamp,
            settled: false,
        })
    }

    /// `(W, t)` as of now: `t` a fresh stamp (every later write is stamped
    /// after it), `W` the oldest stamp in flight or unsure, `t` if none is,
    /// and at most [`CAP_MICROS`] behind `t`.
    fn mark(&self, clock: &Clock) -> (i64, i64) {
        let t = clock.next();
        let floor = t - CAP_MICROS;
        // The stripes first, then `unsure` (see `Flight`'s drop).
        let in_flight = self
            .stripes
            .iter()
            .filter_map(|s| s.lock().expect("flights").first().copied())
            .min();
        let unsure = {
            let mut u = self.unsure.lock().expect("flights");
            *u = u.split_off(&floor);
            u.first().copied()
        };
        let oldest = in_flight.into_iter().chain(unsure).min();
        (oldest.map_or(t, |o| o.min(t)).max(floor), t)
    }

    /// Whether the store has begun marking.
    pub(crate) fn used(&self) -> bool {
        self.used.load(Ordering::SeqCst)
    }

    /// Whether no write of this store may still land: none in flight, and
    /// none whose outcome is unknown within [`CAP_MICROS`].
    pub(crate) fn settled(&self, clock: &Clock) -> bool {
        let floor = clock.next() - CAP_MICROS;
        self.stripes
            .iter()
            .all(|s| s.lock().expect("flights").is_empty())
            && self
                .unsure
                .lock()
                .expect("flights")
                .range(floor..)
                .next()
                .is_none()
    }
}

fn stopping() -> StoreError {
    StoreError::Unavailable("the store is stopping: it writes no more changes".into())
}

fn mark_key(node: &[u8]) -> Key {
    Key::new(marks_table(), MARKS.to_vec(), node.to_vec())
}

/// Decodes a mark's row: `(W, t)`.
fn decode(value: &[u8]) -> Option<(i64, i64)> {
    let w = i64::from_be_bytes(value.get(..8)?.try_into().ok()?);
    let t = i64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
    Some((w, t))
}

/// Publishes the store's mark every [`MARK_EVERY`] once it has begun a
/// feed write, until it is dropped.
pub(crate) fn spawn_marker(inner: Weak<Inner>) {
    tokio::spawn(async move {
        let mut ticks = 0u32;
        loop {
            tokio::time::sleep(MARK_EVERY).await;
            let Some(inner) = inner.upgrade() else { break };
            if inner.flights.ended.load(Ordering::SeqCst) {
                break;
            }
            if !inner.flights.used() {
                continue;
            }
            ticks = ticks.wrapping_add(1);
            if let Err(e) = inner.publish_mark().await {
                tracing::debug!(error = %e, "cassandra store: a feed mark was not written");
            }
            if ticks.is_multiple_of(FORGET_EVERY) {
                // Bounded too: the next mark must not wait on it.
                match tokio::time::timeout(MARK_TIMEOUT, inner.forget_dead_marks()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "cassandra store: old feed marks stay")
                    }
                    Err(_) => tracing::debug!("cassandra store: old feed marks stay (timed out)"),
                }
            }
        }
    });
}

impl Inner {
    /// Before a feed write is stamped: the store's first mark, once, so
    /// that no stamp of this store exists before its marks hold readers
    /// below it. Writes that come meanwhile wait for it; while it cannot
    /// be written (tried for [`FIRST_MARK_TRIES`]) they are refused
    /// (`Unavailable`, nothing sent), those that waited on a try at once.
    pub(crate) async fn first_mark(&self) -> StoreResult<()> {
        if self.flights.used() {
            return Ok(());
        }
        if self.flights.stopped.load(Ordering::SeqCst) {
            return Err(stopping());
        }
        let mut failed = self.flights.first_mark.lock().await;
        if self.flights.used() {
            return Ok(());
        }
        if failed.is_some_and(|at| at.elapsed() < MARK_EVERY) {
            return Err(StoreError::Unavailable(
                "the store's first feed mark could not be written".into(),
            ));
        }
        let deadline = tokio::time::Instant::now() + FIRST_MARK_TRIES;
        loop {
            match self.publish_mark().await {
                Ok(()) => {
                    self.flights.used.store(true, Ordering::SeqCst);
                    *failed = None;
                    return Ok(());
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    *failed = Some(std::time::Instant::now());
                    return Err(StoreError::Unavailable(format!(
                        "the store's first feed mark could not be written: {e}"
                    )));
                }
                Err(_) => tokio::time::sleep(MARK_EVERY).await,
            }
        }
    }

    /// One attempt, bounded by [`MARK_TIMEOUT`]: a mark that cannot be
    /// written now is replaced by the next, fresher one.
    pub(crate) async fn publish_mark(&self) -> StoreResult<()> {
        let (w, t) = self.flights.mark(&self.clock);
        let value = [w.to_be_bytes(), t.to_be_bytes()].concat();
        let table = marks_table();
        let ts = self.clock.next();
        // Stamped before a stop's removal, or not sent: the removal wins.
        if self.flights.ended.load(Ordering::SeqCst) {
            return Err(stopping());
        }
        let write = self.session.execute_unpaged(
            &self.st.put,
            (
                table.name(),
                MARKS,
                &self.flights.node[..],
                value.as_slice(),
                1i64,
                ts,
            ),
        );
        match tokio::time::timeout(MARK_TIMEOUT, write).await {
            Ok(r) => r.map(|_| ()).map_err(crate::error::map_exec),
            Err(_) => Err(StoreError::Unavailable("a feed mark timed out".into())),
        }
    }

    async fn forget_dead_marks(&self) -> StoreResult<()> {
        let rows = self
            .scan(&Scan::partition(marks_table(), MARKS.to_vec(), MARKS_READ))
            .await?;
        let before = wall_micros() - FORGET_MICROS;
        let gone: Vec<Op> = rows
            .into_iter()
            .filter(|r| decode(&r.value).is_none_or(|(_, t)| t < before))
            .map(|r| Op::Delete {
                key: mark_key(&r.clustering),
            })
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        self.write_plain(gone.iter().collect()).await
    }

    /// `horizon`, lowered below the oldest stamp any node may still have
    /// in flight (its mark's `W`, for marks of the last [`HOLD_MICROS`]).
    pub(crate) async fn held_horizon(&self, mut horizon: i64) -> StoreResult<i64> {
        let now = wall_micros();
        let mut after = Bound::Unbounded;
        loop {
            let rows = self
                .scan(
                    &Scan::partition(marks_table(), MARKS.to_vec(), MARKS_READ)
                        .bounds(after, Bound::Unbounded),
                )
                .await?;
            horizon = rows
                .iter()
                .filter_map(|r| decode(&r.value))
                .filter(|&(_, t)| now - t < HOLD_MICROS)
                .fold(horizon, |h, (w, _)| h.min(w));
            match rows.last() {
                Some(last) if rows.len() == MARKS_READ => {
                    after = Bound::Excluded(last.clustering.clone())
                }
                _ => return Ok(horizon),
            }
        }
    }

    /// The node stops: feed writes are refused from now; once those in
    /// flight have landed (waited for at most [`STOP_WAIT`]), its marks
    /// end and its mark is removed (one try, at most [`RETIRE_TIMEOUT`]),
    /// so that readers need not wait out its hold. While a write of its
    /// may still land, it goes on marking for as long as it lives.
    pub(crate) async fn stop_marking(&self) {
        if self.flights.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        while !self.flights.settled(&self.clock) {
            if tokio::time::Instant::now() >= deadline {
                tracing::info!("stopping: a change may still land; this node's feed mark stays");
                return;
            }
            tokio::time::sleep(MARK_EVERY).await;
        }
        let Some(delete) = self.mark_delete() else {
            return;
        };
        if tokio::time::timeout(RETIRE_TIMEOUT, delete).await.is_err() {
            tracing::debug!("cassandra store: a feed mark stays until its hold ends (timed out)");
        }
    }

    /// Removes this store's mark as it goes away, when a runtime is there
    /// to run it (see [`Inner::stop_marking`]).
    pub(crate) fn retire_mark(&self) {
        self.flights.stopped.store(true, Ordering::SeqCst);
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some(delete) = self.mark_delete() {
            handle.spawn(delete);
        }
    }

    /// Ends the marks and answers the removal of this store's mark, if it
    /// has one, it is stopping and no write of its may still land (else
    /// `None`, and it goes on marking). The removal's timestamp is taken
    /// after marks end, so it comes after every mark of the store.
    fn mark_delete(&self) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        if !self.flights.used()
            || !self.flights.settled(&self.clock)
            || self.flights.ended.swap(true, Ordering::SeqCst)
        {
            return None;
        }
        let session = self.session.clone();
        let delete = self.st.delete.clone();
        let ts = self.clock.next();
        let node = self.flights.node;
        Some(async move {
            let table = marks_table();
            let r = session
                .execute_unpaged(&delete, (ts, table.name(), MARKS, &node[..]))
                .await;
            if let Err(e) = r {
                tracing::debug!(error = %e, "cassandra store: a feed mark stays until its hold ends");
            }
        })
    }
}
