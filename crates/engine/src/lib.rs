//! Tarn's engine: principals, groups, items, sharing, declared indexes and
//! ACL-aware listings, on top of the storage contract (`tarn-store`) and
//! nothing else — no HTTP, no database driver.
//!
//! Every user-visible operation is one method of [`Engine`] that takes the
//! caller as presented (a session token, or nobody), opens one read
//! snapshot, resolves who the caller is and what they belong to through it
//! together with everything else the operation reads, drops it, and ends in
//! at most one atomic store write guarded on what it read. A store conflict
//! or a failed guard runs the whole operation again (bounded, with
//! backoff). Nothing is kept between operations but decoded index
//! declarations, looked up by the declarations version each operation reads
//! in its own snapshot, so nothing kept can be stale: a revocation holds on
//! the next call on every node.
//!
//! Listings never filter or sort items: each is answered from an index whose
//! partitions are keyed by reader principal (see [`indexes`] and
//! [`listing`]).

#![warn(missing_docs)]

mod actor;
mod bodies;
mod changes;
mod error;
mod groups;
pub mod indexes;
mod items;
pub mod keys;
pub mod listing;
mod model;
mod schema;
mod search;
pub mod text;
mod throttle;
mod transfer;
mod users;

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tarn_store::{Batch, Snapshot, SnapshotExt, Store, StoreError};

pub use bodies::{check_content_type, media_essence, BodyRange, BodyReader, BodyUpload};
pub use changes::{Change, ChangeOp, ChangePage, Event, Subscription, POLL};
pub use error::{EngineError, Result};
pub use groups::MemberPage;
pub use indexes::{written_field, Heads, IndexDef, IndexState, Readers, SortField, TextField};
pub use items::{link_id, LinkInfo, FOREIGN_TAG, WEAK_TAG};
pub use keys::{Cut, Order};
pub use listing::{ListQuery, Page, Scope};
pub use model::{
    is_valid_name, merge_patch, BodyMeta, Grant, Group, Item, ItemView, Principal, Properties,
    Role, User,
};
pub use search::{Hit, Impacts, SearchPage, SearchQuery, MAX_EXPANSION, MAX_QUERY, MAX_WORDS};
pub use throttle::{sign_in_delay, ADDRESS_FAILURES, PAIR_FAILURES};
pub use transfer::{Importer, Moved, Record};
pub use users::{Me, NewUser, PasswordCost};

/// Who is asking, as a request presents it. Credentials are checked inside
/// each operation, in the same snapshot as the rest of its reads, so nothing
/// about a request is decided twice or in two states of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// No credentials: principal `everyone` only.
    Anonymous,
    /// A session token, checked by the operation.
    Token(String),
    /// A user the process itself vouches for (the command line, tests):
    /// no session is checked, memberships are read as for anyone.
    User {
        /// The username.
        username: String,
        /// Whether the user acts as an administrator.
        admin: bool,
    },
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
    /// Most attempts of one operation when the store reports conflicts.
    pub max_attempts: u32,
    /// Password hashes computed at once. Each Argon2id hash takes its
    /// memory cost and tens of milliseconds of a core: bounding them keeps
    /// memory flat and leaves cores to every other request when sign-ins
    /// pile up.
    pub password_hashers: usize,
    /// Sign-ins that may wait for a hasher, and as many sign-ups (and
    /// password changes) apart; past it they are answered `unavailable` at
    /// once instead of queueing for seconds. By default 64 a hasher: about
    /// 0.8 s of hashing at 12 ms a hash, so a burst of a few dozen sign-ups
    /// (a class joining at once) is served, not refused; with both queues
    /// full a sign-in waits up to 128 hashes a hasher (about 1.5 s).
    pub password_queue: usize,
    /// The longest a slowed sign-in waits ([`throttle::sign_in_delay`]).
    pub max_sign_in_delay: std::time::Duration,
    /// Groups one user may create per hour (administrators are not counted).
    pub groups_per_hour: u32,
    /// Uploads whose bytes are hashed and stored at once; others wait (and
    /// their clients with them, by TCP flow control), so uploads never take
    /// more than this many cores from readers.
    pub upload_slots: usize,
    /// The share of the time (0 to 1) an upload place may be working:
    /// after working for a while an upload rests at its place, so the
    /// socket reads, hashing, store writes and copies that uploads cost
    /// leave readers the rest of the machine. 1 means never rest.
    pub upload_share: f64,
    /// The node's requests being served, uploads among them, as counted by
    /// the HTTP layer: uploads rest only while it counts others. Without
    /// it they always rest.
    pub requests_in_flight: Option<Arc<AtomicI64>>,
    /// How long a replaced or deleted body's bytes stay readable, so that
    /// downloads that started before the change finish.
    pub body_grace: Duration,
    /// How often a node looks for bodies whose grace is over (and uploads
    /// abandoned by a node that stopped) to remove their bytes, and for
    /// changes older than the retention.
    pub sweep_every: Duration,
    /// How long changes are kept for `/changes` and `/events`.
    pub feed_retention: Duration,
    /// How often a node building or dropping an index says it still is
    /// (a row of the index's own). Every node looks at that row as often;
    /// one that has not changed for six of these is taken to be a stopped
    /// node's, and its work is taken up.
    pub index_beat: Duration,
    /// How long a declaration waits for its index's build before it
    /// answers `building`: an index over a kind of few items (a new
    /// application's) answers `ready`, and the next request may use it at
    /// once, on any node.
    pub build_wait: Duration,
    /// How long a group nesting written but not yet checked (see
    /// `groups`) may hold up other nesting changes: one older than this
    /// is taken to be a stopped node's, and removed. Keep it longer than
    /// the clocks of two nodes may differ, and than a Cassandra write's
    /// intent may wait for the sweeper.
    pub nesting_timeout: Duration,
    /// Event streams open at once on one node.
    pub max_streams: usize,
    /// Event streams one user may hold open at once on one node.
    pub max_streams_per_user: usize,
    /// Source of timestamps.
    pub clock: Clock,
}

/// Sign-ins (and, apart, sign-ups) that may wait for each password hasher
/// by default ([`EngineConfig::password_queue`]).
pub const PASSWORD_QUEUE_PER_HASHER: usize = 64;

impl Default for EngineConfig {
    fn default() -> Self {
        let hashers = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
        EngineConfig {
            password_cost: PasswordCost::default(),
            session_ttl: Duration::from_secs(30 * 24 * 3600),
            max_properties: 64 * 1024,
            max_body: 1 << 30,
            max_attempts: 12,
            password_hashers: hashers,
            password_queue: PASSWORD_QUEUE_PER_HASHER * hashers,
            max_sign_in_delay: std::time::Duration::from_millis(500),
            groups_per_hour: 1000,
            upload_slots: hashers,
            upload_share: 0.5,
            requests_in_flight: None,
            body_grace: Duration::from_secs(6 * 3600),
            sweep_every: Duration::from_secs(60),
            feed_retention: Duration::from_secs(7 * 24 * 3600),
            index_beat: Duration::from_secs(5),
            build_wait: Duration::from_secs(2),
            nesting_timeout: Duration::from_secs(60),
            max_streams: 10_000,
            max_streams_per_user: 16,
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
    /// Distinguishes this engine's entries in per-thread caches.
    id: u64,
    /// Buckets of the partitions every reader shares (`everyone`,
    /// `authenticated`): the store's layout, fixed when it was created.
    split: u32,
    retries: AtomicU64,
    /// The bounded pool of password hashing (like a connection pool: the
    /// only thing requests share besides the store's pools).
    hashing: tokio::sync::Semaphore,
    /// Callers waiting for a hasher, sign-ins and new passwords apart
    /// (`users::Hashing`), to bound each queue.
    hash_waiting: [AtomicUsize; 2],
    /// The node's change hub.
    hub: changes::Hub,
    /// The places of uploads working at once (see `upload_slots`).
    uploads: tokio::sync::Semaphore,
    /// Uploads begun and not yet finished or dropped.
    uploads_open: AtomicI64,
    /// Microseconds uploads rested at their places, since start.
    upload_rest: AtomicU64,
    /// The store's cursor key, read once (it never changes).
    cursor_key: tokio::sync::OnceCell<Vec<u8>>,
    /// Places for the store work of index builds and drops on this node:
    /// half the store's connections where those are bounded, so that
    /// requests keep the other half (see `indexes::for_each_item`).
    background: tokio::sync::Semaphore,
    /// The index work this node runs in the background: claimed when
    /// it starts (by a declaration or a drop, an administrator's rare
    /// requests, or by the node's watch) and given up when it ends; no
    /// other request reads it.
    index_work: std::sync::Mutex<std::collections::HashSet<indexes::Task>>,
}

impl Engine {
    /// An engine over `store`. Call [`Engine::start`] once when serving, to
    /// check the store's layout and finish index work a stopped node left.
    pub fn new(store: Arc<dyn Store>, config: EngineConfig) -> Engine {
        let hashers = config.password_hashers.max(1);
        let uploads = config.upload_slots.max(1);
        let split = store.partition_split().clamp(1, 64);
        let background = indexes::background_places(store.connections());
        Engine {
            inner: Arc::new(Inner {
                store,
                config,
                id: random_u64(),
                split,
                retries: AtomicU64::new(0),
                hashing: tokio::sync::Semaphore::new(hashers),
                hash_waiting: [AtomicUsize::new(0), AtomicUsize::new(0)],
                hub: changes::Hub::new(),
                uploads: tokio::sync::Semaphore::new(uploads),
                uploads_open: AtomicI64::new(0),
                upload_rest: AtomicU64::new(0),
                cursor_key: tokio::sync::OnceCell::new(),
                background: tokio::sync::Semaphore::new(background),
                index_work: std::sync::Mutex::default(),
            }),
        }
    }

    /// The key cursors are sealed with: random bytes kept in the store,
    /// made by the first node to need them, the same on every node, never
    /// shown, and new in a store made by an import. Read once a process:
    /// it never changes, so nothing read from it is ever stale.
    pub(crate) async fn cursor_key(&self) -> Result<&[u8]> {
        let key = schema::cursor_key_row();
        let made = self
            .inner
            .cursor_key
            .get_or_try_init(|| {
                self.retrying(|| async {
                    if let Some(row) = self.snapshot().await?.get(&key).await? {
                        return Ok(row.value);
                    }
                    // Another node making it first fails this guard; the
                    // retry reads theirs.
                    let fresh = random_bytes::<16>().to_vec();
                    let mut b = Batch::new();
                    b.put(key.clone(), fresh.clone(), 1)
                        .guard(key.clone(), tarn_store::Expect::Absent);
                    self.store().write(b).await?;
                    Ok(fresh)
                })
            })
            .await?;
        Ok(made)
    }

    /// Waits for one of the node's upload places.
    pub(crate) async fn upload_place(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        place(&self.inner.uploads, "upload").await
    }

    /// A place for one store call of background index work (see
    /// `indexes::for_each_item`).
    pub(crate) async fn background_place(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        place(&self.inner.background, "background").await
    }

    /// Counts an upload as open (`1`) or over (`-1`).
    pub(crate) fn count_upload(&self, by: i64) {
        self.inner.uploads_open.fetch_add(by, Ordering::Relaxed);
    }

    /// Whether the node serves requests besides its uploads (always, when
    /// nobody counts them).
    pub(crate) fn serving_others(&self) -> bool {
        let uploads = self.inner.uploads_open.load(Ordering::Relaxed);
        let requests = self.inner.config.requests_in_flight.as_ref();
        requests.is_none_or(|n| n.load(Ordering::Relaxed) > uploads)
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

    /// How long uploads rested at their places (see
    /// [`EngineConfig::upload_share`]), since start.
    pub fn upload_rest(&self) -> Duration {
        Duration::from_micros(self.inner.upload_rest.load(Ordering::Relaxed))
    }

    pub(crate) fn count_upload_rest(&self, rest: Duration) {
        self.inner
            .upload_rest
            .fetch_add(rest.as_micros() as u64, Ordering::Relaxed);
    }

    pub(crate) fn now(&self) -> i64 {
        self.inner.config.clock.now()
    }

    pub(crate) fn split(&self) -> u32 {
        self.inner.split
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// Writes a batch that records changes, and wakes this node's hub.
    pub(crate) async fn write_changes(&self, b: Batch) -> Result<()> {
        self.inner.store.write(b).await?;
        self.inner.hub.nudge();
        Ok(())
    }

    /// A read snapshot of the store: every read of an operation goes
    /// through one, dropped before the operation writes.
    pub(crate) async fn snapshot(&self) -> Result<Box<dyn Snapshot>> {
        Ok(self.inner.store.snapshot().await?)
    }

    /// Checks the store's layout (written by the first start) against this
    /// engine's, then resumes index builds and drops a stopped node left,
    /// and watches for those another node stops while this one runs.
    pub async fn start(&self) -> Result<()> {
        self.check_layout().await?;
        self.resume_index_work().await?;
        self.watch_index_work();
        self.resume_sweeps();
        self.resume_trims();
        Ok(())
    }

    /// Writes the store's layout at its first start; refuses a store laid
    /// out for another number of buckets than this backend asks for.
    async fn check_layout(&self) -> Result<()> {
        let key = schema::layout_key();
        let want = self.split();
        let row = self
            .retrying(|| async { Ok(self.snapshot().await?.get(&key).await?) })
            .await?;
        match row {
            Some(r) => {
                let have: u32 = schema::decode("layout", &r)?;
                if have != want {
                    return Err(EngineError::Conflict(format!(
                        "this store was laid out for {have} buckets and this backend asks for {want}; move it with tarn export and tarn import"
                    )));
                }
                Ok(())
            }
            None => {
                let mut b = tarn_store::Batch::new();
                b.put(key.clone(), schema::encode(&want), 1)
                    .guard(key.clone(), tarn_store::Expect::Absent);
                match self.store().write(b).await {
                    Ok(()) | Err(tarn_store::StoreError::GuardFailed { .. }) => Ok(()),
                    Err(e) => Err(EngineError::from(e).settle()),
                }
            }
        }
    }

    /// Writes `b`, whose guards say its new row is absent; `taken()` when
    /// it is not. A write the store did not apply because a concurrent one
    /// won (a lightweight transaction under contention) is tried again,
    /// and then finds the row if that other write made it.
    pub(crate) async fn create_row(&self, b: Batch, taken: impl Fn() -> EngineError) -> Result<()> {
        self.retrying(|| async {
            match self.store().write(b.clone()).await {
                Err(StoreError::GuardFailed { .. }) => Err(taken()),
                written => Ok(written?),
            }
        })
        .await
    }

    /// Runs `op` until it succeeds, fails for good, or has used its
    /// attempts. Store conflicts, failed guards (data changed since it was
    /// read) and unavailability (a store busy or unreachable) are retried,
    /// with jittered exponential backoff.
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
                    // 4, 8, ... ms, at most 128 (and as much again of
                    // jitter): twelve attempts wait at most about 2 s, so a
                    // row many write at once (one item, edited by all)
                    // still takes each writer in turn.
                    let base = 2u64 << attempt.min(6);
                    let jitter = random_u64() % base.max(1);
                    tokio::time::sleep(Duration::from_millis(base + jitter)).await;
                }
                Err(e) => return Err(e.settle()),
            }
        }
    }
}

/// Waits for a place of `places` (a node's bounded pool of `what` work;
/// never closed, so waiting fails only if it were).
async fn place<'a>(
    places: &'a tokio::sync::Semaphore,
    what: &str,
) -> Result<tokio::sync::SemaphorePermit<'a>> {
    places
        .acquire()
        .await
        .map_err(|e| EngineError::Internal(format!("{what} places: {e}")))
}

/// One read of `gets` and `scans`, split into as few calls as the store's
/// per-call bounds allow (one, but for callers in very many groups).
pub(crate) async fn read(
    snap: &mut Box<dyn Snapshot>,
    gets: &[tarn_store::Key],
    scans: &[tarn_store::Scan],
) -> Result<tarn_store::ReadResult> {
    let rows: usize = scans.iter().map(|s| s.limit).sum();
    if gets.len() <= tarn_store::MAX_READ_KEYS && rows <= tarn_store::MAX_READ_ROWS {
        return Ok(snap.read(gets, scans).await?);
    }
    let mut out = tarn_store::ReadResult::default();
    for chunk in gets.chunks(tarn_store::MAX_READ_KEYS) {
        out.rows.extend(snap.read(chunk, &[]).await?.rows);
    }
    let mut start = 0;
    while start < scans.len() {
        let mut end = start;
        let mut budget = 0;
        while end < scans.len()
            && (end == start || budget + scans[end].limit <= tarn_store::MAX_READ_ROWS)
        {
            budget += scans[end].limit;
            end += 1;
        }
        out.scans
            .extend(snap.read(&[], &scans[start..end]).await?.scans);
        start = end;
    }
    Ok(out)
}

pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the OS random source works");
    b
}

/// A new item's or body's id: 22 characters of `[-0-9A-Z_a-z]` that sort,
/// as bytes, by the millisecond it was made, then 80 random bits.
///
/// Every row keyed by such an id (an item's own row, its row in its kind's
/// bucket, a body's chunks) then goes beside the rows of the ones made just
/// before it, instead of into a random page of the store: a commit of
/// sixteen creates dirties a few pages for them, not thirty-two (WAL
/// frames, checkpoint copies and, on PostgreSQL, index pages). Ids stay
/// opaque to clients (api.md); they tell the time they were made, and 80
/// random bits (not 128) keep them unguessable.
pub(crate) fn new_id() -> String {
    use base64::Engine as _;
    // base64url's 64 characters in ASCII order, so that the encoding keeps
    // the order of the bytes.
    const SORTED: base64::alphabet::Alphabet = match base64::alphabet::Alphabet::new(
        "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz",
    ) {
        Ok(a) => a,
        Err(_) => panic!("64 distinct characters"),
    };
    const ENGINE: base64::engine::GeneralPurpose =
        base64::engine::GeneralPurpose::new(&SORTED, base64::engine::general_purpose::NO_PAD);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6..].copy_from_slice(&random_bytes::<10>());
    ENGINE.encode(bytes)
}

pub(crate) fn random_u64() -> u64 {
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

/// An opaque cursor: `bytes` and four bytes of their keyed hash, with the
/// store's cursor key (see [`Engine::cursor_key`]) and `route`: a cursor
/// cut short, altered by hand, made up, handed to another route or taken
/// from another store is refused instead of read as another place. (A
/// cursor grants nothing; it only says where a page ends. The key keeps a
/// client from making up a place no page ended at, such as a feed cursor
/// far past the end, which would hide every change from it.)
pub(crate) fn seal(key: &[u8], route: &[u8], bytes: &[u8]) -> String {
    let mut c = Vec::with_capacity(bytes.len() + SEAL);
    c.extend_from_slice(bytes);
    c.extend_from_slice(&seal_of(key, route, bytes));
    b64(&c)
}

/// The bytes of a cursor [`seal`]ed with `key` for `route`; `None` when it
/// is not one, whole.
pub(crate) fn unseal(key: &[u8], route: &[u8], cursor: &str) -> Option<Vec<u8>> {
    let mut c = unb64(cursor)?;
    let at = c.len().checked_sub(SEAL)?;
    (seal_of(key, route, &c[..at]) == c[at..]).then(|| {
        c.truncate(at);
        c
    })
}

/// The seal; without a key and a route, the unkeyed seal of feed cursors
/// made before either (still recognised, to answer them `Gone`).
fn seal_of(key: &[u8], route: &[u8], bytes: &[u8]) -> [u8; SEAL] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    if !key.is_empty() || !route.is_empty() {
        h.update((key.len() as u32).to_be_bytes());
        h.update(key);
        h.update(route);
        h.update([0]);
    }
    h.update(bytes);
    h.finalize()[..SEAL].try_into().expect("SEAL bytes")
}

const SEAL: usize = 4;

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of hex digits, if they are.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// Microseconds since the epoch of an RFC 3339 time (any offset); `None`
/// if it is not one.
pub(crate) fn parse_time(t: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1000).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_the_time_they_were_made() {
        let base64url = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(new_id());
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        for id in &ids {
            assert_eq!(id.len(), 22, "{id}");
            assert!(id.chars().all(base64url), "{id}");
        }
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "ids made 2 ms apart sort in the order made");
        // Made within one millisecond they differ by their random part.
        let many: std::collections::BTreeSet<String> = (0..10_000).map(|_| new_id()).collect();
        assert_eq!(many.len(), 10_000);
    }
}
