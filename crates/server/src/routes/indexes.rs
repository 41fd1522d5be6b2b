//! Index declarations (administrators).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::error::{
    ApiError, ApiResult, BadRequest, Code, Conflict, Forbidden, NotFound, PayloadTooLarge,
    ServiceUnavailable, Unauthorized, UnsupportedMediaType,
};
use crate::extract::{Auth, JsonBody, Path};
use crate::json::{self, IndexName, Name};
use crate::routes::reply;
use crate::AppState;

/// An index that is not there, or is being dropped.
fn no_index(name: &str) -> ApiError {
    ApiError::not_found(format!("no index {name}"))
}

/// The path of an index to read.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct IndexPath {
    /// The index's name.
    #[param(value_type = IndexName)]
    name: String,
}

/// The path of a declared index.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeclaredIndexPath {
    /// The index's name.
    #[param(value_type = Name)]
    name: String,
}

/// Declare an index (administrators)
///
/// A sort index names `sort` fields; a text index names `text` fields
/// (and, optionally, a `language`) and serves `/search`. `201` for a new
/// declaration, whose existing items are added in the
/// background (`state: building`); `200` when an identical one exists;
/// `409` when one of that name differs.
#[utoipa::path(
    put, path = "/api/v1/indexes/{name}", tag = "indexes", operation_id = "declareIndex",
    security(("bearer" = [])),
    params(DeclaredIndexPath),
    request_body = json::IndexDeclaration,
    responses(
        (status = 201, description = "Declared", body = json::Index, links(
            ("getIndex" = (operation_id = "getIndex", parameters(("name" = "$response.body#/name")))),
            ("dropIndex" = (operation_id = "dropIndex", parameters(("name" = "$response.body#/name")))),
            ("listItems" = (operation_id = "listItems", parameters(("kind" = "$response.body#/kind")))),
        )),
        (status = 200, description = "An identical index exists", body = json::Index),
        BadRequest, Unauthorized, Forbidden, Conflict, PayloadTooLarge, UnsupportedMediaType,
        ServiceUnavailable,
    ),
)]
pub async fn put(
    State(s): State<AppState>,
    auth: Auth,
    Path(DeclaredIndexPath { name }): Path<DeclaredIndexPath>,
    JsonBody(body): JsonBody<json::IndexDeclaration>,
) -> ApiResult<Response> {
    let (def, created) = if body.text.is_empty() {
        if body.language.is_some() {
            return Err(ApiError::invalid(
                "language is for text indexes: give text fields",
            ));
        }
        let sort = body.sort.into_iter().map(Into::into).collect();
        s.engine
            .declare_index(&auth.caller, &name, &body.kind, body.where_, sort)
            .await?
    } else {
        if !body.sort.is_empty() {
            return Err(ApiError::invalid(
                "a text index has no sort: results are ordered by score",
            ));
        }
        let text = body.text.into_iter().map(Into::into).collect();
        s.engine
            .declare_text_index(
                &auth.caller,
                &name,
                &body.kind,
                body.where_,
                text,
                body.language,
            )
            .await?
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let shown = json::Index::shown(&def).ok_or_else(|| {
        ApiError::new(Code::Conflict, format!("the index {name} is being dropped"))
    })?;
    Ok(reply(status, &shown))
}

/// One index
#[utoipa::path(
    get, path = "/api/v1/indexes/{name}", tag = "indexes", operation_id = "getIndex",
    security(("bearer" = [])),
    params(IndexPath),
    responses(
        (status = 200, description = "The index", body = json::Index),
        BadRequest, Unauthorized, NotFound, ServiceUnavailable,
    ),
)]
pub async fn get(
    State(s): State<AppState>,
    auth: Auth,
    Path(IndexPath { name }): Path<IndexPath>,
) -> ApiResult<Response> {
    let def = s.engine.get_index(&auth.caller, &name).await?;
    let shown = json::Index::shown(&def).ok_or_else(|| no_index(&name))?;
    Ok(reply(StatusCode::OK, &shown))
}

/// Every index, built-ins included
#[utoipa::path(
    get, path = "/api/v1/indexes", tag = "indexes", operation_id = "listIndexes",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every index", body = json::IndexList),
        Unauthorized, ServiceUnavailable,
    ),
)]
pub async fn list(State(s): State<AppState>, auth: Auth) -> ApiResult<Response> {
    let defs = s.engine.list_indexes(&auth.caller).await?;
    Ok(reply(
        StatusCode::OK,
        &json::IndexList {
            indexes: defs.iter().filter_map(json::Index::shown).collect(),
        },
    ))
}

/// Drop an index and its rows (administrators)
#[utoipa::path(
    delete, path = "/api/v1/indexes/{name}", tag = "indexes", operation_id = "dropIndex",
    security(("bearer" = [])),
    params(DeclaredIndexPath),
    responses(
        (status = 204, description = "Dropping; its rows go in the background"),
        BadRequest, Unauthorized, Forbidden, NotFound, ServiceUnavailable,
    ),
)]
pub async fn delete(
    State(s): State<AppState>,
    auth: Auth,
    Path(DeclaredIndexPath { name }): Path<DeclaredIndexPath>,
) -> ApiResult<StatusCode> {
    s.engine.drop_index(&auth.caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
