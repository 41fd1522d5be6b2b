//! Full-text search.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use tarn_engine::SearchQuery;

use crate::error::{ApiError, ApiResult};
use crate::extract::{serde_urlencoded_pairs, Auth};
use crate::routes::items::where_value;
use crate::{render, AppState};

fn boolean(name: &str, v: &str) -> ApiResult<bool> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ApiError::invalid(format!("{name} is true or false"))),
    }
}

pub async fn search(
    State(s): State<AppState>,
    auth: Auth,
    uri: axum::http::Uri,
) -> ApiResult<Json<Value>> {
    let mut q = SearchQuery::default();
    let mut has_q = false;
    for (k, v) in serde_urlencoded_pairs(uri.query().unwrap_or(""))? {
        match k.as_str() {
            "q" => {
                q.q = v;
                has_q = true;
            }
            "kind" => q.kind = Some(v),
            "match" => {
                q.all = match v.as_str() {
                    "all" => true,
                    "any" => false,
                    _ => return Err(ApiError::invalid("match is all or any")),
                }
            }
            "prefix" => q.prefix = boolean("prefix", &v)?,
            "limit" => {
                q.limit = v
                    .parse()
                    .map_err(|_| ApiError::invalid("limit must be a number from 1 to 1000"))?
            }
            "cursor" => q.cursor = Some(v),
            other => match other.strip_prefix("where.") {
                Some(field) if !field.is_empty() => {
                    q.where_.push((field.to_string(), where_value(&v)))
                }
                _ => return Err(ApiError::invalid(format!("unknown parameter {other}"))),
            },
        }
    }
    if !has_q {
        return Err(ApiError::invalid("q names the words to find"));
    }
    let page = s.engine.search(&auth.caller, &q).await?;
    Ok(Json(json!({
        "items": page.hits.iter().map(|h| {
            let mut v = render::item(&h.item);
            v["score"] = json!(h.score);
            v
        }).collect::<Vec<_>>(),
        "next": page.next,
    })))
}
