//! Extractors: who is calling, link keys, `If-Match`, JSON bodies.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, IF_MATCH};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use tarn_engine::Caller;

use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// The caller, from `Authorization: Bearer <token>`; anonymous without one.
pub struct Auth {
    /// Who is calling.
    pub caller: Caller,
    /// The session token, if one was given.
    pub token: Option<String>,
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Auth> {
        let Some(value) = parts.headers.get(AUTHORIZATION) else {
            return Ok(Auth {
                caller: Caller::Anonymous,
                token: None,
            });
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= 256)
            .ok_or_else(|| {
                ApiError::new(
                    axum::http::StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    "use Authorization: Bearer <token>",
                )
            })?;
        let caller = state.engine.authenticate(token).await?;
        Ok(Auth {
            caller,
            token: Some(token.to_string()),
        })
    }
}

/// A link key, from `?key=` or the `Tarn-Link-Key` header.
pub struct LinkKey(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for LinkKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<LinkKey> {
        if let Some(v) = parts.headers.get("tarn-link-key") {
            let v = v
                .to_str()
                .map_err(|_| ApiError::invalid("Tarn-Link-Key is not text"))?;
            return Ok(LinkKey(Some(v.to_string())));
        }
        let query = parts.uri.query().unwrap_or("");
        let pairs: Vec<(String, String)> = serde_urlencoded_pairs(query)?;
        Ok(LinkKey(
            pairs.into_iter().find(|(k, _)| k == "key").map(|(_, v)| v),
        ))
    }
}

/// Parses a query string into pairs.
pub fn serde_urlencoded_pairs(query: &str) -> ApiResult<Vec<(String, String)>> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(
        &format!("/?{query}")
            .parse()
            .map_err(|_| ApiError::invalid("malformed query string"))?,
    )
    .map(|q| q.0)
    .map_err(|_| ApiError::invalid("malformed query string"))
}

/// `If-Match: "<version>"`; `*` or absent means any version.
pub struct IfMatch(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<IfMatch> {
        let Some(v) = parts.headers.get(IF_MATCH) else {
            return Ok(IfMatch(None));
        };
        let bad = || ApiError::invalid("If-Match takes one ETag of this server, like \"3\"");
        let v = v.to_str().map_err(|_| bad())?.trim();
        if v == "*" {
            return Ok(IfMatch(None));
        }
        let v = v.strip_prefix("W/").unwrap_or(v);
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .ok_or_else(bad)?;
        v.parse().map(|n| IfMatch(Some(n))).map_err(|_| bad())
    }
}

/// The client's address, when the server knows it.
pub struct ClientAddr(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<ClientAddr> {
        Ok(ClientAddr(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip().to_string()),
        ))
    }
}

/// A JSON request body: `application/json`, at most the configured size,
/// refused before it is read whole when it is larger.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> ApiResult<JsonBody<T>> {
        let limit = state.config.max_json;
        let ct = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if essence != "application/json" && essence != "application/merge-patch+json" {
            return Err(ApiError::new(
                axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid-input",
                "send JSON with Content-Type: application/json",
            ));
        }
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(ApiError::too_large(format!(
                "a JSON body is at most {limit} bytes"
            )));
        }
        let bytes = axum::body::to_bytes(req.into_body(), limit)
            .await
            .map_err(|e| {
                let inner = e.into_inner();
                if inner.is::<http_body_util::LengthLimitError>() {
                    ApiError::too_large(format!("a JSON body is at most {limit} bytes"))
                } else {
                    ApiError::invalid(format!("the request body could not be read: {inner}"))
                }
            })?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::invalid(format!("malformed JSON: {e}")))
    }
}
