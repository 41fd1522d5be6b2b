//! Where everything lives in the store: tables, key layouts, row codecs.
//!
//! No key is empty (a distributed backend cannot store one): rows that are
//! alone in their partition have a one-letter clustering key.
//!
//! | table | partition | clustering | value |
//! | --- | --- | --- | --- |
//! | `users` | username | `u` | [`User`](crate::User) JSON |
//! | `sessions` | SHA-256 of the token | `s` | [`SessionRow`] JSON |
//! | `user_sessions` | username | SHA-256 of the token | `-` |
//! | `groups` | group id | `g` | [`Group`](crate::Group) JSON (managers inside) |
//! | `members` | group id | member principal | `-` |
//! | `memberships` | member principal | group id | `-` |
//! | `meta` | `layout` / `feed` | `l` / `trimmed` | the layout / the last change trimmed |
//! | `items` | item id | `i`: the item; `l` + SHA-256 of a link key: the link | [`ItemRow`] JSON / role |
//! | `kinds` | kind, bucket | item id: every item of a kind, for index builds; `\0`: the bucket's declarations stamp | `-` |
//! | `blobs` | blob id | chunk number, 8 bytes big-endian | bytes |
//! | `graveyard` | `g` + due hour | due time, blob id | blobs to remove once no download can need them |
//! | `index_defs` | `defs` | index name; `\0v`: the declarations version | [`IndexDef`](crate::IndexDef) JSON |
//! | `idx` | index uid, principal, bucket (shared principals only), where-values | sort-values, item id | item id |
//! | `throttle` | what is counted | `w` | a window of failures |
//!
//! Row versions are revisions chosen by the writer (the old one plus one),
//! separate from an item's own `version`: background work (an index build)
//! may rewrite a row without changing what users see.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tarn_store::{Key, Row, Table};

use crate::error::{corrupt, Result};

pub(crate) const USERS: Table = Table::new("users");
pub(crate) const SESSIONS: Table = Table::new("sessions");
pub(crate) const USER_SESSIONS: Table = Table::new("user_sessions");
pub(crate) const GROUPS: Table = Table::new("groups");
pub(crate) const MEMBERS: Table = Table::new("members");
pub(crate) const MEMBERSHIPS: Table = Table::new("memberships");
pub(crate) const META: Table = Table::new("meta");
pub(crate) const ITEMS: Table = Table::new("items");
pub(crate) const KINDS: Table = Table::new("kinds");
pub(crate) const BLOBS: Table = Table::new("blobs");
pub(crate) const GRAVEYARD: Table = Table::new("graveyard");
pub(crate) const INDEX_DEFS: Table = Table::new("index_defs");
pub(crate) const INDEX: Table = Table::new("idx");
pub(crate) const THROTTLE: Table = Table::new("throttle");

/// The value of rows whose key says everything.
pub(crate) const MARK: &[u8] = b"-";
/// Clustering key of the item row in an item's partition.
pub(crate) const ITEM_ROW: &[u8] = b"i";
/// Clustering key of a kind bucket's declarations stamp (item ids never
/// start with a zero byte).
pub(crate) const STAMP_ROW: &[u8] = b"\0";
/// Partition of the index declarations.
pub(crate) const DEFS_PARTITION: &[u8] = b"defs";
/// Clustering key of the declarations version (names never start with a
/// zero byte).
pub(crate) const DEFS_VERSION_ROW: &[u8] = b"\0v";
/// Buckets of each kind's partition of `kinds`.
pub(crate) const KIND_BUCKETS: u8 = 16;

pub(crate) fn user_key(username: &str) -> Key {
    Key::new(USERS, username.as_bytes(), b"u".to_vec())
}

pub(crate) fn session_key(hash: &[u8; 32]) -> Key {
    Key::new(SESSIONS, hash.to_vec(), b"s".to_vec())
}

pub(crate) fn user_session_key(username: &str, hash: &[u8; 32]) -> Key {
    Key::new(USER_SESSIONS, username.as_bytes(), hash.to_vec())
}

pub(crate) fn group_key(id: &str) -> Key {
    Key::new(GROUPS, id.as_bytes(), b"g".to_vec())
}

pub(crate) fn layout_key() -> Key {
    Key::new(META, b"layout".to_vec(), b"l".to_vec())
}

pub(crate) fn item_key(id: &str) -> Key {
    Key::new(ITEMS, id.as_bytes(), ITEM_ROW.to_vec())
}

pub(crate) fn link_key(item: &str, link: &str) -> Key {
    let mut clus = b"l".to_vec();
    clus.extend_from_slice(&crate::sha256(link.as_bytes()));
    Key::new(ITEMS, item.as_bytes(), clus)
}

/// The bucket of `kinds` an item id falls in.
pub(crate) fn kind_bucket(id: &str) -> u8 {
    (crate::sha256(id.as_bytes())[0]) % KIND_BUCKETS
}

pub(crate) fn kind_partition(kind: &str, bucket: u8) -> Vec<u8> {
    let mut p = kind.as_bytes().to_vec();
    p.push(0);
    p.push(bucket);
    p
}

pub(crate) fn kind_key(kind: &str, id: &str) -> Key {
    Key::new(KINDS, kind_partition(kind, kind_bucket(id)), id.as_bytes())
}

pub(crate) fn stamp_key(kind: &str, bucket: u8) -> Key {
    Key::new(KINDS, kind_partition(kind, bucket), STAMP_ROW.to_vec())
}

pub(crate) fn chunk_key(blob: &str, n: u64) -> Key {
    Key::new(BLOBS, blob.as_bytes(), n.to_be_bytes())
}

pub(crate) fn defs_version_key() -> Key {
    Key::new(
        INDEX_DEFS,
        DEFS_PARTITION.to_vec(),
        DEFS_VERSION_ROW.to_vec(),
    )
}

pub(crate) fn def_key(name: &str) -> Key {
    Key::new(INDEX_DEFS, DEFS_PARTITION.to_vec(), name.as_bytes())
}

/// A session as stored under the hash of its token.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct SessionRow {
    pub username: String,
    pub expires_at: i64,
}

/// An item as stored: the item and the declarations version its index rows
/// were computed with.
#[derive(serde::Serialize)]
pub(crate) struct ItemRow {
    #[serde(flatten)]
    pub item: crate::Item,
    /// The index declarations version this item's rows follow.
    pub stamp: u64,
}

/// Read without `#[serde(flatten)]`, which buffers the whole row into an
/// intermediate tree and reads it again (callgrind: a sixth of an item
/// read). The same fields, read once.
impl<'de> serde::Deserialize<'de> for ItemRow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<ItemRow, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Flat {
            id: String,
            kind: String,
            properties: Box<serde_json::value::RawValue>,
            version: u64,
            created_by: String,
            created_at: i64,
            modified_at: i64,
            body: Option<crate::BodyMeta>,
            acl: Vec<crate::Grant>,
            stamp: u64,
        }
        let f = Flat::deserialize(d)?;
        Ok(ItemRow {
            item: crate::Item {
                id: f.id,
                kind: f.kind,
                properties: crate::Properties::stored(f.properties),
                version: f.version,
                created_by: f.created_by,
                created_at: f.created_at,
                modified_at: f.modified_at,
                body: f.body,
                acl: f.acl,
            },
            stamp: f.stamp,
        })
    }
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("engine types serialise")
}

pub(crate) fn decode<T: DeserializeOwned>(what: &str, row: &Row) -> Result<T> {
    serde_json::from_slice(&row.value).map_err(|e| corrupt(what, e))
}
