//! Writes: a logged batch without guards; with guards, a lightweight
//! transaction carrying an intent, then the rest (see the crate docs).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt, TryStreamExt};
use scylla::response::query_result::QueryResult;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch as CqlBatch, BatchType};
use scylla::statement::{Consistency as Cl, SerialConsistency};
use scylla::value::CqlValue;
use tarn_store::{Expect, Guard, Key, Op, StoreError, StoreResult};

use crate::error::{self, classify_lwt, map_exec, LwtFailure};
use crate::intent;
use crate::retry::StorePolicy;
use crate::schema::{Cond, KIND_ROW};
use crate::{bump, rows_of, version_i64, version_u64, wall_micros, Inner};

/// Values of one statement of a batch.
type Values<'a> = Box<dyn SerializeRow + Send + Sync + 'a>;

/// How much of a guarded write runs: all of it, except in test hooks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Full,
    /// The transaction only, as a writer dying before step 2.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    FirstStepOnly,
    /// The transaction's answer is dropped and learnt from the intent.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    LoseAnswer,
}

/// The last op on each key, in key order.
pub(crate) fn dedup(ops: &[Op]) -> Vec<&Op> {
    let mut last: BTreeMap<&Key, &Op> = BTreeMap::new();
    for op in ops {
        last.insert(op.key(), op);
    }
    last.into_values().collect()
}

/// One put or delete, borrowed from an [`Op`] or a decoded intent.
#[derive(Clone, Copy)]
pub(crate) struct RowOp<'a> {
    table: &'a str,
    partition: &'a [u8],
    clustering: &'a [u8],
    /// `Some((value, version))` for a put.
    put: Option<(&'a [u8], u64)>,
}

impl<'a> RowOp<'a> {
    pub(crate) fn of(op: &'a Op) -> RowOp<'a> {
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

    pub(crate) fn of_intent(op: &'a intent::IntentOp) -> RowOp<'a> {
        RowOp {
            table: &op.table,
            partition: &op.partition,
            clustering: &op.clustering,
            put: op.put.as_ref().map(|(v, ver)| (v.as_slice(), *ver)),
        }
    }
}

impl Inner {
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
    pub(crate) async fn write_plain(&self, ops: Vec<&Op>) -> StoreResult<()> {
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
    pub(crate) async fn write_guarded(
        &self,
        guards: &[Guard],
        ops: Vec<&Op>,
        mode: Mode,
    ) -> StoreResult<()> {
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

        let (b, values) =
            self.conditional_batch(table, partition, &local, conds, &write_id, &intent, ts);
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

    /// Step 1 as one conditional batch on the guarded partition: the ops
    /// that fall in it, each carrying its row's condition; a condition-only
    /// statement for each other guarded row; the intent.
    #[allow(clippy::too_many_arguments)]
    fn conditional_batch<'a>(
        &self,
        table: &'a str,
        partition: &'a [u8],
        local: &[&'a Op],
        mut conds: BTreeMap<&'a [u8], Expect>,
        write_id: &'a [u8; 16],
        intent: &'a [u8],
        ts: i64,
    ) -> (CqlBatch, Vec<Values<'a>>) {
        let mut b = CqlBatch::new(BatchType::Logged);
        let mut values: Vec<Values<'_>> = Vec::new();
        for op in local {
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
            intent,
            ts,
        )));
        b.set_consistency(Cl::Quorum);
        b.set_serial_consistency(Some(SerialConsistency::Serial));
        b.set_is_idempotent(false);
        // Never resent blindly: an outcome the driver cannot know is learnt
        // from the intent (`resolve`). Only a refusal before it ran, by a
        // node behind the schema, sends it to another node (`retry.rs`).
        b.set_retry_policy(Some(Arc::new(StorePolicy::or_fall_through())));
        (b, values)
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
    pub(crate) async fn apply_by_partition(&self, ops: &[RowOp<'_>], ts: i64) -> StoreResult<()> {
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
    pub(crate) async fn remove_intent(
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
