//! Listings: pick the index that serves the query, read each of the caller's
//! principals' partitions from the cursor with the page limit, merge them
//! with a heap, drop duplicates, and return the page with an opaque cursor.
//!
//! Cost: one bounded scan per principal plus one point read per returned
//! item — never a function of the pool's size. Why reading `limit + 1` rows
//! per partition is enough: a key among the first `limit` distinct keys of
//! the union has fewer than `limit` distinct keys before it, so it lies
//! within the first `limit` rows of its own partition.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Bound;

use serde_json::{json, Value};
use tarn_store::{Direction, Row, Scan};

use crate::error::{EngineError, Result};
use crate::indexes::{IndexDef, IndexState, SortField};
use crate::keys::Order;
use crate::schema::{self, INDEX};
use crate::{b64, unb64, Caller, Engine, Item, ItemView, Role};

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

const CURSOR_VERSION: u8 = 1;

fn encode_cursor(index: &str, direction: Direction, last: &[u8]) -> String {
    let mut c = vec![CURSOR_VERSION, (direction == Direction::Reverse) as u8];
    c.push(index.len() as u8);
    c.extend_from_slice(index.as_bytes());
    c.extend_from_slice(last);
    b64(&c)
}

fn decode_cursor(cursor: &str, index: &str, direction: Direction) -> Result<Vec<u8>> {
    let bad = || EngineError::InvalidInput("the cursor does not belong to this listing".into());
    let c = unb64(cursor).ok_or_else(bad)?;
    if c.len() < 3 || c[0] != CURSOR_VERSION || c[1] != (direction == Direction::Reverse) as u8 {
        return Err(bad());
    }
    let n = c[2] as usize;
    if c.len() < 3 + n || &c[3..3 + n] != index.as_bytes() {
        return Err(bad());
    }
    Ok(c[3 + n..].to_vec())
}

/// One partition's next row in the merge.
struct Head<'a> {
    key: &'a [u8],
    part: usize,
    pos: usize,
    reverse: bool,
}

impl PartialEq for Head<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Head<'_> {}
impl PartialOrd for Head<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head<'_> {
    /// The heap pops its greatest: the smallest key going forward, the
    /// largest going in reverse.
    fn cmp(&self, other: &Self) -> Ordering {
        let by_key = self.key.cmp(other.key);
        let by_key = if self.reverse {
            by_key
        } else {
            by_key.reverse()
        };
        by_key.then(other.part.cmp(&self.part))
    }
}

/// Merges sorted partitions, dropping duplicates, up to `want` rows.
fn merge(parts: &[Vec<Row>], reverse: bool, want: usize) -> Vec<&Row> {
    let mut heap = BinaryHeap::with_capacity(parts.len());
    for (part, rows) in parts.iter().enumerate() {
        if let Some(first) = rows.first() {
            heap.push(Head {
                key: &first.clustering,
                part,
                pos: 0,
                reverse,
            });
        }
    }
    let mut out: Vec<&Row> = Vec::with_capacity(want);
    while let Some(head) = heap.pop() {
        let row = &parts[head.part][head.pos];
        // Equal keys are the same item read through two principals; they
        // come out of the heap one after the other.
        if out
            .last()
            .is_none_or(|last| last.clustering != row.clustering)
        {
            out.push(row);
            if out.len() == want {
                break;
            }
        }
        if let Some(next) = parts[head.part].get(head.pos + 1) {
            heap.push(Head {
                key: &next.clustering,
                part: head.part,
                pos: head.pos + 1,
                reverse,
            });
        }
    }
    out
}

fn suggest(kind: Option<&str>, fields: &BTreeMap<String, Value>, sort: &[SortField]) -> String {
    let kind = kind.unwrap_or("KIND");
    let mut name = kind.to_string();
    for s in sort {
        name.push_str("-by-");
        name.push_str(&s.field.replace('.', "-"));
    }
    let where_: Vec<&String> = fields.keys().filter(|f| *f != "kind").collect();
    for w in &where_ {
        name.push_str("-where-");
        name.push_str(&w.replace('.', "-"));
    }
    let name: String = name
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .take(64)
        .collect();
    json!({
        "name": name,
        "kind": kind,
        "where": where_,
        "sort": sort,
    })
    .to_string()
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
            if !where_matches || d.state == IndexState::Dropping {
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
            let where_values = d.where_.iter().map(|f| fields[f].clone()).collect();
            return Ok(Plan {
                def: d.clone(),
                direction,
                where_values,
            });
        }
        match building {
            Some(name) => Err(EngineError::IndexBuilding(name)),
            None => Err(EngineError::NoIndex {
                declare: suggest(q.kind.as_deref(), fields, sort),
            }),
        }
    }

    /// One page of a listing, from the index that serves it.
    pub async fn list_items(&self, caller: &Caller, q: &ListQuery) -> Result<Page> {
        check_limit(q.limit)?;
        let mut fields: BTreeMap<String, Value> = BTreeMap::new();
        for (f, v) in &q.where_ {
            if fields.insert(f.clone(), v.clone()).is_some() {
                return Err(EngineError::InvalidInput(format!(
                    "where.{f} is given twice"
                )));
            }
        }
        if let Some(kind) = &q.kind {
            fields.insert("kind".into(), Value::from(kind.clone()));
        }
        if q.scope == Scope::Mine {
            let me = Value::from(caller.require_user()?);
            if fields.get("createdBy").is_some_and(|v| *v != me) {
                return Err(EngineError::InvalidInput(
                    "scope=mine lists your own items; drop where.createdBy".into(),
                ));
            }
            fields.insert("createdBy".into(), me);
        } else if q.kind.is_none() {
            return Err(EngineError::InvalidInput("kind is required".into()));
        }
        let sort = if q.sort.is_empty() {
            vec![SortField {
                field: "modifiedAt".into(),
                order: Order::Desc,
            }]
        } else {
            q.sort.clone()
        };
        self.retrying(|| self.list_once(caller, q, &fields, &sort))
            .await
    }

    async fn list_once(
        &self,
        caller: &Caller,
        q: &ListQuery,
        fields: &BTreeMap<String, Value>,
        sort: &[SortField],
    ) -> Result<Page> {
        let defs = self.index_defs().await?;
        let plan = self.plan(&defs.defs, q, fields, sort)?;
        let principals = self.principals(caller).await?;
        let after = match &q.cursor {
            Some(c) => Some(decode_cursor(c, &plan.def.name, plan.direction)?),
            None => None,
        };
        let values: Vec<Option<&Value>> = plan.where_values.iter().map(Some).collect();
        let scans = principals
            .iter()
            .map(|p| {
                let mut scan = Scan::partition(INDEX, plan.def.partition(p, &values), q.limit + 1)
                    .direction(plan.direction);
                if let Some(after) = &after {
                    scan = match plan.direction {
                        Direction::Forward => {
                            scan.bounds(Bound::Excluded(after.clone()), Bound::Unbounded)
                        }
                        Direction::Reverse => {
                            scan.bounds(Bound::Unbounded, Bound::Excluded(after.clone()))
                        }
                    };
                }
                scan
            })
            .collect();
        let parts = self.store().scan_many(scans).await?;
        let rows = merge(&parts, plan.direction == Direction::Reverse, q.limit + 1);
        let more = rows.len() > q.limit;
        let page: Vec<&Row> = rows.into_iter().take(q.limit).collect();
        let next = if more {
            page.last()
                .map(|r| encode_cursor(&plan.def.name, plan.direction, &r.clustering))
        } else {
            None
        };
        let keys = page
            .iter()
            .map(|r| {
                String::from_utf8(r.value.clone())
                    .map(|id| schema::item_key(&id))
                    .map_err(|e| crate::error::corrupt("index row", e))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut items = Vec::with_capacity(keys.len());
        for row in self.store().get_many(keys).await?.into_iter().flatten() {
            let item: Item = schema::decode("item", &row)?;
            // The index said readable; the item row has the last word (a
            // change may have landed between the two reads).
            let role = if caller.is_admin() {
                Some(Role::Manager)
            } else {
                item.role_of(&principals)
            };
            if let Some(role) = role {
                items.push(ItemView { item, role });
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

    #[test]
    fn merge_drops_duplicates_both_directions() {
        let parts = vec![
            vec![row(b"a"), row(b"c"), row(b"e")],
            vec![row(b"b"), row(b"c"), row(b"d")],
            vec![],
            vec![row(b"a")],
        ];
        let keys = |rows: Vec<&Row>| -> Vec<u8> { rows.iter().map(|r| r.clustering[0]).collect() };
        assert_eq!(keys(merge(&parts, false, 10)), b"abcde".to_vec());
        assert_eq!(keys(merge(&parts, false, 3)), b"abc".to_vec());
        let rev: Vec<Vec<Row>> = parts
            .iter()
            .map(|p| p.iter().rev().cloned().collect())
            .collect();
        assert_eq!(keys(merge(&rev, true, 10)), b"edcba".to_vec());
    }

    #[test]
    fn cursors_belong_to_their_listing() {
        let c = encode_cursor("idx", Direction::Forward, b"\x01key");
        assert_eq!(
            decode_cursor(&c, "idx", Direction::Forward).unwrap(),
            b"\x01key"
        );
        assert!(decode_cursor(&c, "other", Direction::Forward).is_err());
        assert!(decode_cursor(&c, "idx", Direction::Reverse).is_err());
        assert!(decode_cursor("!!", "idx", Direction::Forward).is_err());
    }
}
