//! Listings: pick the index that serves the query, read each of the caller's
//! principals' partitions from the cursor, merge them, drop duplicates, and
//! return the page with an opaque cursor.
//!
//! Cost never depends on the pool's size, only on the page and the
//! caller's principals, and it is bounded for any of them. The merge is
//! lazy: each partition is first read for a few rows (all `limit + 1` when
//! the caller has few partitions, fewer when they have many, so that a
//! member of a thousand groups does not read a thousand pages), and a
//! partition is read again, for twice as many rows, only when its last row
//! read could still come before the next row to return. Reading
//! `limit + 1` rows per partition would always be enough: a key among the
//! first `limit` distinct keys of the union has fewer than `limit` distinct
//! keys before it, so it lies within the first `limit` rows of its own
//! partition.
//!
//! Round trips: the first read takes the session, the user, the index
//! declarations' version and the direct memberships; the second the next
//! level of memberships together with the index partitions of every
//! principal known so far; then the items. Without nested groups (or
//! without groups) a listing is three dependent reads.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Bound;

use serde_json::{json, Value};
use tarn_store::{Direction, Row, Scan, SnapshotExt};

use crate::actor::Resolve;
use crate::error::{EngineError, Result};
use crate::indexes::{is_shared, IndexDef, IndexState, SortField, SHARED};
use crate::keys::Order;
use crate::schema::{self, ItemRow, INDEX};
use crate::{seal, unseal, Caller, Engine, ItemView, Principal, Role};

/// Largest page.
pub const MAX_LIMIT: usize = 1000;

/// Which items a listing ranges over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Everything the caller may read.
    #[default]
    Visible,
    /// Items the caller created (and may still read).
    Mine,
    /// Items others shared with the caller or one of the caller's groups,
    /// any kind (not those shared with everyone or every signed-in user).
    Shared,
}

/// A listing request.
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// The kind; required unless `scope` is `Mine`.
    pub kind: Option<String>,
    /// Equality conditions, one per field.
    pub where_: Vec<(String, Value)>,
    /// Sort fields; empty means `modifiedAt` descending.
    pub sort: Vec<SortField>,
    /// Which items.
    pub scope: Scope,
    /// Page size, 1 to [`MAX_LIMIT`].
    pub limit: usize,
    /// Where the previous page ended.
    pub cursor: Option<String>,
}

impl Default for ListQuery {
    fn default() -> Self {
        ListQuery {
            kind: None,
            where_: Vec::new(),
            sort: Vec::new(),
            scope: Scope::Visible,
            limit: 50,
            cursor: None,
        }
    }
}

/// One page of a listing.
#[derive(Clone, Debug)]
pub struct Page {
    /// The items, in order.
    pub items: Vec<ItemView>,
    /// The cursor of the next page; `None` at the end.
    pub next: Option<String>,
}

pub(crate) fn check_limit(limit: usize) -> Result<()> {
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(())
    } else {
        Err(EngineError::InvalidInput(format!(
            "limit must be from 1 to {MAX_LIMIT}"
        )))
    }
}

/// The index chosen for a query and how to read it.
struct Plan {
    def: IndexDef,
    direction: Direction,
    where_values: Vec<Value>,
}

const CURSOR_VERSION: u8 = 3;

impl Plan {
    /// What a cursor is bound to: the index (its uid, never reused, so an
    /// index declared again under a dropped one's name refuses the old
    /// cursors) and the encoded values of its where fields, so that a
    /// cursor of one listing is refused by another instead of starting it
    /// at a foreign place. (The kind is the index's, or, for the built-in
    /// ones, among the where values.)
    fn identity(&self) -> [u8; 16] {
        let index = if self.def.uid.is_empty() {
            &self.def.name
        } else {
            &self.def.uid
        };
        let mut bytes = Vec::with_capacity(64);
        bytes.extend_from_slice(&(index.len() as u32).to_be_bytes());
        bytes.extend_from_slice(index.as_bytes());
        for v in &self.where_values {
            // The bytes that name the partition: `1` and `1.0` alike, and
            // a long string by its hash, whole.
            let v = crate::keys::encoded_where(Some(v));
            bytes.extend_from_slice(&(v.len() as u32).to_be_bytes());
            bytes.extend_from_slice(&v);
        }
        let mut id = [0; 16];
        id.copy_from_slice(&crate::sha256(&bytes)[..16]);
        id
    }
}

fn encode_cursor(key: &[u8], listing: &[u8; 16], direction: Direction, last: &[u8]) -> String {
    let mut c = vec![CURSOR_VERSION, (direction == Direction::Reverse) as u8];
    c.extend_from_slice(listing);
    c.extend_from_slice(last);
    seal(key, b"listing", &c)
}

fn decode_cursor(
    key: &[u8],
    cursor: &str,
    listing: &[u8; 16],
    direction: Direction,
) -> Result<Vec<u8>> {
    let bad = || EngineError::InvalidInput("the cursor does not belong to this listing".into());
    let c = unseal(key, b"listing", cursor).ok_or_else(bad)?;
    if c.len() < 18
        || c[0] != CURSOR_VERSION
        || c[1] != (direction == Direction::Reverse) as u8
        || c[2..18] != listing[..]
    {
        return Err(bad());
    }
    Ok(c[18..].to_vec())
}

/// One partition (or one clustering range of one) read by a merge.
struct Source {
    partition: Vec<u8>,
    /// The range of clustering keys the source covers.
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    /// Bytes at the start of every key of the source that take no part in
    /// ordering (a text index's term: rows of several terms merge by what
    /// follows it).
    strip: usize,
    /// Rows read and not yet merged, in merge order.
    buf: std::collections::VecDeque<Row>,
    /// The last clustering key read: the next read starts after it.
    last: Option<Vec<u8>>,
    /// Whether the partition has no row after `last`.
    exhausted: bool,
    /// Rows the next read asks for.
    next_read: usize,
}

/// A head of the merge: the next row of one source.
struct Head {
    key: Vec<u8>,
    source: usize,
    reverse: bool,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    /// The heap pops its greatest: the smallest key going forward, the
    /// largest going in reverse; then the lowest source.
    fn cmp(&self, other: &Self) -> Ordering {
        let by_key = self.key.cmp(&other.key);
        let by_key = if self.reverse {
            by_key
        } else {
            by_key.reverse()
        };
        by_key.then(other.source.cmp(&self.source))
    }
}

/// A clustering range of one partition: partition, lower and upper bound,
/// and how many leading bytes of its keys take no part in ordering.
pub(crate) type Range = (Vec<u8>, Bound<Vec<u8>>, Bound<Vec<u8>>, usize);

/// A lazy k-way merge of sorted partitions that asks for more rows of a
/// partition only when it needs them (see the module's documentation).
pub(crate) struct Merge {
    table: tarn_store::Table,
    direction: Direction,
    /// Where the previous page ended.
    after: Option<Vec<u8>>,
    /// Rows merged so far that the merge is to reach.
    want: usize,
    /// Rows merged so far (drained or not).
    merged: usize,
    sources: Vec<Source>,
    heads: BinaryHeap<Head>,
    /// Sources whose rows read are all merged but that may have more.
    pending: Vec<usize>,
    /// Sources with a read in flight.
    reading: Vec<usize>,
    out: Vec<Row>,
    /// The ordering key of the last row merged, to drop duplicates.
    last_key: Option<Vec<u8>>,
}

/// What the merge needs next.
pub(crate) enum Step {
    /// Read these scans and hand their answers to [`Merge::absorb`].
    Read(Vec<Scan>),
    /// The page is complete.
    Done,
}

impl Merge {
    pub(crate) fn new(
        table: tarn_store::Table,
        direction: Direction,
        after: Option<Vec<u8>>,
        want: usize,
    ) -> Merge {
        Merge {
            table,
            direction,
            after,
            want,
            merged: 0,
            sources: Vec::new(),
            heads: BinaryHeap::new(),
            pending: Vec::new(),
            reading: Vec::new(),
            out: Vec::with_capacity(want.min(1024)),
            last_key: None,
        }
    }

    fn reverse(&self) -> bool {
        self.direction == Direction::Reverse
    }

    /// `a` comes before `b` in merge order.
    fn before(&self, a: &[u8], b: &[u8]) -> bool {
        if self.reverse() {
            a > b
        } else {
            a < b
        }
    }

    fn first_read(&self, expected: usize) -> usize {
        let expected = expected.max(1);
        let first = if expected <= 16 {
            self.want
        } else {
            (self.want * 4 / expected).max(4).min(self.want)
        };
        first.min(tarn_store::MAX_READ_ROWS / expected).max(1)
    }

    /// Adds whole partitions to merge; `expected` is how many sources
    /// there will be in all, to size the first reads.
    pub(crate) fn add(&mut self, partitions: Vec<Vec<u8>>, expected: usize) {
        let ranges = partitions
            .into_iter()
            .map(|p| (p, Bound::Unbounded, Bound::Unbounded, 0))
            .collect();
        self.add_ranges(ranges, expected);
    }

    /// Adds clustering ranges of partitions to merge, each with the number
    /// of leading key bytes that take no part in ordering.
    pub(crate) fn add_ranges(&mut self, ranges: Vec<Range>, expected: usize) {
        let first = self.first_read(expected);
        self.add_ranges_reading(ranges, first);
    }

    /// Adds clustering ranges whose first reads take `first` rows each.
    pub(crate) fn add_ranges_reading(&mut self, ranges: Vec<Range>, first: usize) {
        let first = first.max(1);
        for (partition, lower, upper, strip) in ranges {
            let i = self.sources.len();
            self.sources.push(Source {
                partition,
                lower,
                upper,
                strip,
                buf: Default::default(),
                last: None,
                exhausted: false,
                next_read: first,
            });
            self.pending.push(i);
        }
    }

    fn scan_of(&self, s: &Source) -> Scan {
        let from = s.last.clone().or_else(|| self.after.clone());
        let scan = Scan::partition(self.table, s.partition.clone(), s.next_read)
            .direction(self.direction)
            .bounds(s.lower.clone(), s.upper.clone());
        match (from, self.direction) {
            (None, _) => scan,
            (Some(k), Direction::Forward) => scan.bounds(Bound::Excluded(k), s.upper.clone()),
            (Some(k), Direction::Reverse) => scan.bounds(s.lower.clone(), Bound::Excluded(k)),
        }
    }

    /// Reads for every source that has never been read (the first round).
    pub(crate) fn first_reads(&mut self) -> Vec<Scan> {
        let unread: Vec<usize> = self
            .pending
            .iter()
            .copied()
            .filter(|i| self.sources[*i].last.is_none() && !self.sources[*i].exhausted)
            .collect();
        self.pending.retain(|i| self.sources[*i].last.is_some());
        self.start_reads(unread)
    }

    fn start_reads(&mut self, which: Vec<usize>) -> Vec<Scan> {
        let mut budget = tarn_store::MAX_READ_ROWS;
        let mut scans = Vec::with_capacity(which.len());
        for i in which {
            let s = &mut self.sources[i];
            s.next_read = s.next_read.min(budget.max(1));
            budget = budget.saturating_sub(s.next_read);
            scans.push(self.scan_of(&self.sources[i]));
            self.reading.push(i);
        }
        scans
    }

    /// Takes the answers to the last reads asked for, in order.
    pub(crate) fn absorb(&mut self, answers: Vec<Vec<Row>>) {
        let reading = std::mem::take(&mut self.reading);
        let cap = self.want.max(1);
        for (i, rows) in reading.into_iter().zip(answers) {
            let reverse = self.reverse();
            let s = &mut self.sources[i];
            s.exhausted = rows.len() < s.next_read;
            s.next_read = (s.next_read * 2).min(cap);
            if let Some(last) = rows.last() {
                s.last = Some(last.clustering.clone());
            }
            let was_empty = s.buf.is_empty();
            s.buf.extend(rows);
            if was_empty {
                if let Some(front) = s.buf.front() {
                    self.heads.push(Head {
                        key: front.clustering[s.strip.min(front.clustering.len())..].to_vec(),
                        source: i,
                        reverse,
                    });
                } else if !s.exhausted {
                    self.pending.push(i);
                }
            }
        }
    }

    /// Merges as far as the rows read allow; asks for reads of the
    /// partitions that could hold the next row, or says the merge has what
    /// it wants (or all there is).
    pub(crate) fn step(&mut self) -> Step {
        loop {
            if self.merged >= self.want {
                return Step::Done;
            }
            // A source that is not exhausted and whose last row read comes
            // before the next head may hold rows before that head.
            let top = self.heads.peek().map(|h| h.key.clone());
            let blocking: Vec<usize> = self
                .pending
                .iter()
                .copied()
                .filter(|i| {
                    let s = &self.sources[*i];
                    !s.exhausted
                        && match (&s.last, &top) {
                            (None, _) | (_, None) => true,
                            (Some(last), Some(top)) => {
                                self.before(&last[s.strip.min(last.len())..], top)
                            }
                        }
                })
                .collect();
            if !blocking.is_empty() {
                self.pending.retain(|i| !blocking.contains(i));
                return Step::Read(self.start_reads(blocking));
            }
            let Some(head) = self.heads.pop() else {
                return Step::Done;
            };
            let reverse = self.reverse();
            let s = &mut self.sources[head.source];
            let row = s.buf.pop_front().expect("a head has a row");
            match s.buf.front() {
                Some(next) => self.heads.push(Head {
                    key: next.clustering[s.strip.min(next.clustering.len())..].to_vec(),
                    source: head.source,
                    reverse,
                }),
                None if !s.exhausted => self.pending.push(head.source),
                None => {}
            }
            // Equal keys are one item read through two principals; they
            // come out of the merge one after the other.
            if self.last_key.as_ref() != Some(&head.key) {
                self.last_key = Some(head.key);
                self.out.push(row);
                self.merged += 1;
            }
        }
    }

    /// Asks for `more` rows past those merged so far.
    pub(crate) fn want_more(&mut self, more: usize) {
        self.want = self.merged + more;
    }

    /// Whether every source is read to its end and merged.
    pub(crate) fn finished(&self) -> bool {
        self.heads.is_empty() && self.sources.iter().all(|s| s.exhausted && s.buf.is_empty())
    }

    /// The rows merged since the last drain.
    pub(crate) fn drain(&mut self) -> Vec<Row> {
        std::mem::take(&mut self.out)
    }

    /// The merged rows.
    pub(crate) fn rows(self) -> Vec<Row> {
        self.out
    }
}

fn suggest(
    defs: &[IndexDef],
    kind: Option<&str>,
    fields: &BTreeMap<String, Value>,
    sort: &[SortField],
) -> (String, String) {
    let mut rest = String::new();
    for s in sort {
        rest.push_str("-by-");
        rest.push_str(&s.field.replace('.', "-"));
    }
    let where_: Vec<&String> = fields.keys().filter(|f| *f != "kind").collect();
    for w in &where_ {
        rest.push_str("-where-");
        rest.push_str(&w.replace('.', "-"));
    }
    // Without a kind (a listing of every kind, which no declared index
    // serves), the advice is for the kind the caller means to list.
    let kind = kind.unwrap_or("<kind>");
    let name = crate::indexes::free_name(defs, &format!("{kind}{rest}"));
    let written = crate::indexes::written_field;
    let declare = json!({
        "kind": kind,
        "where": where_.iter().map(|f| written(f)).collect::<Vec<_>>(),
        "sort": sort
            .iter()
            .map(|s| json!({"field": written(&s.field), "order": s.order}))
            .collect::<Vec<_>>(),
    });
    (name, declare.to_string())
}

/// The plan of `scope=shared`: `_shared`, newest or oldest first.
fn shared_plan(defs: &[IndexDef], sort: &[SortField]) -> Result<Plan> {
    let def = defs
        .iter()
        .find(|d| d.kind.is_none() && d.name == SHARED)
        .expect("a built-in");
    let direction = match sort {
        [s] if s.field == "modifiedAt" && s.order == Order::Asc => Direction::Forward,
        [s] if s.field == "modifiedAt" => Direction::Reverse,
        _ => {
            return Err(EngineError::InvalidInput(
                "scope=shared sorts by modifiedAt or -modifiedAt".into(),
            ))
        }
    };
    Ok(Plan {
        def: def.clone(),
        direction,
        where_values: Vec::new(),
    })
}

fn not_a_time(field: &str) -> EngineError {
    EngineError::InvalidInput(format!(
        "where.{field}: an RFC 3339 time, such as 2026-01-31T12:00:00.000000Z"
    ))
}

/// A listing's or a search's `where` equalities by field: fields an index
/// can have, each once, values a key can hold. `createdAt` and
/// `modifiedAt` take the RFC 3339 times items show (or microseconds since
/// the epoch, as they are stored).
pub(crate) fn where_fields(given: &[(String, Value)]) -> Result<BTreeMap<String, Value>> {
    let mut fields = BTreeMap::new();
    for (written, v) in given {
        let f = &crate::indexes::canonical_field(written)?.to_string();
        // `kind` is the listing's kind, never a where field.
        crate::indexes::check_fields(std::iter::once(f))?;
        let v = match (f.as_str(), v) {
            (_, Value::Array(_) | Value::Object(_)) => {
                return Err(EngineError::InvalidInput(format!(
                    "where.{f}: a where value is a string, number, boolean or null"
                )))
            }
            ("createdAt" | "modifiedAt", Value::String(t)) => {
                Value::from(crate::parse_time(t).ok_or_else(|| not_a_time(f))?)
            }
            ("createdAt" | "modifiedAt", Value::Bool(_)) => return Err(not_a_time(f)),
            (_, v) => v.clone(),
        };
        if fields.insert(f.clone(), v).is_some() {
            return Err(EngineError::InvalidInput(if written == f {
                format!("where.{f} is given twice")
            } else {
                format!("where.{written} is where.{f}, given twice")
            }));
        }
    }
    Ok(fields)
}

impl Engine {
    fn plan(
        &self,
        defs: &[IndexDef],
        q: &ListQuery,
        fields: &BTreeMap<String, Value>,
        sort: &[SortField],
    ) -> Result<Plan> {
        let reversed: Vec<SortField> = sort
            .iter()
            .map(|s| SortField {
                field: s.field.clone(),
                order: s.order.reversed(),
            })
            .collect();
        let mut building = None;
        // Of the ready indexes that serve the listing, the one declared
        // first: declaring an equivalent one later never moves a listing
        // (and the cursors of its pages, which name their index) to it.
        let mut chosen: Option<Plan> = None;
        for d in defs {
            let where_matches = match &d.kind {
                Some(k) => {
                    q.kind.as_deref() == Some(k.as_str())
                        && d.where_.len() == fields.len() - usize::from(fields.contains_key("kind"))
                        && d.where_
                            .iter()
                            .all(|f| f != "kind" && fields.contains_key(f))
                }
                None => {
                    d.where_.len() == fields.len()
                        && d.where_.iter().all(|f| fields.contains_key(f))
                }
            };
            let shared = d.kind.is_none() && d.name == SHARED;
            if !where_matches || shared || d.state == IndexState::Dropping {
                continue;
            }
            let direction = if d.sort == sort {
                Direction::Forward
            } else if d.sort == reversed {
                Direction::Reverse
            } else {
                continue;
            };
            if d.state == IndexState::Building {
                building = Some(d.name.clone());
                continue;
            }
            if chosen.as_ref().is_some_and(|c| c.def.since <= d.since) {
                continue;
            }
            let where_values = d.where_.iter().map(|f| fields[f].clone()).collect();
            chosen = Some(Plan {
                def: d.clone(),
                direction,
                where_values,
            });
        }
        if let Some(plan) = chosen {
            return Ok(plan);
        }
        if let Some(name) = building {
            return Err(EngineError::IndexBuilding(name));
        }
        // Fields no index can have are bad input, not a missing index
        // (`kind` among the where keys is the listing's kind).
        crate::indexes::check_fields(
            sort.iter()
                .map(|s| &s.field)
                .chain(fields.keys().filter(|f| *f != "kind")),
        )?;
        let (name, declare) = suggest(defs, q.kind.as_deref(), fields, sort);
        Err(EngineError::NoIndex {
            what: "listing",
            name,
            declare,
        })
    }

    /// One page of a listing, from the index that serves it.
    pub async fn list_items(&self, caller: &Caller, q: &ListQuery) -> Result<Page> {
        check_limit(q.limit)?;
        let mut fields = where_fields(&q.where_)?;
        if q.scope == Scope::Shared && (q.kind.is_some() || !fields.is_empty()) {
            return Err(EngineError::InvalidInput(
                "scope=shared lists every kind: it takes no kind and no where-fields".into(),
            ));
        }
        if let Some(kind) = &q.kind {
            fields.insert("kind".into(), Value::from(kind.clone()));
        } else if q.scope == Scope::Visible {
            return Err(EngineError::InvalidInput("kind is required".into()));
        }
        if q.sort.len() > crate::indexes::MAX_FIELDS {
            return Err(EngineError::InvalidInput(format!(
                "sort names at most {} fields, as an index has",
                crate::indexes::MAX_FIELDS
            )));
        }
        let sort = if q.sort.is_empty() {
            vec![SortField {
                field: "modifiedAt".into(),
                order: Order::Desc,
            }]
        } else {
            q.sort
                .iter()
                .map(|s| {
                    Ok(SortField {
                        field: crate::indexes::canonical_field(&s.field)?.to_string(),
                        order: s.order,
                    })
                })
                .collect::<Result<Vec<_>>>()?
        };
        // `v` and `properties.v` are one field.
        if let Some(i) =
            (1..sort.len()).find(|&i| sort[..i].iter().any(|f| f.field == sort[i].field))
        {
            return Err(EngineError::InvalidInput(format!(
                "sort names {:?} twice",
                sort[i].field
            )));
        }
        let key = self.cursor_key().await?;
        self.retrying(|| self.list_once(caller, q, fields.clone(), &sort, key))
            .await
    }

    async fn list_once(
        &self,
        caller: &Caller,
        q: &ListQuery,
        mut fields: BTreeMap<String, Value>,
        sort: &[SortField],
        key: &[u8],
    ) -> Result<Page> {
        let mut snap = self.snapshot().await?;
        let mut res = Resolve::new(caller)?;
        // First read: who is asking, and the declarations' version.
        let mut gets = res.first_gets();
        let first = gets.len();
        gets.push(schema::defs_version_key());
        let out = crate::read(&mut snap, &gets, &res.scans()).await?;
        res.absorb_first(self, &out.rows[..first])?;
        res.absorb_scans(&out.scans)?;
        let defs = self.defs_at(&mut snap, &out.rows[first]).await?;
        let me = res.principals();
        if q.scope == Scope::Mine {
            let Some(Principal::User(username)) = me.first() else {
                return Err(EngineError::Unauthenticated("sign in first".into()));
            };
            let username = Value::from(username.as_str());
            if fields.get("createdBy").is_some_and(|v| *v != username) {
                return Err(EngineError::InvalidInput(
                    "scope=mine lists your own items; drop where.createdBy".into(),
                ));
            }
            fields.insert("createdBy".into(), username);
        }
        if q.scope == Scope::Shared && !matches!(me.first(), Some(Principal::User(_))) {
            return Err(EngineError::Unauthenticated("sign in first".into()));
        }
        let plan = if q.scope == Scope::Shared {
            shared_plan(&defs.defs, sort)?
        } else {
            self.plan(&defs.defs, q, &fields, sort)?
        };
        let after = match &q.cursor {
            Some(c) => Some(decode_cursor(key, c, &plan.identity(), plan.direction)?),
            None => None,
        };
        let values: Vec<Option<&Value>> = plan.where_values.iter().map(Some).collect();
        let split = self.split();
        let mut merge = Merge::new(INDEX, plan.direction, after, q.limit + 1);
        let mut added = 0;
        // Then, while memberships are still being walked, every read also
        // takes the index partitions of the principals found so far.
        loop {
            let principals = res.principals();
            let new: Vec<Vec<u8>> = principals[added..]
                .iter()
                // `_shared` has no rows in the partitions every reader shares.
                .filter(|p| q.scope != Scope::Shared || !is_shared(p))
                .flat_map(|p| plan.def.partitions(p, split, &values))
                .collect();
            let expected = if q.scope == Scope::Shared {
                principals.iter().filter(|p| !is_shared(p)).count()
            } else {
                principals.len() + 2 * split.saturating_sub(1) as usize
            };
            added = principals.len();
            merge.add(new, expected);
            let walk = res.scans();
            let index = merge.first_reads();
            if walk.is_empty() && index.is_empty() {
                break;
            }
            let n = walk.len();
            let out = crate::read(&mut snap, &[], &[walk, index].concat()).await?;
            let mut scans = out.scans;
            let index_rows = scans.split_off(n);
            res.absorb_scans(&scans)?;
            merge.absorb(index_rows);
        }
        let actor = res.finish();
        while let Step::Read(scans) = merge.step() {
            let out = crate::read(&mut snap, &[], &scans).await?;
            merge.absorb(out.scans);
        }
        let rows = merge.rows();
        let more = rows.len() > q.limit;
        let page = &rows[..rows.len().min(q.limit)];
        let next = if more {
            page.last()
                .map(|r| encode_cursor(key, &plan.identity(), plan.direction, &r.clustering))
        } else {
            None
        };
        let keys = page
            .iter()
            .map(|r| {
                std::str::from_utf8(&r.value)
                    .map(schema::item_key)
                    .map_err(|e| crate::error::corrupt("index row", e))
            })
            .collect::<Result<Vec<_>>>()?;
        let found = snap.get_many(&keys).await?;
        drop(snap);
        let mut items = Vec::with_capacity(keys.len());
        for row in found.into_iter().flatten() {
            let stored = ItemRow::decode(&row)?;
            // The index said readable; on a store without snapshots the item
            // row has the last word (a change may land between two reads).
            let role = if actor.admin {
                Some(Role::Manager)
            } else {
                stored.item.role_of(&actor.principals)
            };
            // The caller's own items shared with one of their groups are
            // in `_shared` too; they are left out (the page may come out
            // short, its cursor still moves on).
            let own =
                matches!(me.first(), Some(Principal::User(u)) if *u == stored.item.created_by);
            if q.scope == Scope::Shared && own {
                continue;
            }
            if let Some(role) = role {
                items.push(ItemView {
                    item: stored.item,
                    role,
                });
            }
        }
        Ok(Page { items, next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(k: &[u8]) -> Row {
        Row {
            clustering: k.to_vec(),
            value: k.to_vec(),
            version: 1,
        }
    }

    /// Runs a merge against in-memory partitions, counting rows read.
    fn run(parts: &[Vec<u8>], reverse: bool, want: usize) -> (Vec<u8>, usize) {
        let direction = if reverse {
            Direction::Reverse
        } else {
            Direction::Forward
        };
        let table = tarn_store::Table::new("t");
        let mut m = Merge::new(table, direction, None, want);
        let names: Vec<Vec<u8>> = (0..parts.len()).map(|i| vec![i as u8]).collect();
        m.add(names, parts.len());
        let answer = |scans: Vec<Scan>| -> Vec<Vec<Row>> {
            scans
                .iter()
                .map(|s| {
                    let mut keys: Vec<u8> = parts[s.partition[0] as usize]
                        .iter()
                        .copied()
                        .filter(|k| s.contains(&[*k]))
                        .collect();
                    keys.sort();
                    if reverse {
                        keys.reverse();
                    }
                    keys.iter().take(s.limit).map(|k| row(&[*k])).collect()
                })
                .collect()
        };
        let mut read = 0;
        let first = m.first_reads();
        let got = answer(first);
        read += got.iter().map(Vec::len).sum::<usize>();
        m.absorb(got);
        while let Step::Read(scans) = m.step() {
            let got = answer(scans);
            read += got.iter().map(Vec::len).sum::<usize>();
            m.absorb(got);
        }
        (m.rows().iter().map(|r| r.clustering[0]).collect(), read)
    }

    #[test]
    fn merge_drops_duplicates_both_directions() {
        let parts = vec![b"ace".to_vec(), b"bcd".to_vec(), vec![], b"a".to_vec()];
        assert_eq!(run(&parts, false, 10).0, b"abcde".to_vec());
        assert_eq!(run(&parts, false, 3).0, b"abc".to_vec());
        assert_eq!(run(&parts, true, 10).0, b"edcba".to_vec());
        assert_eq!(run(&parts, true, 2).0, b"ed".to_vec());
    }

    #[test]
    fn merge_of_many_partitions_reads_few_rows() {
        // 1000 partitions of 50 rows each; the first 26 keys overall live
        // in the first few partitions.
        let parts: Vec<Vec<u8>> = (0..1000)
            .map(|p| {
                let base = if p < 3 { 0u8 } else { 100u8 };
                (0..50u8).map(|k| base.saturating_add(k)).collect()
            })
            .collect();
        let (keys, read) = run(&parts, false, 26);
        assert_eq!(keys, (0..26u8).collect::<Vec<_>>());
        assert!(read < 1000 * 26 / 4, "read {read} rows");
    }

    #[test]
    fn merge_refills_exactly_what_it_needs() {
        // One partition holds every key; many hold none.
        let mut parts: Vec<Vec<u8>> = vec![(0..200u8).collect()];
        parts.extend((0..99).map(|_| Vec::new()));
        let (keys, _) = run(&parts, false, 101);
        assert_eq!(keys, (0..101u8).collect::<Vec<_>>());
        let (keys, _) = run(&parts, true, 5);
        assert_eq!(keys, vec![199, 198, 197, 196, 195]);
    }

    const KEY: &[u8] = b"a store's key";

    #[test]
    fn cursors_belong_to_their_listing() {
        const IDX: &[u8; 16] = b"idx, where x = 1";
        const OTHER: &[u8; 16] = b"idx, where x = 2";
        let c = encode_cursor(KEY, IDX, Direction::Forward, b"\x01key");
        // Another store's (another key's) cursor is no cursor here.
        assert!(decode_cursor(b"another key", &c, IDX, Direction::Forward).is_err());
        assert_eq!(
            decode_cursor(KEY, &c, IDX, Direction::Forward).unwrap(),
            b"\x01key"
        );
        assert!(decode_cursor(KEY, &c, OTHER, Direction::Forward).is_err());
        assert!(decode_cursor(KEY, &c, IDX, Direction::Reverse).is_err());
        assert!(decode_cursor(KEY, "!!", IDX, Direction::Forward).is_err());
        // Cut short or altered anywhere: refused, never read as a place.
        for n in 0..c.len() {
            assert!(decode_cursor(KEY, &c[..n], IDX, Direction::Forward).is_err());
            let mut altered = c.clone().into_bytes();
            altered[n] = if altered[n] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(altered).unwrap();
            assert!(decode_cursor(KEY, &altered, IDX, Direction::Forward).is_err());
        }
    }
}
