//! Full-text search.

use axum::extract::State;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tarn_engine::SearchQuery;
use utoipa::{IntoParams, ToSchema};

use crate::error::{
    ApiError, ApiResult, BadRequest, PayloadTooLarge, ServiceUnavailable, Unauthorized,
};
use crate::extract::{serde_urlencoded_pairs, Auth};
use crate::json::{self, GivenCursor, Name};
use crate::routes::items::where_value;
use crate::routes::reply_written;
use crate::AppState;

/// How many of the words an item must hold.
#[derive(Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Match {
    /// Every word.
    All,
    /// At least one; items holding more of them first.
    Any,
}

/// The query of a search. Besides these, `where.<field>=<value>` narrows
/// to a category exactly as listings do (described in the operation's
/// text: OpenAPI 3.1 cannot name a family of parameters).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchParams {
    /// The words to find: at most 1024 bytes of UTF-8 and 16 different
    /// words. (`maxLength` counts characters: 1024 characters of which some
    /// take more than a byte are refused.)
    #[param(min_length = 1, max_length = 1024)]
    q: String,
    /// The kind searched; without it, every text index without where-fields.
    #[param(value_type = Name, required = false)]
    kind: Option<String>,
    /// `all` (default): every word; `any`: at least one.
    #[param(inline, rename = "match")]
    match_: Option<Match>,
    /// The last word also matches words that start with it.
    #[param(default = false)]
    prefix: Option<bool>,
    /// Page size.
    #[param(minimum = 1, maximum = 1000, default = 50)]
    limit: Option<u32>,
    /// The `next` of the previous page.
    #[param(value_type = GivenCursor, required = false)]
    cursor: Option<String>,
    /// `where.<field>` equalities.
    #[param(ignore)]
    where_: Vec<(String, Value)>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SearchParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<SearchParams> {
        let mut q: Option<String> = None;
        let mut p = SearchParams {
            q: String::new(),
            kind: None,
            match_: None,
            prefix: None,
            limit: None,
            cursor: None,
            where_: Vec::new(),
        };
        for (k, v) in serde_urlencoded_pairs(parts.uri.query().unwrap_or(""))? {
            let dup = || ApiError::invalid(format!("{k} is given twice"));
            match k.as_str() {
                "q" if q.is_some() => return Err(dup()),
                "q" => q = Some(v),
                "kind" if p.kind.is_some() => return Err(dup()),
                "kind" if !tarn_engine::is_valid_name(&v) => {
                    return Err(ApiError::invalid(format!("kind {v:?} is not a valid kind")))
                }
                "kind" => p.kind = Some(v),
                "match" if p.match_.is_some() => return Err(dup()),
                "match" => {
                    p.match_ = Some(match v.as_str() {
                        "all" => Match::All,
                        "any" => Match::Any,
                        _ => return Err(ApiError::invalid("match is all or any")),
                    })
                }
                "prefix" if p.prefix.is_some() => return Err(dup()),
                "prefix" => {
                    // In any case: Python's `params={"prefix": True}` sends
                    // `True`.
                    p.prefix = Some(match v.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(ApiError::invalid("prefix is true or false")),
                    })
                }
                "limit" if p.limit.is_some() => return Err(dup()),
                "limit" => {
                    p.limit =
                        Some(v.parse().map_err(|_| {
                            ApiError::invalid("limit must be a number from 1 to 1000")
                        })?)
                }
                "cursor" if p.cursor.is_some() => return Err(dup()),
                "cursor" => p.cursor = Some(v),
                // A link key opens its one item, never a search: taken
                // (clients send it everywhere) and ignored.
                "key" => {}
                other => match other.strip_prefix("where.") {
                    Some(field) if !field.is_empty() => {
                        if p.where_.iter().any(|(f, _)| f == field) {
                            return Err(dup());
                        }
                        p.where_.push((field.to_string(), where_value(&v)))
                    }
                    _ => return Err(ApiError::invalid(format!("unknown parameter {other}"))),
                },
            }
        }
        p.q = q.ok_or_else(|| ApiError::invalid("q names the words to find"))?;
        // Empty: the first page (`cursor=${next ?? ''}`).
        p.cursor = p.cursor.filter(|c| !c.is_empty());
        Ok(p)
    }
}

/// Items the caller may read whose words match, best first
///
/// Words match after Unicode word segmentation, case folding, folding of
/// diacritics and stemming. `where.<field>=<value>` (one per where-field of
/// the text index) narrows to a category; a value is JSON when it parses,
/// else a string. No text index serves the kind and fields: `400
/// no-index`, whose detail names the index to declare.
#[utoipa::path(
    get, path = "/api/v1/search", tag = "search", operation_id = "search",
    security((), ("bearer" = [])),
    params(SearchParams),
    responses(
        (status = 200, description = "A page of hits", body = json::SearchPage),
        BadRequest, Unauthorized, PayloadTooLarge, ServiceUnavailable,
    ),
)]
pub async fn search(
    State(s): State<AppState>,
    auth: Auth,
    params: SearchParams,
) -> ApiResult<Response> {
    let q = SearchQuery {
        q: params.q,
        kind: params.kind,
        where_: params.where_,
        all: !matches!(params.match_, Some(Match::Any)),
        prefix: params.prefix.unwrap_or(false),
        limit: params.limit.map_or(50, |n| n as usize),
        cursor: params.cursor,
    };
    let page = s.engine.search(&auth.caller, &q).await?;
    Ok(reply_written(
        StatusCode::OK,
        &json::SearchPage {
            items: page
                .hits
                .iter()
                .map(|h| json::Hit {
                    item: json::Item::from(&h.item),
                    score: h.score,
                })
                .collect(),
            next: page.next.as_deref(),
        },
    ))
}
