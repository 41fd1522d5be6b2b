//! Groups, members and managers.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use tarn_engine::Principal;
use utoipa::IntoParams;

use crate::error::{
    ApiError, ApiResult, BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge,
    ServiceUnavailable, TooManyRequests, Unauthorized, UnsupportedMediaType,
};
use crate::extract::{Auth, JsonBody, Path, Query};
use crate::json::{self, MemberName, Name};
use crate::routes::{reply, PageQuery};
use crate::AppState;

/// Create a group; the caller manages it
#[utoipa::path(
    post, path = "/api/v1/groups", tag = "groups", operation_id = "createGroup",
    security(("bearer" = [])),
    request_body = json::NewGroup,
    responses(
        (status = 201, description = "The new group", body = json::Group, links(
            ("getGroup" = (operation_id = "getGroup", parameters(("id" = "$response.body#/id")))),
            ("listMembers" = (operation_id = "listMembers", parameters(("id" = "$response.body#/id")))),
            ("addMember" = (operation_id = "addMember", parameters(("id" = "$response.body#/id")))),
            ("removeMember" = (operation_id = "removeMember", parameters(("id" = "$response.body#/id")))),
            ("addManager" = (operation_id = "addManager", parameters(("id" = "$response.body#/id")))),
            ("removeManager" = (operation_id = "removeManager", parameters(("id" = "$response.body#/id")))),
        )),
        BadRequest, Unauthorized, Conflict, PayloadTooLarge, UnsupportedMediaType,
        TooManyRequests, ServiceUnavailable,
    ),
)]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    JsonBody(body): JsonBody<json::NewGroup>,
) -> ApiResult<Response> {
    let g = s
        .engine
        .create_group(&auth.caller, &body.id, body.title, body.properties)
        .await?;
    Ok(reply(StatusCode::CREATED, &json::Group::from(&g)))
}

/// The path of a group.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct GroupPath {
    /// The group's id.
    #[param(value_type = Name)]
    id: String,
}

/// The path of a member or manager of a group.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct GroupPrincipalPath {
    /// The group's id.
    #[param(value_type = Name)]
    id: String,
    /// `user:<name>` or `group:<id>`.
    #[param(value_type = MemberName)]
    principal: String,
}

impl GroupPrincipalPath {
    /// The principal: only users and groups are members and managers.
    fn principal(&self) -> ApiResult<Principal> {
        match self.principal.parse().map_err(ApiError::from)? {
            p @ (Principal::User(_) | Principal::Group(_)) => Ok(p),
            _ => Err(ApiError::invalid(
                "members and managers are user:<name> or group:<id>",
            )),
        }
    }
}

/// A group
#[utoipa::path(
    get, path = "/api/v1/groups/{id}", tag = "groups", operation_id = "getGroup",
    security(("bearer" = [])),
    params(GroupPath),
    responses(
        (status = 200, description = "The group", body = json::Group),
        BadRequest, Unauthorized, NotFound, ServiceUnavailable,
    ),
)]
pub async fn get(
    State(s): State<AppState>,
    auth: Auth,
    Path(GroupPath { id }): Path<GroupPath>,
) -> ApiResult<Response> {
    let g = s.engine.get_group(&auth.caller, &id).await?;
    Ok(reply(StatusCode::OK, &json::Group::from(&g)))
}

/// Change a group's title or properties (managers)
///
/// `title` replaces the title; `properties` is a JSON merge patch
/// (RFC 7396) of the properties. What the body leaves out stays.
#[utoipa::path(
    patch, path = "/api/v1/groups/{id}", tag = "groups", operation_id = "patchGroup",
    security(("bearer" = [])),
    params(GroupPath),
    request_body(content(
        (json::GroupPatch = "application/json"),
        (json::GroupPatch = "application/merge-patch+json"),
    )),
    responses(
        (status = 200, description = "The group, changed", body = json::Group),
        BadRequest, Unauthorized, Forbidden, NotFound, PayloadTooLarge, UnsupportedMediaType,
        ServiceUnavailable,
    ),
)]
pub async fn patch(
    State(s): State<AppState>,
    auth: Auth,
    Path(GroupPath { id }): Path<GroupPath>,
    JsonBody(body): JsonBody<json::GroupPatch>,
) -> ApiResult<Response> {
    let g = s
        .engine
        .patch_group(&auth.caller, &id, body.title, body.properties)
        .await?;
    Ok(reply(StatusCode::OK, &json::Group::from(&g)))
}

/// Add a user or group (managers)
///
/// A membership that would make a cycle, nest groups too deep or put anyone
/// in too many groups answers `409`.
#[utoipa::path(
    put, path = "/api/v1/groups/{id}/members/{principal}", tag = "groups",
    operation_id = "addMember",
    security(("bearer" = [])),
    params(GroupPrincipalPath),
    responses(
        (status = 204, description = "A member now"),
        BadRequest, Unauthorized, Forbidden, NotFound, Conflict, ServiceUnavailable,
    ),
)]
pub async fn add_member(
    State(s): State<AppState>,
    auth: Auth,
    Path(path): Path<GroupPrincipalPath>,
) -> ApiResult<StatusCode> {
    s.engine
        .add_member(&auth.caller, &path.id, &path.principal()?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove a member (managers; anyone may leave)
#[utoipa::path(
    delete, path = "/api/v1/groups/{id}/members/{principal}", tag = "groups",
    operation_id = "removeMember",
    security(("bearer" = [])),
    params(GroupPrincipalPath),
    responses(
        (status = 204, description = "Not a member (any more)"),
        BadRequest, Unauthorized, Forbidden, NotFound, ServiceUnavailable,
    ),
)]
pub async fn remove_member(
    State(s): State<AppState>,
    auth: Auth,
    Path(path): Path<GroupPrincipalPath>,
) -> ApiResult<StatusCode> {
    s.engine
        .remove_member(&auth.caller, &path.id, &path.principal()?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A page of a group's direct members
#[utoipa::path(
    get, path = "/api/v1/groups/{id}/members", tag = "groups", operation_id = "listMembers",
    security(("bearer" = [])),
    params(GroupPath, PageQuery),
    responses(
        (status = 200, description = "Members in principal order", body = json::MemberPage),
        BadRequest, Unauthorized, NotFound, ServiceUnavailable,
    ),
)]
pub async fn members(
    State(s): State<AppState>,
    auth: Auth,
    Path(GroupPath { id }): Path<GroupPath>,
    Query(q): Query<PageQuery>,
) -> ApiResult<Response> {
    let page = s
        .engine
        .list_members(&auth.caller, &id, q.limit(), q.cursor())
        .await?;
    Ok(reply(
        StatusCode::OK,
        &json::MemberPage {
            members: &page.members,
            next: page.next.as_deref(),
        },
    ))
}

/// Add a manager (managers)
#[utoipa::path(
    put, path = "/api/v1/groups/{id}/managers/{principal}", tag = "groups",
    operation_id = "addManager",
    security(("bearer" = [])),
    params(GroupPrincipalPath),
    responses(
        (status = 204, description = "A manager now"),
        BadRequest, Unauthorized, Forbidden, NotFound, Conflict, ServiceUnavailable,
    ),
)]
pub async fn add_manager(
    State(s): State<AppState>,
    auth: Auth,
    Path(path): Path<GroupPrincipalPath>,
) -> ApiResult<StatusCode> {
    s.engine
        .add_manager(&auth.caller, &path.id, &path.principal()?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove a manager; one always stays
#[utoipa::path(
    delete, path = "/api/v1/groups/{id}/managers/{principal}", tag = "groups",
    operation_id = "removeManager",
    security(("bearer" = [])),
    params(GroupPrincipalPath),
    responses(
        (status = 204, description = "Not a manager (any more)"),
        BadRequest, Unauthorized, Forbidden, NotFound, Conflict, ServiceUnavailable,
    ),
)]
pub async fn remove_manager(
    State(s): State<AppState>,
    auth: Auth,
    Path(path): Path<GroupPrincipalPath>,
) -> ApiResult<StatusCode> {
    s.engine
        .remove_manager(&auth.caller, &path.id, &path.principal()?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
