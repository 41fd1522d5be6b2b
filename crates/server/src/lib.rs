//! Tarn's HTTP API (axum): routes, authentication, JSON and errors.
//!
//! A handler extracts and validates input, makes one engine call and renders
//! the result; nothing here knows SQL, key encodings or ACL rules. Each
//! handler declares its route, parameters, bodies and answers beside its
//! code; [`routes::router`] builds both the router and the OpenAPI document
//! from them, and the bodies are the types of [`json`]. Requests share
//! nothing mutable but the store's pools and atomic metric counters. The
//! web app's files, built into the binary, are served beside the API
//! ([`web`]).

#![warn(missing_docs)]

pub mod error;
pub mod extract;
pub mod json;
pub mod metrics;
pub mod openapi;
pub mod routes;
pub mod serve;
pub mod web;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tarn_engine::{Engine, EngineConfig};
use tarn_store::Store;

use crate::error::{ApiError, Code, ErrorCause};
use crate::metrics::{MeteredStore, Metrics};

/// Settings of the HTTP layer.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Whether anyone may sign up (else only administrators create users).
    pub signup_open: bool,
    /// Largest JSON request body, in bytes.
    pub max_json: usize,
    /// Proxies whose `X-Forwarded-For` names the client (none by default).
    pub trusted_proxies: Vec<extract::Cidr>,
    /// A request body (JSON or an upload) must bring 16 KiB, or its end,
    /// for every this long the server waits on it: a client that stops
    /// sending, or trickles, is answered `400` and its connection freed
    /// instead of holding it open ([`extract::BodyPieces`]).
    pub body_idle: std::time::Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            signup_open: true,
            max_json: 1024 * 1024,
            trusted_proxies: Vec::new(),
            body_idle: std::time::Duration::from_secs(30),
        }
    }
}

/// What every handler can reach: the engine (the store's pools), settings,
/// and lock-free metrics.
#[derive(Clone)]
pub struct AppState {
    /// The engine.
    pub engine: Engine,
    /// HTTP settings.
    pub config: Arc<ServerConfig>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Route → its methods' metrics series; built once, read-only.
    route_ids: Arc<HashMap<String, Vec<(Method, usize)>>>,
    /// Distinguishes this process's request ids.
    node: u32,
    next_request: Arc<AtomicU64>,
    /// Set when the server stops: event streams end.
    stopping: Arc<tokio::sync::watch::Sender<bool>>,
}

impl AppState {
    /// The state of a server over `store`: the store is wrapped to be timed,
    /// and the engine built on it.
    pub fn new(store: Arc<dyn Store>, mut engine: EngineConfig, config: ServerConfig) -> AppState {
        let operations = openapi::operations();
        let labels: Vec<(String, String)> = operations
            .iter()
            .map(|(m, p)| (m.to_string(), p.clone()))
            .collect();
        let mut route_ids: HashMap<String, Vec<(Method, usize)>> = HashMap::new();
        for (i, (method, path)) in operations.into_iter().enumerate() {
            route_ids.entry(path).or_default().push((method, i));
        }
        let metrics = Arc::new(Metrics::new(&labels));
        engine.requests_in_flight = Some(metrics.in_flight());
        let store: Arc<dyn Store> = Arc::new(MeteredStore::new(store, metrics.clone()));
        let mut node = [0u8; 4];
        let _ = getrandom::fill(&mut node);
        AppState {
            engine: Engine::new(store, engine),
            config: Arc::new(config),
            metrics,
            route_ids: Arc::new(route_ids),
            node: u32::from_le_bytes(node),
            next_request: Arc::new(AtomicU64::new(0)),
            stopping: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }

    /// Ends every event stream, now and as one opens: a stopping server
    /// finishes its requests, and a stream is not a request that finishes
    /// (its client resumes on another node, or after the restart, from
    /// `Last-Event-ID`).
    pub fn end_streams(&self) {
        self.stopping.send_replace(true);
    }

    /// Resolves once the server stops.
    pub(crate) fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.subscribe();
        async move {
            // An error: the sender is gone, so no server is left to stop.
            let _ = stopping.wait_for(|stop| *stop).await;
        }
    }
}

/// The whole HTTP application, with the web app built into this binary.
pub fn app(state: AppState) -> Router {
    app_with_web(state, web::FILES)
}

/// The whole HTTP application, serving `files` as the web app (an empty
/// slice: a server built without the app, which says at `/` how to build
/// it).
pub fn app_with_web(state: AppState, files: &'static [web::WebFile]) -> Router {
    let (router, _) = routes::router().split_for_parts();
    router
        .fallback(move |method, uri, headers| web::fallback(files, method, uri, headers))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), track))
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        Code::MethodNotAllowed,
        "this route does not take that method",
    )
}

/// One log line and one metrics record per request, and a request id;
/// an answer to credentials made private ([`Credentials`]).
async fn track(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string());
    let key_method = if method == Method::HEAD {
        Method::GET
    } else {
        method.clone()
    };
    let series = route
        .as_deref()
        .and_then(|r| s.route_ids.get(r))
        .and_then(|ms| ms.iter().find(|(m, _)| *m == key_method))
        .map_or_else(|| s.metrics.unmatched(), |(_, i)| *i);
    let n = s.next_request.fetch_add(1, Ordering::Relaxed);
    let request_id = format!("{:08x}-{n:x}", s.node);
    let _in_flight = s.metrics.start();
    let credentials = Credentials::of(&req, &s);
    let mut res = next.run(req).await;
    if let Some(c) = credentials {
        c.mark(&mut res);
    }
    let status = res.status();
    let latency = start.elapsed();
    s.metrics.record(series, status.as_u16(), latency);
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        res.headers_mut().insert("x-request-id", v);
    }
    let route = route.as_deref().unwrap_or("unmatched");
    let micros = latency.as_micros() as u64;
    match res.extensions().get::<ErrorCause>() {
        // 503: the store or a bounded queue said "later" (overload is
        // answered by design); the client is told to retry.
        Some(cause) if status == StatusCode::SERVICE_UNAVAILABLE => tracing::warn!(
            request_id = %request_id, method = %method, route, status = status.as_u16(),
            latency_us = micros, cause = %cause.0, "request refused for now"
        ),
        Some(cause) => tracing::error!(
            request_id = %request_id, method = %method, route, status = status.as_u16(),
            latency_us = micros, cause = %cause.0, "request failed"
        ),
        None => tracing::info!(
            request_id = %request_id, method = %method, route, status = status.as_u16(),
            latency_us = micros, "request"
        ),
    }
    res
}

/// What an API request presented that makes its answer private.
///
/// Every API answer varies with `Authorization`, `Cookie` and
/// `Tarn-Link-Key`, so a shared cache never hands one caller's answer
/// to another. An answer to a request that presents credentials (a
/// bearer token, the session cookie or a link key) is that caller's own:
/// no cache keeps it (`Cache-Control: private, no-store`, unless the route
/// set its own), nor keeps what a link opened once the link is removed.
/// One signed by a token or the cookie may not be embedded by another
/// site's page (`Cross-Origin-Resource-Policy: same-origin`); a link's may,
/// as its key travels in the page's own URL. A session cookie that is no
/// session any more (signed out elsewhere, a password reset, expired) is
/// cleared with the `401` a request it signs gets, so the browser stops
/// sending it and reads as anyone.
struct Credentials {
    bearer: bool,
    /// The name of the session cookie presented, if one was.
    cookie: Option<&'static str>,
    link: bool,
    tls: bool,
    /// A sign-in's 401 is about the password it sent (or its address),
    /// never about a session the browser holds; sign-out clears the
    /// cookie itself.
    signing: bool,
}

impl Credentials {
    /// Those of an API request (`None` for any other).
    fn of(req: &Request, s: &AppState) -> Option<Credentials> {
        let h = req.headers();
        let path = req.uri().path();
        if !path.starts_with("/api/") {
            return None;
        }
        // A key in the query, however its name is encoded.
        let link = h.contains_key(extract::LINK_KEY_HEADER)
            || req.uri().query().is_some_and(extract::names_a_key);
        let tls = extract::Via::of_request(req, s).tls;
        let cookie = extract::session_cookie(h, tls).map(|_| extract::session_cookie_name(tls));
        Some(Credentials {
            bearer: h.contains_key(header::AUTHORIZATION),
            cookie,
            link,
            tls,
            signing: path.starts_with("/api/v1/sessions"),
        })
    }

    fn mark(self, res: &mut Response) {
        let dead_cookie = match self.cookie {
            Some(name) if !self.bearer && !self.signing => (res.status()
                == StatusCode::UNAUTHORIZED
                && !res.headers().contains_key(header::SET_COOKIE))
            .then_some(name),
            _ => None,
        };
        let h = res.headers_mut();
        h.append(
            header::VARY,
            HeaderValue::from_static("Authorization, Cookie, Tarn-Link-Key"),
        );
        let signed = self.bearer || self.cookie.is_some();
        if signed || self.link {
            h.entry(header::CACHE_CONTROL)
                .or_insert(HeaderValue::from_static("private, no-store"));
        }
        // Nor may another site's page embed it (an `<img>` of a body, say,
        // sent with the cookie by a sibling subdomain): its loading or not
        // would tell that page what exists.
        if signed {
            h.insert(
                "cross-origin-resource-policy",
                HeaderValue::from_static("same-origin"),
            );
        }
        if let Some(name) = dead_cookie {
            if let Ok(v) = HeaderValue::from_str(&extract::cleared_cookie(name, self.tls)) {
                h.append(header::SET_COOKIE, v);
            }
        }
    }
}

/// Renders any error as problem JSON (for callers outside the router).
pub fn problem(code: Code, detail: &str) -> Response {
    ApiError::new(code, detail).into_response()
}
