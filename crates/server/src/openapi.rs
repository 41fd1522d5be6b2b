//! The OpenAPI 3.1 document, generated from the route table and the schemas
//! below, served at `/api/v1/openapi.json`.

use serde_json::{json, Map, Value};

use crate::routes::{table, Input, Output};

/// The path parameters of a template, in order.
pub fn path_params(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .collect()
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn problem() -> Value {
    json!({
        "description": "An error, as RFC 9457 problem JSON",
        "content": { "application/problem+json": { "schema": schema_ref("Problem") } }
    })
}

/// The whole document.
pub fn document() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for r in table() {
        let mut params: Vec<Value> = path_params(r.path)
            .into_iter()
            .map(|p| json!({"name": p, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        for (name, description) in r.query {
            params.push(json!({
                "name": name, "in": "query", "required": false,
                "description": description, "schema": {"type": "string"}
            }));
        }
        if r.auth {
            params.push(json!({
                "name": "Authorization", "in": "header", "required": false,
                "description": "Bearer <token> from POST /api/v1/sessions",
                "schema": {"type": "string"}
            }));
        }
        let mut op = json!({
            "operationId": r.id,
            "summary": r.summary,
            "parameters": params,
        });
        match r.input {
            Input::None => {}
            Input::Json(s) => {
                op["requestBody"] = json!({
                    "required": true,
                    "content": { "application/json": { "schema": schema_ref(s) } }
                })
            }
            Input::Bytes => {
                op["requestBody"] = json!({
                    "required": true,
                    "content": { "*/*": { "schema": {"type": "string", "contentMediaType": "application/octet-stream"} } }
                })
            }
        }
        let ok = match r.ok.1 {
            Output::Empty => json!({"description": "Done"}),
            Output::Json(s) => json!({
                "description": "Success",
                "content": { "application/json": { "schema": schema_ref(s) } }
            }),
            Output::Bytes => json!({
                "description": "The bytes (206 for a Range)",
                "content": { "*/*": { "schema": {"type": "string", "contentMediaType": "application/octet-stream"} } }
            }),
            Output::Text => json!({
                "description": "Prometheus text exposition",
                "content": { "text/plain": { "schema": {"type": "string"} } }
            }),
        };
        op["responses"] = json!({ r.ok.0.to_string(): ok, "default": problem() });
        let entry = paths
            .entry(r.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[r.method.as_str().to_ascii_lowercase()] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tarn HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A collaboration content server: users, nested groups, items shared per user, group, everyone or link, and listings served by indexes that hold the reader."
        },
        "paths": paths,
        "components": { "schemas": schemas() },
    })
}

fn schemas() -> Value {
    let obj = json!({"type": "object"});
    let time = json!({"type": "string", "format": "date-time"});
    let name = json!({"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$"});
    let role = json!({"type": "string", "enum": ["viewer", "editor", "manager"]});
    let principal = json!({"type": "string", "description": "user:<name>, group:<id>, authenticated or everyone"});
    let grant = json!({"type": "object", "required": ["principal", "role"],
        "properties": {"principal": principal, "role": role}});
    let sort_field = json!({"type": "object", "required": ["field", "order"],
        "properties": {"field": {"type": "string"}, "order": {"type": "string", "enum": ["asc", "desc"]}}});
    let user = json!({"type": "object", "properties": {
        "username": name, "properties": obj, "admin": {"type": "boolean"}, "createdAt": time}});
    json!({
        "Problem": {"type": "object", "required": ["type", "title", "status", "detail"], "properties": {
            "type": {"type": "string", "description": "stable slug: invalid-input, unauthenticated, forbidden, not-found, conflict, version-mismatch, no-index, index-building, too-large, rate-limited, unavailable, internal"},
            "title": {"type": "string"}, "status": {"type": "integer"}, "detail": {"type": "string"}}},
        "Health": {"type": "object", "properties": {"status": {"type": "string"}}},
        "OpenApi": obj,
        "NewUser": {"type": "object", "required": ["username", "password"], "properties": {
            "username": name, "password": {"type": "string", "minLength": 8},
            "properties": obj, "admin": {"type": "boolean", "description": "admins only"}}},
        "User": user,
        "PublicUser": {"type": "object", "properties": {"username": name, "properties": obj}},
        "SignIn": {"type": "object", "required": ["username", "password"], "properties": {
            "username": {"type": "string"}, "password": {"type": "string"}}},
        "Session": {"type": "object", "properties": {"token": {"type": "string"}, "user": user}},
        "Me": {"type": "object", "properties": {"username": name, "properties": obj,
            "admin": {"type": "boolean"}, "createdAt": time,
            "groups": {"type": "array", "items": name}}},
        "NewGroup": {"type": "object", "required": ["id"], "properties": {
            "id": name, "title": {"type": "string"}, "properties": obj}},
        "Group": {"type": "object", "properties": {"id": name, "title": {"type": "string"},
            "properties": obj, "managers": {"type": "array", "items": principal}, "createdAt": time}},
        "MemberPage": {"type": "object", "properties": {
            "members": {"type": "array", "items": principal},
            "next": {"type": ["string", "null"]}}},
        "NewItem": {"type": "object", "required": ["kind"], "properties": {
            "kind": name, "properties": obj, "acl": {"type": "array", "items": grant}}},
        "Item": {"type": "object", "properties": {
            "id": {"type": "string"}, "kind": name, "properties": obj,
            "version": {"type": "integer"}, "createdBy": name,
            "createdAt": time, "modifiedAt": time,
            "body": {"type": ["object", "null"], "properties": {
                "size": {"type": "integer"}, "contentType": {"type": "string"}, "sha256": {"type": "string"}}},
            "role": role,
            "acl": {"type": "array", "items": grant, "description": "managers only"}}},
        "ItemPatch": {"type": "object", "required": ["properties"], "properties": {
            "properties": {"description": "an RFC 7396 JSON merge patch of the properties"}}},
        "ItemPage": {"type": "object", "properties": {
            "items": {"type": "array", "items": schema_ref("Item")},
            "next": {"type": ["string", "null"]}}},
        "AclBody": {"type": "object", "required": ["acl"], "properties": {
            "acl": {"type": "array", "items": grant}}},
        "NewLink": {"type": "object", "required": ["role"], "properties": {
            "role": {"type": "string", "enum": ["viewer", "editor"]}}},
        "Link": {"type": "object", "properties": {"key": {"type": "string"}, "role": role}},
        "IndexDeclaration": {"type": "object", "required": ["kind"], "properties": {
            "kind": name, "where": {"type": "array", "items": {"type": "string"}},
            "sort": {"type": "array", "items": sort_field}}},
        "Index": {"type": "object", "properties": {
            "name": {"type": "string"}, "kind": {"type": ["string", "null"]},
            "where": {"type": "array", "items": {"type": "string"}},
            "sort": {"type": "array", "items": sort_field},
            "state": {"type": "string", "enum": ["building", "ready", "dropping"]},
            "builtin": {"type": "boolean"}}},
        "SearchPage": {"type": "object", "properties": {
            "items": {"type": "array", "items": {"allOf": [schema_ref("Item"), {"type": "object", "properties": {"score": {"type": "number"}}}]}},
            "next": {"type": ["string", "null"]}}},
        "Change": {"type": "object", "required": ["cursor", "op", "id", "kind", "version", "at"], "properties": {
            "cursor": {"type": "string"}, "op": {"type": "string", "enum": ["put", "remove"]},
            "id": {"type": "string"}, "kind": name, "version": {"type": "integer"}, "at": time,
            "item": schema_ref("Item")}},
        "ChangePage": {"type": "object", "properties": {
            "changes": {"type": "array", "items": schema_ref("Change")},
            "next": {"type": "string"}}},
        "IndexList": {"type": "object", "properties": {
            "indexes": {"type": "array", "items": schema_ref("Index")}}},
    })
}
