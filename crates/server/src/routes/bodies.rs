//! Item bodies: streamed in and out, with `Range`.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tarn_engine::BodyRange;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::Required;
use utoipa::IntoParams;

use crate::error::{
    ApiError, ApiResult, BadRequest, Code, Forbidden, NotFound, PayloadTooLarge,
    PreconditionFailed, RangeNotSatisfiable, ServiceUnavailable, Unauthorized,
    UnsupportedMediaType,
};
use crate::extract::{Auth, BodyPieces, IfMatch, LinkKey, Path};
use crate::json::{self, Bytes};
use crate::routes::items::{item_response, ItemPath};
use crate::AppState;

/// Upload the body, streamed (editors)
///
/// The bytes are stored with the request's `Content-Type` (at most 255
/// bytes; without one, `application/octet-stream`), which downloads answer
/// with. No bytes make an empty body. A large body never sits whole in
/// memory.
#[utoipa::path(
    put, path = "/api/v1/items/{id}/body", tag = "bodies", operation_id = "putBody",
    security((), ("bearer" = [])),
    params(ItemPath, LinkKey, IfMatch),
    request_body(
        description = "The bytes. Any Content-Type is taken: it is stored and downloads answer with it; without one, `application/octet-stream`",
        content((Bytes = "application/octet-stream")),
    ),
    responses(
        (status = 200, description = "The item, with its new body", body = json::Item, headers(
            ("ETag" = String, description = "The item's version, quoted"),
        ), links(
            ("getBody" = (operation_id = "getBody", parameters(("id" = "$response.body#/id")))),
        )),
        BadRequest, Unauthorized, Forbidden, NotFound, PreconditionFailed, PayloadTooLarge,
        UnsupportedMediaType, ServiceUnavailable,
    ),
)]
pub async fn put(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(key): LinkKey,
    IfMatch(if_match): IfMatch,
    Path(ItemPath { id }): Path<ItemPath>,
    req: Request,
) -> ApiResult<Response> {
    // Without one, the bytes are taken as what they are to HTTP, octets
    // (RFC 9110, 8.3); one given twice, empty, not ASCII or not a media
    // type is refused.
    let content_type = crate::extract::content_type(req.headers())?
        .unwrap_or("application/octet-stream")
        .to_string();
    // Before the body is read (the engine checks it as well).
    tarn_engine::check_content_type(&content_type)?;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > s.engine.config().max_body) {
        return Err(ApiError::too_large(format!(
            "a body is at most {} bytes",
            s.engine.config().max_body
        )));
    }
    let mut body = BodyPieces::new(req, &s)?;
    let mut upload = s
        .engine
        .begin_body(&auth.caller, &id, key.as_deref(), &content_type, if_match)
        .await?;
    while let Some(piece) = body.next().await? {
        upload.write(&piece).await?;
    }
    let view = upload.finish(if_match).await?;
    Ok(item_response(StatusCode::OK, &view))
}

/// Parses one `bytes=` range against a size (RFC 9110, 14.2); `Ok(None)`
/// means serve it all: no header, a form we do not serve (several ranges,
/// another unit), a header that is not a valid range (ignored, as the RFC
/// says), or an `If-Range` that is not this version's strong ETag `etag`.
/// `Err` means the range is valid but outside the body (416).
fn parse_range(headers: &HeaderMap, size: u64, etag: &str) -> Result<Option<BodyRange>, ()> {
    let Some(v) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    if let Some(tag) = headers.get(header::IF_RANGE) {
        // A date, a weak tag or another version: the whole current body.
        if tag.as_bytes() != etag.as_bytes() {
            return Ok(None);
        }
    }
    // The unit is case-insensitive (RFC 9110, 14.1).
    let v = v.trim();
    let spec = match v.get(..6) {
        Some(unit) if unit.eq_ignore_ascii_case("bytes=") => &v[6..],
        _ => return Ok(None),
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    // Digits only; past u64 a position is as good as the largest.
    let number = |s: &str| -> Option<u64> {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().unwrap_or(u64::MAX))
    };
    let range = if a.trim().is_empty() {
        let Some(n) = number(b) else {
            return Ok(None);
        };
        if n == 0 {
            return Err(());
        }
        if size == 0 {
            // Satisfiable (RFC 9110, 14.1.1), but no 206 can name a byte
            // of nothing: the whole, empty body.
            return Ok(None);
        }
        BodyRange {
            start: size.saturating_sub(n),
            end: size,
        }
    } else {
        let Some(start) = number(a) else {
            return Ok(None);
        };
        let end = if b.trim().is_empty() {
            size
        } else {
            match number(b) {
                Some(last) if last >= start => last.saturating_add(1).min(size),
                _ => return Ok(None),
            }
        };
        BodyRange { start, end }
    };
    if range.start >= size {
        return Err(());
    }
    Ok(Some(range))
}

/// `Range: bytes=a-b`, `bytes=a-` or `bytes=-n`, and `If-Range`, documented.
pub struct RangeHeader;

impl IntoParams for RangeHeader {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![ParameterBuilder::new()
            .name("Range")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "One byte range: `bytes=a-b`, `bytes=a-` or `bytes=-n` answers 206; several ranges, another unit or a header that is no valid range answer the whole body; a range past the end answers 416",
            ))
            .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
            .build(),
        ParameterBuilder::new()
            .name("If-Range")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "Serve the `Range` only if the body is still at this ETag (`\"3\"`); anything else answers the whole current body (200)",
            ))
            .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
            .build()]
    }
}

/// Download the body
#[utoipa::path(
    get, path = "/api/v1/items/{id}/body", tag = "bodies", operation_id = "getBody",
    security((), ("bearer" = [])),
    params(ItemPath, LinkKey, RangeHeader),
    responses(
        (status = 200, description = "The bytes, with the Content-Type they were uploaded with", content(("*/*")), headers(
            ("ETag" = String, description = "The item's version, quoted"),
            ("Content-Length" = u64, description = "The body's size"),
            ("Accept-Ranges" = String, description = "`bytes`"),
        )),
        (status = 206, description = "The bytes of the range", content(("*/*")), headers(
            ("ETag" = String, description = "The item's version, quoted"),
            ("Content-Length" = u64, description = "The range's size"),
            ("Content-Range" = String, description = "`bytes a-b/size`"),
        )),
        BadRequest, Unauthorized, NotFound, RangeNotSatisfiable, ServiceUnavailable,
    ),
)]
pub async fn get(
    State(s): State<AppState>,
    auth: Auth,
    LinkKey(key): LinkKey,
    Path(ItemPath { id }): Path<ItemPath>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (view, reader) = s
        .engine
        .open_body(&auth.caller, &id, key.as_deref())
        .await?;
    let (Some(mut reader), Some(meta)) = (reader, view.item.body.as_ref()) else {
        return Err(ApiError::not_found("the item has no body"));
    };
    let etag = HeaderValue::from_str(&format!("\"{}\"", view.item.version)).expect("digits");
    let range = match parse_range(&headers, meta.size, etag.to_str().expect("digits")) {
        Ok(r) => r,
        Err(()) => {
            let mut e = ApiError::new(
                Code::RangeNotSatisfiable,
                format!("the body has {} bytes", meta.size),
            )
            .into_response();
            e.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{}", meta.size)).expect("digits"),
            );
            return Ok(e);
        }
    };
    let (status, length) = match range {
        Some(r) => {
            reader.seek(r);
            (StatusCode::PARTIAL_CONTENT, r.end - r.start)
        }
        None => (StatusCode::OK, meta.size),
    };
    let stream = futures_util::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        match reader.next_chunk().await {
            Ok(Some(bytes)) => Some((Ok(bytes), Some(reader))),
            Ok(None) => None,
            Err(e) => {
                tracing::error!(error = %e, "body stream failed");
                Some((Err(std::io::Error::other(e.to_string())), None))
            }
        }
    });
    let mut res = Response::new(Body::from_stream(stream));
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&meta.content_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    h.insert(header::ETAG, etag);
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    // Stored bytes are never active content of this origin: no sniffing,
    // no script, no page of any site framing them (a page of a sibling
    // site could show a body to its reader, with their cookie), and
    // anything a browser could run is downloaded.
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox; frame-ancestors 'none'"),
    );
    if !displays_inline(&meta.content_type) {
        h.insert(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_static("attachment"),
        );
    }
    if let Some(r) = range {
        h.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&format!("bytes {}-{}/{}", r.start, r.end - 1, meta.size))
                .expect("digits"),
        );
    }
    Ok(res)
}

/// Whether a browser may show a body of this type in place: passive media
/// and plain text. HTML, SVG, XML, scripts and anything unknown are served
/// as attachments.
fn displays_inline(content_type: &str) -> bool {
    let essence = tarn_engine::media_essence(content_type);
    matches!(
        essence.as_str(),
        "text/plain"
            | "image/png"
            | "image/jpeg"
            | "image/gif"
            | "image/webp"
            | "image/avif"
            | "application/pdf"
    ) || (essence.starts_with("audio/") || essence.starts_with("video/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(v: &str, size: u64) -> Result<Option<(u64, u64)>, ()> {
        ranged(v, None, size)
    }

    fn ranged(v: &str, if_range: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, ()> {
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, HeaderValue::from_str(v).unwrap());
        if let Some(t) = if_range {
            h.insert(header::IF_RANGE, HeaderValue::from_str(t).unwrap());
        }
        parse_range(&h, size, "\"7\"").map(|r| r.map(|r| (r.start, r.end)))
    }

    #[test]
    fn ranges() {
        assert_eq!(range("bytes=0-0", 10), Ok(Some((0, 1))));
        assert_eq!(range("bytes=2-", 10), Ok(Some((2, 10))));
        assert_eq!(range("bytes=-3", 10), Ok(Some((7, 10))));
        assert_eq!(range("bytes=-30", 10), Ok(Some((0, 10))));
        assert_eq!(range("bytes=5-100", 10), Ok(Some((5, 10))));
        assert_eq!(range("bytes=0-1,3-4", 10), Ok(None));
        assert_eq!(range("items=0-1", 10), Ok(None));
        assert_eq!(range("Bytes=2-3", 10), Ok(Some((2, 4))));
        assert_eq!(range("bytés=2-3", 10), Ok(None));
        assert_eq!(range("bytes=10-", 10), Err(()));
        assert_eq!(range("bytes=-0", 10), Err(()));
        // An empty body: a suffix range is satisfiable, and served whole.
        assert_eq!(range("bytes=-5", 0), Ok(None));
        assert_eq!(range("bytes=0-", 0), Err(()));
        // Not a valid range: ignored, the whole body.
        for invalid in [
            "bytes=5-2",
            "bytes=x-2",
            "bytes=1",
            "bytes=-",
            "bytes=+1-2",
            "bytes=1-x",
        ] {
            assert_eq!(range(invalid, 10), Ok(None), "{invalid}");
        }
        // Regression: a last byte of u64::MAX overflowed; past it, clamped.
        assert_eq!(range("bytes=0-18446744073709551615", 11), Ok(Some((0, 11))));
        assert_eq!(range("bytes=0-18446744073709551616", 11), Ok(Some((0, 11))));
        assert_eq!(range("bytes=18446744073709551615-", 11), Err(()));
        assert_eq!(range("bytes=99999999999999999999-", 11), Err(()));
        assert_eq!(range("bytes=-18446744073709551615", 11), Ok(Some((0, 11))));
        assert_eq!(range("bytes=-99999999999999999999", 11), Ok(Some((0, 11))));
    }

    #[test]
    fn if_range_serves_the_range_only_of_this_version() {
        assert_eq!(ranged("bytes=2-3", Some("\"7\""), 10), Ok(Some((2, 4))));
        for other in ["\"6\"", "W/\"7\"", "Tue, 24 Nov 2026 08:00:00 GMT", "7"] {
            assert_eq!(ranged("bytes=2-3", Some(other), 10), Ok(None), "{other}");
        }
    }

    #[test]
    fn only_passive_types_display_inline() {
        for t in [
            "text/plain; charset=utf-8",
            "image/png",
            "video/mp4",
            "IMAGE/JPEG",
        ] {
            assert!(displays_inline(t), "{t}");
        }
        for t in [
            "text/html",
            "image/svg+xml",
            "application/xml",
            "text/xml",
            "application/javascript",
            "application/x-unknown",
            "",
        ] {
            assert!(!displays_inline(t), "{t}");
        }
    }
}
