//! The domain: principals, roles, grants, users, groups, items.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::{EngineError, Result};

/// Whether `s` is a valid username, group id, kind, or index name:
/// `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn is_valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

pub(crate) fn check_name(what: &str, s: &str) -> Result<()> {
    if is_valid_name(s) {
        Ok(())
    } else {
        Err(EngineError::InvalidInput(format!(
            "{what} {s:?} is not valid: use 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit"
        )))
    }
}

/// [`check_name`] for a new user's name or group's id, which may not be
/// the name of a built-in principal either: a user `everyone` would show
/// as `createdBy: "everyone"`, a member `user:everyone` beside `everyone`.
pub(crate) fn check_new_name(what: &str, s: &str) -> Result<()> {
    check_name(what, s)?;
    if s == "everyone" || s == "authenticated" {
        return Err(EngineError::InvalidInput(format!(
            "{what} {s:?} is taken by the built-in principal {s}"
        )));
    }
    Ok(())
}

/// Who can be granted access: a user, a group, any signed-in user, anyone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Principal {
    /// `user:<username>`.
    User(String),
    /// `group:<id>`.
    Group(String),
    /// `authenticated`: every signed-in user.
    Authenticated,
    /// `everyone`: anyone, signed in or not.
    Everyone,
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::User(u) => {
                f.write_str("user:")?;
                f.write_str(u)
            }
            Principal::Group(g) => {
                f.write_str("group:")?;
                f.write_str(g)
            }
            Principal::Authenticated => f.write_str("authenticated"),
            Principal::Everyone => f.write_str("everyone"),
        }
    }
}

impl FromStr for Principal {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Principal> {
        let p = match s.split_once(':') {
            Some(("user", name)) => Principal::User(name.to_string()),
            Some(("group", id)) => Principal::Group(id.to_string()),
            None if s == "authenticated" => Principal::Authenticated,
            None if s == "everyone" => Principal::Everyone,
            _ => {
                return Err(EngineError::InvalidInput(format!(
                    "principal {s:?} is not user:<name>, group:<id>, authenticated or everyone"
                )))
            }
        };
        if let Principal::User(n) | Principal::Group(n) = &p {
            check_name("principal name", n)?;
        }
        Ok(p)
    }
}

// Principals are in every stored item's ACL and every listed item: written
// and read as plain strings, without the formatting machinery (and read
// without a temporary `String`).
impl Serialize for Principal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let named = |prefix: &str, name: &str| {
            let mut out = String::with_capacity(prefix.len() + name.len());
            out.push_str(prefix);
            out.push_str(name);
            out
        };
        match self {
            Principal::User(u) => s.serialize_str(&named("user:", u)),
            Principal::Group(g) => s.serialize_str(&named("group:", g)),
            Principal::Authenticated => s.serialize_str("authenticated"),
            Principal::Everyone => s.serialize_str("everyone"),
        }
    }
}

impl<'de> Deserialize<'de> for Principal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Principal, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Principal;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a principal: user:<name>, group:<id>, authenticated or everyone")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Principal, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Text)
    }
}

/// What a grant allows, each role including the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read.
    Viewer,
    /// Read, change properties and body.
    Editor,
    /// Everything, sharing and deleting included.
    Manager,
}

impl Role {
    /// The role's name as in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Manager => "manager",
        }
    }
}

/// One entry of an item's ACL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Who.
    pub principal: Principal,
    /// What they may do.
    pub role: Role,
}

/// A user as stored (the password hash never leaves the engine).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// Immutable, unique name.
    pub username: String,
    /// Free JSON object.
    pub properties: Map<String, Value>,
    /// Whether the user is an administrator.
    pub admin: bool,
    /// Microseconds since the Unix epoch.
    pub created_at: i64,
    #[serde(default)]
    pub(crate) password_hash: String,
}

/// A group as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// Immutable, unique id.
    pub id: String,
    /// Display title.
    pub title: String,
    /// Free JSON object.
    pub properties: Map<String, Value>,
    /// Who may change the group's members and managers; never empty.
    pub managers: Vec<Principal>,
    /// Microseconds since the Unix epoch.
    pub created_at: i64,
    /// Username of the creator.
    pub created_by: String,
}

/// The body of an item: its bytes live in chunks under `blob`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BodyMeta {
    /// Size in bytes.
    pub size: u64,
    /// The `Content-Type` given at upload.
    pub content_type: String,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
    /// Where the chunks are (internal, never shown).
    pub(crate) blob: String,
    /// Chunk size the blob was written with.
    pub(crate) chunk: u32,
    /// A textual body's most used words (folded, not stemmed) with their
    /// counts, for text indexes on `$body` (internal, never shown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) words: Vec<(String, u32)>,
    /// How many words the indexed part of the body has.
    #[serde(default)]
    pub(crate) word_count: u32,
}

/// An item's properties, a JSON object, held as the text it is stored as,
/// as a tree, or both; each made from the other on first use. A listing
/// decodes the stored text and writes it into the response without
/// building the tree; index rows and merge patches use the tree.
///
/// Serialised, stored text is written as it is through serde_json's raw
/// values: only serde_json serialises these (rows, feed entries, exports,
/// responses). Equality compares the trees.
#[derive(Clone)]
pub struct Properties {
    text: OnceLock<Box<RawValue>>,
    map: OnceLock<Map<String, Value>>,
}

impl Properties {
    /// The properties of a JSON object.
    pub fn new(map: Map<String, Value>) -> Properties {
        Properties {
            text: OnceLock::new(),
            map: map.into(),
        }
    }

    /// Properties as stored: the text of an object the server wrote.
    /// Anything but an object is refused; whether every value in it reads
    /// as a tree is checked when a write needs the tree ([`Properties::check`]).
    pub(crate) fn stored(text: Box<RawValue>) -> std::result::Result<Properties, String> {
        if !text.get().starts_with('{') {
            return Err("properties are not an object".into());
        }
        Ok(Properties {
            text: text.into(),
            map: OnceLock::new(),
        })
    }

    /// Builds the tree now, refusing stored text that does not read as
    /// one (a number beyond `f64`, in a damaged row). Every write that
    /// computes from the properties calls this first, so a damaged item is
    /// refused rather than rewritten from an empty object.
    pub(crate) fn check(&self) -> Result<()> {
        if self.map.get().is_some() {
            return Ok(());
        }
        let text = self.text.get().expect("one of the two is always set");
        let map = serde_json::from_str(text.get())
            .map_err(|e| crate::error::corrupt("item properties", e))?;
        let _ = self.map.set(map);
        Ok(())
    }

    /// The object. Writes call [`Properties::check`] before reading it.
    pub fn map(&self) -> &Map<String, Value> {
        self.map.get_or_init(|| {
            let text = self.text.get().expect("one of the two is always set");
            serde_json::from_str(text.get()).unwrap_or_else(|e| {
                // Only a read that skipped `check` gets here; it shows an
                // empty object and says why.
                tracing::error!(error = %e, "stored properties do not read as an object");
                Map::new()
            })
        })
    }

    /// The object as compact JSON text.
    pub fn text(&self) -> &str {
        self.text
            .get_or_init(|| {
                serde_json::value::to_raw_value(self.map()).expect("a JSON object serialises")
            })
            .get()
    }
}

impl Default for Properties {
    fn default() -> Properties {
        Properties::new(Map::new())
    }
}

impl PartialEq for Properties {
    fn eq(&self, other: &Properties) -> bool {
        self.map() == other.map()
    }
}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

impl Serialize for Properties {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.text.get() {
            Some(text) => text.serialize(s),
            None => self.map().serialize(s),
        }
    }
}

/// Read as a tree: properties inside a tagged or flattened record (feed
/// entries, export records) reach here through serde's buffer, which cannot
/// hand out raw text. The item row, the hot path, reads the text
/// ([`Properties::stored`]).
impl<'de> Deserialize<'de> for Properties {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Properties, D::Error> {
        Map::deserialize(d).map(Properties::new)
    }
}

/// An item as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    /// Server-made, opaque, URL-safe, never reused.
    pub id: String,
    /// What sort of item (`document`, `user-home`, ...).
    pub kind: String,
    /// Free JSON object.
    pub properties: Properties,
    /// 1 at creation, +1 on every change.
    pub version: u64,
    /// Username of the creator.
    pub created_by: String,
    /// Microseconds since the Unix epoch.
    pub created_at: i64,
    /// Microseconds since the Unix epoch.
    pub modified_at: i64,
    /// The body, if any.
    pub body: Option<BodyMeta>,
    /// Who may do what; always holds a manager.
    pub acl: Vec<Grant>,
}

impl Item {
    /// The value of a field: a built-in (`createdAt`, `modifiedAt`,
    /// `createdBy`, `kind`) or a dot path into the properties.
    pub fn field(&self, field: &str) -> Option<Value> {
        match field {
            "createdAt" => Some(Value::from(self.created_at)),
            "modifiedAt" => Some(Value::from(self.modified_at)),
            "createdBy" => Some(Value::from(self.created_by.clone())),
            "kind" => Some(Value::from(self.kind.clone())),
            path => {
                let mut parts = path.split('.');
                let mut cur = self.properties.map().get(parts.next()?)?;
                for p in parts {
                    cur = cur.as_object()?.get(p)?;
                }
                Some(cur.clone())
            }
        }
    }

    /// The best role any of `principals` holds through the ACL.
    pub fn role_of(&self, principals: &[Principal]) -> Option<Role> {
        self.acl
            .iter()
            .filter(|g| principals.contains(&g.principal))
            .map(|g| g.role)
            .max()
    }

    /// Every principal that may read the item, once each.
    pub fn readers(&self) -> Vec<&Principal> {
        let mut out: Vec<&Principal> = self.acl.iter().map(|g| &g.principal).collect();
        out.sort();
        out.dedup();
        out
    }
}

/// An item as one caller sees it.
#[derive(Clone, Debug)]
pub struct ItemView {
    /// The item.
    pub item: Item,
    /// The caller's effective role.
    pub role: Role,
}

/// Normalises an ACL: one grant per principal with its best role, sorted.
pub(crate) fn normalise_acl(acl: Vec<Grant>) -> Vec<Grant> {
    let mut acl = acl;
    acl.sort_by(|a, b| a.principal.cmp(&b.principal).then(b.role.cmp(&a.role)));
    acl.dedup_by(|later, first| later.principal == first.principal);
    acl
}

/// Applies an RFC 7396 JSON merge patch to `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// `properties` with an RFC 7396 merge `patch` applied (a patch of an
/// object by an object is an object).
pub(crate) fn merged(
    properties: &Map<String, Value>,
    patch: &Map<String, Value>,
) -> Map<String, Value> {
    let mut target = Value::Object(properties.clone());
    merge_patch(&mut target, &Value::Object(patch.clone()));
    match target {
        Value::Object(m) => m,
        _ => unreachable!("an object patched by an object stays an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        for ok in ["a", "0", "alice", "a.b_c-d", &"x".repeat(64)] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in ["", "A", "-a", ".a", "a b", "é", &"x".repeat(65), "a/b"] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn principals_round_trip() {
        for s in ["user:alice", "group:g1", "authenticated", "everyone"] {
            assert_eq!(s.parse::<Principal>().unwrap().to_string(), s);
        }
        for bad in ["alice", "user:", "user:A", "team:x", "everyone:x"] {
            assert!(bad.parse::<Principal>().is_err(), "{bad}");
        }
    }

    fn stored(text: &str) -> Properties {
        Properties::stored(serde_json::from_str(text).unwrap()).unwrap()
    }

    #[test]
    fn stored_properties_pass_through_and_read_as_a_tree() {
        // Escapes, non-ASCII and nesting come out byte for byte as stored.
        let text = r#"{"a":{"b":[1,2.5,null]},"q":"say \"hi\" \u0000","t":"ünï 🙂"}"#;
        let p = stored(text);
        assert_eq!(serde_json::to_string(&p).unwrap(), text);
        assert_eq!(p.map()["a"]["b"][1], json!(2.5));
        assert_eq!(p.map()["q"], json!("say \"hi\" \u{0}"));
        // Made from a tree, the text is the tree's.
        let made = Properties::new(p.map().clone());
        assert_eq!(made, p);
        assert_eq!(made.text(), text);
        assert_ne!(made, stored(r#"{"a":1}"#));
        // Equal trees are equal properties, whatever the text's key order.
        assert_eq!(stored(r#"{"x":1,"y":2}"#), stored(r#"{ "y": 2, "x": 1 }"#));
        assert_eq!(p.map()["t"], json!("ünï 🙂"));
        assert!(p.check().is_ok());
    }

    #[test]
    fn properties_read_inside_tagged_records() {
        // Serde buffers a tagged or flattened record before reading its
        // fields, and a buffer cannot give raw text: the tree is read.
        #[derive(Serialize, Deserialize)]
        #[serde(tag = "t")]
        enum Tagged {
            Item { properties: Properties },
        }
        let Tagged::Item { properties } =
            serde_json::from_str(r#"{"t":"Item","properties":{"k":[true]}}"#).unwrap();
        assert_eq!(properties.map()["k"], json!([true]));
        assert_eq!(properties.text(), r#"{"k":[true]}"#);
        let back = serde_json::to_string(&Tagged::Item { properties }).unwrap();
        assert_eq!(back, r#"{"t":"Item","properties":{"k":[true]}}"#);
        assert!(serde_json::from_str::<Tagged>(r#"{"t":"Item","properties":[1]}"#).is_err());
    }

    #[test]
    fn damaged_stored_properties_are_refused() {
        for not_an_object in ["[1,2]", "1", "\"{}\"", "null"] {
            let text = serde_json::from_str(not_an_object).unwrap();
            assert!(Properties::stored(text).is_err(), "{not_an_object}");
        }
        // Valid JSON that does not read as a tree: a write refuses it.
        let p = stored(r#"{"a":1e999}"#);
        assert!(p.check().is_err());
        assert_eq!(p.text(), r#"{"a":1e999}"#);
    }

    #[test]
    fn merge_patch_rfc7396_examples() {
        // The examples of RFC 7396, appendix A.
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (mut target, patch, want) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, want);
        }
    }

    #[test]
    fn acl_keeps_best_role_per_principal() {
        let g = |p: &str, r| Grant {
            principal: p.parse().unwrap(),
            role: r,
        };
        let acl = normalise_acl(vec![
            g("user:b", Role::Viewer),
            g("user:a", Role::Viewer),
            g("user:b", Role::Manager),
            g("everyone", Role::Viewer),
        ]);
        assert_eq!(
            acl,
            vec![
                g("user:a", Role::Viewer),
                g("user:b", Role::Manager),
                g("everyone", Role::Viewer)
            ]
        );
    }
}
