//! Moving a whole store: export as a stream of records, import into an
//! empty store, both in bounded batches so memory stays flat whatever the
//! store's size.
//!
//! Everything goes across — users with their password hashes, groups and
//! memberships, items with their ACLs, links (as the hashes of their keys),
//! bodies, index declarations — but nothing derived: index rows, forward
//! rows, kind entries, the change feed and sessions are rebuilt or started
//! afresh. So a store moves between SQLite, PostgreSQL and Cassandra with
//! identical listings and searches. Index declarations come first in an
//! export, an item's body chunks right after the item, and last a record
//! that counts the others: an import refuses a file cut short.
//!
//! An export reads in fresh snapshots batch by batch: for an exact copy,
//! export a store no one writes to.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use sha2::Digest;

use serde::{Deserialize, Serialize};
use tarn_store::{Batch, Expect, Key, Row, Scan, SnapshotExt, StoreError};

use crate::actor::Admit;
use crate::error::{EngineError, Result};
use crate::indexes::{IndexDef, IndexState};
use crate::items::LinkRow;
use crate::schema::{self, ItemRow, BLOBS, GROUPS, INDEX_DEFS, ITEMS, MEMBERS, META, USERS};
use crate::{b64, hex, unb64, unhex, Engine, Group, Item, Principal, Role, User};

/// Most rows one batch of a whole-store walk reads.
const BATCH: usize = 1000;
/// Fewest rows one batch of a whole-store walk reads.
const MIN_BATCH: usize = 16;
/// The bytes a batch of a whole-store walk aims at: the walk sizes each
/// batch by the bytes a row of the last one held, so that rows of body
/// chunks (256 KiB each) come a few at a time and small rows a thousand.
const BATCH_BYTES: usize = 4 << 20;
/// Rows one import write holds, about.
const WRITE: usize = 1000;

/// One record of an export.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Record {
    /// An index declaration.
    Index {
        /// The declaration (its uid and state are the source store's).
        index: IndexDef,
    },
    /// A user, the Argon2id hash of their password included.
    User {
        /// The user.
        user: User,
    },
    /// A group.
    Group {
        /// The group.
        group: Group,
    },
    /// A membership.
    Member {
        /// The group.
        group: String,
        /// The member.
        member: Principal,
    },
    /// An item with its ACL.
    Item {
        /// The item.
        item: Item,
    },
    /// A link of an item.
    Link {
        /// The item.
        item: String,
        /// SHA-256 of the link's key, hex.
        hash: String,
        /// What the link gives.
        role: Role,
        /// When it was made, microseconds since the Unix epoch (absent for
        /// a link made before links kept their time, and in exports from
        /// before 2026-12-03).
        #[serde(default, rename = "createdAt", skip_serializing_if = "Option::is_none")]
        created_at: Option<i64>,
    },
    /// The last record: how many of each type came before it, so a file
    /// cut short is refused rather than imported in part.
    End {
        /// Counts by record type.
        records: BTreeMap<String, u64>,
    },
    /// A piece of a body.
    Chunk {
        /// The blob.
        blob: String,
        /// The chunk's number.
        n: u64,
        /// Its bytes, base64url.
        data: String,
    },
}

/// How many records of each type went across.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Moved {
    /// Counts by record type.
    pub records: BTreeMap<String, u64>,
}

impl Moved {
    fn count(&mut self, r: &Record) {
        let t = match r {
            Record::Index { .. } => "index",
            Record::User { .. } => "user",
            Record::Group { .. } => "group",
            Record::Member { .. } => "member",
            Record::Item { .. } => "item",
            Record::Link { .. } => "link",
            Record::Chunk { .. } => "chunk",
            Record::End { .. } => return,
        };
        *self.records.entry(t.into()).or_default() += 1;
    }
}

impl Engine {
    /// Streams every record of the store to `sink`, index declarations
    /// first, each item's body chunks right after it.
    pub async fn export<F>(&self, mut sink: F) -> Result<Moved>
    where
        F: FnMut(&Record) -> std::io::Result<()>,
    {
        let mut moved = Moved::default();
        let mut emit = |r: Record, moved: &mut Moved| -> Result<()> {
            moved.count(&r);
            sink(&r).map_err(|e| EngineError::Internal(format!("writing the export: {e}")))
        };
        let defs = self.retrying(|| self.read_defs()).await?;
        for d in defs.defs.iter() {
            if d.kind.is_some() && d.state != IndexState::Dropping {
                emit(Record::Index { index: d.clone() }, &mut moved)?;
            }
        }
        let mut cursor: Option<Vec<u8>> = None;
        let mut limit = MIN_BATCH;
        loop {
            let (rows, next) = self.rows_after(cursor.as_deref(), &mut limit).await?;
            for (key, row) in rows {
                let table = key.table;
                let text = |b: &[u8]| {
                    String::from_utf8(b.to_vec()).map_err(|e| crate::error::corrupt("key", e))
                };
                if table == USERS {
                    let user: User = schema::decode("user", &row)?;
                    emit(Record::User { user }, &mut moved)?;
                } else if table == GROUPS {
                    let group: Group = schema::decode("group", &row)?;
                    emit(Record::Group { group }, &mut moved)?;
                } else if table == MEMBERS && Admit::Settled.admits(&row.value) {
                    let member = text(&key.clustering)?.parse()?;
                    emit(
                        Record::Member {
                            group: text(&key.partition)?,
                            member,
                        },
                        &mut moved,
                    )?;
                } else if table == ITEMS && key.clustering == schema::ITEM_ROW {
                    let stored = ItemRow::decode_checked(&row)?;
                    let body = stored.item.body.clone();
                    emit(Record::Item { item: stored.item }, &mut moved)?;
                    if let Some(body) = body {
                        self.export_blob(&body.blob, &mut |r| emit(r, &mut moved))
                            .await?;
                    }
                } else if table == ITEMS && key.clustering.first() == Some(&b'l') {
                    let link = LinkRow::decode(&row)?.info(&row);
                    emit(
                        Record::Link {
                            item: text(&key.partition)?,
                            hash: link.id,
                            role: link.role,
                            created_at: link.created_at,
                        },
                        &mut moved,
                    )?;
                }
            }
            match next {
                Some(n) => cursor = Some(n),
                None => {
                    let records = moved.records.clone();
                    emit(Record::End { records }, &mut moved)?;
                    return Ok(moved);
                }
            }
        }
    }

    async fn export_blob(
        &self,
        blob: &str,
        emit: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<()> {
        let mut after = Bound::Unbounded;
        loop {
            let scan = Scan::partition(BLOBS, blob.as_bytes().to_vec(), 4)
                .bounds(after.clone(), Bound::Unbounded);
            let rows = self
                .retrying(|| async { Ok(self.snapshot().await?.scan(&scan).await?) })
                .await?;
            let Some(last) = rows.last() else {
                return Ok(());
            };
            after = Bound::Excluded(last.clustering.clone());
            for r in rows {
                let n = u64::from_be_bytes(
                    r.clustering
                        .as_slice()
                        .try_into()
                        .map_err(|_| crate::error::corrupt("chunk key", "length"))?,
                );
                emit(Record::Chunk {
                    blob: blob.to_string(),
                    n,
                    data: b64(&r.value),
                })?;
            }
        }
    }

    /// Whether the store holds no groups, items or index declarations,
    /// and no users but the administrator a server started with
    /// `TARN_ADMIN_PASSWORD` makes before anything else (user `admin`, an
    /// administrator with no properties): only such a store is an import's
    /// target, and an import removes that administrator first.
    pub async fn is_empty(&self) -> Result<bool> {
        let held = self
            .any_row(|key, row| {
                [USERS, GROUPS, ITEMS, INDEX_DEFS].contains(&key.table) && !is_made_admin(key, row)
            })
            .await?;
        Ok(!held)
    }

    /// Whether the store holds no row at all: no server started on it and
    /// nothing was imported into it (a schema or keyspace that opening it
    /// just made, under a name mistyped).
    ///
    /// A batch may hold none of the rows it passed over (Cassandra's hides
    /// its feeds and marks) and still have more after it: the walk goes on
    /// until a row or the end.
    pub async fn holds_nothing(&self) -> Result<bool> {
        Ok(!self.any_row(|_, _| true).await?)
    }

    /// Whether any of the store's rows is `hit`, walking them in batches
    /// to the end or the first such row.
    async fn any_row(&self, hit: impl Fn(&Key, &Row) -> bool) -> Result<bool> {
        let mut cursor: Option<Vec<u8>> = None;
        let mut limit = MIN_BATCH;
        loop {
            let (rows, next) = self.rows_after(cursor.as_deref(), &mut limit).await?;
            if rows.iter().any(|(key, row)| hit(key, row)) {
                return Ok(true);
            }
            match next {
                Some(n) => cursor = Some(n),
                None => return Ok(false),
            }
        }
    }

    /// A batch of at most `limit` of the store's rows, every table's,
    /// after `cursor` (from the first without it), in one snapshot; and
    /// the cursor to go on from. Sets `limit` for the next batch from the
    /// bytes these rows held (see [`BATCH_BYTES`]).
    async fn rows_after(
        &self,
        cursor: Option<&[u8]>,
        limit: &mut usize,
    ) -> Result<(Vec<(Key, Row)>, Option<Vec<u8>>)> {
        let n = *limit;
        let (rows, next) = self
            .retrying(|| async { Ok(self.snapshot().await?.scan_all(cursor, n).await?) })
            .await?;
        let bytes: usize = rows.iter().map(|(_, r)| r.value.len()).sum();
        let per_row = bytes / rows.len().max(1) + 1;
        *limit = (BATCH_BYTES / per_row).clamp(MIN_BATCH, BATCH);
        Ok((rows, next))
    }

    /// An importer writing records into this (empty) store.
    pub fn importer(&self) -> Importer {
        Importer {
            engine: self.clone(),
            defs: None,
            declared: Vec::new(),
            batch: Batch::new(),
            fresh: BTreeSet::new(),
            body: None,
            moved: Moved::default(),
            end: None,
            need_end: true,
            marked: false,
        }
    }

    /// Whether an import into this store began and did not finish: the
    /// store holds part of a file, and must be emptied before it serves or
    /// takes another import.
    pub async fn import_unfinished(&self) -> Result<bool> {
        let key = unfinished_key();
        self.retrying(|| async { Ok(self.snapshot().await?.get(&key).await?.is_some()) })
            .await
    }
}

/// The row an import holds while it runs, gone once it finished whole.
fn unfinished_key() -> Key {
    Key::new(META, b"import".to_vec(), b"unfinished".to_vec())
}

/// A body whose chunks an import is reading (they come right after their
/// item), checked against the item's size and hash once they end. The
/// item is written then, with the words of its bytes (a file's word list
/// is not taken: index rows come from what the store holds).
struct BodyCheck {
    item: Item,
    blob: String,
    /// Every chunk but the last holds this many bytes (reads find a byte
    /// by its chunk), and the last the rest.
    chunk: u64,
    size: u64,
    sha256: String,
    next: u64,
    got: u64,
    hasher: sha2::Sha256,
    /// A textual body's first bytes, as an upload keeps them.
    text: Option<Vec<u8>>,
}

impl BodyCheck {
    /// The item, its body checked, with the words of the body's bytes.
    fn end(self) -> Result<Item> {
        let sha: String = hex(&self.hasher.finalize());
        let mut item = self.item;
        if self.got != self.size || sha != self.sha256 {
            return Err(EngineError::InvalidInput(format!(
                "the body of item {} does not match it: {} bytes with SHA-256 {sha}, where the item says {} bytes with {}",
                item.id, self.got, self.size, self.sha256
            )));
        }
        let content_type = item.body.as_ref().map_or("", |b| b.content_type.as_str());
        let (words, word_count) = crate::bodies::body_words(self.text, self.size, content_type);
        if let Some(body) = &mut item.body {
            body.words = words;
            body.word_count = word_count;
        }
        Ok(item)
    }
}

/// Writes records into an empty store in bounded batches; index
/// declarations must come before every other record.
pub struct Importer {
    engine: Engine,
    defs: Option<crate::indexes::Defs>,
    declared: Vec<IndexDef>,
    batch: Batch,
    /// The user, group and item rows `batch` creates: none may exist.
    fresh: BTreeSet<Key>,
    body: Option<BodyCheck>,
    moved: Moved,
    /// The counts of the end record, once read.
    end: Option<BTreeMap<String, u64>>,
    /// Whether a file without the end record is refused.
    need_end: bool,
    /// Whether the mark of an import under way is written.
    marked: bool,
}

impl Importer {
    /// Takes a file without the end record (exports made before it was
    /// written have none): a file cut short then goes unnoticed.
    pub fn without_end_record(mut self) -> Importer {
        self.need_end = false;
        self
    }

    /// Whether this import has written to the store (from its first
    /// record that is no index declaration on): before, a failure leaves
    /// the store as it was.
    pub fn wrote(&self) -> bool {
        self.marked
    }

    /// Adds one record.
    pub async fn add(&mut self, record: Record) -> Result<()> {
        if self.end.is_some() {
            return Err(EngineError::InvalidInput(
                "a record after the end record".into(),
            ));
        }
        self.moved.count(&record);
        if let Record::End { records } = record {
            self.end = Some(records);
            return Ok(());
        }
        if let Record::Index { index } = record {
            if self.defs.is_some() {
                return Err(EngineError::InvalidInput(
                    "index declarations come before every other record".into(),
                ));
            }
            let kind = index.kind.as_deref().ok_or_else(|| {
                EngineError::InvalidInput(format!("index {} has no kind", index.name))
            })?;
            crate::indexes::check_declaration(
                &index.name,
                kind,
                &index.where_,
                &index.sort,
                &index.text,
                index.language.as_deref(),
            )?;
            // Ties the other way only under a first sort field descending,
            // and wider impact codes only for a text index: what a
            // declaration makes.
            let ties = index.ties == crate::Order::Asc
                || (index.text.is_empty()
                    && index
                        .sort
                        .first()
                        .is_some_and(|s| s.order == crate::Order::Desc));
            let codes = index.impacts.is_milli() || !index.text.is_empty();
            if !ties || !codes {
                return Err(EngineError::InvalidInput(format!(
                    "index {}: ties or impact codes no declaration makes",
                    index.name
                )));
            }
            if self.declared.iter().any(|d| d.name == index.name) {
                return Err(EngineError::InvalidInput(format!(
                    "index {} comes twice",
                    index.name
                )));
            }
            if !index.text.is_empty() {
                if let Some(twin) = crate::indexes::text_twin(&self.declared, kind, &index.where_) {
                    return Err(EngineError::InvalidInput(twin));
                }
            }
            // As the API counts them: the built-in indexes too.
            if self.declared.len() + crate::indexes::builtins().len() >= crate::indexes::MAX_INDEXES
            {
                return Err(EngineError::InvalidInput(format!(
                    "at most {} indexes",
                    crate::indexes::MAX_INDEXES
                )));
            }
            self.declared.push(index);
            return Ok(());
        }
        if let Record::Chunk { blob, n, data } = &record {
            return self.chunk(blob, *n, data).await;
        }
        self.end_body()?;
        let defs = match &self.defs {
            Some(d) => d.clone(),
            None => {
                let d = self.declare().await?;
                self.defs = Some(d.clone());
                d
            }
        };
        let b = &mut self.batch;
        match record {
            Record::Index { .. } => unreachable!("handled above"),
            Record::User { user } => {
                crate::model::check_new_name("username", &user.username)?;
                check_time(&user.username, user.created_at)?;
                self.engine.check_properties(&user.properties)?;
                crate::users::check_stored_hash(&user)?;
                let key = schema::user_key(&user.username);
                fresh(&mut self.fresh, &key, "user", &user.username)?;
                b.put(key, schema::encode(&user), 1);
            }
            Record::Group { group } => {
                crate::model::check_new_name("group id", &group.id)?;
                check_time(&group.id, group.created_at)?;
                check_group(&group)?;
                self.engine.check_properties(&group.properties)?;
                let key = schema::group_key(&group.id);
                fresh(&mut self.fresh, &key, "group", &group.id)?;
                b.put(key, schema::encode(&group), 1);
            }
            Record::Member { group, member } => {
                crate::model::check_new_name("group id", &group)?;
                match &member {
                    Principal::User(u) => crate::model::check_new_name("username", u)?,
                    Principal::Group(g) => crate::model::check_new_name("group id", g)?,
                    _ => {}
                }
                if !matches!(member, Principal::User(_) | Principal::Group(_)) {
                    return Err(EngineError::InvalidInput(format!(
                        "{member} cannot be a member of a group"
                    )));
                }
                if member == Principal::Group(group.clone()) {
                    return Err(EngineError::InvalidInput(format!(
                        "group {group} cannot contain itself"
                    )));
                }
                let m = member.to_string();
                let key = Key::new(MEMBERS, group.as_bytes(), m.as_bytes());
                fresh(
                    &mut self.fresh,
                    &key,
                    "membership",
                    &format!("{m} in {group}"),
                )?;
                b.put(key, schema::MARK.to_vec(), 1);
                b.put(
                    Key::new(schema::MEMBERSHIPS, m.as_bytes(), group.as_bytes()),
                    schema::MARK.to_vec(),
                    1,
                );
            }
            Record::Item { item } => {
                crate::model::check_name("kind", &item.kind)?;
                if !crate::items::plausible_id(&item.id) {
                    return Err(EngineError::InvalidInput(format!(
                        "item id {:?}: 1 to 64 of A-Z, a-z, 0-9, '-', '_'",
                        item.id
                    )));
                }
                check_item(&self.engine, &item)?;
                fresh(
                    &mut self.fresh,
                    &schema::item_key(&item.id),
                    "item",
                    &item.id,
                )?;
                match &item.body {
                    Some(body) => {
                        crate::bodies::check_content_type(&body.content_type)?;
                        self.body = Some(BodyCheck {
                            blob: body.blob.clone(),
                            chunk: u64::from(body.chunk),
                            size: body.size,
                            sha256: body.sha256.clone(),
                            next: 0,
                            got: 0,
                            hasher: sha2::Sha256::new(),
                            text: crate::search::is_textual(&body.content_type).then(Vec::new),
                            item,
                        });
                    }
                    None => put_item(b, &defs, &item, self.engine.split()),
                }
            }
            Record::Link {
                item,
                hash,
                role,
                created_at,
            } => {
                if !matches!(role, Role::Viewer | Role::Editor) {
                    return Err(EngineError::InvalidInput(format!(
                        "a link of item {item} gives {}: links give viewer or editor",
                        role.as_str()
                    )));
                }
                let hash = unhex(&hash).filter(|h| h.len() == 32).ok_or_else(|| {
                    EngineError::InvalidInput("a link hash is 64 hex digits".into())
                })?;
                let key = schema::link_key_of_hash(&item, &hash);
                fresh(&mut self.fresh, &key, "link", &format!("of item {item}"))?;
                let row = match created_at {
                    Some(created_at) => {
                        check_time(&format!("a link of item {item}"), created_at)?;
                        LinkRow::Made { role, created_at }
                    }
                    None => LinkRow::Role(role),
                };
                b.put(key, schema::encode(&row), 1);
            }
            Record::Chunk { .. } | Record::End { .. } => unreachable!("handled above"),
        }
        self.flush_when_full().await
    }

    /// Adds a chunk of the body of the item just added, in order.
    async fn chunk(&mut self, blob: &str, n: u64, data: &str) -> Result<()> {
        let body = self
            .body
            .as_mut()
            .filter(|b| b.blob == blob && b.next == n)
            .ok_or_else(|| {
                EngineError::InvalidInput(format!(
                    "chunk {n} of blob {blob} does not come next: a body's chunks follow its item, in order"
                ))
            })?;
        let item = &body.item.id;
        let bytes = unb64(data)
            .ok_or_else(|| EngineError::InvalidInput("chunk data is base64url".into()))?;
        let want = body.chunk.min(body.size.saturating_sub(body.got));
        if bytes.len() as u64 != want {
            return Err(EngineError::InvalidInput(format!(
                "chunk {n} of the body of item {item} holds {} bytes where its chunk size ({}) and size ({}) say {want}",
                bytes.len(),
                body.chunk,
                body.size
            )));
        }
        body.next += 1;
        body.got += bytes.len() as u64;
        body.hasher.update(&bytes);
        if let Some(t) = &mut body.text {
            let room = crate::search::BODY_READ.saturating_sub(t.len());
            t.extend_from_slice(&bytes[..room.min(bytes.len())]);
        }
        self.batch.put(schema::chunk_key(blob, n), bytes, 1);
        self.flush_when_full().await
    }

    async fn flush_when_full(&mut self) -> Result<()> {
        let b = &self.batch;
        let size: usize = b
            .ops
            .iter()
            .map(|o| match o {
                tarn_store::Op::Put { value, .. } => value.len(),
                tarn_store::Op::Delete { .. } => 0,
            })
            .sum();
        if b.ops.len() >= WRITE || size >= 2 * 1024 * 1024 {
            self.flush().await?;
        }
        Ok(())
    }

    /// Refuses a file not read to its end record (when one is needed):
    /// [`Importer::finish`] asks first, and so may the caller, to know
    /// that a file with no record at all wrote nothing.
    pub fn check_ended(&self) -> Result<()> {
        if self.end.is_none() && self.need_end {
            return Err(EngineError::InvalidInput(
                "the file ends before its end record: it was cut short (or made by an export from before 2026-11-25, which wrote none)".into(),
            ));
        }
        Ok(())
    }

    /// Writes what is pending, checks that what was imported holds
    /// together, and answers what went across. Until it answers, the store
    /// is marked as holding an unfinished import.
    pub async fn finish(mut self) -> Result<Moved> {
        self.check_ended()?;
        if self.defs.is_none() {
            self.defs = Some(self.declare().await?);
        }
        self.end_body()?;
        self.flush().await?;
        match &self.end {
            None => {}
            Some(end) if *end != self.moved.records => {
                return Err(EngineError::InvalidInput(format!(
                    "the end record counts {}, the file holds {}",
                    serde_json::to_string(end).unwrap_or_default(),
                    serde_json::to_string(&self.moved.records).unwrap_or_default()
                )))
            }
            Some(_) => {}
        }
        self.engine.check_imported().await?;
        let engine = &self.engine;
        engine
            .retrying(|| async {
                let mut b = Batch::new();
                b.delete(unfinished_key());
                Ok(engine.store().write(b).await?)
            })
            .await?;
        Ok(self.moved)
    }

    /// Ends the body being read, if any: checks it and adds its item.
    fn end_body(&mut self) -> Result<()> {
        let Some(body) = self.body.take() else {
            return Ok(());
        };
        let item = body.end()?;
        // Its record noted the key in an earlier batch if the body's
        // chunks filled one: noted again, so that a record of the same id
        // right after it is refused before this batch is written.
        self.fresh.insert(schema::item_key(&item.id));
        let defs = self.defs.as_ref().expect("declared before any item");
        put_item(&mut self.batch, defs, &item, self.engine.split());
        Ok(())
    }

    /// Writes what is pending, unless it would create a user, group,
    /// item, membership or link the store already holds.
    async fn flush(&mut self) -> Result<()> {
        let b = std::mem::take(&mut self.batch);
        let fresh: Vec<Key> = std::mem::take(&mut self.fresh).into_iter().collect();
        if b.is_empty() {
            return Ok(());
        }
        let engine = &self.engine;
        let held = engine
            .retrying(|| async {
                let mut snap = engine.snapshot().await?;
                Ok(crate::read(&mut snap, &fresh, &[]).await?.rows)
            })
            .await?;
        if let Some((key, _)) = fresh.iter().zip(&held).find(|(_, r)| r.is_some()) {
            return Err(EngineError::InvalidInput(format!(
                "{} {} comes twice",
                key.table.name(),
                String::from_utf8_lossy(&key.partition)
            )));
        }
        engine
            .retrying(|| async { Ok(engine.store().write(b.clone()).await?) })
            .await
    }

    /// Writes the declarations, ready (their rows are written with each
    /// item), with fresh uids; answers them.
    async fn declare(&mut self) -> Result<crate::indexes::Defs> {
        let engine = self.engine.clone();
        // First of all, the mark of an import under way: one import at a
        // time, so a second one is refused at once rather than tried again
        // until the first is done.
        // Its value is this import's own, so that a write tried again after
        // an unknown outcome knows its own mark from another import's.
        let mark = unfinished_key();
        let ours = crate::random_bytes::<16>().to_vec();
        let mut b = Batch::new();
        b.put(mark.clone(), ours.clone(), 1)
            .guard(mark.clone(), Expect::Absent);
        // From the first try on, the store may hold it.
        self.marked = true;
        engine
            .retrying(|| async {
                match engine.store().write(b.clone()).await {
                    Err(StoreError::GuardFailed { .. }) => {
                        let held = engine.snapshot().await?.get(&mark).await?;
                        if held.is_some_and(|r| r.value == ours) {
                            return Ok(());
                        }
                        Err(EngineError::InvalidInput(
                            "another import into this store is under way".into(),
                        ))
                    }
                    written => Ok(written?),
                }
            })
            .await
            .inspect_err(|e| {
                // Another import's mark: this one wrote nothing.
                if matches!(e, EngineError::InvalidInput(_)) {
                    self.marked = false;
                }
            })?;
        // The store was found empty before the mark: an import that began
        // and ended in between filled it.
        if !engine.is_empty().await? {
            let mut b = Batch::new();
            b.delete(mark);
            engine
                .retrying(|| async { Ok(engine.store().write(b.clone()).await?) })
                .await?;
            return Err(EngineError::InvalidInput(
                "another import filled this store: import into an empty one".into(),
            ));
        }
        self.marked = true;
        // Then the administrator a server made (the one user an empty
        // store may hold), so that the file's users are all there is: its
        // sessions first, so none outlives it.
        engine.retrying(|| engine.end_all_sessions("admin")).await?;
        engine
            .retrying(|| async {
                let mut snap = engine.snapshot().await?;
                let key = schema::user_key("admin");
                let Some(row) = snap.get(&key).await? else {
                    return Ok(());
                };
                if !is_made_admin(&key, &row) {
                    return Err(EngineError::Conflict(
                        "a user admin was made while the import began: empty the store".into(),
                    ));
                }
                let mut b = Batch::new();
                b.delete(key.clone())
                    .guard(key, Expect::Version(row.version));
                Ok(engine.store().write(b).await?)
            })
            .await?;
        // What that administrator did goes too, with the key its cursors
        // were sealed with: the store's history starts with the file, and a
        // cursor handed out before is foreign to it (`400`; one a running
        // node still reads with the old key finds its changes trimmed).
        engine.trim_changes_before(i64::MAX).await?;
        let mut b = Batch::new();
        b.delete(schema::cursor_key_row());
        // Laid out for this backend, as its items' rows are.
        b.put(schema::layout_key(), schema::encode(&engine.split()), 1);
        engine
            .retrying(|| async { Ok(engine.store().write(b.clone()).await?) })
            .await?;
        let mut b = Batch::new();
        for d in &self.declared {
            let mut d = d.clone();
            d.state = IndexState::Ready;
            d.uid = b64(&crate::random_bytes::<9>());
            d.since = 1;
            b.put(schema::def_key(&d.name), schema::encode(&d), 1);
        }
        if !self.declared.is_empty() {
            let key = schema::defs_version_key();
            b.put(key.clone(), schema::MARK.to_vec(), 1)
                .guard(key, Expect::Absent);
            engine
                .retrying(|| async { Ok(engine.store().write(b.clone()).await?) })
                .await?;
        }
        engine.retrying(|| engine.read_defs()).await
    }
}

/// Adds an item's rows to `b`: its index rows, kind entry and item row.
fn put_item(b: &mut Batch, defs: &crate::indexes::Defs, item: &Item, split: u32) {
    defs.apply_diff(b, None, Some(item), split);
    b.put(
        schema::kind_key(&item.kind, &item.id),
        schema::MARK.to_vec(),
        1,
    );
    b.put(
        schema::item_key(&item.id),
        schema::encode_item(item, defs.version),
        1,
    );
}

/// Notes that the batch creates `key`; refused when it already does.
/// Whether `row` at `key` is the administrator a server started with
/// `TARN_ADMIN_PASSWORD` makes: user `admin`, an administrator, with no
/// properties (not a user who signed up as `admin`, nor one in use).
fn is_made_admin(key: &Key, row: &Row) -> bool {
    key == &schema::user_key("admin")
        && schema::decode::<crate::model::User>("user", row)
            .is_ok_and(|u| u.admin && u.properties.is_empty())
}

fn fresh(keys: &mut BTreeSet<Key>, key: &Key, what: &str, name: &str) -> Result<()> {
    if !keys.insert(key.clone()) {
        return Err(EngineError::InvalidInput(format!(
            "{what} {name} comes twice"
        )));
    }
    Ok(())
}

/// The highest version an import takes: past it a JavaScript client
/// could not read a version exactly, and a write would have no next one.
const MAX_VERSION: u64 = (1 << 53) - 1;

/// Refuses a time no write could have made: one outside the years 1970 to
/// 9999 (microseconds since the Unix epoch), which RFC 3339 cannot show.
fn check_time(whose: &str, micros: i64) -> Result<()> {
    const LAST: i64 = 253_402_300_799_999_999;
    if (0..=LAST).contains(&micros) {
        Ok(())
    } else {
        Err(EngineError::InvalidInput(format!(
            "{whose}: the time {micros} is not between 1970 and 9999"
        )))
    }
}

/// Refuses an item no write of the API could have made (except a grant
/// of manager to `everyone` or `authenticated`, which writes before
/// 2026-12-03 made).
fn check_item(engine: &Engine, item: &Item) -> Result<()> {
    engine.check_properties(item.properties.map())?;
    crate::model::check_name("username", &item.created_by)?;
    if item.version == 0 || item.version > MAX_VERSION {
        return Err(EngineError::InvalidInput(format!(
            "item {} is at version {}: versions start at 1 and stay below 2^53",
            item.id, item.version
        )));
    }
    check_time(&item.id, item.created_at)?;
    check_time(&item.id, item.modified_at)?;
    if item.modified_at < item.created_at {
        return Err(EngineError::InvalidInput(format!(
            "item {} was modified before it was created",
            item.id
        )));
    }
    if item.acl.len() > crate::items::MAX_GRANTS {
        return Err(crate::items::too_many_grants());
    }
    let mut named = BTreeSet::new();
    if let Some(twice) = item.acl.iter().find(|g| !named.insert(&g.principal)) {
        return Err(EngineError::InvalidInput(format!(
            "item {}: its ACL names {} twice",
            item.id, twice.principal
        )));
    }
    if !item.acl.iter().any(|g| g.role == Role::Manager) {
        return Err(EngineError::InvalidInput(format!(
            "item {} has no manager",
            item.id
        )));
    }
    Ok(())
}

/// Refuses a group no write of the API could have made.
fn check_group(group: &Group) -> Result<()> {
    let bad = |why: &str| {
        Err(EngineError::InvalidInput(format!(
            "group {}: {why}",
            group.id
        )))
    };
    if group.managers.is_empty() {
        return bad("a group has at least one manager");
    }
    crate::model::check_name("username", &group.created_by)?;
    if crate::groups::check_title(&group.title).is_err() {
        return bad("its title is too long");
    }
    if group.managers.len() > crate::groups::MAX_MANAGERS {
        return bad("a group has too many managers");
    }
    if group
        .managers
        .iter()
        .any(|m| !matches!(m, Principal::User(_) | Principal::Group(_)))
    {
        return bad("managers are users or groups");
    }
    Ok(())
}

impl Engine {
    /// Checks, after an import, that what it wrote holds together: every
    /// membership names a group and a principal that exist, every ACL
    /// principals that exist, every link an item that exists, and no group
    /// contains itself or nests past the bounds. One pass in bounded
    /// batches.
    async fn check_imported(&self) -> Result<()> {
        let mut cursor: Option<Vec<u8>> = None;
        let mut limit = MIN_BATCH;
        loop {
            let (rows, next) = self.rows_after(cursor.as_deref(), &mut limit).await?;
            let mut needs: Vec<(Key, String)> = Vec::new();
            let mut groups = Vec::new();
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            for (key, row) in &rows {
                if key.table == MEMBERS {
                    let (group, member) = (text(&key.partition), text(&key.clustering));
                    let what = format!("membership of {member} in {group}");
                    needs.push((schema::group_key(&group), what.clone()));
                    let member: Principal = member.parse()?;
                    needs.extend(principal_key(&member).map(|k| (k, what)));
                } else if key.table == ITEMS && key.clustering == schema::ITEM_ROW {
                    let item = ItemRow::decode_checked(row)?.item;
                    for g in &item.acl {
                        let what = format!("ACL of item {}", item.id);
                        needs.extend(principal_key(&g.principal).map(|k| (k, what)));
                    }
                    needs.push((
                        schema::user_key(&item.created_by),
                        format!("creator of item {}", item.id),
                    ));
                } else if key.table == ITEMS && key.clustering.first() == Some(&b'l') {
                    let id = text(&key.partition);
                    needs.push((schema::item_key(&id), format!("link of item {id}")));
                } else if key.table == GROUPS {
                    let group: Group = schema::decode("group", row)?;
                    for m in &group.managers {
                        let what = format!("managers of group {}", group.id);
                        needs.extend(principal_key(m).map(|k| (k, what)));
                    }
                    needs.push((
                        schema::user_key(&group.created_by),
                        format!("creator of group {}", group.id),
                    ));
                    groups.push(group.id);
                }
            }
            let keys: Vec<Key> = needs.iter().map(|(k, _)| k.clone()).collect();
            let found = self
                .retrying(|| async {
                    let mut snap = self.snapshot().await?;
                    Ok(crate::read(&mut snap, &keys, &[]).await?.rows)
                })
                .await?;
            if let Some(((key, what), _)) = needs.iter().zip(&found).find(|(_, r)| r.is_none()) {
                return Err(EngineError::InvalidInput(format!(
                    "the {what} names {} {}, which the file does not hold",
                    key.table.name(),
                    text(&key.partition)
                )));
            }
            for g in groups {
                let start = Principal::Group(g.clone());
                let walk = self
                    .retrying(|| async {
                        let mut snap = self.snapshot().await?;
                        self.groups_of(&mut snap, &start).await
                    })
                    .await?;
                if walk.found.contains(&g) {
                    return Err(EngineError::InvalidInput(format!(
                        "group {g} contains itself through its memberships"
                    )));
                }
                if walk.truncated {
                    return Err(EngineError::InvalidInput(format!(
                        "group {g} belongs to more groups, or nests deeper, than the bounds allow"
                    )));
                }
            }
            match next {
                Some(n) => cursor = Some(n),
                None => return Ok(()),
            }
        }
    }
}

/// The row a user or group principal is stored in.
fn principal_key(p: &Principal) -> Option<Key> {
    match p {
        Principal::User(u) => Some(schema::user_key(u)),
        Principal::Group(g) => Some(schema::group_key(g)),
        Principal::Everyone | Principal::Authenticated => None,
    }
}
