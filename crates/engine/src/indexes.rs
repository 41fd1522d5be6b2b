//! Declared indexes: their definitions, the rows they hold, and their
//! building and dropping.
//!
//! For every item an index covers and every principal that may read it, the
//! index holds one row:
//!
//! ```text
//! partition  = (index uid, principal, [bucket], where-values...)
//! clustering = (sort-values..., item id)
//! ```
//!
//! except that an index declared since 2026-12-01 keeps an item shared with
//! `everyone` in that principal's partitions only, and one shared with
//! `authenticated` in that one's ([`Readers`]): every caller reads the
//! first, every signed-in caller the second.
//!
//! encoded with [`keys`](crate::keys) so that byte order is value order.
//! `everyone` and `authenticated` partitions are split in the store's
//! buckets (one on SQLite and PostgreSQL), so none grows without bound on a
//! distributed store; a listing merges them like any other partitions.
//! Writes compute an item's rows before and after and apply the difference
//! in the same atomic write as the item.
//!
//! # Declaring while writes run, correct by construction
//!
//! The declarations have a version (a row of their own, bumped by every
//! change). Each item row carries the version its index rows follow (its
//! *stamp*); each bucket of a kind carries a stamp row. A new index of kind
//! K becomes `building` at version V; its build then
//!
//! 1. raises the stamp row of every bucket of K to at least V,
//! 2. reads every item of K in bounded batches and rewrites each whose
//!    stamp is below V with the rows of every live index (guarded on the
//!    item's revision, many writes in flight),
//! 3. marks the index `ready`.
//!
//! A write computed with declarations older than V cannot land afterwards:
//! an update is guarded on the item's revision, which step 2 advances; a
//! create is guarded on its bucket's stamp row, which step 1 advances. So
//! the guarantee travels with the write and is checked where it commits; no
//! clock is involved. A dropped index's rows are removed in the background
//! and its uid is never reused, so a row a late writer leaves behind is
//! never read.
//!
//! Built-in indexes cover every kind and need no declaration: `_kind`
//! (`where kind`, sort `modifiedAt`), `_mine` (`where createdBy`),
//! `_mine_kind` (`where kind, createdBy`) and `_shared` (no where-fields),
//! all sorted by `modifiedAt`. `_shared` serves "shared with me": it holds
//! rows only in the partitions of the users and groups an item is shared
//! with, not its creator's own and not `everyone`'s or `authenticated`'s,
//! so an item nobody shared costs it nothing.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use futures_util::future::{select, Either};
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use tarn_store::{Batch, Expect, Key, Row, Scan, Snapshot, SnapshotExt};

use crate::error::{EngineError, Result};
use crate::keys::{encode_str, encode_value_cut, encode_where, Cut, Order};
use crate::model::check_name;
use crate::schema::{self, ItemRow, INDEX, INDEX_DEFS, KINDS, KIND_BUCKETS};
use crate::search::Impacts;
use crate::{b64, random_bytes, Caller, Engine, Item, Principal};

/// One sort field of an index.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SortField {
    /// A built-in field or a dot path into properties.
    pub field: String,
    /// Its order.
    pub order: Order,
}

/// Where an index is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexState {
    /// Writes maintain it; existing items are being added; listings refuse it.
    Building,
    /// Complete: listings use it.
    Ready,
    /// Being removed; writes ignore it and the name stays taken until done.
    Dropping,
}

/// A name for an index to declare, made from `raw` (a kind and its
/// fields): what a name may hold (lower case; `<` `>` of a placeholder
/// kind kept), at most 60 characters, and a number after it
/// if an index already has it (one of the same name may sort otherwise).
pub(crate) fn free_name(defs: &[IndexDef], raw: &str) -> String {
    let base: String = raw
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.<>".contains(*c))
        .take(60)
        .collect();
    let mut name = base.clone();
    let mut n = 1;
    while defs.iter().any(|d| d.name == name) {
        n += 1;
        name = format!("{base}-{n}");
    }
    name
}

/// An index declaration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexDef {
    /// Unique name.
    pub name: String,
    /// The kind it covers; `None` only for built-ins, which cover every kind.
    pub kind: Option<String>,
    /// Fields a listing must give equality values for.
    #[serde(rename = "where")]
    pub where_: Vec<String>,
    /// Fields the listing is sorted by.
    pub sort: Vec<SortField>,
    /// Its state.
    pub state: IndexState,
    /// Never reused: the first part of every row's partition, so rows a
    /// dropped index left behind are never read by a later one.
    #[serde(default)]
    pub uid: String,
    /// The declarations version at which the index was declared: items
    /// whose stamp is below it have no rows in it yet.
    #[serde(default)]
    pub since: u64,
    /// The fields whose words a text index makes searchable (empty: a sort
    /// index).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub text: Vec<TextField>,
    /// The stemmer of a text index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The order of ids among items of equal sort values: that of the
    /// first sort field, so ties reverse with the listing's order whichever
    /// way the index was declared (api.md). Indexes declared before it was
    /// kept have their ids ascending, and keep them: their rows say so.
    #[serde(default, skip_serializing_if = "Order::is_asc")]
    pub ties: Order,
    /// How a text index codes impacts (older declarations: the code their
    /// rows were written with).
    #[serde(default, skip_serializing_if = "Impacts::is_milli")]
    pub impacts: Impacts,
    /// Which of an item's readers it keeps rows for (older declarations:
    /// every one, as their rows were written).
    #[serde(default, skip_serializing_if = "Readers::is_every")]
    pub readers: Readers,
    /// How a text index cuts the heads of its terms (older declarations:
    /// as their rows were written).
    #[serde(default, skip_serializing_if = "Heads::is_two")]
    pub heads: Heads,
    /// Where long strings of its sort fields are cut (older declarations:
    /// as their rows were written).
    #[serde(default, skip_serializing_if = "Cut::is_character")]
    pub cut: Cut,
}

/// How a text index cuts a term's head, the part of the term in its
/// rows' partition key: a prefix search reads the partitions of the heads
/// its terms may have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Heads {
    /// The first two characters: text indexes declared before
    /// 2026-12-01, and sort indexes, which have none.
    #[default]
    Two,
    /// The first two characters, but of a term that starts with a Hangul
    /// syllable that syllable alone: a first syllable is a prefix people
    /// type, and the syllables that may follow it are thousands, too many
    /// partitions to read one by one.
    Syllable,
}

impl Heads {
    /// Whether this is the cut of older declarations.
    pub fn is_two(&self) -> bool {
        *self == Heads::Two
    }
}

/// Which of an item's readers an index keeps rows for.
///
/// Every caller reads the partitions of `everyone`, and every signed-in
/// caller those of `authenticated` (api.md: they are among a user's
/// effective principals), so a row of an item in a narrower partition of
/// the same caller is never the only way to it: an item shared with
/// `everyone` and two groups needs its rows once, not four times. Listings
/// and searches merge the caller's partitions and drop duplicates either
/// way, so what they answer is the same; only the rows written differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Readers {
    /// Every principal the ACL names: the built-in indexes (`_shared` is
    /// about who was named) and declarations made before 2026-12-01, whose
    /// rows were written so and are found and removed so.
    #[default]
    Every,
    /// The widest the ACL names: `everyone` when it names it, else
    /// `authenticated` when it names that, else every principal it names.
    Widest,
}

impl Readers {
    /// Whether this is the rule of older declarations.
    pub fn is_every(&self) -> bool {
        *self == Readers::Every
    }

    /// The readers of `item` an index keeps rows for, once each.
    pub(crate) fn of(self, item: &Item) -> Vec<&Principal> {
        let all = item.readers();
        if self == Readers::Every {
            return all;
        }
        for widest in [Principal::Everyone, Principal::Authenticated] {
            if let Some(p) = all.iter().find(|p| ***p == widest) {
                return vec![*p];
            }
        }
        all
    }
}

/// One field of a text index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextField {
    /// A dot path into properties (strings or arrays of strings), or
    /// `$body` for a textual body.
    pub field: String,
    /// How much its words count, positive; default 1.
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

impl Eq for TextField {}

pub(crate) const MAX_FIELDS: usize = 8;
/// Items read per batch of a build.
const BACKFILL_BATCH: usize = 512;
/// Writes a build keeps in flight, so the store commits them in groups.
const BACKFILL_IN_FLIGHT: usize = 128;

/// How many store calls the builds and drops of a node make at once: half
/// the store's connections where those are bounded (with all 128 of a
/// build's writes waiting for one, a node's requests queued behind its own
/// build), else as many as one build keeps in flight.
pub(crate) fn background_places(connections: Option<usize>) -> usize {
    connections.map_or(BACKFILL_IN_FLIGHT, |n| (n / 2).max(1))
}
/// Most index declarations kept.
pub(crate) const MAX_INDEXES: usize = 1000;

pub(crate) fn builtins() -> Vec<IndexDef> {
    let by_modified = vec![SortField {
        field: "modifiedAt".into(),
        order: Order::Asc,
    }];
    let def = |name: &str, where_: &[&str]| IndexDef {
        name: name.into(),
        kind: None,
        where_: where_.iter().map(|s| s.to_string()).collect(),
        sort: by_modified.clone(),
        state: IndexState::Ready,
        uid: name.into(),
        since: 0,
        text: Vec::new(),
        language: None,
        ties: Order::Asc,
        impacts: Impacts::Milli,
        readers: Readers::Every,
        heads: Heads::Two,
        cut: Cut::Character,
    };
    vec![
        def("_kind", &["kind"]),
        def("_mine", &["createdBy"]),
        def("_mine_kind", &["kind", "createdBy"]),
        def(SHARED, &[]),
    ]
}

/// The built-in index of items shared with a user or a group.
pub(crate) const SHARED: &str = "_shared";

/// Moves a dropping declaration (in `b`) from its name to one no one can
/// declare, `~` and its uid, where it waits for its rows to go; answers
/// the work of removing them.
fn move_aside(def: &IndexDef, b: &mut Batch) -> Task {
    let mut moved = def.clone();
    moved.name = format!("~{}", def.uid);
    b.delete(schema::def_key(&def.name));
    b.put(schema::def_key(&moved.name), schema::encode(&moved), 1);
    Task::of(&moved).expect("a dropping declaration has work left")
}

/// The fields every item has outside its properties.
const BUILT_IN_FIELDS: [&str; 3] = ["createdAt", "modifiedAt", "createdBy"];

/// A field as indexes keep it: a path into the properties may be written
/// with `properties.` before it (`properties.title` is `title`), as "dot
/// paths into properties" reads either way. A property named like a field
/// that is not one (`properties.createdAt`, `.kind`, `.$body`) is refused:
/// the name is the built-in's. [`written_field`] is its inverse.
pub(crate) fn canonical_field(field: &str) -> Result<&str> {
    match field.strip_prefix("properties.") {
        Some(rest) if rest == "kind" || rest == "$body" || BUILT_IN_FIELDS.contains(&rest) => {
            Err(EngineError::InvalidInput(format!(
                "field {field:?}: a property named {rest} cannot be indexed, {rest} is the built-in field"
            )))
        }
        Some(rest) if !rest.is_empty() => Ok(rest),
        _ => Ok(field),
    }
}

/// A field as a client writes it, so that writing it back names the same
/// field: a path whose first part is `properties` reads back with
/// `properties.` before it (`properties.properties.x`).
pub fn written_field(field: &str) -> std::borrow::Cow<'_, str> {
    if field.starts_with("properties.") {
        std::borrow::Cow::Owned(format!("properties.{field}"))
    } else {
        std::borrow::Cow::Borrowed(field)
    }
}

/// A declaration's fields as indexes keep them ([`canonical_field`]).
fn canonical_fields(
    where_: &[String],
    sort: &[SortField],
    text: &[TextField],
) -> Result<(Vec<String>, Vec<SortField>, Vec<TextField>)> {
    let canonical = |f: &str| canonical_field(f).map(str::to_string);
    Ok((
        where_.iter().map(|f| canonical(f)).collect::<Result<_>>()?,
        sort.iter()
            .map(|s| {
                Ok(SortField {
                    field: canonical(&s.field)?,
                    order: s.order,
                })
            })
            .collect::<Result<_>>()?,
        text.iter()
            .map(|t| {
                Ok(TextField {
                    field: canonical(&t.field)?,
                    weight: t.weight,
                })
            })
            .collect::<Result<_>>()?,
    ))
}

/// Refuses where and sort fields no index could have: too many, or one
/// that is not a field.
pub(crate) fn check_fields<'a>(fields: impl Iterator<Item = &'a String>) -> Result<()> {
    let mut n = 0;
    for f in fields {
        check_field(f)?;
        n += 1;
    }
    if n > MAX_FIELDS {
        return Err(EngineError::InvalidInput(format!(
            "an index has at most {MAX_FIELDS} fields"
        )));
    }
    Ok(())
}

fn check_field(field: &str) -> Result<()> {
    let ok = !field.is_empty()
        && field.len() <= 256
        && field.split('.').all(|seg| !seg.is_empty())
        && !field.chars().any(char::is_control);
    if field == "$body" {
        Err(EngineError::InvalidInput(
            "$body is the item's body: a text field, never a where or sort field".into(),
        ))
    } else if ok && field != "kind" {
        Ok(())
    } else {
        Err(EngineError::InvalidInput(format!(
            "field {field:?} is not createdAt, modifiedAt, createdBy or a dot path into properties"
        )))
    }
}

/// Whether a grant to `p` shares `item` with someone: a user other than its
/// creator, or a group (what `_shared` holds rows for).
pub(crate) fn is_shared_with(p: &Principal, item: &Item) -> bool {
    match p {
        Principal::User(u) => *u != item.created_by,
        Principal::Group(_) => true,
        Principal::Everyone | Principal::Authenticated => false,
    }
}

/// Whether a principal's partitions are split in buckets: the ones every
/// reader shares.
pub(crate) fn is_shared(p: &Principal) -> bool {
    matches!(p, Principal::Everyone | Principal::Authenticated)
}

/// The bucket of a shared partition an item's row falls in.
pub(crate) fn bucket_of(id: &str, split: u32) -> u32 {
    if split <= 1 {
        0
    } else {
        let h = crate::sha256(id.as_bytes());
        u32::from_be_bytes([h[1], h[2], h[3], h[4]]) % split
    }
}

/// Why a text index for `kind` with these `where` fields cannot be
/// declared beside `defs`, if one of them already serves those searches: a
/// search is served by one text index, so a second would never be read.
pub(crate) fn text_twin(defs: &[IndexDef], kind: &str, where_: &[String]) -> Option<String> {
    let fields: BTreeSet<&String> = where_.iter().collect();
    defs.iter()
        .find(|d| {
            d.is_text()
                && d.state != IndexState::Dropping
                && d.kind.as_deref() == Some(kind)
                && d.where_.iter().collect::<BTreeSet<_>>() == fields
        })
        .map(|twin| {
            format!(
                "text index {} already serves searches of kind {kind} with these where fields; drop it first",
                twin.name
            )
        })
}

/// Refuses a declaration no administrator could make (declared, or read
/// from an export): a name and kind, where and sort fields an index can
/// have, each named once; a sort index sorts by a field at least; a text
/// index has text fields of positive weights and a known language, and no
/// sort.
pub(crate) fn check_declaration(
    name: &str,
    kind: &str,
    where_: &[String],
    sort: &[SortField],
    text: &[TextField],
    language: Option<&str>,
) -> Result<()> {
    check_name("index name", name)?;
    check_name("kind", kind)?;
    check_fields(where_.iter().chain(sort.iter().map(|s| &s.field)))?;
    if let Some(f) = sort.iter().find(|s| s.field.contains(',')) {
        // No listing could name it: `sort` lists fields with commas.
        return Err(EngineError::InvalidInput(format!(
            "sort field {:?} holds a comma, which separates the fields of a sort",
            f.field
        )));
    }
    let unique: BTreeSet<&String> = where_.iter().collect();
    if unique.len() != where_.len() {
        return Err(EngineError::InvalidInput(
            "a where field is named twice".into(),
        ));
    }
    if text.is_empty() {
        if sort.is_empty() {
            return Err(EngineError::InvalidInput(
                "an index sorts by at least one field (or is a text index, with text fields)"
                    .into(),
            ));
        }
        let unique: BTreeSet<&String> = sort.iter().map(|s| &s.field).collect();
        if unique.len() != sort.len() {
            return Err(EngineError::InvalidInput(
                "a sort field is named twice".into(),
            ));
        }
        return Ok(());
    }
    if !sort.is_empty() {
        return Err(EngineError::InvalidInput(
            "a text index has no sort fields".into(),
        ));
    }
    if text.len() > MAX_FIELDS {
        return Err(EngineError::InvalidInput(format!(
            "a text index has at most {MAX_FIELDS} text fields"
        )));
    }
    let mut seen = BTreeSet::new();
    for t in text {
        if t.field != "$body" {
            check_field(&t.field)?;
        }
        if BUILT_IN_FIELDS.contains(&t.field.as_str()) {
            return Err(EngineError::InvalidInput(format!(
                "text field {} is not a dot path into properties or $body",
                t.field
            )));
        }
        if !(t.weight.is_finite() && t.weight > 0.0 && t.weight <= 100.0) {
            return Err(EngineError::InvalidInput(format!(
                "the weight of {} is a number above 0 and at most 100",
                t.field
            )));
        }
        if !seen.insert(t.field.as_str()) {
            return Err(EngineError::InvalidInput(format!(
                "text field {} is named twice",
                t.field
            )));
        }
    }
    let language = language.unwrap_or("english");
    if !crate::text::is_language(language) {
        return Err(EngineError::InvalidInput(format!(
            "language {language:?} is not one of {}",
            crate::text::LANGUAGES.join(", ")
        )));
    }
    Ok(())
}

impl IndexDef {
    /// Whether the index covers items of this kind.
    pub fn covers(&self, kind: &str) -> bool {
        self.kind.as_deref().is_none_or(|k| k == kind)
    }

    /// The partition of `principal` (in `bucket`, for shared principals)
    /// for these where-values (in `where_` order).
    pub(crate) fn partition(
        &self,
        principal: &Principal,
        bucket: u32,
        where_values: &[Option<&serde_json::Value>],
    ) -> Vec<u8> {
        let mut p = Vec::with_capacity(64);
        encode_str(&mut p, &self.uid);
        encode_str(&mut p, &principal.to_string());
        if is_shared(principal) {
            p.extend_from_slice(&bucket.to_be_bytes());
        }
        for v in where_values {
            encode_where(&mut p, *v);
        }
        p
    }

    /// Every partition of `principal` for these where-values.
    pub(crate) fn partitions(
        &self,
        principal: &Principal,
        split: u32,
        where_values: &[Option<&serde_json::Value>],
    ) -> Vec<Vec<u8>> {
        let buckets = if is_shared(principal) { split } else { 1 };
        (0..buckets)
            .map(|b| self.partition(principal, b, where_values))
            .collect()
    }

    /// The clustering key of an item.
    fn clustering(&self, item: &Item) -> Vec<u8> {
        let mut c = Vec::with_capacity(64);
        for s in &self.sort {
            encode_value_cut(&mut c, item.field(&s.field).as_ref(), s.order, self.cut);
        }
        let id = c.len();
        encode_str(&mut c, &item.id);
        if self.ties == Order::Desc {
            for b in &mut c[id..] {
                *b = !*b;
            }
        }
        c
    }

    /// Whether a declaration with these parts would make this index: the
    /// order of where fields and of text fields tells nothing, and no
    /// language is English.
    fn same_as(
        &self,
        kind: &str,
        where_: &[String],
        sort: &[SortField],
        text: &[TextField],
        language: Option<&str>,
    ) -> bool {
        fn set<T: Ord>(items: impl Iterator<Item = T>) -> BTreeSet<T> {
            items.collect()
        }
        let texts = |t: &[TextField]| set(t.iter().map(|t| (t.field.clone(), t.weight.to_bits())));
        self.kind.as_deref() == Some(kind)
            && set(self.where_.iter()) == set(where_.iter())
            && self.sort == sort
            && texts(&self.text) == texts(text)
            && self.language.as_deref().unwrap_or("english") == language.unwrap_or("english")
    }

    /// Whether this is a text index.
    pub fn is_text(&self) -> bool {
        !self.text.is_empty()
    }

    /// The where-values of an item, in `where_` order.
    pub(crate) fn where_values(&self, item: &Item) -> Vec<Option<serde_json::Value>> {
        self.where_.iter().map(|f| item.field(f)).collect()
    }

    /// Every row of this index for `item`, with its value.
    pub(crate) fn rows(&self, item: &Item, split: u32) -> Vec<(Key, Vec<u8>)> {
        if !self.covers(&item.kind) {
            return Vec::new();
        }
        if self.is_text() {
            return crate::search::text_rows(self, item, split);
        }
        let values: Vec<Option<serde_json::Value>> =
            self.where_.iter().map(|f| item.field(f)).collect();
        let refs: Vec<Option<&serde_json::Value>> = values.iter().map(|v| v.as_ref()).collect();
        let clustering = self.clustering(item);
        let bucket = bucket_of(&item.id, split);
        let shared_only = self.kind.is_none() && self.name == SHARED;
        self.readers
            .of(item)
            .into_iter()
            .filter(|p| !shared_only || is_shared_with(p, item))
            .map(|p| {
                let key = Key::new(INDEX, self.partition(p, bucket, &refs), clustering.clone());
                (key, item.id.as_bytes().to_vec())
            })
            .collect()
    }
}

/// The index declarations as of one version, decoded once per thread and
/// version (never stale: every operation reads the version in its own
/// snapshot).
#[derive(Clone)]
pub(crate) struct Defs {
    /// The declarations version (0: none was ever declared).
    pub version: u64,
    /// Built-ins first, then the declared ones in name order.
    pub defs: Arc<Vec<IndexDef>>,
}

/// Declarations decoded by one thread: the engine's id, the version, the
/// definitions.
type Decoded = Option<(u64, u64, Arc<Vec<IndexDef>>)>;

thread_local! {
    /// The last declarations this thread decoded.
    static DECODED: RefCell<Decoded> = const { RefCell::new(None) };
}

impl Defs {
    /// The rows an item written at `stamp` holds, with their values: those
    /// of every index declared at or before its stamp and not yet gone.
    pub(crate) fn rows_at(&self, item: &Item, stamp: u64, split: u32) -> BTreeMap<Key, Vec<u8>> {
        let mut out = BTreeMap::new();
        for d in self.defs.iter().filter(|d| d.since <= stamp) {
            out.extend(d.rows(item, split));
        }
        out
    }

    /// The rows an item written now must hold: every live index's.
    pub(crate) fn rows_now(&self, item: &Item, split: u32) -> BTreeMap<Key, Vec<u8>> {
        let mut out = BTreeMap::new();
        for d in self.defs.iter().filter(|d| d.state != IndexState::Dropping) {
            out.extend(d.rows(item, split));
        }
        out
    }

    /// Adds to `b` the changes that turn the rows of `before` (written at
    /// `stamp`) into those of `after` written now: rows in both, with the
    /// same value, are left alone.
    pub(crate) fn apply_diff(
        &self,
        b: &mut Batch,
        before: Option<(&Item, u64)>,
        after: Option<&Item>,
        split: u32,
    ) {
        let old = before.map_or_else(BTreeMap::new, |(i, s)| self.rows_at(i, s, split));
        let new = after.map_or_else(BTreeMap::new, |i| self.rows_now(i, split));
        for k in old.keys() {
            if !new.contains_key(k) {
                b.delete(k.clone());
            }
        }
        for (k, v) in new {
            if old.get(&k) != Some(&v) {
                b.put(k, v, 1);
            }
        }
    }

    /// One declaration by name (built-ins included).
    pub(crate) fn get(&self, name: &str) -> Option<&IndexDef> {
        self.defs.iter().find(|d| d.name == name)
    }
}

impl Engine {
    /// The declarations whose version row `version_row` holds (as read in
    /// the operation's snapshot), decoded at most once per thread and
    /// version.
    pub(crate) async fn defs_at(
        &self,
        snap: &mut Box<dyn Snapshot>,
        version_row: &Option<Row>,
    ) -> Result<Defs> {
        let version = version_row.as_ref().map_or(0, |r| r.version);
        let cached = DECODED.with(|c| {
            c.borrow()
                .as_ref()
                .filter(|(e, v, _)| *e == self.id() && *v == version)
                .map(|(_, _, d)| d.clone())
        });
        if let Some(defs) = cached {
            return Ok(Defs { version, defs });
        }
        let mut defs = builtins();
        if version > 0 {
            let rows = snap
                .scan(&Scan::partition(
                    INDEX_DEFS,
                    schema::DEFS_PARTITION.to_vec(),
                    MAX_INDEXES + 1,
                ))
                .await?;
            for row in rows
                .iter()
                .filter(|r| r.clustering != schema::DEFS_VERSION_ROW)
            {
                defs.push(schema::decode("index definition", row)?);
            }
        }
        let defs = Arc::new(defs);
        DECODED.with(|c| *c.borrow_mut() = Some((self.id(), version, defs.clone())));
        Ok(Defs { version, defs })
    }

    /// The declarations in a fresh snapshot.
    pub(crate) async fn read_defs(&self) -> Result<Defs> {
        let mut snap = self.snapshot().await?;
        let row = snap.get(&schema::defs_version_key()).await?;
        self.defs_at(&mut snap, &row).await
    }

    /// Writes a declaration change: `changes` applied together with the
    /// version row, guarded on the version the change was computed from.
    async fn write_defs(&self, from: u64, changes: Batch) -> Result<u64> {
        let mut b = changes;
        let key = schema::defs_version_key();
        b.put(key.clone(), schema::MARK.to_vec(), from + 1).guard(
            key,
            if from == 0 {
                Expect::Absent
            } else {
                Expect::Version(from)
            },
        );
        self.store().write(b).await?;
        Ok(from + 1)
    }

    /// Declares an index (administrators). Answers the definition and whether
    /// it was created (`false`: an identical one exists). Existing items are
    /// added in the background; until then the index is `building`.
    pub async fn declare_index(
        &self,
        caller: &Caller,
        name: &str,
        kind: &str,
        where_: Vec<String>,
        sort: Vec<SortField>,
    ) -> Result<(IndexDef, bool)> {
        self.declare(caller, name, kind, where_, sort, Vec::new(), None)
            .await
    }

    /// Declares a text index (administrators): the words of `text` fields
    /// searchable, stemmed for `language` (default `english`). Answers as
    /// [`Engine::declare_index`].
    pub async fn declare_text_index(
        &self,
        caller: &Caller,
        name: &str,
        kind: &str,
        where_: Vec<String>,
        text: Vec<TextField>,
        language: Option<String>,
    ) -> Result<(IndexDef, bool)> {
        if text.is_empty() {
            return Err(EngineError::InvalidInput(
                "a text index names at least one text field".into(),
            ));
        }
        let language = language.unwrap_or_else(|| "english".into());
        self.declare(caller, name, kind, where_, Vec::new(), text, Some(language))
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn declare(
        &self,
        caller: &Caller,
        name: &str,
        kind: &str,
        where_: Vec<String>,
        sort: Vec<SortField>,
        text: Vec<TextField>,
        language: Option<String>,
    ) -> Result<(IndexDef, bool)> {
        let (def, created, aside) = self
            .retrying(|| async {
                // Who asks first: an anonymous caller is told 401, a user
                // 403, whatever the declaration.
                let defs = self.admin_defs(caller).await?;
                let (where_, sort, text) = canonical_fields(&where_, &sort, &text)?;
                check_declaration(name, kind, &where_, &sort, &text, language.as_deref())?;
                let mut b = Batch::new();
                let mut aside = None;
                if let Some(old) = defs.get(name) {
                    let same = old.same_as(kind, &where_, &sort, &text, language.as_deref());
                    if old.state == IndexState::Dropping {
                        // Left dropping under its name by an older server.
                        aside = Some(move_aside(old, &mut b));
                    } else if same {
                        return Ok((old.clone(), false, None));
                    } else {
                        return Err(EngineError::Conflict(format!(
                            "an index named {name} exists with another definition"
                        )));
                    }
                }
                if !text.is_empty() {
                    if let Some(twin) = text_twin(&defs.defs, kind, &where_) {
                        return Err(EngineError::Conflict(twin));
                    }
                }
                if defs.defs.len() >= MAX_INDEXES {
                    // Those being dropped count until their rows are gone.
                    let dropping = defs
                        .defs
                        .iter()
                        .filter(|d| d.state == IndexState::Dropping)
                        .count();
                    let since = match dropping {
                        0 => String::new(),
                        n => format!(", {n} of them still being dropped: try again when they are"),
                    };
                    return Err(EngineError::Conflict(format!(
                        "at most {MAX_INDEXES} indexes{since}"
                    )));
                }
                let def = IndexDef {
                    name: name.to_string(),
                    kind: Some(kind.to_string()),
                    where_: where_.clone(),
                    sort: sort.clone(),
                    state: IndexState::Building,
                    uid: b64(&random_bytes::<9>()),
                    since: defs.version + 1,
                    text: text.clone(),
                    language: language.clone(),
                    ties: sort.first().map_or(Order::Asc, |s| s.order),
                    impacts: if text.is_empty() {
                        Impacts::Milli
                    } else {
                        Impacts::Stepped
                    },
                    readers: Readers::Widest,
                    cut: Cut::Byte,
                    heads: if text.is_empty() {
                        Heads::Two
                    } else {
                        Heads::Syllable
                    },
                };
                b.put(schema::def_key(name), schema::encode(&def), 1);
                self.write_defs(defs.version, b).await?;
                Ok((def, true, aside))
            })
            .await?;
        if let Some(aside) = aside {
            self.spawn_work(aside);
        }
        let build = Task::of(&def)
            .filter(|_| created)
            .and_then(|t| self.spawn_work(t));
        let Some(build) = build else {
            return Ok((def, created));
        };
        // The build goes on in the background if it takes longer.
        if tokio::time::timeout(self.config().build_wait, build)
            .await
            .is_err()
        {
            return Ok((def, created));
        }
        // The declaration is made: a failure to read its state now answers
        // it as building, which it was.
        match self.retrying(|| self.read_defs()).await {
            Ok(defs) => match defs.get(name) {
                Some(now) if now.uid == def.uid => Ok((now.clone(), created)),
                _ => Ok((def, created)),
            },
            Err(e) => {
                tracing::warn!(index = %name, error = %e, "a declared index's state could not be read back");
                Ok((def, created))
            }
        }
    }

    /// Starts `task` in the background, unless this node already works on
    /// it. While it runs, it beats: it rewrites the task's beat row every
    /// [`EngineConfig::index_beat`](crate::EngineConfig), so other nodes
    /// can tell it from work a stopped node left. Answers the running work
    /// (`None` if this node already works on it).
    fn spawn_work(&self, task: Task) -> Option<tokio::task::JoinHandle<()>> {
        let mine = Working::claim(self, &task)?;
        let engine = self.clone();
        Some(tokio::spawn(async move {
            let key = schema::beat_key(&task.name, &task.uid);
            let name = &task.name;
            let run = keep_trying(name, || async {
                match task.work {
                    Work::Build => engine.build_index(name).await,
                    Work::Drop => engine.remove_index_rows(name).await,
                }
            });
            let beat = engine.beat(name, &key);
            let done = match select(std::pin::pin!(run), std::pin::pin!(beat)).await {
                Either::Left((done, _)) => done,
                Either::Right(_) => false,
            };
            if !done {
                // Logged by `keep_trying`. Trying again would meet the
                // same failure: this node keeps the work, so that no node
                // takes it up every half minute; a restart tries again.
                tracing::error!(index = %name, "index work stopped for good on this node; it is tried again when a node starts");
                engine.beat(name, &key).await;
            }
            let mut b = Batch::new();
            b.delete(key);
            if let Err(e) = engine.store().write(b).await {
                // A beat row is read only while its declaration is building
                // or dropping, and no other work has its key (its uid).
                tracing::warn!(index = %name, error = %e, "a finished work's beat row stays");
            }
            drop(mine);
        }))
    }

    /// Rewrites the beat row `key` of the work on index `name` with a
    /// value never written before, every beat (a write that takes longer
    /// is given up, so a slow store misses beats rather than delaying
    /// them), until dropped.
    async fn beat(&self, name: &str, key: &Key) {
        let nonce = random_bytes::<8>();
        let every = self.config().index_beat;
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut missed = false;
        for n in 1u64.. {
            ticks.tick().await;
            let mut value = nonce.to_vec();
            value.extend_from_slice(&n.to_be_bytes());
            let mut b = Batch::new();
            b.put(key.clone(), value, n);
            let error = match tokio::time::timeout(every, self.store().write(b)).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some("the store took longer than a beat".to_string()),
            };
            // Said once a run of misses: six in a row let other nodes take
            // the work up.
            if let (Some(e), false) = (&error, missed) {
                tracing::warn!(index = name, error = %e, "index work missed a beat");
            }
            missed = error.is_some();
        }
    }

    /// Starts this node's watch over background index work: every beat, it
    /// reads the beat row of each index building or dropping; work whose
    /// row has not changed for [`STALE_BEATS`] beats (its node stopped, or
    /// lost the store) is taken up here. Several nodes may take it up at
    /// once: building and dropping are idempotent.
    pub(crate) fn watch_index_work(&self) {
        let engine = self.clone();
        tokio::spawn(async move {
            let mut seen = HashMap::new();
            loop {
                tokio::time::sleep(engine.config().index_beat).await;
                if let Err(e) = engine.look_at_index_work(&mut seen).await {
                    tracing::warn!(error = %e, "the watch over index work will look again");
                }
            }
        });
    }

    /// One look of [`Engine::watch_index_work`]; `seen` holds, per task,
    /// the beat last read and when it was first read.
    async fn look_at_index_work(
        &self,
        seen: &mut HashMap<Task, (Option<Vec<u8>>, std::time::Instant)>,
    ) -> Result<()> {
        let mut snap = self.snapshot().await?;
        let version = snap.get(&schema::defs_version_key()).await?;
        let defs = self.defs_at(&mut snap, &version).await?;
        let open: Vec<Task> = defs.defs.iter().filter_map(Task::of).collect();
        seen.retain(|task, _| open.contains(task));
        if open.is_empty() {
            return Ok(());
        }
        let keys: Vec<Key> = open
            .iter()
            .map(|t| schema::beat_key(&t.name, &t.uid))
            .collect();
        let beats = snap.get_many(&keys).await?;
        drop(snap);
        let stale = self.config().index_beat * STALE_BEATS;
        let now = std::time::Instant::now();
        for (task, beat) in open.into_iter().zip(beats) {
            let beat = beat.map(|r| r.value);
            let (last, since) = seen.entry(task.clone()).or_insert((beat.clone(), now));
            if *last != beat {
                (*last, *since) = (beat, now);
            } else if now.duration_since(*since) >= stale && !Working::is_on(self, &task) {
                tracing::warn!(index = %task.name, "index work stopped beating; taken up here");
                *since = now;
                self.spawn_work(task);
            }
        }
        Ok(())
    }

    /// The declarations as an administrator sees them before changing
    /// them: refused to anyone else.
    async fn admin_defs(&self, caller: &Caller) -> Result<Defs> {
        let mut snap = self.snapshot().await?;
        let (actor, own) = self
            .resolve(&mut snap, caller, &[schema::defs_version_key()], &[])
            .await?;
        actor.require_admin()?;
        self.defs_at(&mut snap, &own.rows[0]).await
    }

    /// One index declaration (built-ins included; signed-in callers).
    pub async fn get_index(&self, caller: &Caller, name: &str) -> Result<IndexDef> {
        self.list_indexes(caller)
            .await?
            .into_iter()
            .find(|d| d.name == name)
            .ok_or_else(|| EngineError::NotFound(format!("no index {name}")))
    }

    /// Every index declaration (built-ins included; signed-in callers).
    pub async fn list_indexes(&self, caller: &Caller) -> Result<Vec<IndexDef>> {
        self.retrying(|| async {
            let mut snap = self.snapshot().await?;
            let (actor, own) = self
                .resolve(&mut snap, caller, &[schema::defs_version_key()], &[])
                .await?;
            actor.require_user()?;
            Ok(self.defs_at(&mut snap, &own.rows[0]).await?.defs.to_vec())
        })
        .await
    }

    /// Drops a declared index (administrators) and removes its rows in the
    /// background. The name is free at once: the declaration moves to a
    /// name no one can declare (`~` and its uid) until its rows are gone,
    /// so an index of the same name can be declared while they go.
    pub async fn drop_index(&self, caller: &Caller, name: &str) -> Result<()> {
        let dropping = self
            .retrying(|| async {
                // Who asks first, as for a declaration.
                let defs = self.admin_defs(caller).await?;
                if builtins().iter().any(|d| d.name == name) {
                    return Err(EngineError::InvalidInput("built-in indexes stay".into()));
                }
                if name.starts_with('_') || !crate::model::is_valid_name(name) {
                    return Err(EngineError::NotFound(format!("no index {name}")));
                }
                let mut def = defs
                    .get(name)
                    .cloned()
                    .ok_or_else(|| EngineError::NotFound(format!("no index {name}")))?;
                // (One an older server left dropping under its name moves
                // aside too.)
                def.state = IndexState::Dropping;
                let mut b = Batch::new();
                let aside = move_aside(&def, &mut b);
                self.write_defs(defs.version, b).await?;
                Ok(aside)
            })
            .await?;
        self.spawn_work(dropping);
        Ok(())
    }

    /// Resumes builds and drops left unfinished (a node stopped mid-way).
    /// Safe to run on several nodes at once: both are idempotent.
    pub async fn resume_index_work(&self) -> Result<()> {
        let defs = self.retrying(|| self.read_defs()).await?;
        for task in defs.defs.iter().filter_map(Task::of) {
            self.spawn_work(task);
        }
        Ok(())
    }

    /// Builds an index: raises its kind's bucket stamps, brings every item
    /// of the kind up to the declarations it was declared in, in bounded
    /// batches with many writes in flight, then marks it ready.
    pub(crate) async fn build_index(&self, name: &str) -> Result<()> {
        let defs = self.retrying(|| self.read_defs()).await?;
        let Some(def) = defs.get(name).cloned() else {
            return Ok(());
        };
        if def.state != IndexState::Building {
            return Ok(());
        }
        let kind = def.kind.clone().unwrap_or_default();
        // Each bucket's stamp is a row of its own: raised all at once (on
        // Cassandra each is a lightweight transaction, and one after
        // another they were most of the time an empty kind took to build).
        let (kind_ref, since) = (&kind, def.since);
        futures_util::future::try_join_all(
            (0..KIND_BUCKETS).map(|b| self.retrying(move || self.raise_stamp(kind_ref, b, since))),
        )
        .await?;
        self.for_each_item(&kind, |row| {
            let since = def.since;
            async move {
                if row.stamp >= since {
                    return Ok(());
                }
                self.retrying(|| self.refresh_item(&row.item.id)).await
            }
        })
        .await?;
        let uid = def.uid.clone();
        self.retrying(|| async {
            let defs = self.read_defs().await?;
            let Some(mut def) = defs.get(name).cloned() else {
                return Ok(());
            };
            // The name may meanwhile be another index's (this one dropped,
            // one of the same name declared): only its own build readies it.
            if def.state != IndexState::Building || def.uid != uid {
                return Ok(());
            }
            def.state = IndexState::Ready;
            let mut b = Batch::new();
            b.put(schema::def_key(name), schema::encode(&def), 1);
            self.write_defs(defs.version, b).await?;
            Ok(())
        })
        .await
    }

    /// Makes a kind bucket's stamp row at least `at`, so creates computed
    /// with older declarations fail their guard.
    async fn raise_stamp(&self, kind: &str, bucket: u8, at: u64) -> Result<()> {
        let key = schema::stamp_key(kind, bucket);
        let row = self.snapshot().await?.get(&key).await?;
        let expect = match &row {
            Some(r) if r.version >= at => return Ok(()),
            Some(r) => Expect::Version(r.version),
            None => Expect::Absent,
        };
        let mut b = Batch::new();
        b.put(key.clone(), schema::MARK.to_vec(), at)
            .guard(key, expect);
        self.store().write(b).await?;
        Ok(())
    }

    /// Rewrites one item's index rows for the current declarations and
    /// advances its stamp and revision (so writers that read it before fail
    /// their guard), if its stamp is behind.
    async fn refresh_item(&self, id: &str) -> Result<()> {
        let mut snap = self.snapshot().await?;
        let out = snap
            .read(&[schema::defs_version_key(), schema::item_key(id)], &[])
            .await?;
        let defs = self.defs_at(&mut snap, &out.rows[0]).await?;
        drop(snap);
        let Some(row) = &out.rows[1] else {
            return Ok(());
        };
        let stored = ItemRow::decode_checked(row)?;
        if stored.stamp >= defs.version {
            return Ok(());
        }
        let mut b = Batch::new();
        defs.apply_diff(
            &mut b,
            Some((&stored.item, stored.stamp)),
            Some(&stored.item),
            self.split(),
        );
        let key = schema::item_key(id);
        let fresh = schema::encode_item(&stored.item, defs.version);
        b.put(key.clone(), fresh, row.version + 1)
            .guard(key, Expect::Version(row.version));
        self.store().write(b).await?;
        Ok(())
    }

    /// Removes every row of a dropped index, then its declaration.
    pub(crate) async fn remove_index_rows(&self, name: &str) -> Result<()> {
        let defs = self.retrying(|| self.read_defs()).await?;
        let Some(def) = defs.get(name).cloned() else {
            return Ok(());
        };
        if def.state != IndexState::Dropping {
            return Ok(());
        }
        let kind = def.kind.clone().unwrap_or_default();
        let split = self.split();
        let mut pending = Batch::new();
        let mut batches = Vec::new();
        self.for_each_item(&kind, |row| {
            for (k, _) in def.rows(&row.item, split) {
                pending.delete(k);
            }
            if pending.ops.len() >= 1000 {
                batches.push(std::mem::take(&mut pending));
            }
            let ready = std::mem::take(&mut batches);
            async move {
                for b in ready {
                    self.retrying(|| self.store_write(b.clone())).await?;
                }
                Ok(())
            }
        })
        .await?;
        self.retrying(|| self.store_write(pending.clone())).await?;
        self.retrying(|| async {
            let defs = self.read_defs().await?;
            if defs
                .get(name)
                .is_none_or(|d| d.state != IndexState::Dropping)
            {
                return Ok(());
            }
            let mut b = Batch::new();
            b.delete(schema::def_key(name));
            self.write_defs(defs.version, b).await?;
            Ok(())
        })
        .await
    }

    async fn store_write(&self, b: Batch) -> Result<()> {
        Ok(self.store().write(b).await?)
    }

    /// Pulls the items of a kind in bounded batches, bucket by bucket, and
    /// runs `each` on every one, with many in flight.
    async fn for_each_item<'a, F, Fut>(&'a self, kind: &str, mut each: F) -> Result<()>
    where
        F: FnMut(ItemRow) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + 'a,
    {
        // Each item's work and each batch read hold one of the node's
        // background places (see `background_places`) while they run.
        let mut in_flight = FuturesUnordered::new();
        for bucket in 0..KIND_BUCKETS {
            let partition = schema::kind_partition(kind, bucket);
            // Item ids are base64url: every one sorts after the stamp row.
            let mut after = schema::STAMP_ROW.to_vec();
            loop {
                // The next batch is read while the items already started run
                // on: each may hold a store connection, and leaving them
                // unpolled while this read waits for one could wait forever.
                let next = self.retrying(|| async {
                    let _place = self.background_place().await?;
                    let mut snap = self.snapshot().await?;
                    let ids = snap
                        .scan(
                            &Scan::partition(KINDS, partition.clone(), BACKFILL_BATCH)
                                .bounds(Bound::Excluded(after.clone()), Bound::Unbounded),
                        )
                        .await?;
                    let keys: Vec<Key> = ids
                        .iter()
                        .map(|r| {
                            String::from_utf8(r.clustering.clone())
                                .map(|id| schema::item_key(&id))
                                .map_err(|e| crate::error::corrupt("kind entry", e))
                        })
                        .collect::<Result<_>>()?;
                    let items = snap.get_many(&keys).await?;
                    Ok((ids.last().map(|r| r.clustering.clone()), items))
                });
                let (last, items) = beside(next, &mut in_flight).await?;
                for row in items.into_iter().flatten() {
                    let item = ItemRow::decode_checked(&row)?;
                    let work = each(item);
                    in_flight.push(async move {
                        let _place = self.background_place().await?;
                        work.await
                    });
                    while in_flight.len() >= BACKFILL_IN_FLIGHT {
                        if let Some(done) = in_flight.next().await {
                            done?;
                        }
                    }
                }
                match last {
                    Some(l) => after = l,
                    None => break,
                }
            }
        }
        while let Some(done) = in_flight.next().await {
            done?;
        }
        Ok(())
    }
}

/// Awaits `fut` while driving the futures `in_flight` (failing with the
/// first of them that fails).
async fn beside<T, F, G>(fut: F, in_flight: &mut FuturesUnordered<G>) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
    G: std::future::Future<Output = Result<()>>,
{
    let mut fut = std::pin::pin!(fut);
    loop {
        if in_flight.is_empty() {
            return fut.await;
        }
        match select(fut.as_mut(), in_flight.next()).await {
            Either::Left((r, _)) => return r,
            Either::Right((Some(done), _)) => done?,
            Either::Right((None, _)) => {}
        }
    }
}

/// Background work on one index.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Work {
    Build,
    Drop,
}

/// Work left on one declaration: its name and uid (a name is taken again
/// by a new index while a dropped one's rows go, and while an old build
/// may still run).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Task {
    name: String,
    uid: String,
    work: Work,
}

impl Task {
    /// The work a declaration in its state needs, if any.
    fn of(def: &IndexDef) -> Option<Task> {
        let work = match def.state {
            IndexState::Building => Work::Build,
            IndexState::Dropping => Work::Drop,
            IndexState::Ready => return None,
        };
        Some(Task {
            name: def.name.clone(),
            uid: def.uid.clone(),
            work,
        })
    }
}

/// Beats without a change after which a node takes up another's index
/// work.
const STALE_BEATS: u32 = 6;

/// This node's claim on a task, given up when dropped (also when the work
/// panics).
struct Working {
    engine: Engine,
    task: Task,
}

impl Working {
    fn claim(engine: &Engine, task: &Task) -> Option<Working> {
        let fresh = engine
            .inner
            .index_work
            .lock()
            .expect("never poisoned")
            .insert(task.clone());
        fresh.then(|| Working {
            engine: engine.clone(),
            task: task.clone(),
        })
    }

    fn is_on(engine: &Engine, task: &Task) -> bool {
        engine
            .inner
            .index_work
            .lock()
            .expect("never poisoned")
            .contains(task)
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.engine
            .inner
            .index_work
            .lock()
            .expect("never poisoned")
            .remove(&self.task);
    }
}

fn tracing_error(name: &str, e: &EngineError) {
    tracing::error!(index = name, error = %e, "background index work failed");
}

/// The longest wait between two tries of background index work.
const RETRY_AT_MOST: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs background index work until it is done. A try that fails because
/// the store could not serve (each try has already retried a few times) is
/// followed by another, later and later up to [`RETRY_AT_MOST`] apart: an
/// outage must not leave an index building, answering `index-building`,
/// until a node restarts. Any other failure is logged and ends the tries:
/// answers whether the work was done.
async fn keep_trying<F, Fut>(name: &str, work: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut wait = std::time::Duration::from_secs(1);
    loop {
        match work().await {
            Ok(()) => return true,
            Err(e) => {
                tracing_error(name, &e);
                if !matches!(e, EngineError::Unavailable(_) | EngineError::Store(_)) {
                    return false;
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_AT_MOST);
    }
}
