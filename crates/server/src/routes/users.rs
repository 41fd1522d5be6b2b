//! Users, sessions and `/me`.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::Required;
use utoipa::IntoParams;

use crate::error::{
    ApiResult, BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge, ServiceUnavailable,
    TooManyRequests, Unauthorized, UnsupportedMediaType,
};
use crate::extract::{
    check_same_origin, session_cookie, session_cookie_name, Auth, ClientAddr, JsonBody, Path, Via,
    SECURE_SESSION_COOKIE, SESSION_COOKIE,
};
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
    security((), ("bearer" = [])),
    params(UserPath),
    responses(
        (status = 200, description = "What any caller may see of the user", body = json::PublicUser),
        BadRequest, Unauthorized, NotFound, ServiceUnavailable,
    ),
)]
pub async fn get(
    State(s): State<AppState>,
    auth: Auth,
    Path(UserPath { username }): Path<UserPath>,
) -> ApiResult<Response> {
    let user = s.engine.get_user(&auth.caller, &username).await?;
    Ok(reply(
        StatusCode::OK,
        &json::PublicUser {
            username: &user.username,
            properties: &user.properties,
        },
    ))
}

/// Change a user's properties (the user, or an administrator)
///
/// `properties` is a JSON merge patch (RFC 7396): `null` removes a key,
/// and what the patch leaves out stays.
#[utoipa::path(
    patch, path = "/api/v1/users/{username}", tag = "users", operation_id = "patchUser",
    security(("bearer" = [])),
    params(UserPath),
    request_body(content(
        (json::UserPatch = "application/json"),
        (json::UserPatch = "application/merge-patch+json"),
    )),
    responses(
        (status = 200, description = "The user, changed", body = json::User),
        BadRequest, Unauthorized, Forbidden, NotFound, PayloadTooLarge, UnsupportedMediaType,
        ServiceUnavailable,
    ),
)]
pub async fn patch(
    State(s): State<AppState>,
    auth: Auth,
    Path(UserPath { username }): Path<UserPath>,
    JsonBody(body): JsonBody<json::UserPatch>,
) -> ApiResult<Response> {
    let user = s
        .engine
        .patch_user(&auth.caller, &username, &body.properties)
        .await?;
    Ok(reply(StatusCode::OK, &json::User::from(&user)))
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
///
/// Ends the session of the bearer token, and the session of the web app's
/// cookie when the request presents one (both, when it presents both); a
/// request that presented the cookie is answered with a `Set-Cookie` that
/// clears it, whatever the sign-out's outcome. (A request signed in by the
/// cookie alone must prove its origin first, as every cookie write: one
/// that does not is refused `403`, and its cookie stays.)
#[utoipa::path(
    delete, path = "/api/v1/sessions/current", tag = "users", operation_id = "signOut",
    security(("bearer" = [])),
    responses(
        (status = 204, description = "The token no longer works", headers(
            ("Set-Cookie" = String, description = "Clears the session cookie, when the request presented one"),
        )),
        Unauthorized, ServiceUnavailable,
    ),
)]
pub async fn sign_out(
    State(s): State<AppState>,
    headers: HeaderMap,
    via: Via,
    auth: Auth,
) -> Response {
    // A bearer token beside the cookie: the cookie's session ends too,
    // whatever became of the token's, or a shared machine's browser would
    // stay signed in (one engine call, one write).
    let cookie = session_cookie(&headers, via.tls).filter(|_| !auth.by_cookie);
    let outcome = s
        .engine
        .sign_out_with(&auth.caller, cookie.as_deref())
        .await;
    let mut res = match outcome {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => crate::error::ApiError::from(e).into_response(),
    };
    // Over HTTPS both names are cleared: a `tarn_session` set before the
    // server sat behind a TLS proxy is no credential there any more.
    let names: &[&str] = if via.tls {
        &[SECURE_SESSION_COOKIE, SESSION_COOKIE]
    } else {
        &[SESSION_COOKIE]
    };
    let sent = |name: &str| {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(';')
                    .any(|p| p.trim().starts_with(&format!("{name}=")))
            })
    };
    for name in names.iter().filter(|n| sent(n)) {
        if let Ok(v) = HeaderValue::from_str(&crate::extract::cleared_cookie(name, via.tls)) {
            res.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    res
}

/// `X-Tarn-CSRF: 1`, which the cookie sign-in needs.
pub struct CsrfHeader;

impl IntoParams for CsrfHeader {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![ParameterBuilder::new()
            .name("X-Tarn-CSRF")
            .parameter_in(ParameterIn::Header)
            .required(Required::True)
            .description(Some(
                "Always `1`: proves the request comes from a page of this origin (another site's page cannot send it without a CORS preflight)",
            ))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["1"])),
            ))
            .build()]
    }
}

/// Sign in the web app: a session in an HttpOnly cookie
///
/// The same check as `POST /api/v1/sessions`, but the session's token is
/// never shown to script: it is set as the cookie `tarn_session`
/// (`HttpOnly; SameSite=Strict; Path=/`), or, when a trusted proxy says
/// the client spoke HTTPS, `__Host-tarn_session` with `Secure` (which no
/// other site or subdomain can plant); the server takes it on every request
/// without `Authorization`. Requests signed in by the cookie that change
/// something must carry `X-Tarn-CSRF: 1` and come from this origin.
#[utoipa::path(
    post, path = "/api/v1/sessions/cookie", tag = "users", operation_id = "signInCookie",
    params(CsrfHeader),
    request_body = json::SignIn,
    responses(
        (status = 201, description = "Signed in; the session is in the cookie", body = json::User, headers(
            ("Set-Cookie" = String, description = "`tarn_session=<token>; Path=/; HttpOnly; SameSite=Strict; Max-Age=<seconds>`; over HTTPS `__Host-tarn_session=<token>; …; Secure`"),
        )),
        BadRequest, Unauthorized, Forbidden, PayloadTooLarge, UnsupportedMediaType, TooManyRequests,
        ServiceUnavailable,
    ),
)]
pub async fn sign_in_cookie(
    State(s): State<AppState>,
    ClientAddr(addr): ClientAddr,
    via: Via,
    headers: HeaderMap,
    JsonBody(body): JsonBody<json::SignIn>,
) -> ApiResult<Response> {
    // Without `X-Tarn-CSRF: 1` this is `403`, as every cookie write.
    check_same_origin(&headers, &via)?;
    let (token, user) = s
        .engine
        .sign_in_throttled(&body.username, &body.password, addr.as_deref())
        .await?;
    let max_age = s.engine.config().session_ttl.as_secs();
    let secure = if via.tls { "; Secure" } else { "" };
    let cookie = format!(
        "{}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}",
        session_cookie_name(via.tls)
    );
    let mut res = reply(StatusCode::CREATED, &json::User::from(&user));
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|_| {
            crate::error::ApiError::new(
                crate::error::Code::Internal,
                "the session token is not a header value",
            )
        })?,
    );
    Ok(res)
}

/// Set a user's password (administrators), or change your own
///
/// An administrator sets any user's password without `currentPassword`,
/// and every session of that user ends at once, on every node. A user
/// changes their own by also giving `currentPassword` (a wrong one is
/// `403`, and failures are slowed and counted as failed sign-ins are);
/// their other sessions end, the one asking goes on.
#[utoipa::path(
    put, path = "/api/v1/users/{username}/password", tag = "users", operation_id = "resetPassword",
    security(("bearer" = [])),
    params(UserPath),
    request_body = json::NewPassword,
    responses(
        (status = 204, description = "The password is set and the user's sessions are ended"),
        BadRequest, Unauthorized, Forbidden, NotFound, Conflict, PayloadTooLarge,
        UnsupportedMediaType, TooManyRequests, ServiceUnavailable,
    ),
)]
pub async fn reset_password(
    State(s): State<AppState>,
    auth: Auth,
    ClientAddr(addr): ClientAddr,
    Path(UserPath { username }): Path<UserPath>,
    JsonBody(body): JsonBody<json::NewPassword>,
) -> ApiResult<StatusCode> {
    match &body.current_password {
        Some(current) => {
            s.engine
                .change_own_password(
                    &auth.caller,
                    &username,
                    current,
                    &body.password,
                    addr.as_deref(),
                )
                .await?
        }
        None => {
            s.engine
                .reset_password(&auth.caller, &username, &body.password)
                .await?
        }
    };
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
