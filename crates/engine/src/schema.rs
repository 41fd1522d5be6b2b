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
//! | `memberships` | member principal | group id; `~`: a user's gate, moved by each new membership | `-` / join cursor |
//! | `meta` | `layout` / `feed` | `l` / `trimmed` | the layout / the last change trimmed |
//! | `items` | item id | `i`: the item; `l` + SHA-256 of a link key: the link | [`ItemRow`] (binary) / `{"role","createdAt"}` JSON (before 2026-12-03 the role alone) |
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

use std::ops::Bound;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tarn_store::{Key, Row, Scan, Table};

use crate::error::{corrupt, Result};
use crate::{BodyMeta, Grant, Principal, Role};

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
/// Clustering key of a user's gate row in the user's memberships: after
/// every group id (ids are lower-case letters, digits and `._-`), so walks
/// end before it. Every direct add of the user writes it, guarded on the
/// version it read, so adds of one user made at once count each other.
pub(crate) const GATE: &[u8] = b"~";

/// The gate row of `member`'s memberships (see [`GATE`]).
pub(crate) fn membership_gate(member: &str) -> Key {
    Key::new(MEMBERSHIPS, member.as_bytes(), GATE.to_vec())
}
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

/// The row of the key cursors are sealed with (see `Engine::cursor_key`).
pub(crate) fn cursor_key_row() -> Key {
    Key::new(META, b"cursors".to_vec(), b"key".to_vec())
}

pub(crate) fn layout_key() -> Key {
    Key::new(META, b"layout".to_vec(), b"l".to_vec())
}

pub(crate) fn item_key(id: &str) -> Key {
    Key::new(ITEMS, id.as_bytes(), ITEM_ROW.to_vec())
}

/// The first byte of the clustering key of an item's link rows.
const LINK_ROWS: u8 = b'l';

pub(crate) fn link_key(item: &str, link: &str) -> Key {
    link_key_of_hash(item, &crate::sha256(link.as_bytes()))
}

/// The row of an item's link, by the hash of its key.
pub(crate) fn link_key_of_hash(item: &str, hash: &[u8]) -> Key {
    let mut clus = vec![LINK_ROWS];
    clus.extend_from_slice(hash);
    Key::new(ITEMS, item.as_bytes(), clus)
}

/// An item's row, then up to `limit` of its link rows: one partition, so
/// one state of it on every store (Cassandra included), whatever else a
/// request reads beside it.
pub(crate) fn item_and_links_scan(item: &str, limit: usize) -> Scan {
    Scan::partition(ITEMS, item.as_bytes().to_vec(), limit + 1).bounds(
        Bound::Included(ITEM_ROW.to_vec()),
        Bound::Excluded(vec![LINK_ROWS + 1]),
    )
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

/// The row a node building or dropping index `name` of uid `uid`
/// rewrites while it works (a partition of its own: no one reads it but
/// the nodes' watchers).
pub(crate) fn beat_key(name: &str, uid: &str) -> Key {
    let mut clustering = name.as_bytes().to_vec();
    clustering.push(0);
    clustering.extend_from_slice(uid.as_bytes());
    Key::new(INDEX_DEFS, b"beats".to_vec(), clustering)
}

/// A session as stored under the hash of its token.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct SessionRow {
    pub username: String,
    pub expires_at: i64,
}

/// An item as stored: the item and the declarations version its index rows
/// were computed with.
///
/// Every listed or searched item is one of these decoded, so it is written
/// in a compact binary form ([`encode_item`]) rather than JSON: no
/// field names, no escapes, and the properties' JSON text last, passed to
/// the response as it is. Rows written as JSON by earlier versions (first
/// byte `{`) still read.
pub(crate) struct ItemRow {
    pub item: crate::Item,
    /// The index declarations version this item's rows follow.
    pub stamp: u64,
}

/// First byte of an item row in the binary form.
const ITEM_BINARY: u8 = 1;

impl ItemRow {
    /// Reads a row written by [`encode_item`], or as JSON before it. The
    /// properties stay text: enough to show the item.
    pub(crate) fn decode(row: &Row) -> Result<ItemRow> {
        let out: ItemRow = match row.value.first() {
            Some(&ITEM_BINARY) => decode_binary(&row.value[1..]).map_err(|e| corrupt("item", e))?,
            _ => decode("item", row)?,
        };
        if out.item.body.as_ref().is_some_and(|b| b.chunk == 0) {
            return Err(corrupt("item", "a body of chunks of 0 bytes"));
        }
        Ok(out)
    }

    /// Reads a row to rewrite it or compute its index rows: the properties
    /// must read as a tree too ([`crate::Properties::check`]).
    pub(crate) fn decode_checked(row: &Row) -> Result<ItemRow> {
        let out = ItemRow::decode(row)?;
        out.item.properties.check()?;
        Ok(out)
    }
}

/// The row of item `i` whose index rows follow declarations version
/// `stamp`: [`ITEM_BINARY`]; id, kind, version, creator, created and
/// modified times, stamp; the ACL (count, then each principal's tag and
/// name and the role); the body (0, or 1 and its fields and words); then
/// the properties' JSON text to the end. Integers are LEB128 (times: 8
/// bytes little-endian), strings a length and UTF-8 bytes.
pub(crate) fn encode_item(i: &crate::Item, stamp: u64) -> Vec<u8> {
    let text = i.properties.text();
    let mut out = Vec::with_capacity(64 + i.id.len() + i.kind.len() + text.len());
    out.push(ITEM_BINARY);
    put_str(&mut out, &i.id);
    put_str(&mut out, &i.kind);
    put_uint(&mut out, i.version);
    put_str(&mut out, &i.created_by);
    out.extend_from_slice(&i.created_at.to_le_bytes());
    out.extend_from_slice(&i.modified_at.to_le_bytes());
    put_uint(&mut out, stamp);
    put_uint(&mut out, i.acl.len() as u64);
    for g in &i.acl {
        match &g.principal {
            Principal::User(n) => {
                out.push(0);
                put_str(&mut out, n);
            }
            Principal::Group(n) => {
                out.push(1);
                put_str(&mut out, n);
            }
            Principal::Authenticated => out.push(2),
            Principal::Everyone => out.push(3),
        }
        out.push(match g.role {
            Role::Viewer => 0,
            Role::Editor => 1,
            Role::Manager => 2,
        });
    }
    match &i.body {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_uint(&mut out, b.size);
            put_str(&mut out, &b.content_type);
            put_str(&mut out, &b.sha256);
            put_str(&mut out, &b.blob);
            put_uint(&mut out, b.chunk.into());
            put_uint(&mut out, b.word_count.into());
            put_uint(&mut out, b.words.len() as u64);
            for (w, n) in &b.words {
                put_str(&mut out, w);
                put_uint(&mut out, (*n).into());
            }
        }
    }
    out.extend_from_slice(text.as_bytes());
    out
}

fn put_uint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_uint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Reads the binary form, front to back.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(format!("{n} bytes wanted, {} left", self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn uint(&mut self) -> std::result::Result<u64, String> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                break;
            }
            n |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(n);
            }
        }
        Err("an integer longer than 64 bits".into())
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        u32::try_from(self.uint()?).map_err(|e| e.to_string())
    }

    fn len(&mut self) -> std::result::Result<usize, String> {
        usize::try_from(self.uint()?).map_err(|e| e.to_string())
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.len()?;
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|e| e.to_string())
    }

    fn i64(&mut self) -> std::result::Result<i64, String> {
        let b = self.take(8)?;
        Ok(i64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

fn decode_binary(b: &[u8]) -> std::result::Result<ItemRow, String> {
    let mut r = Bytes(b);
    let id = r.string()?;
    let kind = r.string()?;
    let version = r.uint()?;
    let created_by = r.string()?;
    let created_at = r.i64()?;
    let modified_at = r.i64()?;
    let stamp = r.uint()?;
    let grants = r.len()?;
    // Each grant takes at least two bytes: no allocation beyond the row.
    let mut acl = Vec::with_capacity(grants.min(r.0.len() / 2));
    for _ in 0..grants {
        let principal = match r.byte()? {
            0 => Principal::User(r.string()?),
            1 => Principal::Group(r.string()?),
            2 => Principal::Authenticated,
            3 => Principal::Everyone,
            t => return Err(format!("principal tag {t}")),
        };
        let role = match r.byte()? {
            0 => Role::Viewer,
            1 => Role::Editor,
            2 => Role::Manager,
            t => return Err(format!("role {t}")),
        };
        acl.push(Grant { principal, role });
    }
    let body = match r.byte()? {
        0 => None,
        1 => {
            let size = r.uint()?;
            let content_type = r.string()?;
            let sha256 = r.string()?;
            let blob = r.string()?;
            let chunk = r.u32()?;
            let word_count = r.u32()?;
            let n = r.len()?;
            let mut words = Vec::with_capacity(n.min(r.0.len() / 2));
            for _ in 0..n {
                words.push((r.string()?, r.u32()?));
            }
            Some(BodyMeta {
                size,
                content_type,
                sha256,
                blob,
                chunk,
                words,
                word_count,
            })
        }
        t => return Err(format!("body tag {t}")),
    };
    let text: Box<serde_json::value::RawValue> =
        serde_json::from_slice(r.0).map_err(|e| format!("properties: {e}"))?;
    Ok(ItemRow {
        item: crate::Item {
            id,
            kind,
            properties: crate::Properties::stored(text)?,
            version,
            created_by,
            created_at,
            modified_at,
            body,
            acl,
        },
        stamp,
    })
}

/// Rows written as JSON by earlier versions. Read without
/// `#[serde(flatten)]`, which buffers the whole row into an intermediate
/// tree and reads it again. The same fields, read once.
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
                properties: crate::Properties::stored(f.properties)
                    .map_err(serde::de::Error::custom)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Item, Properties};

    fn row(value: Vec<u8>) -> Row {
        Row {
            clustering: ITEM_ROW.to_vec(),
            value,
            version: 1,
        }
    }

    fn item(body: Option<BodyMeta>) -> Item {
        let properties: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"title":"ünï \"q\" 🙂","n":[1,2.5,null],"deep":{"a":{"b":"\u0000"}}}"#,
        )
        .unwrap();
        Item {
            id: "-DggAtqRoDxomiS76TlepA".into(),
            kind: "doc".into(),
            properties: Properties::new(properties),
            version: u64::MAX,
            created_by: "alice".into(),
            created_at: -1,
            modified_at: 1_795_424_186_089_284,
            body,
            acl: vec![
                Grant {
                    principal: Principal::User("alice".into()),
                    role: Role::Manager,
                },
                Grant {
                    principal: Principal::Group("g.1".into()),
                    role: Role::Editor,
                },
                Grant {
                    principal: Principal::Authenticated,
                    role: Role::Viewer,
                },
                Grant {
                    principal: Principal::Everyone,
                    role: Role::Viewer,
                },
            ],
        }
    }

    fn body() -> BodyMeta {
        BodyMeta {
            size: 300_000,
            content_type: "text/plain; charset=utf-8".into(),
            sha256: "ab".repeat(32),
            blob: "blob-1".into(),
            chunk: 262_144,
            words: vec![("tea".into(), 7), ("grün".into(), 1)],
            word_count: 812,
        }
    }

    /// Everything an item row holds, as JSON, to compare two decodes.
    fn seen(r: &ItemRow) -> String {
        format!("{} {}", serde_json::to_string(&r.item).unwrap(), r.stamp)
    }

    #[test]
    fn item_rows_round_trip() {
        for body in [None, Some(body())] {
            let i = item(body);
            let back = ItemRow::decode(&row(encode_item(&i, 1 << 40))).unwrap();
            let want = ItemRow {
                item: i,
                stamp: 1 << 40,
            };
            assert_eq!(seen(&back), seen(&want));
            assert_eq!(back.item.body, want.item.body);
            assert_eq!(back.item.acl, want.item.acl);
            // The properties come back as the text written, untouched.
            assert_eq!(back.item.properties.text(), want.item.properties.text());
        }
    }

    #[test]
    fn item_rows_written_as_json_still_read() {
        let i = item(Some(body()));
        let mut json = serde_json::to_value(&i).unwrap();
        json["stamp"] = 9.into();
        let old = ItemRow::decode(&row(serde_json::to_vec(&json).unwrap())).unwrap();
        let new = ItemRow::decode(&row(encode_item(&i, 9))).unwrap();
        assert_eq!(seen(&old), seen(&new));
    }

    #[test]
    fn damaged_item_rows_are_refused_not_misread() {
        let whole = encode_item(&item(Some(body())), 3);
        // Cut anywhere before the properties, or inside them: an error.
        for n in 0..whole.len() {
            let cut = ItemRow::decode(&row(whole[..n].to_vec()));
            assert!(cut.is_err(), "{n} of {} bytes read", whole.len());
        }
        // A principal tag, role or body tag out of range: an error.
        let i = item(None);
        // Format, id, kind, version (u64::MAX: 10 bytes), creator, times,
        // stamp, grant count: then the first principal's tag.
        let tag =
            1 + (1 + i.id.len()) + (1 + i.kind.len()) + 10 + (1 + i.created_by.len()) + 16 + 1 + 1;
        let good = encode_item(&i, 3);
        assert_eq!(good[tag], 0, "the first grant is a user's");
        let name = 1 + "alice".len();
        for (at, value) in [(tag, 4), (tag + 1 + name, 3)] {
            let mut bad = good.clone();
            bad[at] = value;
            assert!(ItemRow::decode(&row(bad)).is_err(), "{at} = {value}");
        }
        // A length or count beyond the row allocates nothing and fails:
        // the id's length, the grant count, the body's word count.
        let mut huge = vec![ITEM_BINARY];
        put_uint(&mut huge, u64::MAX);
        assert!(ItemRow::decode(&row(huge)).is_err());
        let header = good[..tag - 1].to_vec();
        let mut grants = header.clone();
        put_uint(&mut grants, u64::MAX);
        assert!(ItemRow::decode(&row(grants)).is_err());
        // No grants, a body: size, type, hash, blob, chunk, word count,
        // then the number of words.
        let mut words = header;
        put_uint(&mut words, 0);
        words.push(1);
        put_uint(&mut words, 1);
        for s in ["text/plain", "ab", "blob"] {
            put_str(&mut words, s);
        }
        put_uint(&mut words, 4);
        put_uint(&mut words, 10);
        put_uint(&mut words, u64::MAX);
        assert!(ItemRow::decode(&row(words)).is_err());
        // Integers longer than 64 bits, and bodies of 0-byte chunks.
        // (The version, u64::MAX, ends in 0x01; 0x03 would be bit 64.)
        let mut long = good.clone();
        let last = 1 + (1 + i.id.len()) + (1 + i.kind.len()) + 9;
        assert_eq!(long[last], 0x01);
        long[last] = 0x03;
        assert!(ItemRow::decode(&row(long)).is_err());
        let mut zero = body();
        zero.chunk = 0;
        let zero = encode_item(&item(Some(zero)), 3);
        assert!(ItemRow::decode(&row(zero)).is_err());
        // Properties that are not an object, and ones that do not read as
        // a tree: refused at once, and by a write, respectively.
        let mut list = good.clone();
        let props = list.len() - i.properties.text().len();
        list.truncate(props);
        list.extend_from_slice(b"[1]");
        assert!(ItemRow::decode(&row(list)).is_err());
        let mut huge_number = good[..props].to_vec();
        huge_number.extend_from_slice(br#"{"a":1e999}"#);
        assert!(ItemRow::decode(&row(huge_number.clone())).is_ok());
        assert!(ItemRow::decode_checked(&row(huge_number)).is_err());
    }
}
