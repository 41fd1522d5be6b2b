//! From driver errors to [`StoreError`], and what a failed lightweight
//! transaction may have done.

use scylla::errors::{
    DbError, ExecutionError, NewSessionError, PrepareError, RequestAttemptError, WriteType,
};
use tarn_store::StoreError;

/// The database error inside an execution error, if the coordinator answered
/// one.
fn db_error(e: &ExecutionError) -> Option<(&DbError, &str)> {
    match e {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, msg)) => Some((db, msg)),
        _ => None,
    }
}

/// Maps an error of a read or of an idempotent write: timeouts, overload
/// and unreachable nodes are [`StoreError::Unavailable`] (retrying later may
/// succeed), requests Cassandra refuses are [`StoreError::Invalid`].
pub(crate) fn map_exec(e: ExecutionError) -> StoreError {
    let text = e.to_string();
    if let Some((db, msg)) = db_error(&e) {
        return map_db(db, msg);
    }
    match e {
        ExecutionError::BadQuery(_) => StoreError::Invalid(text),
        ExecutionError::PrepareError(p) => map_prepare(p),
        // No node to send to, a broken connection, a client-side timeout.
        _ => StoreError::Unavailable(text),
    }
}

/// What [`StoreError::Unavailable`] says after a refusal for schema lag
/// (schema.rs looks for it).
pub(crate) const SCHEMA_LAG: &str = "a Cassandra node does not know the keyspace or table";

/// Whether the coordinator refused a statement because it does not know the
/// store's keyspace or table: a node that missed the schema change while it
/// was down answers so until gossip brings it. The store created both when
/// it connected, so the refusal is transient (unless an operator dropped
/// them); see `retry.rs`. Cassandra 5 says `keyspace x does not exist` and
/// `table x does not exist` to statements, `Keyspace 'x' doesn't exist`
/// and `Table 'x' doesn't exist` to schema changes; 3.x said `unconfigured
/// table x`.
pub(crate) fn schema_lag(db: &DbError, msg: &str) -> bool {
    let msg = msg.to_ascii_lowercase();
    matches!(db, DbError::Invalid)
        && (((msg.starts_with("keyspace ") || msg.starts_with("table "))
            && (msg.ends_with("does not exist") || msg.ends_with("doesn't exist")))
            || msg.starts_with("unconfigured table "))
}

fn map_db(db: &DbError, msg: &str) -> StoreError {
    let text = format!("{db}: {msg}");
    if schema_lag(db, msg) {
        return StoreError::Unavailable(format!(
            "{text} ({SCHEMA_LAG}: not learnt yet, or dropped)"
        ));
    }
    match db {
        DbError::SyntaxError | DbError::Invalid | DbError::ConfigError => {
            if msg.contains("Batch too large") {
                StoreError::Invalid(format!(
                    "{text} (raise batch_size_fail_threshold in cassandra.yaml, or lower \
                     CassandraOptions::max_batch_bytes)"
                ))
            } else {
                StoreError::Invalid(text)
            }
        }
        DbError::Unavailable { .. }
        | DbError::Overloaded
        | DbError::IsBootstrapping
        | DbError::ReadTimeout { .. }
        | DbError::WriteTimeout { .. }
        | DbError::ReadFailure { .. }
        | DbError::WriteFailure { .. }
        | DbError::RateLimitReached { .. }
        | DbError::TruncateError => StoreError::Unavailable(text),
        _ => StoreError::Other(text),
    }
}

/// Whether an idempotent write that failed so is worth sending again: the
/// cluster was short of replicas or of time, not refusing the request.
pub(crate) fn worth_retrying(e: &ExecutionError) -> bool {
    match db_error(e) {
        Some((db, _)) => matches!(
            db,
            DbError::WriteTimeout { .. } | DbError::Unavailable { .. } | DbError::Overloaded
        ),
        None => matches!(
            e,
            ExecutionError::EmptyPlan
                | ExecutionError::ConnectionPoolError(_)
                | ExecutionError::RequestTimeout(_)
                | ExecutionError::LastAttemptError(RequestAttemptError::BrokenConnectionError(_))
        ),
    }
}

/// Maps a failure to prepare a statement (at connect time).
pub(crate) fn map_prepare(e: PrepareError) -> StoreError {
    let text = e.to_string();
    match e {
        PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(db, msg),
        } => map_db(&db, &msg),
        _ => StoreError::Unavailable(text),
    }
}

/// Maps a failure to open a session.
pub(crate) fn map_session(e: NewSessionError) -> StoreError {
    match e {
        NewSessionError::EmptyKnownNodesList | NewSessionError::IllegalConfig(_) => {
            StoreError::Invalid(e.to_string())
        }
        other => StoreError::Unavailable(format!("cannot reach Cassandra: {other}")),
    }
}

/// What a conditional batch that returned an error may have done.
#[derive(Debug)]
pub(crate) enum LwtFailure {
    /// It surely did not run (refused before any replica saw it).
    NotApplied(StoreError),
    /// It may have been applied: look for its write id.
    Unknown {
        /// A Paxos timeout (`WriteTimeout` of type CAS), which is how
        /// Cassandra reports contention on a partition.
        contention: bool,
        cause: String,
    },
}

/// Sorts an error of a conditional batch into "surely not applied" and
/// "unknown": a timeout of type CAS, a broken connection or a client-side
/// timeout after the request left may all hide an applied transaction.
pub(crate) fn classify_lwt(e: ExecutionError) -> LwtFailure {
    let cause = e.to_string();
    if let Some((db, msg)) = db_error(&e) {
        return match db {
            DbError::WriteTimeout {
                write_type: WriteType::Cas,
                ..
            } => LwtFailure::Unknown {
                contention: true,
                cause,
            },
            DbError::SyntaxError
            | DbError::Invalid
            | DbError::ConfigError
            | DbError::Unauthorized
            | DbError::AuthenticationError
            | DbError::Overloaded
            | DbError::IsBootstrapping
            | DbError::Unprepared { .. } => LwtFailure::NotApplied(map_db(db, msg)),
            DbError::RateLimitReached {
                rejected_by_coordinator: true,
                ..
            } => LwtFailure::NotApplied(map_db(db, msg)),
            _ => LwtFailure::Unknown {
                contention: false,
                cause,
            },
        };
    }
    match e {
        ExecutionError::BadQuery(_) => LwtFailure::NotApplied(StoreError::Invalid(cause)),
        ExecutionError::EmptyPlan | ExecutionError::ConnectionPoolError(_) => {
            LwtFailure::NotApplied(StoreError::Unavailable(cause))
        }
        ExecutionError::PrepareError(p) => LwtFailure::NotApplied(map_prepare(p)),
        _ => LwtFailure::Unknown {
            contention: false,
            cause,
        },
    }
}
