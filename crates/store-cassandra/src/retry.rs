//! The driver's retry policy for every statement of the store: the driver's
//! default, plus another node for a coordinator that does not know the
//! store's keyspace or table yet.
//!
//! A Cassandra node that was down while the keyspace was created (or that
//! lost its last schema change to a kill) learns the schema from the others
//! by gossip some time after it takes clients again. Until then it refuses
//! every statement on the keyspace with `Invalid: keyspace ... does not
//! exist`. The refusal comes before anything runs, so sending the statement
//! to the next node is safe for any statement, idempotent or not, a
//! lightweight transaction included.

use std::sync::Arc;

use scylla::errors::RequestAttemptError;
use scylla::policies::retry::{
    DefaultRetryPolicy, FallthroughRetryPolicy, RequestInfo, RetryDecision, RetryPolicy,
    RetrySession,
};

use crate::error::schema_lag;

/// How many other nodes a statement refused for schema lag is sent to: with
/// a replication factor of three, a second refusal means two nodes lag,
/// which a retry later (503, Retry-After) serves better than a third.
const SCHEMA_LAG_RETRIES: u8 = 2;

/// Another policy, and the next node for a statement refused by a
/// coordinator that lags behind the schema.
#[derive(Debug)]
pub(crate) struct StorePolicy {
    otherwise: Arc<dyn RetryPolicy>,
}

impl StorePolicy {
    /// The driver's default otherwise: for reads and idempotent writes.
    pub(crate) fn or_default() -> StorePolicy {
        StorePolicy {
            otherwise: Arc::new(DefaultRetryPolicy::new()),
        }
    }

    /// Nothing else retried by the driver: for a lightweight transaction,
    /// whose unknown outcome the store learns itself, and for `SERIAL`
    /// reads, which the store retries knowing what it looks for.
    pub(crate) fn or_fall_through() -> StorePolicy {
        StorePolicy {
            otherwise: Arc::new(FallthroughRetryPolicy::new()),
        }
    }
}

impl RetryPolicy for StorePolicy {
    fn new_session(&self) -> Box<dyn RetrySession> {
        Box::new(StoreSession {
            otherwise: self.otherwise.new_session(),
            lag_retries: 0,
        })
    }
}

struct StoreSession {
    otherwise: Box<dyn RetrySession>,
    lag_retries: u8,
}

impl StoreSession {
    /// Whether `error` is a refusal for schema lag to send to the next node.
    fn passes_over(&mut self, error: &RequestAttemptError) -> bool {
        if let RequestAttemptError::DbError(db, msg) = error {
            if schema_lag(db, msg) && self.lag_retries < SCHEMA_LAG_RETRIES {
                self.lag_retries += 1;
                tracing::debug!(%error, "cassandra store: a node behind the schema; asking the next");
                return true;
            }
        }
        false
    }
}

impl RetrySession for StoreSession {
    fn decide_should_retry(&mut self, info: RequestInfo) -> RetryDecision {
        if self.passes_over(info.error) {
            return RetryDecision::RetryNextTarget(None);
        }
        self.otherwise.decide_should_retry(info)
    }

    fn reset(&mut self) {
        self.otherwise.reset();
        self.lag_retries = 0;
    }
}

#[cfg(test)]
mod tests {
    use scylla::errors::DbError;

    use super::*;

    fn session() -> StoreSession {
        StoreSession {
            otherwise: DefaultRetryPolicy::new().new_session(),
            lag_retries: 0,
        }
    }

    #[test]
    fn a_node_behind_the_schema_is_passed_over_twice() {
        let lag = RequestAttemptError::DbError(
            DbError::Invalid,
            "keyspace n_18ebe11ccb3b6db7_27364 does not exist".into(),
        );
        let mut s = session();
        assert!(s.passes_over(&lag));
        assert!(s.passes_over(&lag));
        assert!(!s.passes_over(&lag), "a third node is not asked");
        s.reset();
        assert!(s.passes_over(&lag), "a new request starts again");
    }

    #[test]
    fn every_wording_of_an_unknown_keyspace_or_table_is_schema_lag() {
        for msg in [
            "keyspace n_1 does not exist",
            "table n_1.rows does not exist",
            "Keyspace 'n_1' doesn't exist",
            "Table 'n_1.rows' doesn't exist",
            "unconfigured table rows",
        ] {
            assert!(schema_lag(&DbError::Invalid, msg), "{msg}");
        }
        for msg in [
            "Column 'x' doesn't exist on table rows",
            "Undefined column name x in table n_1.rows",
            "Batch too large",
        ] {
            assert!(!schema_lag(&DbError::Invalid, msg), "{msg}");
        }
    }

    #[test]
    fn other_refusals_are_left_to_the_default() {
        let mut s = session();
        for other in [
            RequestAttemptError::DbError(DbError::Invalid, "Batch too large".into()),
            RequestAttemptError::DbError(DbError::SyntaxError, "table rows does not exist".into()),
            RequestAttemptError::UnableToAllocStreamId,
        ] {
            assert!(!s.passes_over(&other), "{other}");
        }
    }
}
