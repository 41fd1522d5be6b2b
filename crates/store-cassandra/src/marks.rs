//! Feed marks: how far back each node's feed entries may still be landing.
//!
//! A feed entry is stamped with its node's clock before its batch is sent,
//! and lands when the batch does: for a guarded batch, after the
//! transaction. Readers stop [`LAG_MICROS`](crate::feed::LAG_MICROS) behind
//! now, which covers every write that lands within that; one that takes
//! longer (a write retrying while a Cassandra node goes down, a stalled
//! node) would be passed over by a reader already past its stamp.
//!
//! So each node keeps the stamps of its writes still in flight and, every
//! [`MARK_EVERY`] once it has written a feed entry, publishes its *mark*:
//! one row of its own holding `W` — its oldest stamp in flight, or the
//! time of the mark when none is — and that time `t`. Every entry the node
//! stamped before `W` has landed (or its write has failed). A reader stops
//! below the `W` of every mark made in the last [`HOLD_MICROS`]: a write
//! slower than the lag holds every reader back until it lands, so it is
//! read late, never passed over. A node that stops or dies holds readers
//! back for at most `HOLD` after its last mark (a store dropped while its
//! runtime goes on removes its mark). What is left uncovered: a write that lands more than `HOLD` after
//! its node's last mark (the node stopped marking: its marks could not be
//! written either, or it died and the roll-forward completes its write).
//!
//! Cost: a write with feed entries takes one of [`STRIPES`] locks twice,
//! for an insert and a removal; a marking node writes one row every
//! `MARK_EVERY`; a feed read reads the marks' partition (one row a node).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use tarn_store::{Key, Op, Scan, StoreError, StoreResult, Table};

use crate::{wall_micros, Clock, Inner};

/// How often a node that writes feed entries publishes its mark.
pub(crate) const MARK_EVERY: Duration = Duration::from_millis(200);
/// How long a mark holds readers back after it was made.
pub(crate) const HOLD_MICROS: i64 = 3_000_000;
/// Marks older than this are removed by the live nodes (their nodes died).
const FORGET_MICROS: i64 = 600_000_000;
/// The marker looks for such marks every this many marks (about a minute).
const FORGET_EVERY: u32 = 300;
/// Locks the stamps in flight are spread over.
const STRIPES: usize = 16;
/// Most marks a reader looks at: nodes marking at once, and the dead ones
/// of the last [`FORGET_MICROS`].
const MOST_MARKS: usize = 1_000;

fn marks_table() -> Table {
    Table::named(crate::feed::META).expect("a valid table name")
}

const MARKS: &[u8] = b"marks";

/// The stamps of this store's writes whose feed entries may not have
/// landed yet.
pub(crate) struct Flights {
    stripes: [Mutex<BTreeSet<i64>>; STRIPES],
    next: AtomicUsize,
    /// Set by the first write with feed entries: marks start then.
    used: AtomicBool,
    /// This store's mark: its clustering key in the marks' partition.
    pub(crate) node: [u8; 16],
}

/// A write in flight; it leaves the flights when dropped, however the
/// write ends.
pub(crate) struct Flight<'a> {
    flights: &'a Flights,
    stripe: usize,
    pub(crate) stamp: i64,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
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
            next: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            node,
        })
    }

    /// Stamps a write and records it as in flight. The stamp is taken
    /// under the stripe's lock, so a mark that reads the clock after it
    /// finds it in its stripe.
    pub(crate) fn begin<'a>(&'a self, clock: &Clock) -> Flight<'a> {
        self.used.store(true, Ordering::Relaxed);
        let stripe = self.next.fetch_add(1, Ordering::Relaxed) % STRIPES;
        let mut set = self.stripes[stripe].lock().expect("flights");
        let stamp = clock.next();
        set.insert(stamp);
        Flight {
            flights: self,
            stripe,
            stamp,
        }
    }

    /// `W` as of now: the oldest stamp in flight, or a fresh stamp (every
    /// later write is stamped after it) when none is.
    fn mark(&self, clock: &Clock) -> (i64, i64) {
        let t = clock.next();
        let oldest = self
            .stripes
            .iter()
            .filter_map(|s| s.lock().expect("flights").first().copied())
            .min();
        (oldest.map_or(t, |o| o.min(t)), t)
    }

    pub(crate) fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }
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

/// Publishes the store's mark every [`MARK_EVERY`] until it is dropped.
pub(crate) fn spawn_marker(inner: Weak<Inner>) {
    tokio::spawn(async move {
        let mut ticks = 0u32;
        loop {
            tokio::time::sleep(MARK_EVERY).await;
            let Some(inner) = inner.upgrade() else { break };
            if !inner.flights.used() {
                continue;
            }
            ticks = ticks.wrapping_add(1);
            if let Err(e) = inner.publish_mark().await {
                tracing::debug!(error = %e, "cassandra store: a feed mark was not written");
            }
            if ticks.is_multiple_of(FORGET_EVERY) {
                if let Err(e) = inner.forget_dead_marks().await {
                    tracing::debug!(error = %e, "cassandra store: old feed marks stay");
                }
            }
        }
    });
}

impl Inner {
    async fn publish_mark(&self) -> StoreResult<()> {
        let (w, t) = self.flights.mark(&self.clock);
        let value = [w.to_be_bytes(), t.to_be_bytes()].concat();
        let op = Op::Put {
            key: mark_key(&self.flights.node),
            value,
            version: 1,
        };
        self.write_plain(vec![&op]).await
    }

    async fn forget_dead_marks(&self) -> StoreResult<()> {
        let rows = self
            .scan(&Scan::partition(marks_table(), MARKS.to_vec(), MOST_MARKS))
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
    pub(crate) async fn held_horizon(&self, horizon: i64) -> StoreResult<i64> {
        let rows = self
            .scan(&Scan::partition(marks_table(), MARKS.to_vec(), MOST_MARKS))
            .await?;
        let now = wall_micros();
        Ok(rows
            .iter()
            .filter_map(|r| decode(&r.value))
            .filter(|&(_, t)| now - t < HOLD_MICROS)
            .fold(horizon, |h, (w, _)| h.min(w)))
    }

    /// Removes this store's mark as it goes away (when a runtime is there
    /// to run it): readers need not wait out its hold.
    pub(crate) fn retire_mark(&self) {
        if !self.flights.used() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = self.session.clone();
        let delete = self.st.delete.clone();
        let ts = self.clock.next();
        let node = self.flights.node;
        handle.spawn(async move {
            let table = marks_table();
            let r = session
                .execute_unpaged(&delete, (ts, table.name(), MARKS, &node[..]))
                .await;
            if let Err(e) = r {
                tracing::debug!(error = %e, "cassandra store: a feed mark stays until its hold ends");
            }
        });
    }
}
