//! The JSON of api.md, rendered from engine types.

use serde_json::{json, Value};
use tarn_engine::{format_time, Group, IndexDef, ItemView, Role, User};

/// `{"username", "properties", "admin", "createdAt"}`.
pub fn user(u: &User) -> Value {
    json!({
        "username": u.username,
        "properties": u.properties,
        "admin": u.admin,
        "createdAt": format_time(u.created_at),
    })
}

/// What any caller may see of a user.
pub fn public_user(u: &User) -> Value {
    json!({ "username": u.username, "properties": u.properties })
}

/// `{"id", "title", "properties", "managers", "createdAt"}`.
pub fn group(g: &Group) -> Value {
    json!({
        "id": g.id,
        "title": g.title,
        "properties": g.properties,
        "managers": g.managers.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "createdAt": format_time(g.created_at),
    })
}

/// An item as its caller may see it: the ACL only for managers.
pub fn item(v: &ItemView) -> Value {
    let i = &v.item;
    let mut out = json!({
        "id": i.id,
        "kind": i.kind,
        "properties": i.properties,
        "version": i.version,
        "createdBy": i.created_by,
        "createdAt": format_time(i.created_at),
        "modifiedAt": format_time(i.modified_at),
        "body": i.body.as_ref().map(|b| json!({
            "size": b.size,
            "contentType": b.content_type,
            "sha256": b.sha256,
        })),
        "role": v.role.as_str(),
    });
    if v.role == Role::Manager {
        out["acl"] = json!(i
            .acl
            .iter()
            .map(|g| json!({"principal": g.principal.to_string(), "role": g.role.as_str()}))
            .collect::<Vec<_>>());
    }
    out
}

/// `{"name", "kind", "where", "sort", "state"}`.
pub fn index(d: &IndexDef) -> Value {
    let mut out = json!({
        "name": d.name,
        "kind": d.kind,
        "where": d.where_,
        "sort": d.sort,
        "state": d.state,
        "builtin": d.kind.is_none(),
    });
    if d.is_text() {
        out["text"] = json!(d.text);
        out["language"] = json!(d.language);
    }
    out
}
