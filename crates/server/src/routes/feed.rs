//! The change feed: `/changes` pages and `/events` streams.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Json;
use futures_util::Stream;
use serde_json::{json, Value};
use tarn_engine::{Change, ChangeOp, Event};

use crate::error::{ApiError, ApiResult};
use crate::extract::{serde_urlencoded_pairs, Auth};
use crate::{render, AppState};

/// A change as api.md writes it.
fn change(c: &Change) -> Value {
    let mut out = json!({
        "cursor": c.cursor,
        "op": match c.op { ChangeOp::Put => "put", ChangeOp::Remove => "remove" },
        "id": c.id,
        "kind": c.kind,
        "version": c.version,
        "at": tarn_engine::format_time(c.at),
    });
    if let Some(item) = &c.item {
        out["item"] = render::item(item);
    }
    out
}

struct FeedQuery {
    since: Option<String>,
    kind: Option<String>,
    limit: usize,
}

fn feed_query(uri: &axum::http::Uri, with_limit: bool) -> ApiResult<FeedQuery> {
    let mut q = FeedQuery {
        since: None,
        kind: None,
        limit: 50,
    };
    for (k, v) in serde_urlencoded_pairs(uri.query().unwrap_or(""))? {
        match k.as_str() {
            "since" => q.since = Some(v),
            "kind" => q.kind = Some(v),
            "limit" if with_limit => {
                q.limit = v
                    .parse()
                    .map_err(|_| ApiError::invalid("limit must be a number from 1 to 1000"))?
            }
            other => return Err(ApiError::invalid(format!("unknown parameter {other}"))),
        }
    }
    Ok(q)
}

pub async fn changes(
    State(s): State<AppState>,
    auth: Auth,
    uri: axum::http::Uri,
) -> ApiResult<Json<Value>> {
    let q = feed_query(&uri, true)?;
    let page = s
        .engine
        .changes(&auth.caller, q.since.as_deref(), q.kind.as_deref(), q.limit)
        .await?;
    Ok(Json(json!({
        "changes": page.changes.iter().map(change).collect::<Vec<_>>(),
        "next": page.next,
    })))
}

pub async fn events(
    State(s): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let mut q = feed_query(&uri, false)?;
    // A browser's EventSource resumes with Last-Event-ID by itself.
    if let Some(v) = headers.get("last-event-id") {
        let v = v
            .to_str()
            .map_err(|_| ApiError::invalid("Last-Event-ID is not text"))?;
        if !v.is_empty() {
            q.since = Some(v.to_string());
        }
    }
    let sub = s
        .engine
        .subscribe(&auth.caller, q.since.as_deref(), q.kind.as_deref())
        .await?;
    let stream = futures_util::stream::unfold(Some(sub), |sub| async move {
        let mut sub = sub?;
        match sub.next().await {
            Ok(Event::Change(c)) => {
                let e = SseEvent::default()
                    .id(c.cursor.clone())
                    .data(change(&c).to_string());
                Some((Ok(e), Some(sub)))
            }
            Ok(Event::Resync) => {
                let e = SseEvent::default().event("resync").data("{}");
                Some((Ok(e), Some(sub)))
            }
            // The session ended or the server stops: the stream ends.
            Err(e) => {
                tracing::info!(error = %e, "event stream ends");
                None
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(
        KeepAlive::new()
            .interval(Duration::from_secs(15))
            .text("keep-alive"),
    ))
}
