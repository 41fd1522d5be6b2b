//! Items: CRUD, sharing, links and listings.

use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tarn_engine::{ItemView, ListQuery, Order, Scope, SortField};
use utoipa::{IntoParams, ToSchema};

use crate::error::{
    ApiError, ApiResult, BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge,
    PreconditionFailed, ServiceUnavailable, Unauthorized, UnsupportedMediaType,
};
use crate::extract::{serde_urlencoded_pairs, Auth, IfMatch, JsonBody, LinkKey, Path};
use crate::json::{self, GivenCursor, Id, Name};
use crate::routes::{reply, reply_written};
use crate::AppState;

/// An item response with its `ETag`.
pub fn item_response(status: StatusCode, view: &ItemView) -> Response {
    let mut res = reply_written(status, &json::Item::from(view));
    res.headers_mut().insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{}\"", view.item.version)).expect("digits"),
    );
    res
}

/// Create an item; the caller manages it
#[utoipa::path(
    post, path = "/api/v1/items", tag = "items", operation_id = "createItem",
    security(("bearer" = [])),
    request_body = json::NewItem,
    responses(
        (status = 201, description = "The new item", body = json::Item, headers(
            ("ETag" = String, description = "The item's version, quoted"),
            ("Location" = String, description = "The item's URL"),
        ), links(
            ("getItem" = (operation_id = "getItem", parameters(("id" = "$response.body#/id")))),
            ("patchItem" = (operation_id = "patchItem", parameters(("id" = "$response.body#/id")))),
            ("deleteItem" = (operation_id = "deleteItem", parameters(("id" = "$response.body#/id")))),
            ("setAcl" = (operation_id = "setAcl", parameters(("id" = "$response.body#/id")))),
            ("createLink" = (operation_id = "createLink", parameters(("id" = "$response.body#/id")))),
            ("putBody" = (operation_id = "putBody", parameters(("id" = "$response.body#/id")))),
            ("getBody" = (operation_id = "getBody", parameters(("id" = "$response.body#/id")))),
        )),
        BadRequest, Unauthorized, PayloadTooLarge, UnsupportedMediaType, ServiceUnavailable,
    ),
)]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    JsonBody(body): JsonBody<json::NewItem>,
) -> ApiResult<Response> {
    let acl = body.acl.into_iter().map(Into::into).collect();
    let view = s
        .engine
        .create_item(&auth.caller, &body.kind, body.properties, acl)
        .await?;
    let mut res = item_response(StatusCode::CREATED, &view);
    res.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/api/v1/items/{}", view.item.id)).expect("url-safe id"),
    );
    Ok(res)
}

/// The path of an item.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ItemPath {
    /// The item's id.
    #[param(value_type = Id)]
    pub id: String,
}

/// An item
#[utoipa::path(
    get, path = "/api/v1/items/{id}", tag = "items", operation_id = "getItem",
    security((), ("bearer" = [])),
    params(ItemPath, LinkKey),
    responses(
        (status = 200, description = "The item", body = json::Item, headers(
            ("ETag" = String, description = "The item's version, quoted"),
        )),
        BadRequest, Unauthorized, NotFound, ServiceUnavailable,
    ),
)]
pub async fn get(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(key): LinkKey,
    Path(ItemPath { id }): Path<ItemPath>,
) -> ApiResult<Response> {
    let view = s.engine.get_item(&auth.caller, &id, key.as_deref()).await?;
    Ok(item_response(StatusCode::OK, &view))
}

/// Merge-patch the properties (editors)
#[utoipa::path(
    patch, path = "/api/v1/items/{id}", tag = "items", operation_id = "patchItem",
    security((), ("bearer" = [])),
    params(ItemPath, LinkKey, IfMatch),
    request_body(content(
        (json::ItemPatch = "application/json"),
        (json::ItemPatch = "application/merge-patch+json"),
    )),
    responses(
        (status = 200, description = "The item, changed", body = json::Item, headers(
            ("ETag" = String, description = "The item's version, quoted"),
        )),
        BadRequest, Unauthorized, Forbidden, NotFound, PreconditionFailed, PayloadTooLarge,
        UnsupportedMediaType, ServiceUnavailable,
    ),
)]
pub async fn patch(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(key): LinkKey,
    IfMatch(if_match): IfMatch,
    Path(ItemPath { id }): Path<ItemPath>,
    JsonBody(body): JsonBody<json::ItemPatch>,
) -> ApiResult<Response> {
    let patch = Value::Object(body.properties);
    let view = s
        .engine
        .patch_item(&auth.caller, &id, key.as_deref(), &patch, if_match)
        .await?;
    Ok(item_response(StatusCode::OK, &view))
}

/// Delete an item with its rows, links and body (managers)
#[utoipa::path(
    delete, path = "/api/v1/items/{id}", tag = "items", operation_id = "deleteItem",
    security((), ("bearer" = [])),
    params(ItemPath, LinkKey, IfMatch),
    responses(
        (status = 204, description = "Gone"),
        BadRequest, Unauthorized, Forbidden, NotFound, PreconditionFailed, ServiceUnavailable,
    ),
)]
pub async fn delete(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(key): LinkKey,
    IfMatch(if_match): IfMatch,
    Path(ItemPath { id }): Path<ItemPath>,
) -> ApiResult<StatusCode> {
    s.engine
        .delete_item(&auth.caller, &id, key.as_deref(), if_match)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Replace the ACL (managers); it keeps a manager
#[utoipa::path(
    put, path = "/api/v1/items/{id}/acl", tag = "items", operation_id = "setAcl",
    security((), ("bearer" = [])),
    params(ItemPath, LinkKey, IfMatch),
    request_body = json::Acl,
    responses(
        (status = 200, description = "The item, shared anew", body = json::Item, headers(
            ("ETag" = String, description = "The item's version, quoted"),
        )),
        BadRequest, Unauthorized, Forbidden, NotFound, PreconditionFailed, PayloadTooLarge,
        UnsupportedMediaType, ServiceUnavailable,
    ),
)]
pub async fn set_acl(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(key): LinkKey,
    IfMatch(if_match): IfMatch,
    Path(ItemPath { id }): Path<ItemPath>,
    JsonBody(body): JsonBody<json::Acl>,
) -> ApiResult<Response> {
    // The engine bounds the ACL once duplicates are merged; the request
    // itself is bounded as documented.
    if body.acl.len() > json::MAX_GRANTS {
        return Err(ApiError::invalid(format!(
            "an ACL holds at most {} grants",
            json::MAX_GRANTS
        )));
    }
    let acl = body.acl.into_iter().map(Into::into).collect();
    let view = s
        .engine
        .set_acl(&auth.caller, &id, key.as_deref(), acl, if_match)
        .await?;
    Ok(item_response(StatusCode::OK, &view))
}

/// Make a link key (managers)
#[utoipa::path(
    post, path = "/api/v1/items/{id}/links", tag = "items", operation_id = "createLink",
    security((), ("bearer" = [])),
    params(ItemPath, LinkKey, IfMatch),
    request_body = json::NewLink,
    responses(
        (status = 201, description = "The key, shown once", body = json::Link, links(
            ("getItem" = (operation_id = "getItem", parameters(
                ("id" = "$request.path.id"), ("key" = "$response.body#/key"),
            ))),
            ("deleteLink" = (operation_id = "deleteLink", parameters(
                ("id" = "$request.path.id"), ("key" = "$response.body#/key"),
            ))),
        )),
        BadRequest, Unauthorized, Forbidden, NotFound, Conflict, PreconditionFailed,
        PayloadTooLarge, UnsupportedMediaType, ServiceUnavailable,
    ),
)]
pub async fn create_link(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(presented): LinkKey,
    IfMatch(if_match): IfMatch,
    Path(ItemPath { id }): Path<ItemPath>,
    JsonBody(body): JsonBody<json::NewLink>,
) -> ApiResult<Response> {
    let key = s
        .engine
        .create_link(
            &auth.caller,
            &id,
            presented.as_deref(),
            body.role.into(),
            if_match,
        )
        .await?;
    Ok(reply(
        StatusCode::CREATED,
        &json::Link {
            key: &key,
            role: body.role,
            id: tarn_engine::link_id(&key),
        },
    ))
}

/// An item's links, without their keys (managers)
#[utoipa::path(
    get, path = "/api/v1/items/{id}/links", tag = "items", operation_id = "listLinks",
    security((), ("bearer" = [])),
    params(ItemPath, LinkKey),
    responses(
        (status = 200, description = "The item's links, the newest first", body = json::Links),
        BadRequest, Unauthorized, Forbidden, NotFound, ServiceUnavailable,
    ),
)]
pub async fn list_links(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(presented): LinkKey,
    Path(ItemPath { id }): Path<ItemPath>,
) -> ApiResult<Response> {
    let links = s
        .engine
        .links(&auth.caller, &id, presented.as_deref())
        .await?;
    Ok(reply(StatusCode::OK, &json::Links::from(&links[..])))
}

/// The path of a link.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct LinkPath {
    /// The item's id.
    #[param(value_type = Id)]
    id: String,
    /// The link's key, or its `id` as `listLinks` gives it.
    #[param(value_type = Id)]
    key: String,
}

/// Remove a link, named by its key or its id (managers)
#[utoipa::path(
    delete, path = "/api/v1/items/{id}/links/{key}", tag = "items", operation_id = "deleteLink",
    security((), ("bearer" = [])),
    params(LinkPath, LinkKey, IfMatch),
    responses(
        (status = 204, description = "The key no longer works"),
        BadRequest, Unauthorized, Forbidden, NotFound, PreconditionFailed, ServiceUnavailable,
    ),
)]
pub async fn delete_link(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(presented): LinkKey,
    IfMatch(if_match): IfMatch,
    Path(LinkPath { id, key }): Path<LinkPath>,
) -> ApiResult<StatusCode> {
    s.engine
        .delete_link(&auth.caller, &id, presented.as_deref(), &key, if_match)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Which items a listing ranges over.
#[derive(Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListScope {
    /// Everything the caller may read.
    Visible,
    /// Items the caller created.
    Mine,
    /// Items others shared with the caller or one of the caller's groups,
    /// any kind, by `modifiedAt`.
    Shared,
}

/// The query of a listing. Besides these, `where.<field>=<value>` asks for
/// equality on a where-field of the index (a value is JSON when it parses,
/// else a string): OpenAPI 3.1 cannot name a family of parameters, so they
/// are described in the operation's text.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// The kind to list; required for `scope=visible`, optional for
    /// `scope=mine`, refused for `scope=shared`.
    #[param(value_type = Name, required = false)]
    kind: Option<String>,
    /// Sort fields, comma-separated, `-field` for descending; default
    /// `-modifiedAt`. A declared index must serve the combination.
    #[param(
        pattern = "^[-+]?[^,+-][^,]*(,[-+]?[^,+-][^,]*)*$",
        default = "-modifiedAt"
    )]
    sort: Option<String>,
    /// Page size.
    #[param(minimum = 1, maximum = 1000, default = 50)]
    limit: Option<u32>,
    /// The `next` of the previous page.
    #[param(value_type = GivenCursor, required = false)]
    cursor: Option<String>,
    /// Everything the caller may read (default), only what they created, or
    /// only what others shared with them or their groups.
    #[param(inline)]
    scope: Option<ListScope>,
    /// `where.<field>` equalities.
    #[param(ignore)]
    where_: Vec<(String, Value)>,
}

/// Parses `sort=a,-b` into sort fields.
/// A `+` left unencoded in a URL reads as a space: ` field` is `+field`.
fn parse_sort(s: &str) -> ApiResult<Vec<SortField>> {
    let fields = s
        .split(',')
        .map(|f| {
            let (field, order) = match f.strip_prefix('-') {
                Some(rest) => (rest, Order::Desc),
                None => (f.strip_prefix(['+', ' ']).unwrap_or(f), Order::Asc),
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
        .collect::<ApiResult<Vec<_>>>()?;
    // (A field named twice, in any spelling, is refused by the engine.)
    Ok(fields)
}

/// `where.<field>=<value>`: JSON when it parses, else a string.
pub(crate) fn where_value(v: &str) -> Value {
    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ListParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<ListParams> {
        let mut q = ListParams {
            kind: None,
            sort: None,
            limit: None,
            cursor: None,
            scope: None,
            where_: Vec::new(),
        };
        for (k, v) in serde_urlencoded_pairs(parts.uri.query().unwrap_or(""))? {
            let dup = || ApiError::invalid(format!("{k} is given twice"));
            match k.as_str() {
                "kind" if q.kind.is_some() => return Err(dup()),
                "kind" if !tarn_engine::is_valid_name(&v) => {
                    return Err(ApiError::invalid(format!("kind {v:?} is not a valid kind")))
                }
                "kind" => q.kind = Some(v),
                "sort" if q.sort.is_some() => return Err(dup()),
                "sort" => q.sort = Some(v),
                "limit" if q.limit.is_some() => return Err(dup()),
                "limit" => {
                    q.limit =
                        Some(v.parse().map_err(|_| {
                            ApiError::invalid("limit must be a number from 1 to 1000")
                        })?)
                }
                "cursor" if q.cursor.is_some() => return Err(dup()),
                "cursor" => q.cursor = Some(v),
                // A link key opens its one item, never a listing: taken
                // (clients send it everywhere) and ignored.
                "key" => {}
                "scope" if q.scope.is_some() => return Err(dup()),
                "scope" => {
                    q.scope = Some(match v.as_str() {
                        "visible" => ListScope::Visible,
                        "mine" => ListScope::Mine,
                        "shared" => ListScope::Shared,
                        _ => return Err(ApiError::invalid("scope is visible, mine or shared")),
                    })
                }
                other => match other.strip_prefix("where.") {
                    Some(field) if !field.is_empty() => {
                        q.where_.push((field.to_string(), where_value(&v)))
                    }
                    _ => return Err(ApiError::invalid(format!("unknown parameter {other}"))),
                },
            }
        }
        // Empty: the first page (`cursor=${next ?? ''}`).
        q.cursor = q.cursor.filter(|c| !c.is_empty());
        Ok(q)
    }
}

/// A page of a listing, served by an index
///
/// `where.<field>=<value>` (repeatable, one per field) asks for equality on
/// a where-field of the index; a value is parsed as JSON when it parses
/// (`true`, `42`, `"x"`), else taken as a string. No declared index serves
/// the combination: `400 no-index`, whose detail names the index to
/// declare. An index still being built: `503 index-building`.
///
/// `scope=shared` lists, newest first (or `sort=modifiedAt`), the items
/// of every kind that others shared with the caller or one of the
/// caller's groups (not those shared only with `everyone` or
/// `authenticated`); the caller's own items shared with their groups are
/// left out, so a page may hold fewer than `limit` items while `next` is
/// not `null`.
#[utoipa::path(
    get, path = "/api/v1/items", tag = "items", operation_id = "listItems",
    security((), ("bearer" = [])),
    params(ListParams),
    responses(
        (status = 200, description = "A page", body = json::ItemPage),
        BadRequest, Unauthorized, ServiceUnavailable,
    ),
)]
pub async fn list(
    State(s): State<AppState>,
    auth: Auth,
    params: ListParams,
) -> ApiResult<Response> {
    let q = ListQuery {
        kind: params.kind,
        where_: params.where_,
        sort: match &params.sort {
            Some(s) => parse_sort(s)?,
            None => Vec::new(),
        },
        scope: match params.scope {
            Some(ListScope::Mine) => Scope::Mine,
            Some(ListScope::Shared) => Scope::Shared,
            Some(ListScope::Visible) | None => Scope::Visible,
        },
        limit: params.limit.map_or(50, |n| n as usize),
        cursor: params.cursor,
    };
    let page = s.engine.list_items(&auth.caller, &q).await?;
    Ok(reply_written(
        StatusCode::OK,
        &json::ItemPage {
            items: page.items.iter().map(json::Item::from).collect(),
            next: page.next.as_deref(),
        },
    ))
}
