//! The JSON of api.md: every request and response body as a Rust type. The
//! same types parse requests, render responses and, through `ToSchema`,
//! make the OpenAPI document, so a field added here is documented at once.
//!
//! Responses borrow from the engine's values: rendering an item or a page
//! of them copies nothing but numbers.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{json, Map, Value};
use tarn_engine::Principal;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{KnownFormat, Ref, RefOr, SchemaFormat};
use utoipa::{PartialSchema, ToSchema};

/// Usernames, group ids, kinds and index names.
pub const NAME: &str = "^[a-z0-9][a-z0-9._-]{0,63}$";
/// `user:<name>`, `group:<id>`, `authenticated` or `everyone`.
pub const PRINCIPAL: &str =
    "^(user:[a-z0-9][a-z0-9._-]{0,63}|group:[a-z0-9][a-z0-9._-]{0,63}|authenticated|everyone)$";
/// Most grants an ACL sent in a request holds (the engine's bound; a
/// creator's own grant is added to a new item's).
pub const MAX_GRANTS: usize = 256;
/// `user:<name>` or `group:<id>`: who may be a member or manager of a group.
pub const MEMBER: &str = "^(user:[a-z0-9][a-z0-9._-]{0,63}|group:[a-z0-9][a-z0-9._-]{0,63})$";
/// Cursors: unpadded base64url, as the server makes them (the last
/// character carries no stray bits), of at most [`CURSOR_CHARS`].
pub const CURSOR: &str =
    "^([A-Za-z0-9_-]{4})*([A-Za-z0-9_-][AQgw]|[A-Za-z0-9_-]{2}[AEIMQUYcgkosw048])?$";
/// The longest cursor: a listing's, whose place is a clustering key (at
/// most `tarn_store::MAX_KEY_LEN` bytes) after 18 bytes of version,
/// direction and listing, sealed with 4 more: 4,118 bytes in base64url.
pub const CURSOR_CHARS: usize = (18 + tarn_store::MAX_KEY_LEN + 4) * 4 / 3 + 1;
/// Index names as read: declared names, or a built-in's (`_kind`, ...).
pub const INDEX_NAME: &str = "^(_[a-z_]{1,63}|[a-z0-9][a-z0-9._-]{0,63})$";
/// A field an index names: `createdAt`, `modifiedAt`, `createdBy` or a dot
/// path into `properties` (no empty segment).
pub const FIELD: &str = "^[^.]+(\\.[^.]+)*$";
/// Item ids and link keys: server-made, URL-safe.
pub const TOKEN: &str = "^[A-Za-z0-9_-]{1,64}$";

/// Keywords utoipa's model has no field for (JSON Schema's `not` and
/// `contains`, a header's `required`), carried in its extension map, which
/// is flattened into the object it belongs to.
pub fn keywords<const N: usize>(pairs: [(&str, Value); N]) -> Extensions {
    Extensions::from_iter(pairs)
}

/// A string schema with a pattern and a length bound.
fn string_schema(pattern: &str, max_length: Option<usize>, description: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
        .max_length(max_length)
        .description(Some(description))
        .into()
}

/// The schema of usernames, group ids, kinds and index names ([`NAME`]);
/// fields of that shape name it with `value_type = Name`.
pub struct Name;

impl PartialSchema for Name {
    fn schema() -> RefOr<Schema> {
        string_schema(
            NAME,
            None,
            "A username, group id, kind or index name: 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit",
        )
    }
}

impl ToSchema for Name {}

/// The schema of item ids and link keys ([`TOKEN`]).
pub struct Id;

impl PartialSchema for Id {
    fn schema() -> RefOr<Schema> {
        string_schema(TOKEN, None, "Server-made, opaque, URL-safe")
    }
}

impl ToSchema for Id {}

/// The schema of group members and managers ([`MEMBER`]).
pub struct MemberName;

impl PartialSchema for MemberName {
    fn schema() -> RefOr<Schema> {
        string_schema(
            MEMBER,
            None,
            "A member or manager of a group: user:<name> or group:<id>",
        )
    }
}

impl ToSchema for MemberName {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Member")
    }
}

/// The schema of index names as read ([`INDEX_NAME`]): a declared name or
/// a built-in's.
pub struct IndexName;

impl PartialSchema for IndexName {
    fn schema() -> RefOr<Schema> {
        string_schema(
            INDEX_NAME,
            None,
            "A declared index's name, or a built-in's (_kind, _mine, _mine_kind, _shared)",
        )
    }
}

impl ToSchema for IndexName {}

/// The schema of raw bytes (item bodies).
pub struct Bytes;

impl PartialSchema for Bytes {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .description(Some("Raw bytes"))
            .into()
    }
}

impl ToSchema for Bytes {}

/// The schema of cursors ([`CURSOR`]) as the server gives them.
pub struct Cursor;

impl PartialSchema for Cursor {
    fn schema() -> RefOr<Schema> {
        let RefOr::T(Schema::Object(mut cursor)) = string_schema(
            CURSOR,
            Some(CURSOR_CHARS),
            "Opaque: the `next` of the previous page",
        ) else {
            unreachable!("an object schema")
        };
        cursor.min_length = Some(1);
        RefOr::T(Schema::Object(cursor))
    }
}

/// The schema of a cursor a client gives back ([`CURSOR`]): empty, it is
/// read as none (the first page, or the feed's current end).
pub struct GivenCursor;

impl PartialSchema for GivenCursor {
    fn schema() -> RefOr<Schema> {
        string_schema(
            CURSOR,
            Some(CURSOR_CHARS),
            "Opaque: the `next` of the previous page; empty is the same as none",
        )
    }
}

impl ToSchema for GivenCursor {}

impl ToSchema for Cursor {}

/// The schema of principals ([`PRINCIPAL`]).
pub struct PrincipalName;

impl PartialSchema for PrincipalName {
    fn schema() -> RefOr<Schema> {
        string_schema(
            PRINCIPAL,
            None,
            "Who may be granted access: user:<name>, group:<id>, authenticated (every signed-in user) or everyone",
        )
    }
}

impl ToSchema for PrincipalName {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Principal")
    }
}

/// The schema of the fields an index names ([`FIELD`], at most 256 bytes,
/// never `kind`).
pub struct FieldName;

impl PartialSchema for FieldName {
    fn schema() -> RefOr<Schema> {
        let RefOr::T(Schema::Object(mut field)) = string_schema(
            FIELD,
            Some(256),
            "createdAt, modifiedAt, createdBy, or a dot path into properties (kind is implied by the index's kind)",
        ) else {
            unreachable!("an object schema")
        };
        field.extensions = Some(keywords([("not", json!({"const": "kind"}))]));
        RefOr::T(Schema::Object(field))
    }
}

impl ToSchema for FieldName {}

/// A time, rendered as RFC 3339 UTC with microseconds, without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Time(pub i64);

impl Time {
    /// `YYYY-MM-DDTHH:MM:SS.ffffffZ`, digits written by hand: the
    /// formatting machinery took a sixth of a 25-item listing's
    /// instructions (callgrind, scripts/profile-read.sh), and the date is
    /// computed from the day number directly (H. Hinnant's
    /// `civil_from_days`). Times outside the years 0–9999 (never written by
    /// the server) read as the epoch.
    fn rfc3339(&self) -> [u8; 27] {
        /// 0000-01-01T00:00:00Z and the last microsecond of 9999.
        const FIRST: i64 = -62_167_219_200_000_000;
        const LAST: i64 = 253_402_300_799_999_999;
        let micros = if (FIRST..=LAST).contains(&self.0) {
            self.0
        } else {
            0
        };
        let secs = micros.div_euclid(1_000_000);
        let day_secs = secs.rem_euclid(86_400);
        let z = secs.div_euclid(86_400) + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        fn put(out: &mut [u8], mut v: i64) {
            for d in out.iter_mut().rev() {
                *d = b'0' + (v % 10) as u8;
                v /= 10;
            }
        }
        let mut b = *b"0000-00-00T00:00:00.000000Z";
        put(&mut b[0..4], year);
        put(&mut b[5..7], month);
        put(&mut b[8..10], day);
        put(&mut b[11..13], day_secs / 3600);
        put(&mut b[14..16], day_secs % 3600 / 60);
        put(&mut b[17..19], day_secs % 60);
        put(&mut b[20..26], micros.rem_euclid(1_000_000));
        b
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.rfc3339();
        f.write_str(std::str::from_utf8(&b).expect("ASCII digits"))
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.rfc3339();
        s.serialize_str(std::str::from_utf8(&b).expect("ASCII digits"))
    }
}

/// What a grant or link allows, each role including the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read.
    Viewer,
    /// Read, change properties and body.
    Editor,
    /// Everything, sharing and deleting included.
    Manager,
}

impl From<tarn_engine::Role> for Role {
    fn from(r: tarn_engine::Role) -> Role {
        match r {
            tarn_engine::Role::Viewer => Role::Viewer,
            tarn_engine::Role::Editor => Role::Editor,
            tarn_engine::Role::Manager => Role::Manager,
        }
    }
}

impl From<Role> for tarn_engine::Role {
    fn from(r: Role) -> tarn_engine::Role {
        match r {
            Role::Viewer => tarn_engine::Role::Viewer,
            Role::Editor => tarn_engine::Role::Editor,
            Role::Manager => tarn_engine::Role::Manager,
        }
    }
}

/// One entry of an ACL.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Who.
    #[schema(value_type = PrincipalName)]
    pub principal: Principal,
    /// What they may do.
    pub role: Role,
}

impl From<Grant> for tarn_engine::Grant {
    fn from(g: Grant) -> tarn_engine::Grant {
        tarn_engine::Grant {
            principal: g.principal,
            role: g.role.into(),
        }
    }
}

/// The ACL of an item as its managers see it.
fn acl_of(acl: &[tarn_engine::Grant]) -> Vec<Grant> {
    acl.iter()
        .map(|g| Grant {
            principal: g.principal.clone(),
            role: g.role.into(),
        })
        .collect()
}

// ---------------------------------------------------------------- users

/// An optional field given as `null`: read as if it were left out.
fn null_as_absent<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A sign-up (or, by an administrator, a new user).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// Immutable and unique.
    #[schema(value_type = Name)]
    pub username: String,
    /// At least 8 characters, at most 1024 bytes.
    #[schema(min_length = 8, max_length = 1024)]
    pub password: String,
    /// A free JSON object (at most 64 KiB by default).
    #[serde(default, deserialize_with = "null_as_absent")]
    #[schema(value_type = Object, nullable = true)]
    pub properties: Map<String, Value>,
    /// Make an administrator (administrators only).
    #[serde(default)]
    pub admin: bool,
}

/// A sign-in.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// The username.
    pub username: String,
    /// The password.
    pub password: String,
}

/// A new password: set by an administrator, or by the user, who gives
/// their current one.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewPassword {
    /// At least 8 characters, at most 1024 bytes.
    #[schema(min_length = 8, max_length = 1024)]
    pub password: String,
    /// The user's password now, when they change their own: checked (and
    /// slowed after failures) as a sign-in's; a wrong one is `403`.
    /// Administrators setting another user's password leave it out.
    #[schema(max_length = 1024)]
    pub current_password: Option<String>,
}

/// A user, as the user and administrators see it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct User<'a> {
    /// Immutable and unique.
    #[schema(value_type = Name)]
    pub username: &'a str,
    /// A free JSON object.
    #[schema(value_type = Object)]
    pub properties: &'a Map<String, Value>,
    /// Whether the user is an administrator.
    pub admin: bool,
    /// When the user was created.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Time,
}

impl<'a> From<&'a tarn_engine::User> for User<'a> {
    fn from(u: &'a tarn_engine::User) -> User<'a> {
        User {
            username: &u.username,
            properties: &u.properties,
            admin: u.admin,
            created_at: Time(u.created_at),
        }
    }
}

/// What any caller may see of a user.
#[derive(Serialize, ToSchema)]
pub struct PublicUser<'a> {
    /// Immutable and unique.
    #[schema(value_type = Name)]
    pub username: &'a str,
    /// A free JSON object.
    #[schema(value_type = Object)]
    pub properties: &'a Map<String, Value>,
}

/// A new session.
#[derive(Serialize, ToSchema)]
pub struct Session<'a> {
    /// Present it as `Authorization: Bearer <token>`.
    pub token: &'a str,
    /// Who signed in.
    pub user: User<'a>,
}

/// The caller and every group they belong to.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Me<'a> {
    /// Immutable and unique.
    #[schema(value_type = Name)]
    pub username: &'a str,
    /// A free JSON object.
    #[schema(value_type = Object)]
    pub properties: &'a Map<String, Value>,
    /// Whether the caller is an administrator.
    pub admin: bool,
    /// When the user was created.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Time,
    /// Every group the caller belongs to, directly or through nesting.
    pub groups: &'a [String],
}

/// A change of a user's properties.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserPatch {
    /// An RFC 7396 JSON merge patch of the properties: `null` removes a key.
    #[schema(value_type = Object)]
    pub properties: Map<String, Value>,
}

// ---------------------------------------------------------------- groups

/// A new group.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewGroup {
    /// Immutable and unique.
    #[schema(value_type = Name)]
    pub id: String,
    /// A display title, at most 1024 bytes.
    #[schema(max_length = 1024)]
    pub title: Option<String>,
    /// A free JSON object.
    #[serde(default, deserialize_with = "null_as_absent")]
    #[schema(value_type = Object, nullable = true)]
    pub properties: Map<String, Value>,
}

/// A change of a group: what it names changes, the rest stays.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupPatch {
    /// A new display title, at most 1024 bytes of UTF-8 (`""` clears it;
    /// `null`, like leaving it out, keeps the title).
    #[schema(max_length = 1024, nullable = true)]
    pub title: Option<String>,
    /// An RFC 7396 JSON merge patch of the properties: `null` removes a key.
    /// The field itself `null`, like leaving it out, keeps them all.
    #[serde(default)]
    #[schema(value_type = Object, nullable = true)]
    pub properties: Option<Map<String, Value>>,
}

/// A group.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Group<'a> {
    /// Immutable and unique.
    #[schema(value_type = Name)]
    pub id: &'a str,
    /// A display title.
    pub title: &'a str,
    /// A free JSON object.
    #[schema(value_type = Object)]
    pub properties: &'a Map<String, Value>,
    /// Who may change its members and managers.
    #[schema(value_type = Vec<MemberName>)]
    pub managers: &'a [Principal],
    /// When the group was created.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Time,
}

impl<'a> From<&'a tarn_engine::Group> for Group<'a> {
    fn from(g: &'a tarn_engine::Group) -> Group<'a> {
        Group {
            id: &g.id,
            title: &g.title,
            properties: &g.properties,
            managers: &g.managers,
            created_at: Time(g.created_at),
        }
    }
}

/// A page of a group's direct members, in principal order.
#[derive(Serialize, ToSchema)]
pub struct MemberPage<'a> {
    /// Members: `user:<name>` or `group:<id>`.
    #[schema(value_type = Vec<MemberName>)]
    pub members: &'a [Principal],
    /// The cursor of the next page; `null` at the end.
    #[schema(required = true)]
    pub next: Option<&'a str>,
}

// ---------------------------------------------------------------- items

/// A new item.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewItem {
    /// What sort of item.
    #[schema(value_type = Name)]
    pub kind: String,
    /// A free JSON object (at most 64 KiB by default).
    #[serde(default, deserialize_with = "null_as_absent")]
    #[schema(value_type = Object, nullable = true)]
    pub properties: Map<String, Value>,
    /// Grants besides the creator's, who is always a manager.
    /// `everyone` and `authenticated` may be viewers or editors, never
    /// managers.
    #[serde(default, deserialize_with = "null_as_absent")]
    #[schema(max_items = 256, nullable = true)]
    pub acl: Vec<Grant>,
}

/// A change of an item's properties.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemPatch {
    /// An RFC 7396 JSON merge patch of the properties: `null` removes a key.
    #[schema(value_type = Object)]
    pub properties: Map<String, Value>,
}

/// A new ACL.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Acl {
    /// The grants; at least one is a manager's, and `everyone` and
    /// `authenticated` are never managers.
    #[schema(schema_with = acl_with_a_manager)]
    pub acl: Vec<Grant>,
}

/// An ACL of at most 256 grants, one of them a manager's.
fn acl_with_a_manager() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(Ref::from_schema_name("Grant"))
        .min_items(Some(1))
        .max_items(Some(MAX_GRANTS))
        .description(Some(
            "The grants; at least one gives manager, and never to everyone or authenticated",
        ))
        .extensions(Some(keywords([(
            "contains",
            json!({"type": "object", "required": ["role"], "properties": {"role": {"const": "manager"}}}),
        )])))
}

/// A new link.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewLink {
    /// What the link gives: viewer or editor, never manager.
    pub role: LinkRole,
}

/// What a link may give.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LinkRole {
    /// Read.
    Viewer,
    /// Read, change properties and body.
    Editor,
}

impl From<LinkRole> for tarn_engine::Role {
    fn from(r: LinkRole) -> tarn_engine::Role {
        match r {
            LinkRole::Viewer => tarn_engine::Role::Viewer,
            LinkRole::Editor => tarn_engine::Role::Editor,
        }
    }
}

/// A link key, shown once.
#[derive(Serialize, ToSchema)]
pub struct Link<'a> {
    /// Present it as `?key=` or `Tarn-Link-Key`.
    pub key: &'a str,
    /// What it gives.
    pub role: LinkRole,
    /// The link's id, as `listLinks` gives it (the hex SHA-256 of `key`).
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub id: String,
}

/// A link as its item's managers see it: never its key.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkEntry<'a> {
    /// Names the link to revoke it (`DELETE .../links/{id}`): the hex
    /// SHA-256 of its key, which does not open the item.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub id: &'a str,
    /// What it gives.
    pub role: LinkRole,
    /// When it was made; `null` for a link made before links kept their
    /// time.
    #[schema(value_type = Option<String>, format = DateTime, required = true)]
    pub created_at: Option<Time>,
}

/// An item's links, the newest first, in one answer: an item holds at most
/// a hundred (those made at once before 2026-11-28 could pass that; up to
/// a thousand are listed).
#[derive(Serialize, ToSchema)]
pub struct Links<'a> {
    /// The links.
    pub links: Vec<LinkEntry<'a>>,
}

impl<'a> From<&'a [tarn_engine::LinkInfo]> for Links<'a> {
    fn from(links: &'a [tarn_engine::LinkInfo]) -> Links<'a> {
        let links = links
            .iter()
            .map(|l| LinkEntry {
                id: &l.id,
                // The engine reads a link row giving manager as corrupt.
                role: match l.role {
                    tarn_engine::Role::Editor => LinkRole::Editor,
                    tarn_engine::Role::Viewer | tarn_engine::Role::Manager => LinkRole::Viewer,
                },
                created_at: l.created_at.map(Time),
            })
            .collect();
        Links { links }
    }
}

/// An item's body, as its item describes it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Body<'a> {
    /// Size in bytes.
    pub size: u64,
    /// The `Content-Type` it was uploaded with.
    pub content_type: &'a str,
    /// Lower-case hex SHA-256 of the bytes.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub sha256: &'a str,
}

/// An item as its caller may see it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Item<'a> {
    /// Server-made, opaque, URL-safe.
    pub id: &'a str,
    /// What sort of item.
    #[schema(value_type = Name)]
    pub kind: &'a str,
    /// A free JSON object.
    #[schema(value_type = Object)]
    pub properties: &'a tarn_engine::Properties,
    /// 1 at creation, one more at every change; the `ETag`.
    #[schema(minimum = 1)]
    pub version: u64,
    /// The creator's username.
    pub created_by: &'a str,
    /// When the item was created.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Time,
    /// When the item last changed.
    #[schema(value_type = String, format = DateTime)]
    pub modified_at: Time,
    /// The body, if one was uploaded.
    #[schema(required = true)]
    pub body: Option<Body<'a>>,
    /// The caller's effective role.
    pub role: Role,
    /// Who may do what: only for managers.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub acl: Option<Vec<Grant>>,
}

impl<'a> From<&'a tarn_engine::ItemView> for Item<'a> {
    fn from(v: &'a tarn_engine::ItemView) -> Item<'a> {
        let i = &v.item;
        Item {
            id: &i.id,
            kind: &i.kind,
            properties: &i.properties,
            version: i.version,
            created_by: &i.created_by,
            created_at: Time(i.created_at),
            modified_at: Time(i.modified_at),
            body: i.body.as_ref().map(|b| Body {
                size: b.size,
                content_type: &b.content_type,
                sha256: &b.sha256,
            }),
            role: v.role.into(),
            acl: (v.role == tarn_engine::Role::Manager).then(|| acl_of(&i.acl)),
        }
    }
}

/// Items, pages of items and search hits written by hand: every listing
/// writes many of them, and through serde each field name goes through
/// the string escaper (a seventh of a 25-item listing's instructions,
/// callgrind). Field names are constants here, a string is copied as it is
/// unless it holds a quote, backslash or control character, and the
/// properties are the stored text. The output is byte for byte what the
/// `Serialize` derive writes (tests below); the derive stays the
/// definition, and the OpenAPI document's.
pub trait WriteJson {
    /// Appends the JSON of `self` to `out`.
    fn write_json(&self, out: &mut Vec<u8>);
}

/// A JSON string, escaped exactly as serde_json escapes it.
fn put_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        serde_json::to_writer(&mut *out, s).expect("writing to memory");
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// A number, as serde_json writes it.
fn put_num<T: Serialize>(out: &mut Vec<u8>, n: T) {
    serde_json::to_writer(&mut *out, &n).expect("writing to memory");
}

impl Item<'_> {
    /// The fields, without the closing brace (a search hit adds its score).
    fn write_fields(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"id":"#);
        put_str(out, self.id);
        out.extend_from_slice(br#","kind":"#);
        put_str(out, self.kind);
        out.extend_from_slice(br#","properties":"#);
        out.extend_from_slice(self.properties.text().as_bytes());
        out.extend_from_slice(br#","version":"#);
        put_num(out, self.version);
        out.extend_from_slice(br#","createdBy":"#);
        put_str(out, self.created_by);
        out.extend_from_slice(br#","createdAt":""#);
        out.extend_from_slice(&self.created_at.rfc3339());
        out.extend_from_slice(br#"","modifiedAt":""#);
        out.extend_from_slice(&self.modified_at.rfc3339());
        out.extend_from_slice(br#"","body":"#);
        match &self.body {
            None => out.extend_from_slice(b"null"),
            Some(b) => {
                out.extend_from_slice(br#"{"size":"#);
                put_num(out, b.size);
                out.extend_from_slice(br#","contentType":"#);
                put_str(out, b.content_type);
                out.extend_from_slice(br#","sha256":"#);
                put_str(out, b.sha256);
                out.push(b'}');
            }
        }
        out.extend_from_slice(br#","role":"#);
        out.extend_from_slice(match self.role {
            Role::Viewer => br#""viewer""#.as_slice(),
            Role::Editor => br#""editor""#.as_slice(),
            Role::Manager => br#""manager""#.as_slice(),
        });
        if let Some(acl) = &self.acl {
            out.extend_from_slice(br#","acl":"#);
            serde_json::to_writer(&mut *out, acl).expect("writing to memory");
        }
    }
}

impl WriteJson for Item<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        self.write_fields(out);
        out.push(b'}');
    }
}

impl WriteJson for Hit<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        self.item.write_fields(out);
        out.extend_from_slice(br#","score":"#);
        put_num(out, self.score);
        out.push(b'}');
    }
}

/// `{"items":[...],"next":...}`, the shape of listings and searches.
fn write_page<T: WriteJson>(out: &mut Vec<u8>, items: &[T], next: Option<&str>) {
    out.extend_from_slice(br#"{"items":["#);
    for (n, i) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        i.write_json(out);
    }
    out.extend_from_slice(br#"],"next":"#);
    match next {
        Some(c) => put_str(out, c),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
}

impl WriteJson for ItemPage<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_page(out, &self.items, self.next);
    }
}

impl WriteJson for SearchPage<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_page(out, &self.items, self.next);
    }
}

/// A page of a listing.
#[derive(Serialize, ToSchema)]
pub struct ItemPage<'a> {
    /// The items, in the listing's order.
    pub items: Vec<Item<'a>>,
    /// The cursor of the next page; `null` at the end.
    #[schema(required = true)]
    pub next: Option<&'a str>,
}

// ---------------------------------------------------------------- indexes

/// A sort order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Smallest first.
    #[default]
    Asc,
    /// Largest first.
    Desc,
}

/// One sort field of an index.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SortField {
    /// `createdAt`, `modifiedAt`, `createdBy` or a dot path into `properties`.
    #[schema(value_type = FieldName)]
    pub field: String,
    /// Its order; `asc` when left out (or `null`).
    #[serde(default, deserialize_with = "null_as_absent")]
    #[schema(nullable = true)]
    pub order: Order,
}

impl From<SortField> for tarn_engine::SortField {
    fn from(s: SortField) -> tarn_engine::SortField {
        tarn_engine::SortField {
            field: s.field,
            order: match s.order {
                Order::Asc => tarn_engine::Order::Asc,
                Order::Desc => tarn_engine::Order::Desc,
            },
        }
    }
}

/// One sort field of an index, as an index shows it.
#[derive(Serialize, ToSchema)]
pub struct ShownSortField {
    /// `createdAt`, `modifiedAt`, `createdBy` or a dot path into `properties`.
    #[schema(value_type = FieldName)]
    pub field: String,
    /// Its order.
    pub order: Order,
}

impl From<&tarn_engine::SortField> for ShownSortField {
    fn from(s: &tarn_engine::SortField) -> ShownSortField {
        ShownSortField {
            field: tarn_engine::written_field(&s.field).into_owned(),
            order: match s.order {
                tarn_engine::Order::Asc => Order::Asc,
                tarn_engine::Order::Desc => Order::Desc,
            },
        }
    }
}

/// The `where` of a declaration: at most 8 fields, each once.
fn where_fields() -> ArrayBuilder {
    ArrayBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::Array,
            Type::Null,
        ]))
        .items(Ref::from_schema_name("FieldName"))
        .max_items(Some(8))
        .unique_items(true)
        .description(Some(
            "Fields a listing gives equality values for, each once; none when left out (or `null`)",
        ))
}

/// An index declaration. `where` and `sort` name at most 8 fields together.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IndexDeclaration {
    /// The kind it serves.
    #[schema(value_type = Name)]
    pub kind: String,
    /// Fields a listing gives equality values for, each once; none when
    /// left out (or `null`).
    #[serde(default, rename = "where", deserialize_with = "null_as_absent")]
    #[schema(schema_with = where_fields)]
    pub where_: Vec<String>,
    /// Fields the listing is sorted by (a sort index); none when left out
    /// (or `null`).
    #[serde(default, deserialize_with = "null_as_absent")]
    #[schema(max_items = 8, nullable = true)]
    pub sort: Vec<SortField>,
    /// Fields whose words a search finds (a text index, which has no
    /// `sort`), each once; none when left out (or `null`).
    #[serde(default, deserialize_with = "null_as_absent")]
    #[schema(max_items = 8, nullable = true)]
    pub text: Vec<TextField>,
    /// A text index's stemmer; `english` by default.
    #[schema(schema_with = language_schema)]
    pub language: Option<String>,
}

/// One field of a text index.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextField {
    /// A dot path into `properties` (strings or arrays of strings), or
    /// `$body` for a textual body (its first MiB).
    #[schema(value_type = FieldName)]
    pub field: String,
    /// How much its words count; 1 when left out (or `null`).
    #[serde(default = "one", deserialize_with = "null_as_one")]
    #[schema(exclusive_minimum = 0, maximum = 100, default = 1, nullable = true)]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// A weight given as `null` is the default one, as one left out.
fn null_as_one<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or_else(one))
}

impl From<TextField> for tarn_engine::TextField {
    fn from(t: TextField) -> tarn_engine::TextField {
        tarn_engine::TextField {
            field: t.field,
            weight: t.weight,
        }
    }
}

/// One field of a text index, as an index shows it.
#[derive(Serialize, ToSchema)]
pub struct ShownTextField {
    /// A dot path into `properties`, or `$body`.
    #[schema(value_type = FieldName)]
    pub field: String,
    /// How much its words count.
    pub weight: f64,
}

impl From<&tarn_engine::TextField> for ShownTextField {
    fn from(t: &tarn_engine::TextField) -> ShownTextField {
        ShownTextField {
            field: tarn_engine::written_field(&t.field).into_owned(),
            weight: t.weight,
        }
    }
}

/// The stemmers a text index may name (`none`: words are only folded).
fn language_schema() -> ObjectBuilder {
    let mut names: Vec<Value> = tarn_engine::text::LANGUAGES
        .iter()
        .map(|l| Value::from(*l))
        .collect();
    names.push(Value::Null);
    ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::String,
            Type::Null,
        ]))
        .enum_values(Some(names))
        .description(Some("A text index's stemmer; `english` by default"))
}

impl IndexDeclaration {
    /// Most fields `where` and `sort` name together.
    pub const MAX_FIELDS: usize = 8;

    /// The budget of fields as JSON Schema (`anyOf`), which the derive
    /// cannot state: one alternative per split of the budget between
    /// `where` and `sort`.
    pub fn field_budget() -> Value {
        let n = Self::MAX_FIELDS;
        Value::Array(
            (0..=n)
                .map(|w| {
                    json!({"properties": {
                        "where": {"maxItems": w},
                        "sort": {"maxItems": n - w},
                    }})
                })
                .collect(),
        )
    }

    /// What makes a declaration a sort index or a text index, as JSON
    /// Schema (`allOf`): not both `sort` and `text` fields, and `language`
    /// only beside `text` fields.
    pub fn shape() -> Value {
        json!([
            {"anyOf": [
                {"not": {"required": ["text"]}},
                {"properties": {"text": {"maxItems": 0}}},
                {"not": {"required": ["sort"]}},
                {"properties": {"sort": {"maxItems": 0}}},
            ]},
            {"anyOf": [
                {"not": {"required": ["language"]}},
                {"properties": {"language": {"type": "null"}}},
                {"required": ["text"], "properties": {"text": {"minItems": 1}}},
            ]},
        ])
    }
}

/// Where an index is in its life. (An index being dropped is gone as far as
/// the API goes: its rows are removed in the background.)
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IndexState {
    /// Existing items are being added; listings answer `503 index-building`.
    Building,
    /// Listings use it.
    Ready,
}

/// An index.
#[derive(Serialize, ToSchema)]
pub struct Index<'a> {
    /// Its name; built-ins start with `_`.
    #[schema(value_type = IndexName)]
    pub name: &'a str,
    /// The kind it serves; `null` for built-ins, which serve every kind.
    #[schema(required = true)]
    pub kind: Option<&'a str>,
    /// Fields a listing gives equality values for.
    #[serde(rename = "where")]
    pub where_: Vec<std::borrow::Cow<'a, str>>,
    /// Fields the listing is sorted by (empty for a text index).
    pub sort: Vec<ShownSortField>,
    /// A text index's fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub text: Option<Vec<ShownTextField>>,
    /// A text index's stemmer.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub language: Option<&'a str>,
    /// Where it is in its life.
    pub state: IndexState,
    /// Whether it is built in.
    pub builtin: bool,
}

impl<'a> Index<'a> {
    /// The index as the API shows it; `None` while it is being dropped.
    pub fn shown(d: &'a tarn_engine::IndexDef) -> Option<Index<'a>> {
        let state = match d.state {
            tarn_engine::IndexState::Building => IndexState::Building,
            tarn_engine::IndexState::Ready => IndexState::Ready,
            tarn_engine::IndexState::Dropping => return None,
        };
        Some(Index {
            name: &d.name,
            kind: d.kind.as_deref(),
            where_: d
                .where_
                .iter()
                .map(|f| tarn_engine::written_field(f))
                .collect(),
            sort: d.sort.iter().map(ShownSortField::from).collect(),
            text: d
                .is_text()
                .then(|| d.text.iter().map(ShownTextField::from).collect()),
            language: d.language.as_deref(),
            state,
            builtin: d.kind.is_none(),
        })
    }
}

/// Every index.
#[derive(Serialize, ToSchema)]
pub struct IndexList<'a> {
    /// Built-ins first, then by name.
    pub indexes: Vec<Index<'a>>,
}

// ---------------------------------------------------------------- search

/// A search hit: the item as its caller may see it, and its score.
#[derive(Serialize, ToSchema)]
pub struct Hit<'a> {
    /// The item.
    #[serde(flatten)]
    pub item: Item<'a>,
    /// How well it matches: higher is better. Comparable within one search
    /// only.
    pub score: f64,
}

/// A page of search hits, best first, ties broken on id.
#[derive(Serialize, ToSchema)]
pub struct SearchPage<'a> {
    /// The hits.
    pub items: Vec<Hit<'a>>,
    /// The cursor of the next page; `null` at the end.
    #[schema(required = true)]
    pub next: Option<&'a str>,
}

// ---------------------------------------------------------------- changes

/// What a change did, as the caller sees it.
#[derive(Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeOp {
    /// The item, as the caller reads it at this version.
    Put,
    /// The item is no longer visible to the caller: deleted, unshared, or
    /// access lost (which, it never says).
    Remove,
}

/// One change.
#[derive(Serialize, ToSchema)]
pub struct Change<'a> {
    /// Where it is in the feed: `since` of the next read, or an event's
    /// `id`.
    #[schema(value_type = Cursor)]
    pub cursor: &'a str,
    /// Put or remove.
    pub op: ChangeOp,
    /// The item's id.
    pub id: &'a str,
    /// The item's kind.
    #[schema(value_type = Name)]
    pub kind: &'a str,
    /// The item's version after a put; for a remove, the last version the
    /// caller could read (so a remove never says whether the item was
    /// deleted or unshared).
    pub version: u64,
    /// When it was committed.
    #[schema(value_type = String, format = DateTime)]
    pub at: Time,
    /// The item, for puts.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub item: Option<Item<'a>>,
}

impl<'a> From<&'a tarn_engine::Change> for Change<'a> {
    fn from(c: &'a tarn_engine::Change) -> Change<'a> {
        Change {
            cursor: &c.cursor,
            op: match c.op {
                tarn_engine::ChangeOp::Put => ChangeOp::Put,
                tarn_engine::ChangeOp::Remove => ChangeOp::Remove,
            },
            id: &c.id,
            kind: &c.kind,
            version: c.version,
            at: Time(c.at),
            item: c.item.as_ref().map(Item::from),
        }
    }
}

/// A page of changes, in commit order.
#[derive(Serialize, ToSchema)]
pub struct ChangePage<'a> {
    /// The changes; fewer than `limit` means caught up for now.
    pub changes: Vec<Change<'a>>,
    /// Where to read on from.
    #[schema(value_type = Cursor)]
    pub next: &'a str,
    /// Present, and `true`, when the caller's groups changed within the
    /// changes this page covers (it, or a group it is in, joined or left a
    /// group): items came into or left its view without a change of their
    /// own, so the client re-lists what it shows, as after a stream's
    /// `event: resync`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub resync: bool,
}

// ---------------------------------------------------------------- system

/// The server is up.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    #[schema(pattern = "^ok$")]
    pub status: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items whose strings need each kind of escape, one kind a string,
    /// with and without a body, in every role (managers see the ACL).
    fn views() -> Vec<tarn_engine::ItemView> {
        let odd = [
            "plain ünï 🙂 \u{202e} \u{7f}",
            "q\"uote",
            "back\\slash",
            "\u{0}",
            "\u{1f}",
            "line\nbreak",
            "\t\r\u{8}\u{c}",
        ];
        let roles = [
            tarn_engine::Role::Viewer,
            tarn_engine::Role::Editor,
            tarn_engine::Role::Manager,
        ];
        let mut out = Vec::new();
        for (n, s) in odd.into_iter().enumerate() {
            let body = (n % 2 == 0).then(|| {
                json!({"size": u64::MAX, "contentType": s, "sha256": "ab".repeat(32),
                       "blob": "b", "chunk": 1})
            });
            let item = json!({
                "id": s,
                "kind": s,
                "properties": {"title": s, "n": [1, -2.5, 1e300, null, true],
                               "deep": {"": {"a\"b": {}}}},
                "version": n as u64 + 1,
                "createdBy": s,
                "createdAt": -62_135_596_800_000_000i64 + n as i64,
                "modifiedAt": 1_795_424_186_089_284i64,
                "body": body,
                "acl": [{"principal": "user:alice", "role": "manager"},
                        {"principal": "group:g.1", "role": "editor"},
                        {"principal": "everyone", "role": "viewer"}],
            });
            out.push(tarn_engine::ItemView {
                item: serde_json::from_value(item).unwrap(),
                role: roles[n % 3],
            });
        }
        out
    }

    fn written<T: WriteJson>(v: &T) -> String {
        let mut out = Vec::new();
        v.write_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn written_items_are_what_serde_writes() {
        let views = views();
        for v in &views {
            let item = Item::from(v);
            assert_eq!(written(&item), serde_json::to_string(&item).unwrap());
        }
        for next in [None, Some("AbC-_9"), Some("needs \"escape\"")] {
            let page = ItemPage {
                items: views.iter().map(Item::from).collect(),
                next,
            };
            assert_eq!(written(&page), serde_json::to_string(&page).unwrap());
            let empty = ItemPage {
                items: Vec::new(),
                next,
            };
            assert_eq!(written(&empty), serde_json::to_string(&empty).unwrap());
            let hits = SearchPage {
                items: views
                    .iter()
                    .zip([0.0, 1.0e-7, 12_345.678_9, 1.0, 0.5, 3.0e10, 7.25])
                    .map(|(v, score)| Hit {
                        item: Item::from(v),
                        score,
                    })
                    .collect(),
                next,
            };
            assert_eq!(written(&hits), serde_json::to_string(&hits).unwrap());
        }
    }

    /// 2,000 times spread over the years 0–9999 (a fixed LCG).
    fn spread() -> impl Iterator<Item = i64> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..2000).map(move |_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            -62_167_219_200_000_000 + (x % 315_569_520_000_000_000) as i64
        })
    }

    #[test]
    fn times_outside_the_years_0_to_9999_read_as_the_epoch() {
        for micros in [
            i64::MIN,
            -62_167_219_200_000_001,
            253_402_300_800_000_000,
            i64::MAX,
        ] {
            assert_eq!(Time(micros).to_string(), "1970-01-01T00:00:00.000000Z");
        }
    }

    #[test]
    fn times_render_as_the_engine_formats_them() {
        for micros in [
            0,
            1,
            999_999,
            1_700_000_000_000_000,
            1_700_000_000_123_456,
            253_402_300_799_999_999,
            -1,
            -62_167_219_200_000_000,
            951_782_400_000_000,
            4_107_542_400_000_000,
        ]
        .into_iter()
        .chain(spread())
        {
            assert_eq!(
                Time(micros).to_string(),
                tarn_engine::format_time(micros),
                "{micros}"
            );
            assert_eq!(
                serde_json::to_string(&Time(micros)).unwrap(),
                format!("\"{}\"", tarn_engine::format_time(micros)),
            );
        }
    }
}
