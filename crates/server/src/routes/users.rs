//! Users, sessions and `/me`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::error::{
    ApiResult, BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge, ServiceUnavailable,
    TooManyRequests, Unauthorized, UnsupportedMediaType,
};
use crate::extract::{Auth, ClientAddr, JsonBody, Path};
use crate::json::{self, Name, Time};
use crate::routes::reply;
use crate::AppState;

/// Sign up (or, administrators, create a user)
///
/// Sign-up is open unless the server runs with sign-up closed; then only an
/// administrator may create users. Only an administrator may create an
/// administrator.
#[utoipa::path(
    post, path = "/api/v1/users", tag = "users", operation_id = "createUser",
    security((), ("bearer" = [])),
    request_body = json::NewUser,
    responses(
        (status = 201, description = "The new user", body = json::User, links(
            ("getUser" = (operation_id = "getUser", parameters(("username" = "$response.body#/username")))),
        )),
        BadRequest, Unauthorized, Forbidden, Conflict, PayloadTooLarge, UnsupportedMediaType,
        ServiceUnavailable,
    ),
)]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    JsonBody(body): JsonBody<json::NewUser>,
) -> ApiResult<Response> {
    let user = s
        .engine
        .create_user(
            &auth.caller,
            tarn_engine::NewUser {
                username: body.username,
                password: body.password,
                properties: body.properties,
                admin: body.admin,
            },
            s.config.signup_open,
        )
        .await?;
    Ok(reply(StatusCode::CREATED, &json::User::from(&user)))
}

/// The path of a user.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct UserPath {
    /// The username.
    #[param(value_type = Name)]
    username: String,
}

/// A user's public profile
#[utoipa::path(
    get, path = "/api/v1/users/{username}", tag = "users", operation_id = "getUser",
    params(UserPath),
    responses(
        (status = 200, description = "What any caller may see of the user", body = json::PublicUser),
        BadRequest, NotFound, ServiceUnavailable,
    ),
)]
pub async fn get(
    State(s): State<AppState>,
    Path(UserPath { username }): Path<UserPath>,
) -> ApiResult<Response> {
    let user = s.engine.get_user(&username).await?;
    Ok(reply(
        StatusCode::OK,
        &json::PublicUser {
            username: &user.username,
            properties: &user.properties,
        },
    ))
}

/// Sign in
///
/// Wrong username and wrong password answer the same. Failed sign-ins are
/// slowed per username and client address; an address that keeps failing
/// is refused with `429` whatever it sends next.
#[utoipa::path(
    post, path = "/api/v1/sessions", tag = "users", operation_id = "signIn",
    request_body = json::SignIn,
    responses(
        (status = 201, description = "A new session", body = json::Session),
        BadRequest, Unauthorized, PayloadTooLarge, UnsupportedMediaType, TooManyRequests,
        ServiceUnavailable,
    ),
)]
pub async fn sign_in(
    State(s): State<AppState>,
    ClientAddr(addr): ClientAddr,
    JsonBody(body): JsonBody<json::SignIn>,
) -> ApiResult<Response> {
    let (token, user) = s
        .engine
        .sign_in_throttled(&body.username, &body.password, addr.as_deref())
        .await?;
    Ok(reply(
        StatusCode::CREATED,
        &json::Session {
            token: &token,
            user: json::User::from(&user),
        },
    ))
}

/// End this session on every node
#[utoipa::path(
    delete, path = "/api/v1/sessions/current", tag = "users", operation_id = "signOut",
    security(("bearer" = [])),
    responses(
        (status = 204, description = "The token no longer works"),
        Unauthorized, ServiceUnavailable,
    ),
)]
pub async fn sign_out(State(s): State<AppState>, auth: Auth) -> ApiResult<StatusCode> {
    s.engine.sign_out(&auth.caller).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The caller and all their groups
#[utoipa::path(
    get, path = "/api/v1/me", tag = "users", operation_id = "me",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The caller", body = json::Me),
        Unauthorized, ServiceUnavailable,
    ),
)]
pub async fn me(State(s): State<AppState>, auth: Auth) -> ApiResult<Response> {
    let me = s.engine.me(&auth.caller).await?;
    Ok(reply(
        StatusCode::OK,
        &json::Me {
            username: &me.user.username,
            properties: &me.user.properties,
            admin: me.user.admin,
            created_at: Time(me.user.created_at),
            groups: &me.groups,
        },
    ))
}
