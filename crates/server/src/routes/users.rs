//! Users, sessions and `/me`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tarn_engine::NewUser;

use crate::error::ApiResult;
use crate::extract::{Auth, ClientAddr, JsonBody};
use crate::{render, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignUp {
    username: String,
    password: String,
    #[serde(default)]
    properties: Map<String, Value>,
    #[serde(default)]
    admin: bool,
}

pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    JsonBody(body): JsonBody<SignUp>,
) -> ApiResult<impl IntoResponse> {
    let user = s
        .engine
        .create_user(
            &auth.caller,
            NewUser {
                username: body.username,
                password: body.password,
                properties: body.properties,
                admin: body.admin,
            },
            s.config.signup_open,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(render::user(&user))))
}

pub async fn get(
    State(s): State<AppState>,
    Path(username): Path<String>,
) -> ApiResult<Json<Value>> {
    let user = s.engine.get_user(&username).await?;
    Ok(Json(render::public_user(&user)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    username: String,
    password: String,
}

pub async fn sign_in(
    State(s): State<AppState>,
    ClientAddr(addr): ClientAddr,
    JsonBody(body): JsonBody<SignIn>,
) -> ApiResult<impl IntoResponse> {
    let (token, user) = s
        .engine
        .sign_in_throttled(&body.username, &body.password, addr.as_deref())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"token": token, "user": render::user(&user)})),
    ))
}

pub async fn sign_out(State(s): State<AppState>, auth: Auth) -> ApiResult<StatusCode> {
    s.engine.sign_out(&auth.caller).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn me(State(s): State<AppState>, auth: Auth) -> ApiResult<Json<Value>> {
    let me = s.engine.me(&auth.caller).await?;
    Ok(Json(json!({
        "username": me.user.username,
        "properties": me.user.properties,
        "admin": me.user.admin,
        "createdAt": tarn_engine::format_time(me.user.created_at),
        "groups": me.groups,
    })))
}
