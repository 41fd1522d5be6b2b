//! The engine's errors: what the caller did wrong, kept apart from what went
//! wrong inside.

use tarn_store::StoreError;

/// Everything an engine operation can answer instead of a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Malformed or out-of-range input.
    #[error("{0}")]
    InvalidInput(String),
    /// The operation needs a signed-in caller, or the credentials are wrong.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's role does not allow the operation.
    #[error("{0}")]
    Forbidden(String),
    /// No such thing, or the caller may not know it exists.
    #[error("{0}")]
    NotFound(String),
    /// The thing exists already, or the change would break an invariant
    /// (a group cycle, no manager left).
    #[error("{0}")]
    Conflict(String),
    /// `If-Match` named another version than the current one (or a weak
    /// tag, [`crate::WEAK_TAG`], which never matches).
    #[error("the item is at version {current}{}", asked(*.expected))]
    VersionMismatch {
        /// The version asked for.
        expected: u64,
        /// The version the item has.
        current: u64,
    },
    /// No declared index serves the listing or search; `name` and
    /// `declare` say what would, as a request the administrator can send.
    #[error("no index serves this {what}; declare one: PUT /api/v1/indexes/{name} {declare}")]
    NoIndex {
        /// `listing` or `search`.
        what: &'static str,
        /// A name no index has.
        name: String,
        /// The body of a declaration that would serve it, as JSON.
        declare: String,
    },
    /// The index that serves the listing is still being built.
    #[error("index {0} is still being built")]
    IndexBuilding(String),
    /// Over a size limit.
    #[error("{0}")]
    TooLarge(String),
    /// A feed cursor older than the changes kept: list again.
    #[error("{0}")]
    Gone(String),
    /// Too many attempts; try again after `retry_after` seconds.
    #[error("{detail}")]
    RateLimited {
        /// What was limited.
        detail: String,
        /// Seconds to wait.
        retry_after: u64,
    },
    /// The store could not serve, even after retries; try again later.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    /// A store failure that retrying will not mend (logged, never shown).
    #[error("internal error: {0}")]
    Internal(String),
    /// A store error on its way to the retry loop.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl EngineError {
    /// Whether the operation should be run again from the start: the store
    /// reported a conflict or a guard on data this operation read failed.
    pub(crate) fn is_retry(&self) -> bool {
        match self {
            EngineError::Store(e) => {
                e.is_retryable() || matches!(e, StoreError::GuardFailed { .. })
            }
            _ => false,
        }
    }

    /// What a store error becomes once retries are over: every store
    /// failure is `Unavailable` (answered 503 with `Retry-After`), but a
    /// request the store refuses as malformed, which is the caller's input.
    pub(crate) fn settle(self) -> EngineError {
        match self {
            EngineError::Store(StoreError::Invalid(m)) => EngineError::InvalidInput(m),
            EngineError::Store(StoreError::GuardFailed { .. }) => {
                EngineError::Unavailable("too many concurrent changes; try again".into())
            }
            EngineError::Store(e) => EngineError::Unavailable(e.to_string()),
            other => other,
        }
    }
}

/// Result of engine operations.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

pub(crate) fn corrupt(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(format!("corrupt {what}: {e}"))
}

/// What a version mismatch says of the version asked for.
fn asked(expected: u64) -> String {
    if expected == crate::WEAK_TAG {
        ", and If-Match compares strongly: a weak ETag (W/) never matches".into()
    } else if expected == crate::FOREIGN_TAG {
        ", and If-Match named no ETag this server gives".into()
    } else {
        format!(", not {expected}")
    }
}
