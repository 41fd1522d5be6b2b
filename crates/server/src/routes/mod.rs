//! Every route of the API. Each handler declares its path, parameters,
//! bodies and the statuses it can answer beside its code
//! (`#[utoipa::path]`); [`router`] gathers them into the axum router and
//! the OpenAPI document at once, so neither can name a route the other
//! lacks.

mod bodies;
mod feed;
mod groups;
mod indexes;
mod items;
mod search;
mod system;
mod users;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::json::GivenCursor;
use crate::AppState;

/// The routes and their document (see [`crate::openapi`] for the rest of
/// the document).
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(crate::openapi::base())
        .routes(routes!(system::health))
        .routes(routes!(system::metrics))
        .routes(routes!(system::openapi))
        .routes(routes!(users::create))
        .routes(routes!(users::get, users::patch))
        .routes(routes!(users::sign_in))
        .routes(routes!(users::sign_out))
        .routes(routes!(users::sign_in_cookie))
        .routes(routes!(users::reset_password))
        .routes(routes!(users::me))
        .routes(routes!(groups::create))
        .routes(routes!(groups::get, groups::patch))
        .routes(routes!(groups::members))
        .routes(routes!(groups::add_member, groups::remove_member))
        .routes(routes!(groups::add_manager, groups::remove_manager))
        .routes(routes!(items::create, items::list))
        .routes(routes!(items::get, items::patch, items::delete))
        .routes(routes!(bodies::put, bodies::get))
        .routes(routes!(items::set_acl))
        .routes(routes!(items::create_link, items::list_links))
        .routes(routes!(items::delete_link))
        .routes(routes!(search::search))
        .routes(routes!(feed::changes))
        .routes(routes!(feed::events))
        .routes(routes!(indexes::list))
        .routes(routes!(indexes::put, indexes::get, indexes::delete))
}

/// A JSON response, serialised at once (so it may borrow the handler's
/// values).
pub(crate) fn reply<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => json_response(status, bytes),
        Err(e) => crate::error::ApiError {
            cause: Some(format!("rendering JSON: {e}")),
            ..crate::error::ApiError::new(
                crate::error::Code::Internal,
                "an internal error occurred; it is logged with this request's id",
            )
        }
        .into_response(),
    }
}

/// A page of a paged collection.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Page size.
    #[param(minimum = 1, maximum = 1000, default = 50)]
    limit: Option<u32>,
    /// The `next` of the previous page.
    #[param(value_type = GivenCursor, required = false)]
    cursor: Option<String>,
}

impl PageQuery {
    /// The page size asked for, 50 by default.
    fn limit(&self) -> usize {
        self.limit.map_or(50, |n| n as usize)
    }

    /// Where the page starts: an empty cursor is the first page.
    fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref().filter(|c| !c.is_empty())
    }
}

/// A response of JSON written by hand ([`crate::json::WriteJson`]).
pub(crate) fn reply_written<T: crate::json::WriteJson>(status: StatusCode, body: &T) -> Response {
    let mut bytes = Vec::with_capacity(1024);
    body.write_json(&mut bytes);
    json_response(status, bytes)
}

fn json_response(status: StatusCode, bytes: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        bytes,
    )
        .into_response()
}
