//! Errors as RFC 9457 problem documents. One table maps every engine error to
//! its status and stable `type` slug; internal causes are logged with the
//! request id and never sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tarn_engine::EngineError;

/// An error on its way to becoming a problem response.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable slug, the problem's `type`.
    pub slug: &'static str,
    /// What the client may read.
    pub detail: String,
    /// Seconds to wait before retrying, for 429 and 503.
    pub retry_after: Option<u64>,
    /// The cause, logged and never sent (internal errors only).
    pub cause: Option<String>,
}

impl ApiError {
    /// An error with a status, slug and detail.
    pub fn new(status: StatusCode, slug: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            slug,
            detail: detail.into(),
            retry_after: None,
            cause: None,
        }
    }

    /// `400 invalid-input`.
    pub fn invalid(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid-input", detail)
    }

    /// `404 not-found`.
    pub fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    /// `413 too-large`.
    pub fn too_large(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too-large", detail)
    }
}

/// The table: engine error → status and slug.
impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        use StatusCode as S;
        let (status, slug) = match &e {
            EngineError::InvalidInput(_) => (S::BAD_REQUEST, "invalid-input"),
            EngineError::Unauthenticated(_) => (S::UNAUTHORIZED, "unauthenticated"),
            EngineError::Forbidden(_) => (S::FORBIDDEN, "forbidden"),
            EngineError::NotFound(_) => (S::NOT_FOUND, "not-found"),
            EngineError::Conflict(_) => (S::CONFLICT, "conflict"),
            EngineError::VersionMismatch { .. } => (S::PRECONDITION_FAILED, "version-mismatch"),
            EngineError::NoIndex { .. } => (S::BAD_REQUEST, "no-index"),
            EngineError::IndexBuilding(_) => (S::SERVICE_UNAVAILABLE, "index-building"),
            EngineError::TooLarge(_) => (S::PAYLOAD_TOO_LARGE, "too-large"),
            EngineError::Gone(_) => (S::GONE, "resync"),
            EngineError::RateLimited { .. } => (S::TOO_MANY_REQUESTS, "rate-limited"),
            EngineError::Unavailable(_) => (S::SERVICE_UNAVAILABLE, "unavailable"),
            _ => (S::INTERNAL_SERVER_ERROR, "internal"),
        };
        let internal = status == S::INTERNAL_SERVER_ERROR;
        let retry_after = match (&e, slug) {
            (EngineError::RateLimited { retry_after, .. }, _) => Some(*retry_after),
            (_, "unavailable" | "index-building") => Some(1),
            _ => None,
        };
        let detail = if internal {
            "an internal error occurred; it is logged with this request's id".to_string()
        } else if matches!(e, EngineError::Unavailable(_)) {
            "the server is busy; try again shortly".to_string()
        } else {
            e.to_string()
        };
        ApiError {
            status,
            slug,
            detail,
            retry_after,
            cause: (internal || slug == "unavailable").then(|| e.to_string()),
        }
    }
}

/// The logged cause of an error response, for the request log.
#[derive(Clone, Debug)]
pub struct ErrorCause(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "type": self.slug,
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut res = (self.status, body.to_string()).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(cause) = self.cause {
            res.extensions_mut().insert(ErrorCause(cause));
        }
        res
    }
}

/// Result of handlers.
pub type ApiResult<T> = Result<T, ApiError>;
