//! Groups, members and managers.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tarn_engine::Principal;

use crate::error::{ApiError, ApiResult};
use crate::extract::{serde_urlencoded_pairs, Auth, JsonBody};
use crate::{render, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewGroup {
    id: String,
    title: Option<String>,
    #[serde(default)]
    properties: Map<String, Value>,
}

pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    JsonBody(body): JsonBody<NewGroup>,
) -> ApiResult<impl IntoResponse> {
    let g = s
        .engine
        .create_group(&auth.caller, &body.id, body.title, body.properties)
        .await?;
    Ok((StatusCode::CREATED, Json(render::group(&g))))
}

pub async fn get(
    State(s): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(render::group(
        &s.engine.get_group(&auth.caller, &id).await?,
    )))
}

fn principal(p: &str) -> ApiResult<Principal> {
    p.parse().map_err(ApiError::from)
}

pub async fn add_member(
    State(s): State<AppState>,
    auth: Auth,
    Path((id, member)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    s.engine
        .add_member(&auth.caller, &id, &principal(&member)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn remove_member(
    State(s): State<AppState>,
    auth: Auth,
    Path((id, member)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    s.engine
        .remove_member(&auth.caller, &id, &principal(&member)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn members(
    State(s): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    uri: axum::http::Uri,
) -> ApiResult<Json<Value>> {
    let mut limit = 50usize;
    let mut cursor = None;
    for (k, v) in serde_urlencoded_pairs(uri.query().unwrap_or(""))? {
        match k.as_str() {
            "limit" => {
                limit = v
                    .parse()
                    .map_err(|_| ApiError::invalid("limit must be a number from 1 to 1000"))?
            }
            "cursor" => cursor = Some(v),
            other => return Err(ApiError::invalid(format!("unknown parameter {other}"))),
        }
    }
    let page = s
        .engine
        .list_members(&auth.caller, &id, limit, cursor.as_deref())
        .await?;
    Ok(Json(json!({
        "members": page.members.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "next": page.next,
    })))
}

pub async fn add_manager(
    State(s): State<AppState>,
    auth: Auth,
    Path((id, manager)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    s.engine
        .add_manager(&auth.caller, &id, &principal(&manager)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn remove_manager(
    State(s): State<AppState>,
    auth: Auth,
    Path((id, manager)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    s.engine
        .remove_manager(&auth.caller, &id, &principal(&manager)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
