//! Declared indexes: their definitions, the rows they hold, and their
//! building and dropping.
//!
//! For every item an index covers and every principal that may read it, the
//! index holds one row:
//!
//! ```text
//! partition  = (index name, principal, where-values...)
//! clustering = (sort-values..., item id)
//! ```
//!
//! encoded with [`keys`](crate::keys) so that byte order is value order.
//! Writes compute an item's rows before and after and apply the difference in
//! the same atomic write as the item.
//!
//! Built-in indexes cover every kind and need no declaration: `_kind`
//! (`where kind`, sort `modifiedAt`), `_mine` (`where createdBy`) and
//! `_mine_kind` (`where kind, createdBy`), both sorted by `modifiedAt`.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tarn_store::{Batch, Expect, Key, Scan};

use crate::error::{EngineError, Result};
use crate::keys::{encode_str, encode_value, Order};
use crate::model::check_name;
use crate::schema::{self, INDEX, INDEX_DEFS, KINDS};
use crate::{Caller, Engine, Item, Principal};

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
}

const MAX_FIELDS: usize = 8;
const BACKFILL_BATCH: usize = 200;
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
    };
    vec![
        def("_kind", &["kind"]),
        def("_mine", &["createdBy"]),
        def("_mine_kind", &["kind", "createdBy"]),
    ]
}

fn check_field(field: &str) -> Result<()> {
    let ok = !field.is_empty() && field.len() <= 256 && field.split('.').all(|seg| !seg.is_empty());
    if ok && field != "kind" {
        Ok(())
    } else {
        Err(EngineError::InvalidInput(format!(
            "field {field:?} is not createdAt, modifiedAt, createdBy or a dot path into properties"
        )))
    }
}

impl IndexDef {
    /// Whether the index covers items of this kind.
    pub fn covers(&self, kind: &str) -> bool {
        self.kind.as_deref().is_none_or(|k| k == kind)
    }

    /// The partition of `principal` for these where-values (in `where_`
    /// order).
    pub(crate) fn partition(
        &self,
        principal: &Principal,
        where_values: &[Option<&serde_json::Value>],
    ) -> Vec<u8> {
        let mut p = Vec::with_capacity(64);
        encode_str(&mut p, &self.name);
        encode_str(&mut p, &principal.to_string());
        for v in where_values {
            encode_value(&mut p, *v, Order::Asc);
        }
        p
    }

    /// The clustering key of an item.
    fn clustering(&self, item: &Item) -> Vec<u8> {
        let mut c = Vec::with_capacity(64);
        for s in &self.sort {
            encode_value(&mut c, item.field(&s.field).as_ref(), s.order);
        }
        encode_str(&mut c, &item.id);
        c
    }

    /// Every row of this index for `item`.
    pub(crate) fn rows(&self, item: &Item) -> Vec<Key> {
        if !self.covers(&item.kind) || self.state == IndexState::Dropping {
            return Vec::new();
        }
        let values: Vec<Option<serde_json::Value>> =
            self.where_.iter().map(|f| item.field(f)).collect();
        let refs: Vec<Option<&serde_json::Value>> = values.iter().map(|v| v.as_ref()).collect();
        let clustering = self.clustering(item);
        item.readers()
            .into_iter()
            .map(|p| Key::new(INDEX, self.partition(p, &refs), clustering.clone()))
            .collect()
    }
}

/// The index rows of an item (or none) under every index in `defs`.
pub(crate) fn rows_of(defs: &[IndexDef], item: Option<&Item>) -> BTreeSet<Key> {
    let mut out = BTreeSet::new();
    if let Some(item) = item {
        for d in defs {
            out.extend(d.rows(item));
        }
    }
    out
}

/// Adds to `b` the changes that turn the rows of `before` into those of
/// `after`: rows in both are left alone.
pub(crate) fn apply_diff(
    b: &mut Batch,
    defs: &[IndexDef],
    before: Option<&Item>,
    after: Option<&Item>,
) {
    let old = rows_of(defs, before);
    let new = rows_of(defs, after);
    for k in old.difference(&new) {
        b.delete(k.clone());
    }
    if let Some(item) = after {
        for k in new.difference(&old) {
            b.put(k.clone(), item.id.as_bytes().to_vec(), 1);
        }
    }
}

/// Index declarations read for one write, with the moment they were read.
pub(crate) struct Defs {
    pub defs: Vec<IndexDef>,
    read_at: Instant,
}

impl Engine {
    /// Every index declaration, built-ins first, read from the store.
    pub(crate) async fn index_defs(&self) -> Result<Defs> {
        let read_at = Instant::now();
        let rows = self
            .store()
            .scan(Scan::partition(INDEX_DEFS, Vec::new(), MAX_INDEXES))
            .await?;
        let mut defs = builtins();
        for row in rows {
            defs.push(schema::decode("index definition", &row)?);
        }
        Ok(Defs { defs, read_at })
    }

    /// Fails (to be retried) if the write is about to land later than the
    /// lease after its declarations were read: index builds rely on it.
    pub(crate) fn check_lease(&self, defs: &Defs) -> Result<()> {
        if defs.read_at.elapsed() > self.inner.config.write_lease {
            return Err(tarn_store::StoreError::Conflict(
                "index declarations read too long ago".into(),
            )
            .into());
        }
        Ok(())
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
        caller.require_admin()?;
        check_name("index name", name)?;
        check_name("kind", kind)?;
        if where_.len() + sort.len() > MAX_FIELDS {
            return Err(EngineError::InvalidInput(format!(
                "an index has at most {MAX_FIELDS} fields"
            )));
        }
        for f in where_.iter().chain(sort.iter().map(|s| &s.field)) {
            check_field(f)?;
        }
        let unique: BTreeSet<&String> = where_.iter().collect();
        if unique.len() != where_.len() {
            return Err(EngineError::InvalidInput(
                "a where field is named twice".into(),
            ));
        }
        let def = IndexDef {
            name: name.to_string(),
            kind: Some(kind.to_string()),
            where_,
            sort,
            state: IndexState::Building,
        };
        let key = Key::new(INDEX_DEFS, Vec::new(), name.as_bytes());
        let existing = self.store().get(key.clone()).await?;
        if let Some(row) = existing {
            let old: IndexDef = schema::decode("index definition", &row)?;
            let same = old.kind == def.kind && old.where_ == def.where_ && old.sort == def.sort;
            if same && old.state != IndexState::Dropping {
                return Ok((old, false));
            }
            return Err(EngineError::Conflict(format!(
                "an index named {name} exists with another definition or is being dropped"
            )));
        }
        if self.index_defs().await?.defs.len() >= MAX_INDEXES {
            return Err(EngineError::Conflict(format!(
                "at most {MAX_INDEXES} indexes"
            )));
        }
        let mut b = Batch::new();
        b.put(key.clone(), schema::encode(&def), 1)
            .guard(key, Expect::Absent);
        match self.store().write(b).await {
            Ok(()) => {}
            Err(tarn_store::StoreError::GuardFailed { .. }) => {
                return Err(EngineError::Conflict(format!(
                    "the index {name} was declared concurrently"
                )))
            }
            Err(e) => return Err(EngineError::from(e).settle()),
        }
        let engine = self.clone();
        let name = def.name.clone();
        tokio::spawn(async move {
            if let Err(e) = engine.build_index(&name).await {
                tracing_error(&name, &e);
            }
        });
        Ok((def, true))
    }

    /// One index declaration (built-ins included).
    pub async fn get_index(&self, name: &str) -> Result<IndexDef> {
        self.index_defs()
            .await?
            .defs
            .into_iter()
            .find(|d| d.name == name)
            .ok_or_else(|| EngineError::NotFound(format!("no index {name}")))
    }

    /// Every index declaration (built-ins included).
    pub async fn list_indexes(&self) -> Result<Vec<IndexDef>> {
        Ok(self.index_defs().await?.defs)
    }

    /// Drops a declared index (administrators) and removes its rows in the
    /// background.
    pub async fn drop_index(&self, caller: &Caller, name: &str) -> Result<()> {
        caller.require_admin()?;
        if name.starts_with('_') {
            return Err(EngineError::InvalidInput("built-in indexes stay".into()));
        }
        let key = Key::new(INDEX_DEFS, Vec::new(), name.as_bytes());
        let row = self
            .store()
            .get(key.clone())
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("no index {name}")))?;
        let mut def: IndexDef = schema::decode("index definition", &row)?;
        if def.state != IndexState::Dropping {
            def.state = IndexState::Dropping;
            let mut b = Batch::new();
            b.put(key.clone(), schema::encode(&def), row.version + 1)
                .guard(key, Expect::Version(row.version));
            self.store()
                .write(b)
                .await
                .map_err(|e| EngineError::from(e).settle())?;
        }
        let engine = self.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            if let Err(e) = engine.remove_index_rows(&name).await {
                tracing_error(&name, &e);
            }
        });
        Ok(())
    }

    /// Resumes builds and drops left unfinished (a node stopped mid-way).
    /// Safe to run on several nodes at once: both passes are idempotent.
    pub async fn resume_index_work(&self) -> Result<()> {
        for def in self.index_defs().await?.defs {
            let engine = self.clone();
            let name = def.name.clone();
            match def.state {
                IndexState::Building => {
                    tokio::spawn(async move {
                        if let Err(e) = engine.build_index(&name).await {
                            tracing_error(&name, &e);
                        }
                    });
                }
                IndexState::Dropping => {
                    tokio::spawn(async move {
                        if let Err(e) = engine.remove_index_rows(&name).await {
                            tracing_error(&name, &e);
                        }
                    });
                }
                IndexState::Ready => {}
            }
        }
        Ok(())
    }

    /// Waits out the write lease twice, so every write that read the
    /// declarations before this index changed state has landed or given up.
    async fn wait_out_leases(&self) {
        tokio::time::sleep(self.inner.config.write_lease * 2).await;
    }

    /// Adds every existing item of the index's kind to it, pulling items in
    /// bounded batches, then marks it ready.
    pub(crate) async fn build_index(&self, name: &str) -> Result<()> {
        self.wait_out_leases().await;
        let key = Key::new(INDEX_DEFS, Vec::new(), name.as_bytes());
        let Some(row) = self.store().get(key.clone()).await? else {
            return Ok(());
        };
        let def: IndexDef = schema::decode("index definition", &row)?;
        if def.state != IndexState::Building {
            return Ok(());
        }
        let kind = def.kind.clone().unwrap_or_default();
        self.for_each_of_kind(&kind, |item, version| {
            let def = def.clone();
            async move {
                let mut b = Batch::new();
                for k in def.rows(&item) {
                    b.put(k, item.id.as_bytes().to_vec(), 1);
                }
                b.guard(schema::item_key(&item.id), Expect::Version(version));
                b
            }
        })
        .await?;
        self.retrying(|| async {
            let Some(row) = self.store().get(key.clone()).await? else {
                return Ok(());
            };
            let mut def: IndexDef = schema::decode("index definition", &row)?;
            if def.state != IndexState::Building {
                return Ok(());
            }
            def.state = IndexState::Ready;
            let mut b = Batch::new();
            b.put(key.clone(), schema::encode(&def), row.version + 1)
                .guard(key.clone(), Expect::Version(row.version));
            self.store().write(b).await?;
            Ok(())
        })
        .await
    }

    /// Removes every row of a dropped index, then its declaration.
    pub(crate) async fn remove_index_rows(&self, name: &str) -> Result<()> {
        self.wait_out_leases().await;
        let key = Key::new(INDEX_DEFS, Vec::new(), name.as_bytes());
        let Some(row) = self.store().get(key.clone()).await? else {
            return Ok(());
        };
        let mut def: IndexDef = schema::decode("index definition", &row)?;
        if def.state != IndexState::Dropping {
            return Ok(());
        }
        // Rows are computed as they were written: with the index live.
        def.state = IndexState::Ready;
        let kind = def.kind.clone().unwrap_or_default();
        self.for_each_of_kind(&kind, |item, version| {
            let def = def.clone();
            async move {
                let mut b = Batch::new();
                for k in def.rows(&item) {
                    b.delete(k);
                }
                b.guard(schema::item_key(&item.id), Expect::Version(version));
                b
            }
        })
        .await?;
        let mut b = Batch::new();
        b.delete(key.clone())
            .guard(key, Expect::Version(row.version));
        self.store().write(b).await?;
        Ok(())
    }

    /// Pulls the items of a kind in bounded batches and writes, per item,
    /// the batch `make` builds (guarded on the item's version; an item that
    /// changed meanwhile is read again).
    async fn for_each_of_kind<F, Fut>(&self, kind: &str, make: F) -> Result<()>
    where
        F: Fn(Item, u64) -> Fut,
        Fut: std::future::Future<Output = Batch>,
    {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let lower = after.clone().map_or(Bound::Unbounded, Bound::Excluded);
            let rows = self
                .store()
                .scan(
                    Scan::partition(KINDS, kind.as_bytes().to_vec(), BACKFILL_BATCH)
                        .bounds(lower, Bound::Unbounded),
                )
                .await?;
            let Some(last) = rows.last() else {
                return Ok(());
            };
            after = Some(last.clustering.clone());
            for row in rows {
                let id = String::from_utf8(row.clustering)
                    .map_err(|e| crate::error::corrupt("kind entry", e))?;
                self.retrying(|| async {
                    let Some((item, version)) = self.read_item(&id).await? else {
                        return Ok(());
                    };
                    self.store().write(make(item, version).await).await?;
                    Ok(())
                })
                .await?;
            }
        }
    }
}

fn tracing_error(name: &str, e: &EngineError) {
    tracing::error!(index = name, error = %e, "background index work failed");
}
