//! Health, metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::AppState;

/// Touches no data: the load kit's ceiling.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn metrics(State(s): State<AppState>) -> Response {
    let mut res = s
        .metrics
        .render(s.engine.retries(), &s.engine.store().counters())
        .into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    res
}

pub async fn openapi() -> Json<Value> {
    Json(crate::openapi::document())
}
