//! An in-memory reference store: ordered maps behind one lock.
//!
//! It exists for tests and as the executable meaning of the contract; the one
//! lock makes it simple and obviously serialisable, and unfit for serving.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::RwLock;

use crate::{Batch, Direction, Expect, Key, Op, Row, Scan, Store, StoreError, StoreResult, Table};

type Partition = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;

/// Rows in nested ordered maps: `(table, partition) -> clustering -> row`.
#[derive(Default)]
pub struct MemoryStore {
    rows: RwLock<BTreeMap<(Table, Vec<u8>), Partition>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// How many rows the store holds, over all tables.
    pub fn len(&self) -> usize {
        self.rows.read().unwrap().values().map(|p| p.len()).sum()
    }

    /// Whether the store holds no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Unbounded => Bound::Unbounded,
        Bound::Included(v) => Bound::Included(v.as_slice()),
        Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: Key) -> StoreResult<Option<Row>> {
        let rows = self.rows.read().unwrap();
        Ok(rows
            .get(&(key.table, key.partition))
            .and_then(|p| p.get(&key.clustering))
            .map(|(value, version)| Row {
                clustering: key.clustering,
                value: value.clone(),
                version: *version,
            }))
    }

    async fn scan(&self, scan: Scan) -> StoreResult<Vec<Row>> {
        if scan.limit == 0 || !bounds_nonempty(&scan) {
            return Ok(Vec::new());
        }
        let rows = self.rows.read().unwrap();
        let Some(part) = rows.get(&(scan.table, scan.partition.clone())) else {
            return Ok(Vec::new());
        };
        let range = part.range::<[u8], _>((bound_ref(&scan.lower), bound_ref(&scan.upper)));
        let to_row = |(k, (v, ver)): (&Vec<u8>, &(Vec<u8>, u64))| Row {
            clustering: k.clone(),
            value: v.clone(),
            version: *ver,
        };
        Ok(match scan.direction {
            Direction::Forward => range.take(scan.limit).map(to_row).collect(),
            Direction::Reverse => range.rev().take(scan.limit).map(to_row).collect(),
        })
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        batch.validate()?;
        let mut rows = self.rows.write().unwrap();
        for (i, g) in batch.guards.iter().enumerate() {
            let current = rows
                .get(&(g.key.table, g.key.partition.clone()))
                .and_then(|p| p.get(&g.key.clustering))
                .map(|(_, v)| *v);
            let holds = match (g.expect, current) {
                (Expect::Absent, None) => true,
                (Expect::Version(want), Some(have)) => want == have,
                _ => false,
            };
            if !holds {
                return Err(StoreError::GuardFailed { guard: i });
            }
        }
        for op in batch.ops {
            match op {
                Op::Put {
                    key,
                    value,
                    version,
                } => {
                    rows.entry((key.table, key.partition))
                        .or_default()
                        .insert(key.clustering, (value, version));
                }
                Op::Delete { key } => {
                    let pk = (key.table, key.partition);
                    if let Some(p) = rows.get_mut(&pk) {
                        p.remove(&key.clustering);
                        if p.is_empty() {
                            rows.remove(&pk);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether the bounds can hold any key at all; `BTreeMap::range` panics on
/// inverted bounds, and every backend must answer them with nothing.
pub(crate) fn bounds_nonempty(scan: &Scan) -> bool {
    match (&scan.lower, &scan.upper) {
        (Bound::Included(l), Bound::Included(u)) => l <= u,
        (Bound::Included(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u))
        | (Bound::Excluded(l), Bound::Excluded(u)) => l < u,
        _ => true,
    }
}
