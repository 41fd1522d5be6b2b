//! Errors as RFC 9457 problem documents.
//!
//! One table, [`Code`], gives every kind of error the API answers its status
//! and stable `type` slug; engine errors map onto it in one place, and the
//! OpenAPI document describes each operation's errors in its terms (the
//! [`IntoResponses`] types at the bottom, one per status). Internal causes are
//! logged with the request id and never sent.

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tarn_engine::EngineError;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{IntoResponses, ToSchema};

use crate::json::keywords;

/// Every kind of error the API answers: the one table of statuses and slugs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// Malformed or out-of-range input: a body, a query string, a header.
    InvalidInput,
    /// No declared index serves a listing.
    NoIndex,
    /// The operation needs a signed-in caller, or the token is not valid.
    Unauthenticated,
    /// The caller's role does not allow the operation.
    Forbidden,
    /// No such thing, or the caller may not know it exists.
    NotFound,
    /// The route exists but does not take that method.
    MethodNotAllowed,
    /// The thing exists already, or the change would break an invariant.
    Conflict,
    /// A feed cursor older than the changes kept: list again.
    Gone,
    /// `If-Match` named another version than the current one.
    VersionMismatch,
    /// Over a size limit.
    TooLarge,
    /// A JSON body sent with another content type.
    UnsupportedMediaType,
    /// A `Range` the body cannot satisfy.
    RangeNotSatisfiable,
    /// Too many attempts; `Retry-After` says when to try again.
    RateLimited,
    /// The index that serves a listing is still being built.
    IndexBuilding,
    /// The store or the server is busy; `Retry-After` says when to try again.
    Unavailable,
    /// A failure inside the server, logged and never detailed.
    Internal,
}

impl Code {
    /// Every code, in status order.
    pub const ALL: [Code; 16] = [
        Code::InvalidInput,
        Code::NoIndex,
        Code::Unauthenticated,
        Code::Forbidden,
        Code::NotFound,
        Code::MethodNotAllowed,
        Code::Conflict,
        Code::Gone,
        Code::VersionMismatch,
        Code::TooLarge,
        Code::UnsupportedMediaType,
        Code::RangeNotSatisfiable,
        Code::RateLimited,
        Code::Internal,
        Code::IndexBuilding,
        Code::Unavailable,
    ];

    /// The table: status and problem `type` of each code.
    pub const fn entry(self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            Code::InvalidInput => (S::BAD_REQUEST, "invalid-input"),
            Code::NoIndex => (S::BAD_REQUEST, "no-index"),
            Code::Unauthenticated => (S::UNAUTHORIZED, "unauthenticated"),
            Code::Forbidden => (S::FORBIDDEN, "forbidden"),
            Code::NotFound => (S::NOT_FOUND, "not-found"),
            Code::MethodNotAllowed => (S::METHOD_NOT_ALLOWED, "method-not-allowed"),
            Code::Conflict => (S::CONFLICT, "conflict"),
            Code::Gone => (S::GONE, "resync"),
            Code::VersionMismatch => (S::PRECONDITION_FAILED, "version-mismatch"),
            Code::TooLarge => (S::PAYLOAD_TOO_LARGE, "too-large"),
            Code::UnsupportedMediaType => (S::UNSUPPORTED_MEDIA_TYPE, "invalid-input"),
            Code::RangeNotSatisfiable => (S::RANGE_NOT_SATISFIABLE, "invalid-input"),
            Code::RateLimited => (S::TOO_MANY_REQUESTS, "rate-limited"),
            Code::Internal => (S::INTERNAL_SERVER_ERROR, "internal"),
            Code::IndexBuilding => (S::SERVICE_UNAVAILABLE, "index-building"),
            Code::Unavailable => (S::SERVICE_UNAVAILABLE, "unavailable"),
        }
    }

    /// The HTTP status.
    pub const fn status(self) -> StatusCode {
        self.entry().0
    }

    /// The problem `type`.
    pub const fn slug(self) -> &'static str {
        self.entry().1
    }

    /// Whether the answer carries `Retry-After`: the caller may simply try
    /// again later.
    pub const fn retries(self) -> bool {
        matches!(
            self,
            Code::RateLimited | Code::IndexBuilding | Code::Unavailable
        )
    }

    /// The code of an engine error.
    fn of(e: &EngineError) -> Code {
        match e {
            EngineError::InvalidInput(_) => Code::InvalidInput,
            EngineError::Unauthenticated(_) => Code::Unauthenticated,
            EngineError::Forbidden(_) => Code::Forbidden,
            EngineError::NotFound(_) => Code::NotFound,
            EngineError::Conflict(_) => Code::Conflict,
            EngineError::VersionMismatch { .. } => Code::VersionMismatch,
            EngineError::NoIndex { .. } => Code::NoIndex,
            EngineError::IndexBuilding(_) => Code::IndexBuilding,
            EngineError::TooLarge(_) => Code::TooLarge,
            EngineError::Gone(_) => Code::Gone,
            EngineError::RateLimited { .. } => Code::RateLimited,
            EngineError::Unavailable(_) => Code::Unavailable,
            _ => Code::Internal,
        }
    }
}

/// An error on its way to becoming a problem response.
#[derive(Debug)]
pub struct ApiError {
    /// What kind of error: its status and slug.
    pub code: Code,
    /// What the client may read.
    pub detail: String,
    /// Seconds to wait before retrying, for codes that [`Code::retries`].
    pub retry_after: Option<u64>,
    /// The cause, logged and never sent (internal errors only).
    pub cause: Option<String>,
}

impl ApiError {
    /// An error of a code, with a detail.
    pub fn new(code: Code, detail: impl Into<String>) -> ApiError {
        ApiError {
            code,
            detail: detail.into(),
            retry_after: code.retries().then_some(1),
            cause: None,
        }
    }

    /// `400 invalid-input`.
    pub fn invalid(detail: impl Into<String>) -> ApiError {
        ApiError::new(Code::InvalidInput, detail)
    }

    /// `404 not-found`.
    pub fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError::new(Code::NotFound, detail)
    }

    /// `413 too-large`.
    pub fn too_large(detail: impl Into<String>) -> ApiError {
        ApiError::new(Code::TooLarge, detail)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let code = Code::of(&e);
        let retry_after = match &e {
            EngineError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => code.retries().then_some(1),
        };
        let detail = match code {
            Code::Internal => {
                "an internal error occurred; it is logged with this request's id".to_string()
            }
            Code::Unavailable => "the server is busy; try again shortly".to_string(),
            _ => e.to_string(),
        };
        ApiError {
            code,
            detail,
            retry_after,
            cause: matches!(code, Code::Internal | Code::Unavailable).then(|| e.to_string()),
        }
    }
}

/// The logged cause of an error response, for the request log.
#[derive(Clone, Debug)]
pub struct ErrorCause(pub String);

/// An RFC 9457 problem document, as every error is answered.
#[derive(Serialize, ToSchema)]
pub struct Problem<'a> {
    /// A stable slug naming the kind of error.
    #[serde(rename = "type")]
    #[schema(schema_with = slug_schema)]
    pub slug: &'static str,
    /// The status's reason phrase.
    pub title: &'static str,
    /// The HTTP status, repeated.
    #[schema(minimum = 400, maximum = 599)]
    pub status: u16,
    /// What went wrong, for people.
    pub detail: &'a str,
}

/// The `type` of a problem: one of the slugs of the table.
fn slug_schema() -> ObjectBuilder {
    let mut slugs: Vec<&str> = Code::ALL.iter().map(|c| c.slug()).collect();
    slugs.sort_unstable();
    slugs.dedup();
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(slugs))
        .description(Some("A stable slug naming the kind of error"))
}

/// The longest `detail` sent, in bytes: details quote what was refused (a
/// name, a path), which may be as long as the request that held it.
pub const MAX_DETAIL: usize = 2048;

/// `detail` cut to [`MAX_DETAIL`] bytes at a character boundary, saying so.
fn bounded(detail: &str) -> std::borrow::Cow<'_, str> {
    if detail.len() <= MAX_DETAIL {
        return detail.into();
    }
    const CUT: &str = " … (cut)";
    let mut end = MAX_DETAIL - CUT.len();
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &detail[..end]).into()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, slug) = self.code.entry();
        let body = serde_json::to_vec(&Problem {
            slug,
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: &bounded(&self.detail),
        })
        .expect("a problem serialises");
        let mut res = (status, body).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        // RFC 9110, 15.5.2: a 401 names the scheme to authenticate with.
        if status == StatusCode::UNAUTHORIZED {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(cause) = self.cause {
            res.extensions_mut().insert(ErrorCause(cause));
        }
        res
    }
}

/// Result of handlers.
pub type ApiResult<T> = Result<T, ApiError>;

/// The documented response of one error status: problem JSON whose `type`
/// is one of the table's slugs at that status, with `Retry-After` where the
/// table says so.
pub fn problem_response(status: StatusCode) -> utoipa::openapi::Response {
    let codes: Vec<Code> = Code::ALL
        .into_iter()
        .filter(|c| c.status() == status)
        .collect();
    let mut slugs: Vec<String> = codes.iter().map(|c| format!("`{}`", c.slug())).collect();
    slugs.dedup();
    let reason = status.canonical_reason().unwrap_or("Error");
    let mut response = ResponseBuilder::new()
        .description(format!("{reason}: {}", slugs.join(" or ")))
        .content(
            "application/problem+json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        );
    if codes.iter().any(|c| c.retries()) {
        response = response.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0)),
                ))
                .description(Some("Seconds to wait before trying again"))
                .extensions(Some(keywords([("required", true.into())])))
                .build(),
        );
    }
    if status == StatusCode::UNAUTHORIZED {
        response = response.header(
            "WWW-Authenticate",
            HeaderBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                .description(Some("`Bearer`: the scheme to authenticate with"))
                .extensions(Some(keywords([("required", true.into())])))
                .build(),
        );
    }
    if status == StatusCode::RANGE_NOT_SATISFIABLE {
        response = response.header(
            "Content-Range",
            HeaderBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                .description(Some("`bytes */size`: the body's size"))
                .extensions(Some(keywords([("required", true.into())])))
                .build(),
        );
    }
    response.build()
}

macro_rules! problems {
    ($($(#[$doc:meta])* $name:ident => $status:ident,)*) => {
        $(
            $(#[$doc])*
            pub struct $name;

            impl IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
                    let status = StatusCode::$status;
                    BTreeMap::from([(
                        status.as_u16().to_string(),
                        RefOr::T(problem_response(status)),
                    )])
                }
            }
        )*
    };
}

problems! {
    /// `400`: `invalid-input` or `no-index`.
    BadRequest => BAD_REQUEST,
    /// `401 unauthenticated`.
    Unauthorized => UNAUTHORIZED,
    /// `403 forbidden`.
    Forbidden => FORBIDDEN,
    /// `404 not-found`.
    NotFound => NOT_FOUND,
    /// `409 conflict`.
    Conflict => CONFLICT,
    /// `410 resync`: a feed cursor older than the changes kept.
    Gone => GONE,
    /// `412 version-mismatch`.
    PreconditionFailed => PRECONDITION_FAILED,
    /// `413 too-large`.
    PayloadTooLarge => PAYLOAD_TOO_LARGE,
    /// `415`: a JSON body with another content type.
    UnsupportedMediaType => UNSUPPORTED_MEDIA_TYPE,
    /// `416`: a range the body cannot satisfy.
    RangeNotSatisfiable => RANGE_NOT_SATISFIABLE,
    /// `429 rate-limited`, with `Retry-After`.
    TooManyRequests => TOO_MANY_REQUESTS,
    /// `503`: `index-building` or `unavailable`, with `Retry-After`.
    ServiceUnavailable => SERVICE_UNAVAILABLE,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_an_error_status_and_retries_only_when_it_says_so() {
        for c in Code::ALL {
            assert!(c.status().is_client_error() || c.status().is_server_error());
            let e = ApiError::new(c, "x");
            assert_eq!(e.retry_after.is_some(), c.retries(), "{c:?}");
        }
        let statuses: Vec<u16> = Code::ALL.iter().map(|c| c.status().as_u16()).collect();
        assert!(statuses.windows(2).all(|w| w[0] <= w[1]), "in status order");
    }

    #[test]
    fn details_are_cut_at_a_character_boundary() {
        assert_eq!(bounded("short"), "short");
        let exact = "x".repeat(MAX_DETAIL);
        assert_eq!(bounded(&exact), exact);
        for long in ["y".repeat(1_000_000), "é".repeat(MAX_DETAIL)] {
            let cut = bounded(&long);
            assert!(
                cut.len() <= MAX_DETAIL && cut.len() > MAX_DETAIL - 16,
                "{}",
                cut.len()
            );
            assert!(cut.ends_with(" … (cut)"));
            assert!(long.starts_with(cut.trim_end_matches(" … (cut)")));
        }
    }
}
