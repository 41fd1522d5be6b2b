//! The web app, embedded at build time (see `build.rs`), served at `/`
//! beside the API.
//!
//! - `/assets/…` are content-hashed by the app's build: cached for a year,
//!   `immutable`.
//! - Every other `GET` outside `/api/` that accepts HTML (a client-side
//!   route such as `/items/x`, reloaded) answers the app's `index.html`,
//!   never cached, so a new build is picked up at once.
//! - Pages carry a strict Content-Security-Policy: script only from this
//!   origin, no inline script, no `eval`, no plugins, no framing.
//! - Anything else, and every unknown path under `/api/`, is the API's
//!   `404 not-found` problem.
//!
//! A server built without the app answers `/` with a short page saying how
//! to build it.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use tarn_engine::{Caller, Engine, EngineError, Order, SortField};

use crate::error::ApiError;

/// One file of the built app.
pub struct WebFile {
    /// Its URL path (`/index.html`, `/assets/index-1a2b3c.js`).
    pub path: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
    /// Its gzip-compressed bytes, when the build wrote them.
    pub gzip: Option<&'static [u8]>,
}

include!(concat!(env!("OUT_DIR"), "/web_files.rs"));

/// The policy of the app's pages. Styles and images from this origin
/// (images also as `blob:`/`data:` URLs the app makes itself); scripts only
/// from this origin's files; connections (the API, its event stream) only
/// to this origin.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; media-src 'self'; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// Whether this binary holds a built app.
pub fn built() -> bool {
    file(FILES, "/index.html").is_some()
}

fn file(files: &'static [WebFile], path: &str) -> Option<&'static WebFile> {
    files.iter().find(|f| f.path == path)
}

/// The page a server without a built app answers at `/`.
pub const NOT_BUILT: &str = "<!doctype html>
<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Tarn</title></head>
<body><main>
<h1>Tarn is running; its web app is not built into this binary</h1>
<p>The API is at <a href=\"/api/v1/openapi.json\">/api/v1/openapi.json</a>.</p>
<p>To have the web app here, build it and then the server: <code>make run</code>
does both (it runs <code>npm ci</code> and <code>npm run build</code> in <code>web/</code>,
then <code>cargo build --release -p tarn</code>).</p>
</main></body></html>
";

fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map_or("", |(_, e)| e);
    match ext {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "webmanifest" => "application/manifest+json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// Headers every response of the app carries.
fn secure(res: &mut Response) {
    let h = res.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
}

fn page(status: StatusCode, html: Body) -> Response {
    let mut res = (status, html).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    secure(&mut res);
    res
}

/// Whether the client takes gzip.
fn takes_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|e| {
            let mut parts = e.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

/// A file's response: the gzip twin when the client takes it.
fn serve(f: &WebFile, headers: &HeaderMap) -> Response {
    let gzip = f.gzip.filter(|_| takes_gzip(headers));
    let body = Body::from(gzip.unwrap_or(f.body));
    let mut res = if f.path == "/index.html" {
        page(StatusCode::OK, body)
    } else {
        let mut res = body.into_response();
        let cache = if f.path.starts_with("/assets/") {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(f.path)),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
        secure(&mut res);
        res
    };
    if f.gzip.is_some() {
        let h = res.headers_mut();
        h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        if gzip.is_some() {
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
    }
    res
}

/// Whether the client asks for a page (a browser's navigation does).
fn accepts_html(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/html"))
}

/// What answers every request no API route matches, the app being
/// `files` (see [`crate::app_with_web`]).
pub async fn fallback(
    files: &'static [WebFile],
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let path = uri.path();
    let api = path == "/api" || path.starts_with("/api/");
    if api || (method != Method::GET && method != Method::HEAD) {
        return ApiError::not_found("no such route").into_response();
    }
    if let Some(f) = file(files, path).filter(|f| f.path != "/index.html") {
        return serve(f, &headers);
    }
    // An asset of another build is gone: answering the page instead would
    // hand a script tag HTML.
    let is_asset = path.starts_with("/assets/");
    if !is_asset && (path == "/" || accepts_html(&headers)) {
        return match file(files, "/index.html") {
            Some(index) => serve(index, &headers),
            None => page(StatusCode::OK, Body::from(NOT_BUILT)),
        };
    }
    ApiError::not_found("no such route").into_response()
}

/// The index the app lists a chat room's history with: messages (items of
/// kind `message`, shared with the room's group) by their `room`
/// property, newest first.
pub const CHAT_HISTORY: &str = "chat-history";

/// Declares the indexes the app's pages need, unless they exist: `tarn
/// serve` calls it at start (idempotent, and harmless on every node of a
/// cluster). An index of the same name that differs is left alone, and
/// said so in the log.
pub async fn declare_app_indexes(engine: &Engine) -> Result<(), EngineError> {
    let system = Caller::User {
        username: "admin".into(),
        admin: true,
    };
    let sort = vec![SortField {
        field: "createdAt".into(),
        order: Order::Desc,
    }];
    match engine
        .declare_index(&system, CHAT_HISTORY, "message", vec!["room".into()], sort)
        .await
    {
        Ok(_) => Ok(()),
        Err(EngineError::Conflict(detail)) => {
            tracing::warn!(
                index = CHAT_HISTORY,
                detail,
                "an index of this name exists and differs; chat history may not list"
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_taken_unless_refused() {
        let mut h = HeaderMap::new();
        assert!(!takes_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            "gzip, deflate, br".parse().unwrap(),
        );
        assert!(takes_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, "br, gzip;q=0".parse().unwrap());
        assert!(!takes_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, "GZIP;q=0.5".parse().unwrap());
        assert!(takes_gzip(&h));
    }

    #[test]
    fn types() {
        assert_eq!(
            content_type("/assets/a-1.js"),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(content_type("/assets/a-1.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("/x"), "application/octet-stream");
    }
}
