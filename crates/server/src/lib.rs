//! Tarn's HTTP API (axum): routes, authentication, JSON and errors.
//!
//! A handler extracts and validates input, makes one engine call and renders
//! the result; nothing here knows SQL, key encodings or ACL rules.

#![warn(missing_docs)]

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tarn_store::Store;

/// What every request handler can reach: the store's pools, nothing mutable.
#[derive(Clone)]
pub struct AppState {
    /// The store behind the engine.
    pub store: Arc<dyn Store>,
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/api/v1/health", get(health))
        .fallback(not_found)
        .with_state(state)
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn not_found() -> Response {
    problem(StatusCode::NOT_FOUND, "not-found", "no such route")
}

/// An RFC 9457 problem response.
pub fn problem(status: StatusCode, slug: &str, detail: &str) -> Response {
    let body = json!({
        "type": slug,
        "title": status.canonical_reason().unwrap_or(""),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}
