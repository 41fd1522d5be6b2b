//! A test client over the router, in-process.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tarn_engine::{Clock, EngineConfig, PasswordCost};
use tarn_server::{AppState, ServerConfig};
use tower::ServiceExt;

pub struct TestApp {
    pub router: Router,
    pub state: AppState,
    /// With TARN_TEST_NODES=2, a second node on the same data: requests
    /// sent through [`TestApp::raw`] alternate between the two, so every
    /// test also checks that what one node did shows on the other.
    pub other: Option<(Router, AppState)>,
    turn: std::sync::atomic::AtomicUsize,
    /// The SQLite store's directory, kept for the test's lifetime.
    pub _dir: Option<tempfile::TempDir>,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub bytes: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    /// Asserts the status, and that errors are problem JSON with a slug.
    pub fn expect(self, status: u16) -> Reply {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text());
        if status >= 400 {
            self.assert_problem();
        }
        self
    }
    pub fn assert_problem(&self) {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.text()
        );
        let p = self.json();
        assert!(
            p["type"].is_string() && p["title"].is_string() && p["detail"].is_string(),
            "{p}"
        );
        assert_eq!(p["status"], self.status.as_u16());
    }
}

pub fn engine_config() -> EngineConfig {
    EngineConfig {
        password_cost: PasswordCost::for_tests(),
        clock: Clock::Stepping(Arc::new(AtomicI64::new(1_700_000_000_000_000))),
        // Declarations answer ready when their builds finish, however slow
        // a shared machine is (the suite's kinds hold few items).
        build_wait: std::time::Duration::from_secs(120),
        ..EngineConfig::default()
    }
}

/// The stores the suite runs on: memory, or SQLite, PostgreSQL or
/// Cassandra with TARN_TEST_STORE=sqlite|postgres|cassandra (`make test`
/// runs the suite every way): one, a second connection to the same data
/// for a second node (not on SQLite, which one process opens at a time),
/// and the SQLite store's directory.
type Stores = (
    Arc<dyn tarn_store::Store>,
    Option<Arc<dyn tarn_store::Store>>,
    Option<tempfile::TempDir>,
);

async fn stores() -> Stores {
    let unique = || {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).unwrap();
        u64::from_le_bytes(b)
    };
    match std::env::var("TARN_TEST_STORE").as_deref() {
        Ok("sqlite") => {
            let dir = tempfile::tempdir().unwrap();
            let store = tarn_store_sqlite::SqliteStore::open(dir.path()).unwrap();
            (Arc::new(store), None, Some(dir))
        }
        Ok("postgres") => {
            let base = std::env::var("TARN_TEST_POSTGRES")
                .expect("TARN_TEST_POSTGRES (see scripts/with-postgres.sh)");
            let url = format!("{base}?schema=s_{:016x}", unique());
            let connect = || tarn_store_postgres::PgStore::connect(&url);
            let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
            (Arc::new(a), Some(Arc::new(b)), None)
        }
        Ok("cassandra") => {
            let base = std::env::var("TARN_TEST_CASSANDRA")
                .expect("TARN_TEST_CASSANDRA (see scripts/with-cassandra.sh)");
            // An emptied keyspace of the cluster's pool, held until the
            // test's thread ends.
            let url = tarn_store_cassandra::pool::for_test(&base, "s")
                .await
                .unwrap();
            let connect = || tarn_store_cassandra::CassandraStore::connect(&url);
            let a = connect().await.unwrap();
            let b = connect().await.unwrap();
            (Arc::new(a), Some(Arc::new(b)), None)
        }
        Ok("memory") | Err(_) => {
            let store = tarn_store::memory::MemoryStore::new();
            (Arc::new(store.clone()), Some(Arc::new(store)), None)
        }
        Ok(other) => panic!("TARN_TEST_STORE={other}: use memory, sqlite, postgres or cassandra"),
    }
}

/// Whether requests alternate between two nodes (TARN_TEST_NODES=2).
fn two_nodes() -> bool {
    match std::env::var("TARN_TEST_NODES").as_deref() {
        Ok("2") => true,
        Ok("1") | Err(_) => false,
        Ok(other) => panic!("TARN_TEST_NODES={other}: use 1 or 2"),
    }
}

impl TestApp {
    pub async fn new() -> TestApp {
        TestApp::with(ServerConfig::default()).await
    }

    pub async fn with(config: ServerConfig) -> TestApp {
        TestApp::serving(config, None, two_nodes()).await
    }

    /// One node whatever TARN_TEST_NODES says, for what each node counts
    /// for itself (metrics).
    pub async fn one_node() -> TestApp {
        TestApp::serving(ServerConfig::default(), None, false).await
    }

    /// A server whose web app is `files` instead of the one built into
    /// this binary (an empty slice: a binary built without the app).
    pub async fn with_web(files: &'static [tarn_server::web::WebFile]) -> TestApp {
        TestApp::serving(ServerConfig::default(), Some(files), two_nodes()).await
    }

    /// One node of `state`.
    pub fn of(state: AppState) -> TestApp {
        TestApp {
            router: tarn_server::app(state.clone()),
            state,
            other: None,
            turn: Default::default(),
            _dir: None,
        }
    }

    async fn serving(
        config: ServerConfig,
        files: Option<&'static [tarn_server::web::WebFile]>,
        two: bool,
    ) -> TestApp {
        let (store, second, dir) = stores().await;
        // One clock for both nodes, as if they kept time together.
        let engine = engine_config();
        let node = |store, config| {
            let state = AppState::new(store, engine.clone(), config);
            let router = match files {
                Some(files) => tarn_server::app_with_web(state.clone(), files),
                None => tarn_server::app(state.clone()),
            };
            (router, state)
        };
        let other = if two {
            let second = second.expect("a second node: not on SQLite");
            Some(node(second, config.clone()))
        } else {
            None
        };
        let (router, state) = node(store, config);
        TestApp {
            router,
            state,
            other,
            turn: Default::default(),
            _dir: dir,
        }
    }

    /// Sends a request to the next node in turn.
    pub async fn raw(&self, req: Request<Body>) -> Reply {
        let turn = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let router = match &self.other {
            Some((other, _)) if turn % 2 == 1 => other,
            _ => &self.router,
        };
        let res = router.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        // An event stream stays open: it is answered, not read to its end
        // (tests/it/live.rs reads streams frame by frame).
        let streaming = headers
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let bytes = if streaming {
            Vec::new()
        } else {
            res.into_body().collect().await.unwrap().to_bytes().to_vec()
        };
        Reply {
            status,
            headers,
            bytes,
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        self.call_with(method, path, token, body, &[]).await
    }

    pub async fn call_with(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = match body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        };
        self.raw(req.unwrap()).await
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Reply {
        self.call(Method::GET, path, token, None).await
    }

    /// Signs up and in; returns the token.
    pub async fn user(&self, name: &str) -> String {
        let password = format!("{name}-password");
        self.call(
            Method::POST,
            "/api/v1/users",
            None,
            Some(json!({"username": name, "password": password})),
        )
        .await
        .expect(201);
        self.sign_in(name, &password).await
    }

    pub async fn sign_in(&self, name: &str, password: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/api/v1/sessions",
                None,
                Some(json!({"username": name, "password": password})),
            )
            .await
            .expect(201);
        r.json()["token"].as_str().unwrap().to_string()
    }

    pub async fn admin(&self) -> String {
        self.state
            .engine
            .ensure_admin("admin-password")
            .await
            .unwrap();
        self.sign_in("admin", "admin-password").await
    }

    pub async fn item(&self, token: &str, kind: &str, props: Value, acl: Value) -> Value {
        self.call(
            Method::POST,
            "/api/v1/items",
            Some(token),
            Some(json!({"kind": kind, "properties": props, "acl": acl})),
        )
        .await
        .expect(201)
        .json()
    }

    pub async fn put_body(
        &self,
        token: Option<&str>,
        path: &str,
        bytes: Vec<u8>,
        content_type: &str,
    ) -> Reply {
        let mut req = Request::builder()
            .method(Method::PUT)
            .uri(path)
            .header("content-type", content_type);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        self.raw(req.body(Body::from(bytes)).unwrap()).await
    }

    pub async fn wait_index(&self, token: &str, name: &str) {
        for _ in 0..300 {
            let r = self
                .get(&format!("/api/v1/indexes/{name}"), Some(token))
                .await
                .expect(200);
            if r.json()["state"] == "ready" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("index {name} never became ready");
    }
}
