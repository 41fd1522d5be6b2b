//! Where everything lives in the store: tables, key layouts, row codecs.
//!
//! | table | partition | clustering | value |
//! | --- | --- | --- | --- |
//! | `users` | username | empty | [`User`](crate::User) JSON |
//! | `sessions` | SHA-256 of the token | empty | [`SessionRow`] JSON |
//! | `user_sessions` | username | SHA-256 of the token | empty |
//! | `groups` | group id | empty | [`Group`](crate::Group) JSON (managers inside) |
//! | `members` | group id | member principal | empty |
//! | `memberships` | member principal | group id | empty |
//! | `meta` | `graph` | empty | empty; guards group nesting changes |
//! | `items` | item id | empty: the item; `l` + SHA-256 of a link key: the link | item JSON / role |
//! | `kinds` | kind | item id | empty: every item of a kind, for index builds |
//! | `blobs` | blob id | chunk number, 8 bytes big-endian | bytes |
//! | `index_defs` | empty | index name | [`IndexDef`](crate::IndexDef) JSON |
//! | `idx` | index name, principal, where-values | sort-values, item id | item id |

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
pub(crate) const INDEX_DEFS: Table = Table::new("index_defs");
pub(crate) const INDEX: Table = Table::new("idx");

pub(crate) fn user_key(username: &str) -> Key {
    Key::new(USERS, username.as_bytes(), Vec::new())
}

pub(crate) fn group_key(id: &str) -> Key {
    Key::new(GROUPS, id.as_bytes(), Vec::new())
}

pub(crate) fn graph_key() -> Key {
    Key::new(META, b"graph".to_vec(), Vec::new())
}

pub(crate) fn item_key(id: &str) -> Key {
    Key::new(ITEMS, id.as_bytes(), Vec::new())
}

pub(crate) fn link_key(item: &str, link: &str) -> Key {
    let mut clus = b"l".to_vec();
    clus.extend_from_slice(&crate::sha256(link.as_bytes()));
    Key::new(ITEMS, item.as_bytes(), clus)
}

pub(crate) fn kind_key(kind: &str, id: &str) -> Key {
    Key::new(KINDS, kind.as_bytes(), id.as_bytes())
}

pub(crate) fn chunk_key(blob: &str, n: u64) -> Key {
    Key::new(BLOBS, blob.as_bytes(), n.to_be_bytes())
}

/// A session as stored under the hash of its token.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct SessionRow {
    pub username: String,
    pub expires_at: i64,
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("engine types serialise")
}

pub(crate) fn decode<T: DeserializeOwned>(what: &str, row: &Row) -> Result<T> {
    serde_json::from_slice(&row.value).map_err(|e| corrupt(what, e))
}
