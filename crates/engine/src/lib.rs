//! Tarn's engine: principals, groups, items, sharing, declared indexes and
//! ACL-aware listings, on top of the storage contract (`tarn-store`) and
//! nothing else — no HTTP, no database driver.
//!
//! Every user-visible operation is one method of [`Engine`] that takes the
//! caller, reads what it needs, and ends in one atomic store write guarded on
//! what it read. A store conflict or a failed guard runs the whole operation
//! again (bounded, with backoff); nothing is cached between operations, so a
//! revocation holds on the next call on every node.
//!
//! Listings never filter or sort items: each is answered from an index whose
//! partitions are keyed by reader principal (see [`indexes`] and
//! [`listing`]).

#![warn(missing_docs)]

mod bodies;
mod error;
mod groups;
pub mod indexes;
mod items;
pub mod keys;
pub mod listing;
mod model;
mod schema;
mod throttle;
mod users;

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tarn_store::Store;

pub use bodies::{BodyRange, BodyReader, BodyUpload};
pub use error::{EngineError, Result};
pub use groups::MemberPage;
pub use indexes::{IndexDef, IndexState, SortField};
pub use keys::Order;
pub use listing::{ListQuery, Page, Scope};
pub use model::{
    is_valid_name, merge_patch, BodyMeta, Grant, Group, Item, ItemView, Principal, Role, User,
};
pub use throttle::{ADDRESS_FAILURES, USER_FAILURES};
pub use users::{Me, NewUser, PasswordCost};

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// No credentials: principal `everyone` only.
    Anonymous,
    /// A signed-in user.
    User {
        /// The username.
        username: String,
        /// Whether the user is an administrator.
        admin: bool,
    },
}

impl Caller {
    /// The username, if signed in.
    pub fn username(&self) -> Option<&str> {
        match self {
            Caller::Anonymous => None,
            Caller::User { username, .. } => Some(username),
        }
    }

    /// Whether the caller is an administrator.
    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::User { admin: true, .. })
    }

    pub(crate) fn require_user(&self) -> Result<&str> {
        self.username()
            .ok_or_else(|| EngineError::Unauthenticated("sign in first".into()))
    }

    pub(crate) fn require_admin(&self) -> Result<()> {
        self.require_user()?;
        if self.is_admin() {
            Ok(())
        } else {
            Err(EngineError::Forbidden("administrators only".into()))
        }
    }
}

/// Where time comes from.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The system clock.
    #[default]
    System,
    /// A counter that advances one millisecond at every reading, for tests
    /// that need distinct, predictable times.
    Stepping(Arc<AtomicI64>),
}

impl Clock {
    /// Microseconds since the Unix epoch.
    pub fn now(&self) -> i64 {
        match self {
            Clock::System => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64),
            Clock::Stepping(c) => c.fetch_add(1000, Ordering::Relaxed) + 1000,
        }
    }
}

/// Settings of an [`Engine`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Argon2id cost of password hashes.
    pub password_cost: PasswordCost,
    /// How long a session lasts.
    pub session_ttl: Duration,
    /// Largest `properties` object, serialised, in bytes.
    pub max_properties: usize,
    /// Largest item body, in bytes.
    pub max_body: u64,
    /// Bound on how long a write may take between reading the index
    /// declarations and committing. Index builds wait twice this before
    /// backfilling, so no write that missed a new index can land after it.
    pub write_lease: Duration,
    /// Most attempts of one operation when the store reports conflicts.
    pub max_attempts: u32,
    /// Password hashes computed at once. Each Argon2id hash takes its
    /// memory cost and tens of milliseconds of a core: bounding them keeps
    /// memory flat and leaves cores to every other request when sign-ins
    /// pile up.
    pub password_hashers: usize,
    /// Source of timestamps.
    pub clock: Clock,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            password_cost: PasswordCost::default(),
            session_ttl: Duration::from_secs(30 * 24 * 3600),
            max_properties: 64 * 1024,
            max_body: 1 << 30,
            write_lease: Duration::from_secs(2),
            max_attempts: 8,
            password_hashers: std::thread::available_parallelism()
                .map_or(1, |n| (n.get() / 2).max(1)),
            clock: Clock::System,
        }
    }
}

/// The engine. Cheap to clone; clones share the store's pools and nothing
/// else mutable but counters.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    config: EngineConfig,
    retries: AtomicU64,
    /// The bounded pool of password hashing (like a connection pool: the
    /// only thing requests share besides the store's pools).
    hashing: tokio::sync::Semaphore,
}

impl Engine {
    /// An engine over `store`. Call [`Engine::resume_index_work`] once at
    /// start to finish index builds and drops a stopped node left behind.
    pub fn new(store: Arc<dyn Store>, config: EngineConfig) -> Engine {
        let hashers = config.password_hashers.max(1);
        Engine {
            inner: Arc::new(Inner {
                store,
                config,
                retries: AtomicU64::new(0),
                hashing: tokio::sync::Semaphore::new(hashers),
            }),
        }
    }

    /// The store behind the engine.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// How many times operations were run again after a conflict, since start.
    pub fn retries(&self) -> u64 {
        self.inner.retries.load(Ordering::Relaxed)
    }

    pub(crate) fn now(&self) -> i64 {
        self.inner.config.clock.now()
    }

    /// Runs `op` until it succeeds, fails for good, or has used its attempts.
    /// Only store conflicts and failed guards (data changed since it was
    /// read) are retried, with jittered exponential backoff.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut attempt = 0;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retry() && attempt + 1 < self.inner.config.max_attempts => {
                    attempt += 1;
                    self.inner.retries.fetch_add(1, Ordering::Relaxed);
                    let base = 2u64 << attempt.min(8);
                    let jitter = random_u64() % base.max(1);
                    tokio::time::sleep(Duration::from_millis(base + jitter)).await;
                }
                Err(e) => return Err(e.settle()),
            }
        }
    }
}

pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the OS random source works");
    b
}

fn random_u64() -> u64 {
    u64::from_le_bytes(random_bytes::<8>())
}

pub(crate) fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

pub(crate) fn unb64(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// Formats microseconds since the epoch as RFC 3339 UTC with microseconds.
pub fn format_time(micros: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    ))
    .unwrap_or_default()
}
