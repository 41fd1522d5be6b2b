//! Index declarations (administrators).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tarn_engine::{SortField, TextField};

use crate::error::ApiResult;
use crate::extract::{Auth, JsonBody};
use crate::{render, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declare {
    kind: String,
    #[serde(default, rename = "where")]
    where_: Vec<String>,
    #[serde(default)]
    sort: Vec<SortField>,
    /// A text index's fields (a text index has no `sort`).
    #[serde(default)]
    text: Vec<TextField>,
    /// A text index's stemmer.
    language: Option<String>,
}

pub async fn put(
    State(s): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<Declare>,
) -> ApiResult<impl IntoResponse> {
    let (def, created) = if body.text.is_empty() {
        if body.language.is_some() {
            return Err(crate::error::ApiError::invalid(
                "language is for text indexes: give text fields",
            ));
        }
        s.engine
            .declare_index(&auth.caller, &name, &body.kind, body.where_, body.sort)
            .await?
    } else {
        if !body.sort.is_empty() {
            return Err(crate::error::ApiError::invalid(
                "a text index has no sort: results are ordered by score",
            ));
        }
        s.engine
            .declare_text_index(
                &auth.caller,
                &name,
                &body.kind,
                body.where_,
                body.text,
                body.language,
            )
            .await?
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(render::index(&def))))
}

pub async fn get(
    State(s): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(render::index(
        &s.engine.get_index(&auth.caller, &name).await?,
    )))
}

pub async fn list(State(s): State<AppState>, auth: Auth) -> ApiResult<Json<Value>> {
    let defs = s.engine.list_indexes(&auth.caller).await?;
    Ok(Json(
        json!({"indexes": defs.iter().map(render::index).collect::<Vec<_>>()}),
    ))
}

pub async fn delete(
    State(s): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    s.engine.drop_index(&auth.caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
