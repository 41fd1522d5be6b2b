//! The keyspace, the one table, its intent index, and the prepared
//! statements every operation uses.

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, Statement};
use std::sync::Arc;
use tarn_store::{Direction, StoreError, StoreResult};

use crate::error::{map_exec, map_prepare, SCHEMA_LAG};
use crate::retry::StorePolicy;
use crate::url::Target;

/// The table's name in its keyspace.
pub(crate) const TABLE: &str = "rows";
/// The index that lets the roll-forward find intents without scanning.
const INDEX: &str = "rows_intent_at";
/// `kind` of a contract row.
pub(crate) const KIND_ROW: i8 = 0;
/// `kind` of an intent row (see the crate docs).
pub(crate) const KIND_INTENT: i8 = 1;

/// A table id derived from the keyspace's name, so that nodes creating the
/// table at the same moment through different coordinators create the same
/// table rather than two tables with one name (Cassandra 5.0 merges schema
/// changes per table id).
fn table_id(keyspace: &str) -> String {
    // FNV-1a, twice with different offsets: 128 stable bits, no dependency.
    let hash = |offset: u64| {
        let mut h = offset;
        for b in "tarn-store-cassandra/".bytes().chain(keyspace.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&hash(0xcbf2_9ce4_8422_2325).to_be_bytes());
    id[8..].copy_from_slice(&hash(0x6c62_272e_07bb_0142).to_be_bytes());
    // RFC 9562 version 8 (custom), variant 10.
    id[6] = (id[6] & 0x0f) | 0x80;
    id[8] = (id[8] & 0x3f) | 0x80;
    let h: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Whether the table and its index exist, as this node's schema says.
async fn exists(session: &Session, keyspace: &str) -> StoreResult<bool> {
    let mut q = Statement::new(
        "SELECT index_name FROM system_schema.indexes WHERE keyspace_name = ? AND table_name = ? AND index_name = ?",
    );
    q.set_consistency(Consistency::One);
    let r = session
        .query_unpaged(q, (keyspace, TABLE, INDEX))
        .await
        .map_err(map_exec)?;
    let rows = r
        .into_rows_result()
        .map_err(|e| StoreError::Other(format!("schema query: {e}")))?;
    Ok(rows.rows_num() > 0)
}

/// Creates what is missing. Every statement is `IF NOT EXISTS` and the
/// driver waits for schema agreement after each, so any number of
/// processes may run this at once.
pub(crate) async fn ensure(session: &Session, target: &Target) -> StoreResult<()> {
    let ks = &target.keyspace;
    if exists(session, ks).await? {
        return Ok(());
    }
    let ddl = [
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = \
             {{'class': 'SimpleStrategy', 'replication_factor': {}}}",
            target.replication
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {ks}.{TABLE} (
                 tbl text, part blob, kind tinyint, clus blob,
                 value blob, version bigint, intent_at bigint,
                 PRIMARY KEY ((tbl, part), kind, clus)
             ) WITH ID = {} AND comment = 'Tarn store rows (tarn-store-cassandra)' \
               AND compaction = {{'class': '{COMPACTION}'}}",
            table_id(ks)
        ),
        format!(
            "CREATE CUSTOM INDEX IF NOT EXISTS {INDEX} ON {ks}.{TABLE} (intent_at) \
             USING 'StorageAttachedIndex'"
        ),
    ];
    for stmt in ddl {
        run_ddl(session, stmt).await?;
    }
    agree(session).await
}

/// Waits until every node reports one schema version.
pub(crate) async fn agree(session: &Session) -> StoreResult<()> {
    session
        .await_schema_agreement()
        .await
        .map(|_| ())
        .map_err(|e| StoreError::Unavailable(format!("schema agreement: {e}")))
}

/// Runs one `IF NOT EXISTS` statement once the schema agrees. The driver
/// may send each statement to another node, and a statement that changes
/// nothing (another process got there first) is not followed by schema
/// agreement: so a node may not know yet of the keyspace or table that
/// another process created through another node. That is retried.
async fn run_ddl(session: &Session, stmt: String) -> StoreResult<()> {
    let mut attempt = 0;
    loop {
        agree(session).await?;
        match session
            .query_unpaged(Statement::new(stmt.as_str()), ())
            .await
            .map_err(map_exec)
        {
            Ok(_) => return Ok(()),
            Err(StoreError::Unavailable(m)) if attempt < 20 && m.contains(SCHEMA_LAG) => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100 * attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A scan statement's shape: kind of lower bound, kind of upper bound
/// (0 unbounded, 1 included, 2 excluded), direction.
pub(crate) fn scan_index(lower: usize, upper: usize, direction: Direction) -> usize {
    (lower * 3 + upper) * 2 + usize::from(direction == Direction::Reverse)
}

/// Every statement, prepared once per store.
pub(crate) struct Statements {
    pub get: PreparedStatement,
    /// Indexed by [`scan_index`].
    pub scans: Vec<PreparedStatement>,
    pub put: PreparedStatement,
    pub delete: PreparedStatement,
    /// Conditional-batch members, indexed by [`Cond`].
    pub cas_put: [PreparedStatement; 3],
    pub cas_delete: [PreparedStatement; 3],
    pub check_version: PreparedStatement,
    pub check_absent: PreparedStatement,
    pub intent_put: PreparedStatement,
    pub intent_delete: PreparedStatement,
    pub intent_serial: PreparedStatement,
    pub guards_serial: PreparedStatement,
    pub sweep: PreparedStatement,
    pub intent_get: PreparedStatement,
    /// Removes a feed partition's entries up to a cursor.
    pub feed_trim: PreparedStatement,
    /// Every row, in token order, from the first token / after a token.
    pub all_from: PreparedStatement,
    pub all_after: PreparedStatement,
}

/// The condition a conditional-batch member carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cond {
    None = 0,
    Version = 1,
    Absent = 2,
}

impl Statements {
    pub(crate) async fn prepare(session: &Session, ks: &str) -> StoreResult<Statements> {
        let t = format!("{ks}.{TABLE}");
        let row = format!("tbl = ? AND part = ? AND kind = {KIND_ROW} AND clus = ?");
        let mut scan_texts = Vec::new();
        for lower in 0..3 {
            for upper in 0..3 {
                for dir in [Direction::Forward, Direction::Reverse] {
                    let mut q =
                        format!("SELECT clus, value, version FROM {t} WHERE tbl = ? AND part = ? AND kind = {KIND_ROW}");
                    q.push_str(["", " AND clus >= ?", " AND clus > ?"][lower]);
                    q.push_str(["", " AND clus <= ?", " AND clus < ?"][upper]);
                    q.push_str(match dir {
                        Direction::Forward => " ORDER BY kind ASC, clus ASC",
                        Direction::Reverse => " ORDER BY kind DESC, clus DESC",
                    });
                    q.push_str(" LIMIT ?");
                    debug_assert_eq!(scan_texts.len(), scan_index(lower, upper, dir));
                    scan_texts.push(q);
                }
            }
        }
        let texts = [
            format!("SELECT value, version FROM {t} WHERE {row}"),
            format!(
                "INSERT INTO {t} (tbl, part, kind, clus, value, version) VALUES (?, ?, {KIND_ROW}, ?, ?, ?) USING TIMESTAMP ?"
            ),
            format!("DELETE FROM {t} USING TIMESTAMP ? WHERE {row}"),
            format!("UPDATE {t} SET value = ?, version = ? WHERE {row}"),
            format!("UPDATE {t} SET value = ?, version = ? WHERE {row} IF version = ?"),
            format!("UPDATE {t} SET value = ?, version = ? WHERE {row} IF version = null"),
            format!("DELETE FROM {t} WHERE {row}"),
            format!("DELETE FROM {t} WHERE {row} IF version = ?"),
            format!("DELETE FROM {t} WHERE {row} IF version = null"),
            // A guard on a row the batch does not change: rewriting the
            // version with itself is the write that carries the condition.
            format!("UPDATE {t} SET version = ? WHERE {row} IF version = ?"),
            format!("DELETE FROM {t} WHERE {row} IF version = null"),
            format!(
                "INSERT INTO {t} (tbl, part, kind, clus, value, version, intent_at) VALUES (?, ?, {KIND_INTENT}, ?, ?, 0, ?)"
            ),
            format!(
                "DELETE FROM {t} USING TIMESTAMP ? WHERE tbl = ? AND part = ? AND kind = {KIND_INTENT} AND clus = ?"
            ),
            format!("SELECT clus FROM {t} WHERE tbl = ? AND part = ? AND kind = {KIND_INTENT} AND clus = ?"),
            format!(
                "SELECT clus, version FROM {t} WHERE tbl = ? AND part = ? AND kind = {KIND_ROW} AND clus IN ?"
            ),
            // Keys only: a page of intents costs little memory however
            // large the intents are; each is then read on its own.
            format!(
                "SELECT tbl, part, clus, WRITETIME(value) FROM {t} WHERE intent_at < ? LIMIT ?"
            ),
            format!(
                "SELECT value FROM {t} WHERE tbl = ? AND part = ? AND kind = {KIND_INTENT} AND clus = ?"
            ),
            format!(
                "DELETE FROM {t} USING TIMESTAMP ? WHERE tbl = ? AND part = ? AND kind = {KIND_ROW} AND clus <= ?"
            ),
            format!(
                "SELECT tbl, part, kind, clus, value, version, token(tbl, part) FROM {t} WHERE token(tbl, part) >= ? LIMIT ?"
            ),
            format!(
                "SELECT tbl, part, kind, clus, value, version, token(tbl, part) FROM {t} WHERE token(tbl, part) > ? LIMIT ?"
            ),
        ];
        let all: Vec<String> = scan_texts.into_iter().chain(texts).collect();
        let prepared =
            futures_util::future::try_join_all(all.iter().map(|q| session.prepare(q.as_str())))
                .await
                .map_err(map_prepare)?;
        let mut it = prepared.into_iter();
        let mut next = || it.next().expect("one statement per text");
        let scans: Vec<PreparedStatement> = (0..18).map(|_| quorum(next())).collect();
        let get = quorum(next());
        let put = quorum(next());
        let delete = quorum(next());
        let cas_put = [next(), next(), next()];
        let cas_delete = [next(), next(), next()];
        let check_version = next();
        let check_absent = next();
        let intent_put = next();
        let intent_delete = quorum(next());
        let intent_serial = serial(next());
        let guards_serial = serial(next());
        let sweep = quorum(next());
        let intent_get = quorum(next());
        let feed_trim = quorum(next());
        let all_from = quorum(next());
        let all_after = quorum(next());
        Ok(Statements {
            get,
            scans,
            put,
            delete,
            cas_put,
            cas_delete,
            check_version,
            check_absent,
            intent_put,
            intent_delete,
            intent_serial,
            guards_serial,
            sweep,
            intent_get,
            feed_trim,
            all_from,
            all_after,
        })
    }
}

/// A QUORUM read, or a QUORUM write with an explicit timestamp (running it
/// twice is running it once): idempotent, so the driver may retry it on
/// another node.
fn quorum(mut s: PreparedStatement) -> PreparedStatement {
    s.set_consistency(Consistency::Quorum);
    s.set_is_idempotent(true);
    s
}

/// A linearizable read through Paxos. The driver does not retry SERIAL
/// reads itself (but for a node behind the schema: `retry.rs`); the store
/// does, knowing what it looks for.
fn serial(mut s: PreparedStatement) -> PreparedStatement {
    s.set_consistency(Consistency::Serial);
    s.set_retry_policy(Some(Arc::new(StorePolicy::or_fall_through())));
    s
}

/// The largest row-index granularity (`column_index_size`) under which a
/// reversed slice stays cheap. Cassandra indexes the rows of a partition
/// only past this many bytes, and reads a partition without that index
/// whole to walk it backwards: with the default (64 KiB for the `big`
/// sstable format), a newest-first listing of Tarn's index partitions
/// (rows of about 100 bytes) deserialized every row of each partition it
/// read, up to about 600, to return 25. At 4 KiB a reversed slice reads
/// at most one 4 KiB block more than it returns.
pub(crate) const COLUMN_INDEX_BYTES: u64 = 4 * 1024;

/// How the table compacts. Leveled compaction keeps a partition's rows in
/// at most one sstable a level, so a listing's slices read a few sstables
/// however much was written; size-tiered (Cassandra's default) lets a
/// partition spread over more sstables until they are merged. Tarn's
/// tables are read far more than written. (The user-home bench has not
/// told the two apart on the project's machine: the README, issue 12.)
pub(crate) const COMPACTION: &str = "LeveledCompactionStrategy";

/// The compaction class of the keyspace's table, as the schema names it
/// (`org.apache.cassandra.db.compaction.` and the class).
pub(crate) async fn compaction_class(session: &Session, keyspace: &str) -> StoreResult<String> {
    let mut q = Statement::new(
        "SELECT compaction FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?",
    );
    q.set_consistency(Consistency::One);
    let r = session
        .query_unpaged(q, (keyspace, TABLE))
        .await
        .map_err(map_exec)?;
    let rows = r
        .into_rows_result()
        .map_err(|e| StoreError::Other(format!("expected rows: {e}")))?;
    let row = rows
        .maybe_first_row::<(Option<std::collections::HashMap<String, String>>,)>()
        .map_err(|e| StoreError::Other(format!("schema row: {e}")))?;
    Ok(row
        .and_then(|(m,)| m)
        .and_then(|mut m| m.remove("class"))
        .unwrap_or_default())
}

/// Advice for a table that compacts with `class` rather than
/// [`COMPACTION`] (a table made before Tarn asked for it keeps what it
/// had), or `None` when it compacts so or its class could not be read.
pub(crate) fn compaction_advice(keyspace: &str, class: &str) -> Option<String> {
    if class.is_empty() || class.rsplit('.').next() == Some(COMPACTION) {
        return None;
    }
    Some(format!(
        "table {keyspace}.{TABLE} compacts with {class}, where a partition may spread over \
         more sstables, which listings read; Tarn makes it leveled: `ALTER TABLE \
         {keyspace}.{TABLE} WITH compaction = {{'class': '{COMPACTION}'}}`"
    ))
}

/// The coordinator's `column_index_size` (`None` when unset: Cassandra
/// then uses its default for the sstable format).
pub(crate) async fn column_index_size(session: &Session) -> StoreResult<Option<String>> {
    let mut q = Statement::new("SELECT value FROM system_views.settings WHERE name = ?");
    q.set_consistency(Consistency::One);
    let r = session
        .query_unpaged(q, ("column_index_size",))
        .await
        .map_err(map_exec)?;
    let rows = r
        .into_rows_result()
        .map_err(|e| StoreError::Other(format!("expected rows: {e}")))?;
    let row = rows
        .maybe_first_row::<(Option<String>,)>()
        .map_err(|e| StoreError::Other(format!("settings row: {e}")))?;
    Ok(row.and_then(|(v,)| v))
}

/// Why a node's `column_index_size` (as [`column_index_size`] reads it)
/// makes reversed slices expensive, or `None` when it does not: unset
/// (64 KiB for big sstables) or above [`COLUMN_INDEX_BYTES`].
pub(crate) fn column_index_advice(value: Option<&str>) -> Option<String> {
    let bytes = value.and_then(storage_bytes);
    if bytes.is_some_and(|b| b <= COLUMN_INDEX_BYTES) {
        return None;
    }
    Some(format!(
        "column_index_size is {}: newest-first listings read whole index partitions; \
         set `column_index_size: 4KiB` in every node's cassandra.yaml (on a running node: \
         `nodetool setcolumnindexsize 4`, then `nodetool upgradesstables -a KEYSPACE`)",
        value.unwrap_or("unset (64KiB for big sstables)")
    ))
}

/// Bytes of a Cassandra data storage setting such as `4KiB` or `64 KiB`.
fn storage_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..digits].parse().ok()?;
    let unit: u64 = match text[digits..].trim() {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_ids_are_stable_uuids() {
        let a = table_id("tarn");
        assert_eq!(a, table_id("tarn"));
        assert_ne!(a, table_id("tarn2"));
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "8", "version 8: {a}");
    }

    #[test]
    fn scan_shapes_are_numbered_densely() {
        let mut seen: Vec<usize> = (0..3)
            .flat_map(|l| {
                (0..3).flat_map(move |u| {
                    [Direction::Forward, Direction::Reverse].map(|d| scan_index(l, u, d))
                })
            })
            .collect();
        seen.sort();
        assert_eq!(seen, (0..18).collect::<Vec<_>>());
    }

    #[test]
    fn storage_settings_read_as_bytes() {
        assert_eq!(storage_bytes("4KiB"), Some(4096));
        assert_eq!(storage_bytes("64 KiB"), Some(65536));
        assert_eq!(storage_bytes("1MiB"), Some(1 << 20));
        assert_eq!(storage_bytes("512B"), Some(512));
        assert_eq!(storage_bytes("4kb"), None);
        assert_eq!(storage_bytes("KiB"), None);
        assert_eq!(storage_bytes("99999999999999999999GiB"), None);
    }

    #[test]
    fn a_coarse_or_unset_row_index_is_advised_against() {
        assert!(column_index_advice(Some("4KiB")).is_none());
        assert!(column_index_advice(Some("1KiB")).is_none());
        let unset = column_index_advice(None).unwrap();
        assert!(unset.contains("unset"), "{unset}");
        let coarse = column_index_advice(Some("64KiB")).unwrap();
        assert!(
            coarse.contains("64KiB") && coarse.contains("4KiB"),
            "{coarse}"
        );
        assert!(column_index_advice(Some("8KiB")).is_some());
        assert!(column_index_advice(Some("garbage")).is_some());
    }

    #[test]
    fn a_table_compacting_otherwise_than_leveled_is_advised_against() {
        let lcs = "org.apache.cassandra.db.compaction.LeveledCompactionStrategy";
        assert!(compaction_advice("tarn", lcs).is_none());
        let stcs = "org.apache.cassandra.db.compaction.SizeTieredCompactionStrategy";
        let advice = compaction_advice("tarn", stcs).unwrap();
        assert!(
            advice.contains("SizeTiered") && advice.contains("ALTER TABLE tarn.rows"),
            "{advice}"
        );
        assert!(compaction_advice("tarn", "").is_none());
    }
}
