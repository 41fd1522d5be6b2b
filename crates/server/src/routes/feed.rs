//! The change feed: `/changes` pages and `/events` streams.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::Response;
use futures_util::{Stream, StreamExt};
use tarn_engine::Event;
use utoipa::IntoParams;

use crate::error::{
    ApiError, ApiResult, BadRequest, Gone, ServiceUnavailable, TooManyRequests, Unauthorized,
};
use crate::extract::{serde_urlencoded_pairs, Auth, ClientAddr};
use crate::json::{self, GivenCursor, Name};
use crate::routes::reply;
use crate::AppState;

/// The query of `/changes`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ChangesParams {
    /// A cursor (a change's, or a page's `next`); without it, the current
    /// end: no changes, and the cursor to poll from.
    #[param(value_type = GivenCursor, required = false)]
    since: Option<String>,
    /// Only changes of items of this kind.
    #[param(value_type = Name, required = false)]
    kind: Option<String>,
    /// The most changes returned.
    #[param(minimum = 1, maximum = 1000, default = 50)]
    limit: Option<u32>,
}

/// The query of `/events`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsParams {
    /// A cursor to resume after (or the `Last-Event-ID` header, which wins);
    /// without either, from now.
    #[param(value_type = GivenCursor, required = false)]
    since: Option<String>,
    /// Only changes of items of this kind.
    #[param(value_type = Name, required = false)]
    kind: Option<String>,
}

/// Parses a feed query: `since`, `kind` and, when `limit` is `Some`,
/// `limit`; each at most once, an empty `since` too.
fn feed_query(
    parts: &Parts,
    mut limit: Option<&mut Option<u32>>,
) -> ApiResult<(Option<String>, Option<String>)> {
    let (mut since, mut kind) = (None, None);
    for (k, v) in serde_urlencoded_pairs(parts.uri.query().unwrap_or(""))? {
        let dup = || ApiError::invalid(format!("{k} is given twice"));
        match (k.as_str(), limit.as_deref_mut()) {
            ("since", _) if since.is_some() => return Err(dup()),
            ("since", _) => since = Some(v),
            ("kind", _) if kind.is_some() => return Err(dup()),
            ("kind", _) if !tarn_engine::is_valid_name(&v) => {
                return Err(ApiError::invalid(format!("kind {v:?} is not a valid kind")))
            }
            ("kind", _) => kind = Some(v),
            ("limit", Some(Some(_))) => return Err(dup()),
            ("limit", Some(slot)) => {
                *slot = Some(
                    v.parse()
                        .map_err(|_| ApiError::invalid("limit must be a number from 1 to 1000"))?,
                )
            }
            // A link key opens its one item, never a feed: taken and ignored.
            ("key", _) => {}
            (other, _) => return Err(ApiError::invalid(format!("unknown parameter {other}"))),
        }
    }
    // Empty: from the current end, as without it (`since=${next ?? ''}`).
    Ok((since.filter(|c| !c.is_empty()), kind))
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ChangesParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<ChangesParams> {
        let mut limit = None;
        let (since, kind) = feed_query(parts, Some(&mut limit))?;
        Ok(ChangesParams { since, kind, limit })
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for EventsParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<EventsParams> {
        let (mut since, kind) = feed_query(parts, None)?;
        // A browser's EventSource resumes with Last-Event-ID by itself.
        if let Some(v) = parts.headers.get("last-event-id") {
            let v = v
                .to_str()
                .map_err(|_| ApiError::invalid("Last-Event-ID is not text"))?;
            if !v.is_empty() {
                since = Some(v.to_string());
            }
        }
        Ok(EventsParams { since, kind })
    }
}

/// A page of the changes the caller may see, in commit order
///
/// A caller sees a change only if it could read the item before or after
/// it; `remove` says only that the item is no longer visible. A cursor
/// older than the changes kept answers `410` with `type` `resync`: list
/// again, then read on from a fresh cursor.
#[utoipa::path(
    get, path = "/api/v1/changes", tag = "changes", operation_id = "changes",
    security((), ("bearer" = [])),
    params(ChangesParams),
    responses(
        (status = 200, description = "A page of changes", body = json::ChangePage),
        BadRequest, Unauthorized, Gone, ServiceUnavailable,
    ),
)]
pub async fn changes(
    State(s): State<AppState>,
    auth: Auth,
    params: ChangesParams,
) -> ApiResult<Response> {
    let page = s
        .engine
        .changes(
            &auth.caller,
            params.since.as_deref(),
            params.kind.as_deref(),
            params.limit.map_or(50, |n| n as usize),
        )
        .await?;
    Ok(reply(
        StatusCode::OK,
        &json::ChangePage {
            changes: page.changes.iter().map(json::Change::from).collect(),
            next: &page.next,
            resync: page.resync,
        },
    ))
}

/// The changes the caller may see, live (server-sent events)
///
/// Each change is one event whose `id` is its cursor and whose `data` is
/// the change as JSON (the schema `Change`), so an `EventSource` resumes
/// by itself. A comment line comes at least every 15 s while idle. When
/// the caller's groups change, or a cursor is older than the changes kept,
/// an `event: resync` with `data: {}` comes instead and the stream stays
/// open: the client lists again what it shows.
#[utoipa::path(
    get, path = "/api/v1/events", tag = "changes", operation_id = "events",
    security((), ("bearer" = [])),
    params(
        EventsParams,
        ("Last-Event-ID" = Option<String>, Header, description = "The cursor to resume after, as an `EventSource` sends it"),
    ),
    responses(
        (status = 200, description = "A stream of changes that stays open",
            content_type = "text/event-stream", body = String),
        BadRequest, Unauthorized, TooManyRequests, ServiceUnavailable,
    ),
)]
pub async fn events(
    State(s): State<AppState>,
    auth: Auth,
    ClientAddr(address): ClientAddr,
    params: EventsParams,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let sub = s
        .engine
        .subscribe_from(
            &auth.caller,
            params.since.as_deref(),
            params.kind.as_deref(),
            address.as_deref(),
        )
        .await?;
    let stopped = s.stopped();
    let stream = futures_util::stream::unfold(Some(sub), |sub| async move {
        let mut sub = sub?;
        match sub.next().await {
            Ok(Event::Change(c)) => {
                let data =
                    serde_json::to_string(&json::Change::from(&*c)).expect("a change serialises");
                let e = SseEvent::default().id(c.cursor.clone()).data(data);
                Some((Ok(e), Some(sub)))
            }
            Ok(Event::Resync) => {
                let e = SseEvent::default().event("resync").data("{}");
                Some((Ok(e), Some(sub)))
            }
            // The session ended: the stream ends.
            Err(e) => {
                tracing::info!(error = %e, "event stream ends");
                None
            }
        }
    })
    .take_until(stopped);
    Ok(Sse::new(stream).keep_alive(
        // At least every 15 s, says the contract: every 10, so that no
        // timer's lateness makes a gap of 15.
        KeepAlive::new()
            .interval(Duration::from_secs(10))
            .text("keep-alive"),
    ))
}
