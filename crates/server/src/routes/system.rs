//! Health, metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::json;
use crate::routes::reply;
use crate::AppState;

/// Liveness; touches no data
///
/// The load kit measures the server's own ceiling with it.
#[utoipa::path(
    get, path = "/api/v1/health", tag = "system", operation_id = "health",
    responses((status = 200, description = "Up", body = json::Health)),
)]
pub async fn health() -> Response {
    reply(StatusCode::OK, &json::Health { status: "ok" })
}

/// Prometheus metrics
///
/// Request counts and latency histograms by route and status, store
/// operation latencies, retries, open connections.
#[utoipa::path(
    get, path = "/metrics", tag = "system", operation_id = "metrics",
    responses((status = 200, description = "The Prometheus text exposition", content_type = "text/plain", body = String)),
)]
pub async fn metrics(State(s): State<AppState>) -> Response {
    let mut res = s
        .metrics
        .render(
            s.engine.retries(),
            s.engine.upload_rest(),
            &s.engine.store().counters(),
        )
        .into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    res
}

/// This document
#[utoipa::path(
    get, path = "/api/v1/openapi.json", tag = "system", operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI 3.1 description of this API", body = Object)),
)]
pub async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        crate::openapi::json(),
    )
        .into_response()
}
