//! The change feed: every item write and membership change appends an entry
//! to the store's `changes` feed in the same atomic write, and callers read
//! it back in commit order, filtered to what they may read.
//!
//! - [`Engine::changes`] pulls a bounded page from a cursor.
//! - Each serving node runs one *hub*: a single task that reads the feed
//!   from the store (woken by this node's own writes, reading at most every
//!   [`GAP`] so a stream of writes is read in batches, and every [`POLL`]
//!   otherwise, so changes committed on other nodes arrive too) and
//!   routes each entry to the subscribers registered under one of the
//!   principals it names (an item's readers before and after; a membership
//!   entry's member), each through a bounded queue of its own: a message to
//!   a room wakes the room's members, not every stream on the node. A
//!   [`Subscription`] then filters exactly, by intersecting each change's
//!   readers with its principals. A subscriber whose queue is full is
//!   dropped from the routes and grows no buffer: it catches up by pulling
//!   from the store, from its own last cursor, then listens again.
//! - Routes only widen while a stream lives: the hub adds the groups a join
//!   gained to the routes of those it reaches before routing the next entry,
//!   and a subscriber whose groups grow past its routes any other way adds
//!   them and pulls again from its last cursor, so no entry for a group it
//!   reached slips past it.
//! - An entry names the principals that could read the item before and
//!   after the write, and the item as it is after it; a membership entry
//!   names the principal whose groups changed and, when the write can say,
//!   the groups gained or lost: a subscriber among them applies that at the
//!   entry's place and tells its client to resync (`Subscription::check`
//!   says when it reads its groups from the store instead).
//! - Entries older than the retention are trimmed in bounded batches; a
//!   cursor older than the last trimmed entry is answered [`EngineError::Gone`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tarn_store::{Batch, FeedEntry, Key, Snapshot, SnapshotExt, Table};
use tokio::sync::{mpsc, Notify};

use crate::actor::Actor;
use crate::error::{EngineError, Result};
use crate::schema::{self, META};
use crate::{seal, unseal, Caller, Engine, Item, ItemView, Principal, Role};

/// The feed every change goes to.
pub(crate) const CHANGES: Table = Table::new("changes");
/// How often a hub reads the feed when nothing on its own node woke it:
/// the most a change committed on another node waits to be read here. One
/// indexed read of the feed's end; 20 a second cost a node nothing it
/// would notice.
pub const POLL: Duration = Duration::from_millis(50);
/// The least time between two of a hub's reads: under a stream of writes
/// the hub reads every few milliseconds, a batch each time, instead of once
/// for every write; after a quiet spell it reads at once.
const GAP: Duration = Duration::from_millis(5);
/// Entries a hub or a pull reads per store call.
const READ_BATCH: usize = 256;
/// Entries one pull looks at, at most, however few the caller may see.
const PULL_BUDGET: usize = 10_000;
/// Entries one subscriber's queue holds before it is made to pull.
const QUEUE: usize = 1024;
/// What one subscriber's queue may hold, by [`HubEntry::size`], before it
/// is made to pull: a stream that does not read pins no more than this.
const QUEUE_BYTES: usize = 1 << 20;
/// How often a stream checks its caller's session and groups.
const CHECK_EVERY: Duration = Duration::from_secs(30);
/// Stripes of the per-user stream counts.
const STRIPES: usize = 64;
/// On a store whose feed lags, how long a pull that reached the readable
/// end waits, at most, for the feed to become readable through the moment
/// it was asked: a write still landing holds the feed back longer (the
/// rest comes on a later poll). As long as Cassandra's fixed lag was.
const PULL_WAIT: Duration = Duration::from_secs(1);
/// How often such a pull looks whether the feed has become readable,
/// once the store's lag has passed.
const PULL_LOOK: Duration = Duration::from_millis(50);

/// One entry of the `changes` feed as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ChangeRow {
    /// When, microseconds since the epoch.
    pub at: i64,
    /// What changed.
    #[serde(flatten)]
    pub what: What,
}

/// What a change entry records.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "lowercase")]
pub(crate) enum What {
    /// An item was created, changed or deleted.
    Item {
        /// The item id.
        id: String,
        /// Its kind.
        kind: String,
        /// Its version after the change (before it, for a delete).
        version: u64,
        /// Its version before the change, for an item that was there (a
        /// remove carries it: the last version its caller could read).
        /// Absent in entries of older servers, whose writes in place all
        /// made `version` one higher.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        was: Option<u64>,
        /// Who could read it before.
        before: Vec<Principal>,
        /// Who can read it after.
        after: Vec<Principal>,
        /// The item after the change; `None` once deleted.
        item: Option<Box<Item>>,
    },
    /// The groups of a principal changed (it joined or left a group, or a
    /// group it is in was nested or unnested).
    Member {
        /// The principal, `user:<name>` or `group:<id>`.
        principal: String,
        /// Groups everyone reaching the principal now belongs to, as the
        /// write read them (a join).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gained: Option<Vec<String>>,
        /// Groups the principal, a user, no longer belongs to at all, as the
        /// write read them (a user's leave).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lost: Option<Vec<String>>,
    },
}

/// How a membership change moves the groups of those it touches, as its
/// write saw them. A subscriber applies it at the entry's place in the feed,
/// so the changes before and after the entry are filtered with the groups
/// the subscriber had then, not with whatever the store holds when the
/// entry is read (a later leave would already be in that).
pub(crate) enum Delta {
    /// Everyone reaching the principal gains these groups.
    Gained(Vec<String>),
    /// The principal (a user) loses these groups.
    Lost(Vec<String>),
    /// Not known from the entry alone (a group left a group: who loses what
    /// depends on each member's other paths): read the groups again.
    Unknown,
}

/// Whether a change puts an item in the caller's view or removes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeOp {
    /// The item is readable, as it now is.
    Put,
    /// The item is no longer visible (deleted, unshared, or access lost).
    Remove,
}

/// One change as one caller sees it.
#[derive(Clone, Debug)]
pub struct Change {
    /// Where it is in the feed (opaque).
    pub cursor: String,
    /// Put or remove.
    pub op: ChangeOp,
    /// The item id.
    pub id: String,
    /// The item's kind.
    pub kind: String,
    /// The item's version.
    pub version: u64,
    /// When, microseconds since the epoch.
    pub at: i64,
    /// The item as the caller reads it (puts only).
    pub item: Option<ItemView>,
}

/// A page of changes.
#[derive(Clone, Debug)]
pub struct ChangePage {
    /// The changes, in commit order.
    pub changes: Vec<Change>,
    /// Where to read on from.
    pub next: String,
    /// The caller's groups changed within the entries this page looked
    /// at (it, or a group it is in, joined or left a group): items came
    /// into or went out of its view with no change of their own, and
    /// changes before that point were filtered with its groups of now.
    /// The client re-lists what it shows, as on a stream's resync. (A
    /// change through a group the caller has left since is told by the
    /// leave's entry, on that entry's page.)
    pub resync: bool,
}

/// What a subscription yields.
#[derive(Clone, Debug)]
pub enum Event {
    /// A change the subscriber may see.
    Change(Box<Change>),
    /// The subscriber's groups changed or its cursor is too old: re-list.
    Resync,
}

/// Version 3: the store's position hidden (see [`encode_cursor`]).
const CURSOR_VERSION: u8 = 3;
/// Version 2: the store's position in the clear.
const CLEAR_VERSION: u8 = 2;
/// Random bytes a cursor hides its position with.
const NONCE: usize = 8;

/// A page of changes, and whether its read reached the feed's readable
/// end (rather than the page's limit or the budget).
struct Pulled {
    page: ChangePage,
    reached_end: bool,
    /// On a store whose feed lags, the feed's end as the pull began.
    asked: Option<Vec<u8>>,
}

/// A feed cursor: the store's position, hidden with the store's key and
/// random bytes of its own, then sealed. A position in the clear would
/// count the store's writes for anyone who polls (`next` moves past the
/// changes a caller cannot see), and the gap between two of one's own
/// changes would say how many came between; hidden, no two cursors look
/// alike, even of one position.
fn encode_cursor(key: &[u8], store: &[u8]) -> String {
    let nonce: [u8; NONCE] = crate::random_bytes();
    let mut c = Vec::with_capacity(1 + NONCE + store.len());
    c.push(CURSOR_VERSION);
    c.extend_from_slice(&nonce);
    c.extend(
        store
            .iter()
            .zip(keystream(key, &nonce, store.len()))
            .map(|(b, k)| b ^ k),
    );
    seal(key, b"feed", &c)
}

/// `len` bytes to hide a position with: SHA-256 of the store's key, the
/// cursor's random bytes and a block number, block after block (a
/// pseudorandom function of fixed-length input in counter mode).
fn keystream(key: &[u8], nonce: &[u8; NONCE], len: usize) -> Vec<u8> {
    use sha2::Digest;
    let mut out = Vec::with_capacity(len + 32);
    let mut block = 0u32;
    while out.len() < len {
        let mut h = sha2::Sha256::new();
        h.update((key.len() as u32).to_be_bytes());
        h.update(key);
        h.update(b"feed position");
        h.update(nonce);
        h.update(block.to_be_bytes());
        out.extend_from_slice(&h.finalize());
        block += 1;
    }
    out.truncate(len);
    out
}

/// The store's cursor inside an API cursor; malformed ones are refused.
/// A cursor of an older server (version 2, its position in the clear,
/// sealed with or without the store's key) is `Gone`, as a cursor older
/// than the changes kept: the client lists
/// again and resumes from the end, instead of a browser's `EventSource`
/// giving up on a 400 after an upgrade. (Version 1 was unsealed, the byte
/// 1 and 8 of a position: one text in 256 that decodes to 9 bytes has
/// that shape, so it is not told apart from a malformed cursor.)
pub(crate) fn decode_cursor(key: &[u8], c: &str) -> Result<Vec<u8>> {
    let bad = || EngineError::InvalidInput("the cursor is not one of this feed".into());
    if c.is_empty() || c.len() > 128 {
        return Err(bad());
    }
    let older = || {
        EngineError::Gone(
            "the cursor is from an older server; list again and start from the end".into(),
        )
    };
    let Some(raw) = unseal(key, b"feed", c) else {
        if unseal(&[], &[], c).is_some_and(|r| r.first() == Some(&CLEAR_VERSION)) {
            return Err(older());
        }
        return Err(bad());
    };
    match raw.split_first() {
        Some((&CURSOR_VERSION, rest)) if rest.len() > NONCE => {
            let (nonce, hidden) = rest.split_at(NONCE);
            let nonce: &[u8; NONCE] = nonce.try_into().expect("NONCE bytes");
            let stream = keystream(key, nonce, hidden.len());
            Ok(hidden.iter().zip(stream).map(|(b, k)| b ^ k).collect())
        }
        Some((&CLEAR_VERSION, rest)) if !rest.is_empty() => Err(older()),
        _ => Err(bad()),
    }
}

/// The row holding the cursor of the last entry trimmed away.
fn trimmed_key() -> Key {
    Key::new(META, b"feed".to_vec(), b"trimmed".to_vec())
}

/// Adds the change entry of an item write to `b`.
pub(crate) fn record_item(b: &mut Batch, at: i64, before: Option<&Item>, after: Option<&Item>) {
    let (id, kind, version) = match (before, after) {
        (_, Some(i)) | (Some(i), None) => (i.id.clone(), i.kind.clone(), i.version),
        (None, None) => return,
    };
    let readers = |i: Option<&Item>| -> Vec<Principal> {
        i.map_or_else(Vec::new, |i| i.readers().into_iter().cloned().collect())
    };
    let row = ChangeRow {
        at,
        what: What::Item {
            id,
            kind,
            version,
            was: before.map(|i| i.version),
            before: readers(before),
            after: readers(after),
            item: after.cloned().map(Box::new),
        },
    };
    b.append(CHANGES, schema::encode(&row));
}

/// Adds the change entry of a membership change of `principal` to `b`.
pub(crate) fn record_member(b: &mut Batch, at: i64, principal: &Principal, delta: Delta) {
    let (gained, lost) = match delta {
        Delta::Gained(g) => (Some(g), None),
        Delta::Lost(l) => (None, Some(l)),
        Delta::Unknown => (None, None),
    };
    let row = ChangeRow {
        at,
        what: What::Member {
            principal: principal.to_string(),
            gained,
            lost,
        },
    };
    b.append(CHANGES, schema::encode(&row));
}

/// Whether an entry changed the groups of the caller: its principal is
/// the caller, or a group the caller reached when the entry was written
/// (a group it reaches now and joined after the entry does not count).
/// A group the caller has left since is not seen here; the leave's own
/// entry, which names the caller or a group it still reaches, is.
fn moves_groups_of(entry: &FeedEntry, row: &ChangeRow, actor: &Actor) -> bool {
    let What::Member { principal, .. } = &row.what else {
        return false;
    };
    principal
        .parse::<Principal>()
        .is_ok_and(|p| actor.saw_through(&p, &entry.cursor))
}

/// What `principals` see of one entry, if anything.
fn view(
    key: &[u8],
    entry: &FeedEntry,
    row: &ChangeRow,
    actor: &Actor,
    kind: Option<&str>,
) -> Option<Change> {
    let What::Item {
        id,
        kind: item_kind,
        version,
        was: version_before,
        before,
        after,
        item,
    } = &row.what
    else {
        return None;
    };
    if kind.is_some_and(|k| k != item_kind) {
        return None;
    }
    let mine = |ps: &[Principal]| ps.iter().any(|p| actor.saw_through(p, &entry.cursor));
    let (was, is) = (mine(before), mine(after));
    if !was && !is {
        return None;
    }
    // A remove carries the last version the caller could read, the one
    // before the write: a write that leaves the item in place (an unshare)
    // made it higher and a delete did not, so the entry's own version would
    // tell the two apart, which a remove never does.
    let version = match version_before {
        Some(v) if !is => *v,
        None if !is && item.is_some() => version.saturating_sub(1),
        _ => *version,
    };
    let item = if is {
        item.as_ref().map(|i| {
            // The role the caller had at this change: through the
            // principals it held then, not groups joined since (whose
            // managers' view, with the ACL, was not the caller's then).
            let role = if actor.admin {
                Role::Manager
            } else {
                i.acl
                    .iter()
                    .filter(|g| actor.saw_through(&g.principal, &entry.cursor))
                    .map(|g| g.role)
                    .max()
                    .unwrap_or(Role::Viewer)
            };
            ItemView {
                item: (**i).clone(),
                role,
            }
        })
    } else {
        None
    };
    Some(Change {
        cursor: encode_cursor(key, &entry.cursor),
        op: if item.is_some() {
            ChangeOp::Put
        } else {
            ChangeOp::Remove
        },
        id: id.clone(),
        kind: item_kind.clone(),
        version,
        at: row.at,
        item,
    })
}

/// How an entry changes the groups of `actor`, if it touches one of its
/// principals.
fn touches(row: &ChangeRow, actor: &Actor) -> Option<Delta> {
    let What::Member {
        principal,
        gained,
        lost,
    } = &row.what
    else {
        return None;
    };
    if !actor.principals.iter().any(|p| p.to_string() == *principal) {
        return None;
    }
    Some(match (gained, lost) {
        (Some(g), _) => Delta::Gained(g.clone()),
        (None, Some(l)) => Delta::Lost(l.clone()),
        (None, None) => Delta::Unknown,
    })
}

/// `actor`'s principals moved by `delta`; `false` if the delta does not say.
/// Applied at its entry's place: a group gained is the actor's from there.
fn apply(actor: &mut Actor, delta: &Delta) -> bool {
    if let Delta::Gained(groups) | Delta::Lost(groups) = delta {
        actor
            .joined
            .retain(|(p, _)| !matches!(p, Principal::Group(g) if groups.contains(g)));
    }
    match delta {
        Delta::Gained(groups) => {
            for g in groups {
                let p = Principal::Group(g.clone());
                if !actor.principals.contains(&p) {
                    actor.principals.push(p);
                }
            }
            true
        }
        Delta::Lost(groups) => {
            actor
                .principals
                .retain(|p| !matches!(p, Principal::Group(g) if groups.contains(g)));
            true
        }
        Delta::Unknown => false,
    }
}

fn decode_row(entry: &FeedEntry) -> Result<ChangeRow> {
    serde_json::from_slice(&entry.value).map_err(|e| crate::error::corrupt("change", e))
}

/// One decoded feed entry, as the hub hands it to subscribers.
#[derive(Debug)]
pub(crate) struct HubEntry {
    entry: FeedEntry,
    row: ChangeRow,
}

impl HubEntry {
    fn size(&self) -> usize {
        held(&self.entry)
    }
}

/// About the memory a feed entry holds once decoded: its bytes, and the
/// item decoded from them (taken as twice as large).
fn held(entry: &FeedEntry) -> usize {
    3 * entry.value.len() + entry.cursor.len() + 256
}

/// A subscriber's end of its queue.
pub(crate) struct Queue {
    rx: mpsc::Receiver<Arc<HubEntry>>,
    /// What the queue holds, by [`HubEntry::size`].
    bytes: Arc<AtomicUsize>,
}

impl Queue {
    async fn recv(&mut self) -> Option<Arc<HubEntry>> {
        let e = self.rx.recv().await?;
        Some(self.took(e))
    }

    /// `e`, taken off the queue: what it held is given back.
    fn took(&self, e: Arc<HubEntry>) -> Arc<HubEntry> {
        self.bytes.fetch_sub(e.size(), Ordering::Relaxed);
        e
    }

    fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

/// Where the hub sends entries: each subscriber's queue, and who is
/// registered under each principal.
///
/// One lock per node, and deliberately so: the hub takes it once per batch
/// it reads, and a stream when it opens, closes, widens its route or checks
/// its place; no item read or write, and no delivery to a waiting stream,
/// ever touches it. It replaces a broadcast channel whose lock every stream
/// took for every entry.
#[derive(Default)]
struct Routes {
    next: u64,
    subs: HashMap<u64, Route>,
    by_principal: HashMap<Principal, HashSet<u64>>,
    /// The cursor of the last entry the hub routed.
    cursor: Option<Vec<u8>>,
}

struct Route {
    tx: mpsc::Sender<Arc<HubEntry>>,
    bytes: Arc<AtomicUsize>,
    principals: Vec<Principal>,
}

impl Route {
    /// Queues `e`, unless the queue is full by count or by size (an empty
    /// queue takes one entry of any size).
    fn offer(&self, e: &Arc<HubEntry>) -> bool {
        let size = e.size();
        // Counted before it is sent, so the receiver never takes away
        // more than was added.
        let before = self.bytes.fetch_add(size, Ordering::Relaxed);
        if (before > 0 && before + size > QUEUE_BYTES) || self.tx.try_send(e.clone()).is_err() {
            self.bytes.fetch_sub(size, Ordering::Relaxed);
            return false;
        }
        true
    }
}

impl Routes {
    /// Registers `principals` for subscriber `id`; whether any was new.
    fn widen<'a>(&mut self, id: u64, principals: impl IntoIterator<Item = &'a Principal>) -> bool {
        let Some(route) = self.subs.get_mut(&id) else {
            return false;
        };
        let mut grew = false;
        for p in principals {
            if !route.principals.contains(p) {
                route.principals.push(p.clone());
                self.by_principal.entry(p.clone()).or_default().insert(id);
                grew = true;
            }
        }
        grew
    }

    /// A fresh queue for subscriber `id`, registered under `principals`.
    fn register(&mut self, id: u64, principals: &[Principal]) -> Queue {
        self.remove(id);
        let (tx, rx) = mpsc::channel(QUEUE);
        let bytes = Arc::new(AtomicUsize::new(0));
        self.subs.insert(
            id,
            Route {
                tx,
                bytes: bytes.clone(),
                principals: Vec::new(),
            },
        );
        self.widen(id, principals);
        Queue { rx, bytes }
    }

    fn remove(&mut self, id: u64) {
        let Some(route) = self.subs.remove(&id) else {
            return;
        };
        for p in &route.principals {
            if let Some(ids) = self.by_principal.get_mut(p) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.by_principal.remove(p);
                }
            }
        }
    }

    /// Hands `e` to every subscriber registered under a principal it
    /// names; one whose queue is full is removed (it will pull).
    fn route(&mut self, e: &Arc<HubEntry>) {
        let mut to: Vec<u64> = Vec::new();
        match &e.row.what {
            What::Item { before, after, .. } => {
                for p in before.iter().chain(after) {
                    to.extend(self.by_principal.get(p).into_iter().flatten());
                }
            }
            What::Member {
                principal, gained, ..
            } => {
                let Ok(p) = principal.parse::<Principal>() else {
                    tracing::error!(%principal, "a membership change names no principal; no stream gets it");
                    return;
                };
                to.extend(self.by_principal.get(&p).into_iter().flatten());
                let gained: Vec<Principal> = gained
                    .iter()
                    .flatten()
                    .map(|g| Principal::Group(g.clone()))
                    .collect();
                for &id in &to {
                    self.widen(id, &gained);
                }
            }
        }
        to.sort_unstable();
        to.dedup();
        for id in to {
            if self.subs.get(&id).is_some_and(|r| !r.offer(e)) {
                self.remove(id);
            }
        }
    }
}

/// The node's feed reader and its subscribers' counts.
pub(crate) struct Hub {
    routes: Mutex<Routes>,
    nudge: Notify,
    streams: AtomicUsize,
    per_user: [Mutex<HashMap<String, usize>>; STRIPES],
    /// Entries the hub has read, for metrics.
    read: AtomicU64,
    /// Set once the hub's task runs.
    started: tokio::sync::OnceCell<()>,
}

impl Hub {
    pub(crate) fn new() -> Hub {
        Hub {
            routes: Mutex::new(Routes::default()),
            nudge: Notify::new(),
            streams: AtomicUsize::new(0),
            per_user: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            read: AtomicU64::new(0),
            started: tokio::sync::OnceCell::new(),
        }
    }

    /// Wakes the hub: this node just wrote a change.
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    fn stripe(&self, user: &str) -> &Mutex<HashMap<String, usize>> {
        let h = crate::sha256(user.as_bytes());
        &self.per_user[h[0] as usize % STRIPES]
    }
}

/// A subscriber's place in the hub's routes; removed on drop.
struct RouteId {
    engine: Engine,
    id: u64,
}

impl RouteId {
    fn new(engine: &Engine) -> RouteId {
        let mut routes = engine.inner.hub.routes.lock().expect("routes");
        routes.next += 1;
        RouteId {
            engine: engine.clone(),
            id: routes.next,
        }
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.engine.inner.hub.routes.lock().expect("routes")
    }

    fn register(&self, principals: &[Principal]) -> Queue {
        self.routes().register(self.id, principals)
    }

    fn widen(&self, principals: &[Principal]) -> bool {
        self.routes().widen(self.id, principals)
    }

    /// The hub's place, if this route is live and `rx`, its queue, is empty.
    fn caught_up(&self, rx: &Queue) -> Option<Vec<u8>> {
        let routes = self.routes();
        if routes.subs.contains_key(&self.id) && rx.is_empty() {
            routes.cursor.clone()
        } else {
            None
        }
    }
}

impl Drop for RouteId {
    fn drop(&mut self) {
        self.routes().remove(self.id);
    }
}

/// A counted place in the node's and a user's stream limits; freed on drop.
struct StreamSlot {
    engine: Engine,
    user: Option<String>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let hub = &self.engine.inner.hub;
        hub.streams.fetch_sub(1, Ordering::Relaxed);
        if let Some(u) = &self.user {
            let mut m = hub.stripe(u).lock().expect("stripe");
            if let Some(n) = m.get_mut(u) {
                *n -= 1;
                if *n == 0 {
                    m.remove(u);
                }
            }
        }
    }
}

/// A live view of the changes one caller may see.
pub struct Subscription {
    engine: Engine,
    /// The store's cursor key, for the cursors of the events.
    key: Vec<u8>,
    caller: Caller,
    actor: Actor,
    kind: Option<String>,
    rx: Queue,
    route: RouteId,
    /// The cursor of the last entry handled (delivered or filtered out).
    last: Option<Vec<u8>>,
    /// Whether to pull from the store before listening (a start from a
    /// cursor, or a fall-back after lagging).
    pulling: bool,
    /// Whether the entries being handled came from a pull.
    replaying: bool,
    pending: VecDeque<Event>,
    /// When to check the caller's session and groups next.
    due: std::time::Instant,
    /// Whether the tracked groups may hold more than the caller has (a
    /// membership entry that did not say what changed): until they are
    /// read again at a place where the stream has caught up, they are only
    /// ever narrowed.
    unsure: bool,
    /// Whether the session was checked since `pending` was last empty:
    /// the changes that arrive together go out after one check, so a
    /// signed-out session's stream gets none after its sign-out.
    session_checked: bool,
    _slot: StreamSlot,
}

impl Engine {
    /// A page of the changes the caller may see after `since` (from the
    /// current end without it), at most `limit`, of `kind` if given.
    ///
    /// Bounded: one call looks at no more than [`PULL_BUDGET`] entries;
    /// `next` moves past every entry looked at, so nothing is skipped.
    pub async fn changes(
        &self,
        caller: &Caller,
        since: Option<&str>,
        kind: Option<&str>,
        limit: usize,
    ) -> Result<ChangePage> {
        crate::listing::check_limit(limit)?;
        let key = self.cursor_key().await?;
        let since = since.map(|c| decode_cursor(key, c)).transpose()?;
        if let Some(k) = kind {
            crate::model::check_name("kind", k)?;
        }
        let Some(since) = since else {
            return self
                .retrying(|| async {
                    let mut snap = self.snapshot().await?;
                    // Resolved for its refusals (a dead session is 401).
                    self.resolve(&mut snap, caller, &[], &[]).await?;
                    let end = snap.feed_end(CHANGES).await?;
                    Ok(ChangePage {
                        changes: Vec::new(),
                        next: encode_cursor(key, &end),
                        resync: false,
                    })
                })
                .await;
        };
        let asked_at = tokio::time::Instant::now();
        let page = self
            .pull_page(caller, key, since.clone(), kind, limit)
            .await?;
        // On a store whose feed is readable only some time after a write
        // (Cassandra), a page that reached the readable end is read again
        // once the feed is readable through the moment it was asked: it
        // then holds every change committed before, on any node, unless a
        // write still landing holds the feed back for longer than
        // [`PULL_WAIT`] (the rest comes on a later poll). A full page (of
        // changes further back) is answered at once.
        let Some(asked) = page.asked.filter(|_| page.reached_end) else {
            return Ok(page.page);
        };
        let wait = self.wait_readable(&asked, asked_at);
        if tokio::time::timeout(PULL_WAIT, wait).await.is_err() {
            tracing::debug!("a pull answers what the feed shows: it is held back");
        }
        Ok(self.pull_page(caller, key, since, kind, limit).await?.page)
    }

    /// Waits until the feed of changes is readable through `end`: until
    /// the store's lag after `asked_at`, then a look every [`PULL_LOOK`]. A look that fails
    /// ends the wait (the pull after it answers the store's failure).
    async fn wait_readable(&self, end: &[u8], asked_at: tokio::time::Instant) {
        tokio::time::sleep_until(asked_at + self.store().feed_lag()).await;
        loop {
            let look = async {
                Ok::<_, EngineError>(self.snapshot().await?.feed_readable(CHANGES).await?)
            };
            match look.await {
                Ok(readable) if readable.as_slice() >= end => return,
                Ok(_) => tokio::time::sleep(PULL_LOOK).await,
                Err(e) => {
                    tracing::debug!(error = %e, "a pull stops waiting for the feed");
                    return;
                }
            }
        }
    }

    /// One read of [`Engine::changes`] from `since`: at most `limit`
    /// changes, looking at no more than [`PULL_BUDGET`] entries.
    async fn pull_page(
        &self,
        caller: &Caller,
        key: &[u8],
        since: Vec<u8>,
        kind: Option<&str>,
        limit: usize,
    ) -> Result<Pulled> {
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (actor, own) = self
                .resolve(&mut snap, caller, &[trimmed_key()], &[])
                .await?;
            check_not_trimmed(&own.rows[0], &since)?;
            let asked = if self.store().feed_lag().is_zero() {
                None
            } else {
                Some(snap.feed_end(CHANGES).await?)
            };
            let mut changes = Vec::new();
            let mut cursor = since.clone();
            let mut looked = 0;
            let mut resync = false;
            let mut reached_end = false;
            while changes.len() < limit && looked < PULL_BUDGET {
                let entries = snap.read_feed(CHANGES, Some(&cursor), READ_BATCH).await?;
                let n = entries.len();
                for entry in entries {
                    looked += 1;
                    let row = decode_row(&entry)?;
                    cursor = entry.cursor.clone();
                    resync |= moves_groups_of(&entry, &row, &actor);
                    if let Some(c) = view(key, &entry, &row, &actor, kind) {
                        changes.push(c);
                        if changes.len() == limit {
                            break;
                        }
                    }
                }
                if n < READ_BATCH {
                    reached_end = changes.len() < limit;
                    break;
                }
            }
            Ok(Pulled {
                page: ChangePage {
                    changes,
                    next: encode_cursor(key, &cursor),
                    resync,
                },
                reached_end,
                asked,
            })
        })
        .await
    }

    /// Opens a live view of the changes the caller may see after `since`
    /// (from now without it), of `kind` if given. Refused with
    /// `RateLimited` past the node's or the user's limit of open streams.
    pub async fn subscribe(
        &self,
        caller: &Caller,
        since: Option<&str>,
        kind: Option<&str>,
    ) -> Result<Subscription> {
        self.subscribe_from(caller, since, kind, None).await
    }

    /// [`Engine::subscribe`] for a client at `address`: streams without a
    /// signed-in user count against the per-user limit of their address,
    /// so one client cannot take every stream of the node.
    pub async fn subscribe_from(
        &self,
        caller: &Caller,
        since: Option<&str>,
        kind: Option<&str>,
        address: Option<&str>,
    ) -> Result<Subscription> {
        // A cursor from an older server resumes at the end, after a resync.
        let key = self.cursor_key().await?.to_vec();
        let (since, stale) = match since.map(|c| decode_cursor(&key, c)).transpose() {
            Ok(since) => (since, false),
            Err(EngineError::Gone(_)) => (None, true),
            Err(e) => return Err(e),
        };
        if let Some(k) = kind {
            crate::model::check_name("kind", k)?;
        }
        let actor = self
            .retrying(|| async {
                let mut snap = self.snapshot().await?;
                Ok(self.resolve(&mut snap, caller, &[], &[]).await?.0)
            })
            .await?;
        // `@` starts no username: an address never counts as a user.
        let holder = match (&actor.username, address) {
            (Some(u), _) => Some(u.clone()),
            (None, Some(a)) => Some(format!("@{a}")),
            (None, None) => None,
        };
        let slot = self.take_stream_slot(holder.as_deref())?;
        // The hub starts (if it has not) at the feed's end as of now; then
        // listen; then pull what came before from the store: nothing falls
        // between.
        self.ensure_hub().await?;
        let route = RouteId::new(self);
        let rx = route.register(&actor.principals);
        let mut pending = VecDeque::new();
        if stale {
            pending.push_back(Event::Resync);
        }
        let mut last = match &since {
            Some(s) => Some(s.clone()),
            None => Some(
                self.retrying(|| async { Ok(self.snapshot().await?.feed_end(CHANGES).await?) })
                    .await?,
            ),
        };
        if let Some(since) = &since {
            let trimmed = self
                .retrying(|| async { Ok(self.snapshot().await?.get(&trimmed_key()).await?) })
                .await?;
            if check_not_trimmed(&trimmed, since).is_err() {
                pending.push_back(Event::Resync);
                last = Some(
                    self.retrying(|| async { Ok(self.snapshot().await?.feed_end(CHANGES).await?) })
                        .await?,
                );
            }
        }
        Ok(Subscription {
            engine: self.clone(),
            key,
            caller: caller.clone(),
            actor,
            kind: kind.map(str::to_string),
            rx,
            route,
            pulling: last.is_some(),
            replaying: false,
            last,
            pending,
            due: std::time::Instant::now() + CHECK_EVERY,
            unsure: false,
            session_checked: false,
            _slot: slot,
        })
    }

    /// A place among the node's streams and among those of `user` (a
    /// username, or `@` and the address of a client signed in as no one).
    fn take_stream_slot(&self, user: Option<&str>) -> Result<StreamSlot> {
        let hub = &self.inner.hub;
        let limits = &self.inner.config;
        let refuse = |what: &str| EngineError::RateLimited {
            detail: format!("too many open event streams {what}; close one first"),
            retry_after: 5,
        };
        if hub.streams.fetch_add(1, Ordering::Relaxed) >= limits.max_streams {
            hub.streams.fetch_sub(1, Ordering::Relaxed);
            return Err(refuse("on this server"));
        }
        // From here the slot's drop gives the places back.
        let mut slot = StreamSlot {
            engine: self.clone(),
            user: None,
        };
        let Some(user) = user else {
            return Ok(slot);
        };
        let mut m = hub.stripe(user).lock().expect("stripe");
        let n = m.entry(user.to_string()).or_insert(0);
        if *n >= limits.max_streams_per_user {
            return Err(refuse(if user.starts_with('@') {
                "from this address without signing in"
            } else {
                "for this user"
            }));
        }
        *n += 1;
        drop(m);
        slot.user = Some(user.to_string());
        Ok(slot)
    }

    /// Starts this node's hub once, from the feed's end as of the first
    /// call: every entry after it is handed to the subscribers. Concurrent
    /// first calls wait for the one that starts it.
    async fn ensure_hub(&self) -> Result<()> {
        self.inner
            .hub
            .started
            .get_or_try_init(|| async {
                let start = self
                    .retrying(|| async { Ok(self.snapshot().await?.feed_end(CHANGES).await?) })
                    .await?;
                let engine = self.clone();
                tokio::spawn(async move { engine.run_hub(start).await });
                Ok::<_, EngineError>(())
            })
            .await?;
        Ok(())
    }

    /// The hub: reads the feed from `start` in bounded batches and hands
    /// every entry to the subscribers.
    async fn run_hub(&self, start: Vec<u8>) {
        let hub = &self.inner.hub;
        let mut cursor = Some(start);
        let mut read_at = tokio::time::Instant::now();
        loop {
            if read_at.elapsed() < GAP {
                tokio::time::sleep_until(read_at + GAP).await;
            }
            read_at = tokio::time::Instant::now();
            let step = async {
                let mut snap = self.snapshot().await?;
                loop {
                    let entries = snap
                        .read_feed(CHANGES, cursor.as_deref(), READ_BATCH)
                        .await?;
                    let n = entries.len();
                    let Some(end) = entries.last().map(|e| e.cursor.clone()) else {
                        return Ok(());
                    };
                    let decoded: Vec<Arc<HubEntry>> = entries
                        .into_iter()
                        .filter_map(|entry| match decode_row(&entry) {
                            Ok(row) => Some(Arc::new(HubEntry { entry, row })),
                            Err(e) => {
                                // Read past, or every stream here would stop
                                // at it: no stream can be told what it was.
                                tracing::error!(error = %e, "a change entry no stream gets");
                                None
                            }
                        })
                        .collect();
                    {
                        let mut routes = hub.routes.lock().expect("routes");
                        for e in &decoded {
                            routes.route(e);
                        }
                        routes.cursor = Some(end.clone());
                    }
                    cursor = Some(end);
                    hub.read.fetch_add(n as u64, Ordering::Relaxed);
                    if n < READ_BATCH {
                        return Ok::<_, EngineError>(());
                    }
                    // A long backlog: a fresh snapshot for each batch keeps
                    // no transaction open for long.
                    snap = self.snapshot().await?;
                }
            };
            if let Err(e) = step.await {
                tracing::warn!(error = %e, "the change hub will read again");
            }
            let _ = tokio::time::timeout(POLL, hub.nudge.notified()).await;
        }
    }

    /// Trims the changes older than the retention (see
    /// [`Engine::trim_changes_before`]).
    pub async fn trim_changes(&self) -> Result<usize> {
        let horizon = self.now() - self.config().feed_retention.as_micros() as i64;
        self.trim_changes_before(horizon).await
    }

    /// Trims the changes made before `horizon` (microseconds since the
    /// epoch), in bounded steps; the cursor of the last entry trimmed is
    /// recorded first, so a caller asking from before it is told to resync
    /// rather than miss changes.
    pub(crate) async fn trim_changes_before(&self, horizon: i64) -> Result<usize> {
        let mut removed = 0;
        loop {
            let entries = self
                .retrying(|| async {
                    Ok(self
                        .snapshot()
                        .await?
                        .read_feed(CHANGES, None, 1000)
                        .await?)
                })
                .await?;
            let mut through = None;
            for e in &entries {
                if decode_row(e)?.at >= horizon {
                    break;
                }
                through = Some(e.cursor.clone());
            }
            let Some(through) = through else {
                return Ok(removed);
            };
            let mut b = Batch::new();
            b.put(trimmed_key(), through.clone(), 1);
            self.retrying(|| async { Ok(self.store().write(b.clone()).await?) })
                .await?;
            loop {
                let n = self
                    .retrying(|| async {
                        Ok(self.store().trim_feed(CHANGES, &through, 1000).await?)
                    })
                    .await?;
                removed += n;
                if n < 1000 {
                    break;
                }
            }
        }
    }

    /// Starts this node's trimmer of old changes.
    pub(crate) fn resume_trims(&self) {
        let engine = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = engine.trim_changes().await {
                    tracing::warn!(error = %e, "trimming old changes will be tried again");
                }
                tokio::time::sleep(engine.config().sweep_every).await;
            }
        });
    }

    /// Entries this node's hub has read, since start.
    pub fn hub_entries(&self) -> u64 {
        self.inner.hub.read.load(Ordering::Relaxed)
    }

    /// Event streams open on this node.
    pub fn open_streams(&self) -> usize {
        self.inner.hub.streams.load(Ordering::Relaxed)
    }
}

fn check_not_trimmed(trimmed: &Option<tarn_store::Row>, since: &[u8]) -> Result<()> {
    match trimmed {
        Some(t) if since < t.value.as_slice() => Err(EngineError::Gone(
            "the cursor is older than the changes kept; list again and start from the end".into(),
        )),
        _ => Ok(()),
    }
}

impl Subscription {
    /// The next event; waits for one.
    pub async fn next(&mut self) -> Result<Event> {
        loop {
            // A resync too: it would tell a signed-out session's holder
            // when the user joined or left a group.
            if !self.pending.is_empty() && !self.session_checked {
                self.engine.session_holds(&self.caller).await?;
                self.session_checked = true;
            }
            if let Some(e) = self.pending.pop_front() {
                if self.pending.is_empty() {
                    self.session_checked = false;
                }
                return Ok(e);
            }
            if std::time::Instant::now() >= self.due {
                // A signed-out session's stream ends within this long.
                self.check().await?;
            }
            if self.pulling {
                self.pull().await?;
                continue;
            }
            let wait = self
                .due
                .saturating_duration_since(std::time::Instant::now());
            match tokio::time::timeout(wait, self.rx.recv()).await {
                Err(_) => continue,
                Ok(Some(e)) => self.take(&e.entry, &e.row).await?,
                Ok(None) => {
                    // The queue filled and the hub let go of it: listen
                    // again, then catch up from the store.
                    self.rx = self.route.register(&self.actor.principals);
                    self.pulling = true;
                }
            }
        }
    }

    /// Handles one entry: skips what was handled, filters, notices
    /// membership changes.
    async fn take(&mut self, entry: &FeedEntry, row: &ChangeRow) -> Result<()> {
        if self.last.as_ref().is_some_and(|l| entry.cursor <= *l) {
            return Ok(());
        }
        self.last = Some(entry.cursor.clone());
        if let Some(delta) = touches(row, &self.actor) {
            if apply(&mut self.actor, &delta) {
                self.widen_route();
            } else {
                self.unsure = true;
                self.check().await?;
            }
            self.pending.push_back(Event::Resync);
            return Ok(());
        }
        if let Some(c) = view(&self.key, entry, row, &self.actor, self.kind.as_deref()) {
            self.pending.push_back(Event::Change(Box::new(c)));
        }
        Ok(())
    }

    /// Checks the caller's session and groups against the store.
    ///
    /// The stream tracks its groups entry by entry (a membership entry says
    /// what a join gained or a leave lost), because the store may already
    /// hold a membership change whose entry the stream has not reached, and
    /// the changes before that entry must be filtered with the groups from
    /// before it. The store's groups are taken as they are only where they
    /// describe the stream's place: when the same snapshot holds no
    /// membership entry the stream has not handled that could move its
    /// groups. That also corrects what entries cannot say exactly (two
    /// membership changes of one caller written at once each compute their
    /// delta without the other's). Elsewhere the tracked groups stay,
    /// narrowed to the store's when they are unsure, and the check comes
    /// again in a second.
    ///
    /// The stream's place is the hub's when its queue is empty: everything
    /// the hub routed to it is handled, and what the hub did not route names
    /// none of its principals.
    async fn check(&mut self) -> Result<()> {
        // While the stream pulls from the store, its place is the last
        // entry it handled, however far behind the hub.
        if !self.pulling && !self.replaying {
            if let Some(at) = self.route.caught_up(&self.rx) {
                if self.last.as_ref().is_none_or(|l| at > *l) {
                    self.last = Some(at);
                }
            }
        }
        let engine = self.engine.clone();
        let caller = self.caller.clone();
        let last = self.last.clone();
        let mine = self.actor.principals.clone();
        let (now, behind) = engine
            .retrying(|| async {
                let mut snap = engine.snapshot().await?;
                let (actor, _) = engine.resolve(&mut snap, &caller, &[], &[]).await?;
                let unread = snap.read_feed(CHANGES, last.as_deref(), READ_BATCH).await?;
                let moves = |e: &FeedEntry| match decode_row(e).map(|r| r.what) {
                    Ok(What::Member { principal, .. }) => mine
                        .iter()
                        .chain(&actor.principals)
                        .any(|p| p.to_string() == principal),
                    Ok(What::Item { .. }) => false,
                    Err(_) => true,
                };
                let behind = unread.len() == READ_BATCH || unread.iter().any(moves);
                Ok((actor, behind))
            })
            .await?;
        if !behind {
            self.actor = now;
            self.unsure = false;
            self.due = std::time::Instant::now() + CHECK_EVERY;
            self.widen_route();
            return Ok(());
        }
        if self.unsure {
            self.actor.principals.retain(|p| now.principals.contains(p));
            // A group kept may have been lost and joined again since the
            // stream's place: it counts only from when the store says the
            // caller's present path into it began (the earliest such path,
            // so a group held throughout loses nothing).
            for (g, since) in &now.joined {
                if !self.actor.principals.contains(g) {
                    continue;
                }
                match self.actor.joined.iter_mut().find(|(p, _)| p == g) {
                    Some((_, mine)) if *mine >= *since => {}
                    Some((_, mine)) => *mine = since.clone(),
                    None => self.actor.joined.push((g.clone(), since.clone())),
                }
            }
        }
        self.actor.admin = now.admin;
        self.actor.user = now.user;
        self.due = std::time::Instant::now() + Duration::from_secs(1);
        Ok(())
    }

    /// Registers groups the stream reached that its route lacks. Entries
    /// for them may already have gone past unrouted: pull again from the
    /// last cursor (what was routed is skipped by its cursor).
    fn widen_route(&mut self) {
        if self.route.widen(&self.actor.principals) {
            self.pulling = true;
        }
    }

    /// Pulls one batch from the store after the last cursor; stops pulling
    /// at the feed's end (the queue has the rest).
    ///
    /// A stream that fell so far behind that entries after its last cursor
    /// were trimmed away gets a resync and goes on from the feed's end,
    /// as one opened at such a cursor does: nothing is skipped unsaid.
    async fn pull(&mut self) -> Result<()> {
        let engine = self.engine.clone();
        let last = self.last.clone();
        let read = engine
            .retrying(|| async {
                let mut snap: Box<dyn Snapshot> = engine.snapshot().await?;
                let trimmed = snap.get(&trimmed_key()).await?;
                if let Some(l) = &last {
                    if check_not_trimmed(&trimmed, l).is_err() {
                        return Ok(Err(snap.feed_end(CHANGES).await?));
                    }
                }
                Ok(Ok(snap
                    .read_feed(CHANGES, last.as_deref(), READ_BATCH)
                    .await?))
            })
            .await?;
        let entries = match read {
            Ok(entries) => entries,
            Err(end) => {
                self.pending.push_back(Event::Resync);
                self.last = Some(end);
                self.pulling = false;
                return Ok(());
            }
        };
        // What a stream holds to send stays within what its queue may:
        // the entries past that are read again by the next pull.
        let mut bytes = 0;
        let fit = entries
            .iter()
            .position(|e| {
                bytes += held(e);
                bytes > QUEUE_BYTES
            })
            .map_or(entries.len(), |n| n.max(1));
        if fit == entries.len() && entries.len() < READ_BATCH {
            self.pulling = false;
        }
        self.replaying = true;
        let r = self.take_all(&entries[..fit]).await;
        self.replaying = false;
        r
    }

    async fn take_all(&mut self, entries: &[FeedEntry]) -> Result<()> {
        for entry in entries {
            let row = decode_row(entry)?;
            self.take(entry, &row).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A feed cursor holds only with the store's key: one made up (sealed
    /// with another key, say far past the end) is refused; one sealed the
    /// way older servers did, without a key, is `Gone` (the client lists
    /// again); other text that decodes is refused, that of version 1's
    /// shape too.
    #[test]
    fn feed_cursors_hold_only_with_the_stores_key() {
        let key = b"this store's key";
        let c = encode_cursor(key, &[0, 0, 0, 7]);
        assert_eq!(decode_cursor(key, &c).unwrap(), vec![0, 0, 0, 7]);
        let made_up = encode_cursor(b"guessed", &[0xff; 8]);
        assert!(matches!(
            decode_cursor(key, &made_up),
            Err(EngineError::InvalidInput(_))
        ));
        let older = seal(&[], &[], &[CLEAR_VERSION, 0, 0, 0, 7]);
        assert!(matches!(
            decode_cursor(key, &older),
            Err(EngineError::Gone(_))
        ));
        let clear = seal(key, b"feed", &[CLEAR_VERSION, 0, 0, 0, 7]);
        assert!(matches!(
            decode_cursor(key, &clear),
            Err(EngineError::Gone(_))
        ));
        // A position is hidden: two cursors of one position differ, and
        // neither holds its bytes; a long one comes back whole.
        let again = encode_cursor(key, &[0, 0, 0, 7]);
        assert_ne!(c, again);
        assert_eq!(decode_cursor(key, &again).unwrap(), vec![0, 0, 0, 7]);
        let seq = 0x0123_4567_89ab_cdefu64.to_be_bytes();
        let raw = crate::unb64(&encode_cursor(key, &seq)).unwrap();
        assert!(!raw.windows(8).any(|w| w == seq));
        let long: Vec<u8> = (0..60).collect();
        assert_eq!(
            decode_cursor(key, &encode_cursor(key, &long)).unwrap(),
            long
        );
        let listing = seal(key, b"listing", &[CURSOR_VERSION, 0, 0, 0, 7]);
        assert!(matches!(
            decode_cursor(key, &listing),
            Err(EngineError::InvalidInput(_))
        ));
        // Text that only decodes (as `AQA` does, to 1 and 0) is no cursor.
        for junk in ["AQA", "AQAAAAAAAAAH", "AQAAAAAAAAAAAAAH", "Abc"] {
            assert!(
                matches!(decode_cursor(key, junk), Err(EngineError::InvalidInput(_))),
                "{junk}"
            );
        }
    }

    fn entry(n: u8, what: What) -> Arc<HubEntry> {
        Arc::new(HubEntry {
            entry: FeedEntry {
                cursor: vec![n],
                value: Vec::new(),
            },
            row: ChangeRow { at: 0, what },
        })
    }

    fn shared_with(n: u8, readers: &[&str]) -> Arc<HubEntry> {
        entry(
            n,
            What::Item {
                id: format!("i{n}"),
                kind: "message".into(),
                version: 1,
                was: None,
                before: Vec::new(),
                after: readers.iter().map(|r| r.parse().unwrap()).collect(),
                item: None,
            },
        )
    }

    fn joined(n: u8, who: &str, groups: &[&str]) -> Arc<HubEntry> {
        entry(
            n,
            What::Member {
                principal: who.into(),
                gained: Some(groups.iter().map(|g| g.to_string()).collect()),
                lost: None,
            },
        )
    }

    fn cursors(q: &mut Queue) -> Vec<u8> {
        std::iter::from_fn(|| q.rx.try_recv().ok().map(|e| q.took(e)))
            .map(|e| e.entry.cursor[0])
            .collect()
    }

    #[test]
    fn entries_reach_only_the_subscribers_of_their_principals() {
        let mut r = Routes::default();
        let ann = ["user:ann".parse().unwrap(), Principal::Everyone];
        let bob = ["user:bob".parse().unwrap(), "group:room1".parse().unwrap()];
        let mut a = r.register(1, &ann);
        let mut b = r.register(2, &bob);
        r.route(&shared_with(1, &["group:room1"]));
        r.route(&shared_with(2, &["group:room2"]));
        r.route(&shared_with(3, &["everyone", "user:bob"]));
        assert_eq!(cursors(&mut a), vec![3]);
        assert_eq!(cursors(&mut b), vec![1, 3]);
    }

    #[test]
    fn a_join_widens_the_route_before_the_next_entry() {
        let mut r = Routes::default();
        let mut b = r.register(2, &["user:bob".parse().unwrap()]);
        r.route(&joined(1, "user:bob", &["room1", "house"]));
        r.route(&shared_with(2, &["group:house"]));
        assert_eq!(cursors(&mut b), vec![1, 2]);
        // Widening by the subscriber says whether anything was new.
        assert!(!r.widen(2, &["group:room1".parse().unwrap()]));
        assert!(r.widen(2, &["group:room2".parse().unwrap()]));
        r.remove(2);
        assert!(r.by_principal.is_empty(), "nothing left behind");
    }

    #[test]
    fn a_full_queue_is_let_go() {
        let mut r = Routes::default();
        let mut b = r.register(2, &["user:bob".parse().unwrap()]);
        for n in 0..=QUEUE {
            r.route(&shared_with((n % 250) as u8, &["user:bob"]));
        }
        assert!(!r.subs.contains_key(&2), "the full queue was dropped");
        assert!(r.by_principal.is_empty());
        assert_eq!(cursors(&mut b).len(), QUEUE, "what it held is still read");
        assert!(b.rx.try_recv().is_err());
    }

    #[test]
    fn a_queue_is_let_go_at_its_size_too() {
        let mut r = Routes::default();
        let mut b = r.register(2, &["user:bob".parse().unwrap()]);
        let sized = |n: u8, len: usize| {
            let e = shared_with(n, &["user:bob"]);
            let mut entry = e.entry.clone();
            entry.value = vec![b' '; len];
            Arc::new(HubEntry {
                entry,
                row: e.row.clone(),
            })
        };
        let big = |n: u8| sized(n, 64 * 1024);
        let fits = QUEUE_BYTES / big(0).size();
        for n in 0..fits {
            r.route(&big(n as u8));
        }
        assert!(r.subs.contains_key(&2), "{fits} entries fit");
        r.route(&big(0));
        assert!(!r.subs.contains_key(&2), "one more is too many");
        assert_eq!(cursors(&mut b).len(), fits);
        // What a queue takes is given back as it is read.
        let mut c = r.register(3, &["user:bob".parse().unwrap()]);
        for round in 0..3 * fits {
            r.route(&big(round as u8));
            assert_eq!(cursors(&mut c).len(), 1);
        }
        assert!(r.subs.contains_key(&3), "a queue read as it fills stays");
        assert_eq!(c.bytes.load(Ordering::Relaxed), 0);
        // An empty queue takes one entry of any size, and then no other.
        r.route(&sized(0, QUEUE_BYTES));
        assert!(r.subs.contains_key(&3));
        r.route(&big(1));
        assert!(!r.subs.contains_key(&3));
        assert_eq!(cursors(&mut c).len(), 1);
    }
}
