//! The roll-forward: completes the intents of guarded writes whose writer
//! died between its two steps.

use std::sync::Weak;
use std::time::Duration;

use scylla::value::CqlValue;
use tarn_store::{StoreError, StoreResult};

use crate::error::map_exec;
use crate::intent;
use crate::write::RowOp;
use crate::{bump, rows_of, wall_micros, Inner};

/// Runs [`Inner::roll_forward`] every `every` until the store is dropped.
pub(crate) fn spawn_sweeper(inner: Weak<Inner>, every: Duration) {
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

impl Inner {
    /// One sweep: see [`crate::CassandraStore::roll_forward`].
    pub(crate) async fn roll_forward(&self) -> StoreResult<usize> {
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
                    Ok(completed) => {
                        done += usize::from(completed);
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
    /// timestamp, then its removal. `false` if it was gone already.
    async fn complete_intent(&self, row: scylla::value::Row) -> StoreResult<bool> {
        let mut cols = row.columns.into_iter();
        let (
            Some(CqlValue::Text(table)),
            Some(CqlValue::Blob(partition)),
            Some(CqlValue::Blob(id)),
            Some(CqlValue::BigInt(written)),
        ) = (
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
        let r = self
            .session
            .execute_unpaged(&self.st.intent_get, (&table, &partition, &id))
            .await
            .map_err(map_exec)?;
        let Some(value) = rows_of(r)?.into_iter().next().and_then(|row| {
            match row.columns.into_iter().next().flatten() {
                Some(CqlValue::Blob(v)) => Some(v),
                _ => None,
            }
        }) else {
            // Completed meanwhile, by its writer or another sweeper.
            return Ok(false);
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
        Ok(true)
    }
}
