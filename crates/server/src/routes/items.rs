//! Items: CRUD, sharing, links and listings.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tarn_engine::{Grant, ItemView, ListQuery, Order, Role, Scope, SortField};

use crate::error::{ApiError, ApiResult};
use crate::extract::{serde_urlencoded_pairs, Auth, IfMatch, JsonBody, LinkKey};
use crate::{render, AppState};

/// An item response with its `ETag`.
pub fn item_response(status: StatusCode, view: &ItemView) -> Response {
    let mut res = (status, Json(render::item(view))).into_response();
    res.headers_mut().insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{}\"", view.item.version)).expect("digits"),
    );
    res
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewItem {
    kind: String,
    #[serde(default)]
    properties: Map<String, Value>,
    #[serde(default)]
    acl: Vec<Grant>,
}

pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    JsonBody(body): JsonBody<NewItem>,
) -> ApiResult<Response> {
    let view = s
        .engine
        .create_item(&auth.caller, &body.kind, body.properties, body.acl)
        .await?;
    let mut res = item_response(StatusCode::CREATED, &view);
    res.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/api/v1/items/{}", view.item.id)).expect("url-safe id"),
    );
    Ok(res)
}

pub async fn get(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(key): LinkKey,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let view = s.engine.get_item(&auth.caller, &id, key.as_deref()).await?;
    Ok(item_response(StatusCode::OK, &view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patch {
    properties: Value,
}

pub async fn patch(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(key): LinkKey,
    IfMatch(if_match): IfMatch,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Patch>,
) -> ApiResult<Response> {
    let view = s
        .engine
        .patch_item(
            &auth.caller,
            &id,
            key.as_deref(),
            &body.properties,
            if_match,
        )
        .await?;
    Ok(item_response(StatusCode::OK, &view))
}

pub async fn delete(
    State(s): State<AppState>,
    auth: Auth,
    IfMatch(if_match): IfMatch,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    s.engine.delete_item(&auth.caller, &id, if_match).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acl {
    acl: Vec<Grant>,
}

pub async fn set_acl(
    State(s): State<AppState>,
    auth: Auth,
    IfMatch(if_match): IfMatch,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Acl>,
) -> ApiResult<Response> {
    let view = s
        .engine
        .set_acl(&auth.caller, &id, body.acl, if_match)
        .await?;
    Ok(item_response(StatusCode::OK, &view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewLink {
    role: Role,
}

pub async fn create_link(
    State(s): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<NewLink>,
) -> ApiResult<impl IntoResponse> {
    let key = s.engine.create_link(&auth.caller, &id, body.role).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"key": key, "role": body.role.as_str()})),
    ))
}

pub async fn delete_link(
    State(s): State<AppState>,
    auth: Auth,
    Path((id, key)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    s.engine.delete_link(&auth.caller, &id, &key).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Parses `sort=a,-b` into sort fields.
fn parse_sort(s: &str) -> ApiResult<Vec<SortField>> {
    s.split(',')
        .map(|f| {
            let (field, order) = match f.strip_prefix('-') {
                Some(rest) => (rest, Order::Desc),
                None => (f.strip_prefix('+').unwrap_or(f), Order::Asc),
            };
            if field.is_empty() {
                return Err(ApiError::invalid(
                    "sort names a field, or -field for descending",
                ));
            }
            Ok(SortField {
                field: field.to_string(),
                order,
            })
        })
        .collect()
}

/// `where.<field>=<value>`: JSON when it parses, else a string.
pub(crate) fn where_value(v: &str) -> Value {
    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
}

pub async fn list(
    State(s): State<AppState>,
    auth: Auth,
    uri: axum::http::Uri,
) -> ApiResult<Json<Value>> {
    let mut q = ListQuery::default();
    for (k, v) in serde_urlencoded_pairs(uri.query().unwrap_or(""))? {
        match k.as_str() {
            "kind" => q.kind = Some(v),
            "sort" => q.sort = parse_sort(&v)?,
            "limit" => {
                q.limit = v
                    .parse()
                    .map_err(|_| ApiError::invalid("limit must be a number from 1 to 1000"))?
            }
            "cursor" => q.cursor = Some(v),
            "scope" => {
                q.scope = match v.as_str() {
                    "visible" => Scope::Visible,
                    "mine" => Scope::Mine,
                    _ => return Err(ApiError::invalid("scope is visible or mine")),
                }
            }
            other => match other.strip_prefix("where.") {
                Some(field) if !field.is_empty() => {
                    q.where_.push((field.to_string(), where_value(&v)))
                }
                _ => return Err(ApiError::invalid(format!("unknown parameter {other}"))),
            },
        }
    }
    let page = s.engine.list_items(&auth.caller, &q).await?;
    Ok(Json(json!({
        "items": page.items.iter().map(render::item).collect::<Vec<_>>(),
        "next": page.next,
    })))
}
