//! The web app's side of the server: the cookie session (HttpOnly, CSRF
//! proofs on writes, bearer tokens winning), an administrator's password
//! reset, and the app's pages (client-side routes, cache headers, the
//! Content-Security-Policy).

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request};
use serde_json::{json, Value};
use tarn_server::web::WebFile;
use tarn_server::ServerConfig;

use crate::support::{Reply, TestApp};

/// Signs in by cookie; returns the reply (its `Set-Cookie` holds the token).
async fn cookie_sign_in(app: &TestApp, name: &str, password: &str) -> Reply {
    app.call_with(
        Method::POST,
        "/api/v1/sessions/cookie",
        None,
        Some(json!({"username": name, "password": password})),
        &[("x-tarn-csrf", "1")],
    )
    .await
}

/// The `tarn_session=<token>` pair of a `Set-Cookie`.
fn cookie_pair(r: &Reply) -> String {
    let set = r.header("set-cookie").expect("a Set-Cookie");
    set.split(';').next().unwrap().trim().to_string()
}

/// Signs a user up, then in by cookie; returns the `Cookie` header value.
async fn browser(app: &TestApp, name: &str) -> String {
    app.user(name).await;
    let r = cookie_sign_in(app, name, &format!("{name}-password"))
        .await
        .expect(201);
    cookie_pair(&r)
}

#[tokio::test]
async fn the_cookie_sign_in_sets_an_httponly_strict_cookie_and_never_shows_the_token() {
    let app = TestApp::new().await;
    app.user("alice").await;
    // Without the CSRF header it is refused before any password is
    // checked, as every cookie write is.
    let r = app
        .call(
            Method::POST,
            "/api/v1/sessions/cookie",
            None,
            Some(json!({"username": "alice", "password": "alice-password"})),
        )
        .await
        .expect(403);
    assert!(r.header("set-cookie").is_none());
    cookie_sign_in(&app, "alice", "wrong-password")
        .await
        .expect(401);

    let r = cookie_sign_in(&app, "alice", "alice-password")
        .await
        .expect(201);
    let body = r.json();
    assert_eq!(body["username"], "alice");
    assert!(body.get("token").is_none(), "{body}");
    let set = r.header("set-cookie").unwrap().to_string();
    let attrs: Vec<&str> = set.split(';').map(str::trim).collect();
    assert!(attrs[0].starts_with("tarn_session=alice."), "{set}");
    for a in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(attrs.contains(&a), "{a} in {set}");
    }
    assert!(attrs.iter().any(|a| a.starts_with("Max-Age=")), "{set}");
    assert!(!attrs.contains(&"Secure"), "plain HTTP: {set}");
    // The token is nowhere in the body.
    let token = attrs[0].strip_prefix("tarn_session=").unwrap();
    assert!(!r.text().contains(token));

    // Another site's page cannot sign someone in.
    let r = app
        .call_with(
            Method::POST,
            "/api/v1/sessions/cookie",
            None,
            Some(json!({"username": "alice", "password": "alice-password"})),
            &[("x-tarn-csrf", "1"), ("sec-fetch-site", "cross-site")],
        )
        .await
        .expect(403);
    assert!(r.header("set-cookie").is_none());
}

#[tokio::test]
async fn the_cookie_is_secure_only_when_a_trusted_proxy_says_https() {
    let app = TestApp::with(ServerConfig {
        trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
        ..ServerConfig::default()
    })
    .await;
    app.user("alice").await;
    let sign_in = |peer: &str, proto: Option<&str>| {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri("/api/v1/sessions/cookie")
            .header("content-type", "application/json")
            .header("x-tarn-csrf", "1");
        if let Some(p) = proto {
            req = req.header("x-forwarded-proto", p);
        }
        let mut req = req
            .body(Body::from(
                json!({"username": "alice", "password": "alice-password"}).to_string(),
            ))
            .unwrap();
        let peer: SocketAddr = format!("{peer}:5000").parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        req
    };
    let secure = |r: &Reply| {
        r.header("set-cookie")
            .unwrap()
            .split(';')
            .any(|a| a.trim() == "Secure")
    };
    let r = app
        .raw(sign_in("127.0.0.1", Some("https")))
        .await
        .expect(201);
    assert!(secure(&r), "{:?}", r.header("set-cookie"));
    let r = app
        .raw(sign_in("127.0.0.1", Some("http")))
        .await
        .expect(201);
    assert!(!secure(&r));
    // A client cannot claim HTTPS for itself.
    let r = app
        .raw(sign_in("10.9.9.9", Some("https")))
        .await
        .expect(201);
    assert!(!secure(&r));
}

/// A request as it arrives from `peer`, with `headers`.
fn from_peer(
    method: Method,
    uri: &str,
    peer: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Request<Body> {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let mut req = req
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let peer: SocketAddr = format!("{peer}:5000").parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_cookie_is_host_only_and_forwarded_host_believed() {
    let app = TestApp::with(ServerConfig {
        trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
        ..ServerConfig::default()
    })
    .await;
    app.user("alice").await;
    let https = [("x-forwarded-proto", "https"), ("x-tarn-csrf", "1")];
    let r = app
        .raw(from_peer(
            Method::POST,
            "/api/v1/sessions/cookie",
            "127.0.0.1",
            &https,
            Some(json!({"username": "alice", "password": "alice-password"})),
        ))
        .await
        .expect(201);
    let set = r.header("set-cookie").unwrap().to_string();
    assert!(set.starts_with("__Host-tarn_session=alice."), "{set}");
    assert!(set.contains("; Secure") && set.contains("Path=/") && !set.contains("Domain"));
    let pair = cookie_pair(&r);
    let token = pair
        .strip_prefix("__Host-tarn_session=")
        .unwrap()
        .to_string();
    let me = |cookie: String| {
        app.raw(from_peer(
            Method::GET,
            "/api/v1/me",
            "127.0.0.1",
            &[("x-forwarded-proto", "https"), ("cookie", cookie.as_str())],
            None,
        ))
    };
    let r = me(pair.clone()).await.expect(200);
    assert_eq!(r.json()["username"], "alice");
    // Over HTTPS a plain `tarn_session` (which a sibling subdomain or a
    // plain-HTTP attacker could plant) is no credential.
    me(format!("tarn_session={token}")).await.expect(401);
    // Writes from the proxied site's pages: the proxy's X-Forwarded-Host
    // names the origin; from a peer that is no trusted proxy it does not.
    // (The proxy's headers are sent from every peer; only a trusted one's
    // count.)
    let write = |peer: &'static str, cookie: String| {
        let app = &app;
        async move {
            app.raw(from_peer(
                Method::POST,
                "/api/v1/items",
                peer,
                &[
                    ("x-forwarded-proto", "https"),
                    ("cookie", cookie.as_str()),
                    ("x-tarn-csrf", "1"),
                    ("host", "127.0.0.1:7700"),
                    ("x-forwarded-host", "tarn.example"),
                    ("origin", "https://tarn.example"),
                ],
                Some(json!({"kind": "document"})),
            ))
            .await
        }
    };
    write("127.0.0.1", pair.clone()).await.expect(201);
    // (From elsewhere the cookie is read as `tarn_session`, absent here.)
    write("10.9.9.9", pair.clone()).await.expect(401);
    let plain = format!("{}; x=1", pair.replace("__Host-", ""));
    let r = write("10.9.9.9", plain).await.expect(403);
    assert_eq!(r.json()["type"], "forbidden");
}

/// Regression: the first of two same-named session cookies won, so a
/// cookie planted for a parent domain (sent first) signed the victim in as
/// the attacker (session fixation).
#[tokio::test]
async fn two_different_session_cookies_are_no_credential() {
    let app = TestApp::new().await;
    let alice = browser(&app, "alice").await;
    let mallory = browser(&app, "mallory").await;
    let me = |cookie: String| {
        let app = &app;
        async move {
            app.call_with(
                Method::GET,
                "/api/v1/me",
                None,
                None,
                &[("cookie", cookie.as_str())],
            )
            .await
        }
    };
    me(format!("{mallory}; {alice}")).await.expect(401);
    me(format!("{alice}; theme=dark; {mallory}"))
        .await
        .expect(401);
    // The same cookie twice is still that session.
    let r = me(format!("{alice}; {alice}")).await.expect(200);
    assert_eq!(r.json()["username"], "alice");
}

#[tokio::test]
async fn signing_out_with_a_token_and_the_cookie_ends_both_sessions() {
    let app = TestApp::new().await;
    let cookie = browser(&app, "alice").await;
    let token = app.sign_in("alice", "alice-password").await;
    let r = app
        .call_with(
            Method::DELETE,
            "/api/v1/sessions/current",
            Some(&token),
            None,
            &[("cookie", cookie.as_str())],
        )
        .await
        .expect(204);
    assert!(r
        .header("set-cookie")
        .unwrap()
        .starts_with("tarn_session=;"));
    app.call(Method::GET, "/api/v1/me", Some(&token), None)
        .await
        .expect(401);
    app.call_with(
        Method::GET,
        "/api/v1/me",
        None,
        None,
        &[("cookie", cookie.as_str())],
    )
    .await
    .expect(401);
    // A stale bearer token beside a live cookie: the cookie's session ends
    // all the same.
    let r = cookie_sign_in(&app, "alice", "alice-password")
        .await
        .expect(201);
    let cookie = cookie_pair(&r);
    app.call_with(
        Method::DELETE,
        "/api/v1/sessions/current",
        Some(&token),
        None,
        &[("cookie", cookie.as_str())],
    )
    .await
    .expect(401);
    app.call_with(
        Method::GET,
        "/api/v1/me",
        None,
        None,
        &[("cookie", cookie.as_str())],
    )
    .await
    .expect(401);
}

#[tokio::test]
async fn the_cookie_signs_in_reads_and_the_bearer_token_wins() {
    let app = TestApp::new().await;
    let alice = browser(&app, "alice").await;
    let bob = app.user("bob").await;
    let me = |cookie: Option<String>, token: Option<String>| {
        let app = &app;
        async move {
            let mut headers = Vec::new();
            if let Some(c) = &cookie {
                headers.push(("cookie", c.as_str()));
            }
            let headers: Vec<(&str, &str)> = headers;
            app.call_with(Method::GET, "/api/v1/me", token.as_deref(), None, &headers)
                .await
        }
    };
    let r = me(Some(alice.clone()), None).await.expect(200);
    assert_eq!(r.json()["username"], "alice");
    // Among other cookies, too.
    let r = me(Some(format!("theme=dark; {alice}; x=1")), None)
        .await
        .expect(200);
    assert_eq!(r.json()["username"], "alice");
    let r = me(Some(alice.clone()), Some(bob.clone())).await.expect(200);
    assert_eq!(r.json()["username"], "bob", "the bearer token wins");
    // A bad bearer token is refused even beside a good cookie: no fallback.
    me(Some(alice.clone()), Some("alice.forged".into()))
        .await
        .expect(401);
    me(Some("tarn_session=alice.forged".into()), None)
        .await
        .expect(401);
    // The event stream takes the cookie (a browser's EventSource sends it).
    let r = app
        .call_with(
            Method::GET,
            "/api/v1/events",
            None,
            None,
            &[("cookie", alice.as_str())],
        )
        .await
        .expect(200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
}

#[tokio::test]
async fn writes_signed_in_by_cookie_need_the_csrf_proofs() {
    let app = TestApp::new().await;
    let alice = browser(&app, "alice").await;
    let bob = app.user("bob").await;
    let create = |headers: Vec<(&'static str, String)>| {
        let app = &app;
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            app.call_with(
                Method::POST,
                "/api/v1/items",
                None,
                Some(json!({"kind": "document"})),
                &h,
            )
            .await
        }
    };
    let c = || ("cookie", alice.clone());
    let csrf = || ("x-tarn-csrf", "1".to_string());
    let r = create(vec![c()]).await.expect(403);
    assert_eq!(r.json()["type"], "forbidden");
    create(vec![c(), ("x-tarn-csrf", "yes".into())])
        .await
        .expect(403);
    create(vec![c(), csrf(), ("origin", "http://evil.example".into())])
        .await
        .expect(403);
    create(vec![c(), csrf(), ("origin", "null".into())])
        .await
        .expect(403);
    create(vec![c(), csrf(), ("sec-fetch-site", "same-site".into())])
        .await
        .expect(403);
    // From the app's own page.
    let r = create(vec![
        c(),
        csrf(),
        ("host", "tarn.example:7700".into()),
        ("origin", "http://tarn.example:7700".into()),
        ("sec-fetch-site", "same-origin".into()),
    ])
    .await
    .expect(201);
    assert_eq!(r.json()["createdBy"], "alice");
    // An origin is its scheme too: over plain HTTP, https://host is not it.
    for other in ["https://tarn.example:7700", "foo://tarn.example:7700"] {
        create(vec![
            c(),
            csrf(),
            ("host", "tarn.example:7700".into()),
            ("origin", other.into()),
        ])
        .await
        .expect(403);
    }
    // X-Forwarded-Host is believed only from a trusted proxy (see
    // behind_a_trusted_proxy_the_cookie_is_host_only_and_forwarded_host_believed);
    // a client cannot name its own site as this one.
    create(vec![
        c(),
        csrf(),
        ("host", "127.0.0.1:7700".into()),
        ("x-forwarded-host", "evil.example".into()),
        ("origin", "https://evil.example".into()),
    ])
    .await
    .expect(403);
    create(vec![c(), csrf()]).await.expect(201);
    // Reads need no proof; a bearer token needs none either.
    app.call_with(
        Method::GET,
        "/api/v1/items?scope=mine",
        None,
        None,
        &[("cookie", alice.as_str())],
    )
    .await
    .expect(200);
    let r = app
        .call_with(
            Method::POST,
            "/api/v1/items",
            Some(&bob),
            Some(json!({"kind": "document"})),
            &[("cookie", alice.as_str())],
        )
        .await
        .expect(201);
    assert_eq!(r.json()["createdBy"], "bob");
}

#[tokio::test]
async fn signing_out_by_cookie_clears_it_and_ends_the_session() {
    let app = TestApp::new().await;
    let alice = browser(&app, "alice").await;
    let h = [("cookie", alice.as_str()), ("x-tarn-csrf", "1")];
    // Without the proof, the session stays.
    app.call_with(
        Method::DELETE,
        "/api/v1/sessions/current",
        None,
        None,
        &h[..1],
    )
    .await
    .expect(403);
    // What the session reads is its own: no cache keeps it.
    let r = app
        .call_with(Method::GET, "/api/v1/me", None, None, &h[..1])
        .await
        .expect(200);
    assert_eq!(r.header("cache-control"), Some("private, no-store"));
    assert!(r.header("vary").unwrap().contains("Cookie"));
    assert_eq!(
        r.header("cross-origin-resource-policy"),
        Some("same-origin")
    );
    let r = app.get("/api/v1/health", None).await.expect(200);
    assert!(
        r.header("cache-control").is_none(),
        "no credentials, nothing private"
    );
    // But a shared cache keeps it apart from what a signed-in caller gets.
    assert!(r.header("vary").unwrap().contains("Authorization, Cookie"));
    // A wrong password sent from a browser that is signed in says nothing
    // of its session: the cookie stays.
    let r = app
        .call_with(
            Method::POST,
            "/api/v1/sessions/cookie",
            None,
            Some(json!({"username": "alice", "password": "not-her-password"})),
            &h,
        )
        .await
        .expect(401);
    assert!(r.header("set-cookie").is_none());
    let r = app
        .call_with(Method::DELETE, "/api/v1/sessions/current", None, None, &h)
        .await
        .expect(204);
    let set = r.header("set-cookie").unwrap();
    assert!(set.starts_with("tarn_session=;"), "{set}");
    assert!(set.contains("Max-Age=0"), "{set}");
    // A dead cookie is cleared by the 401 it gets, so the browser stops
    // sending it.
    let r = app
        .call_with(Method::GET, "/api/v1/me", None, None, &h[..1])
        .await
        .expect(401);
    let set = r.header("set-cookie").expect("the dead cookie cleared");
    assert!(
        set.starts_with("tarn_session=;") && set.contains("Max-Age=0"),
        "{set}"
    );
    // Signing out again with the dead cookie still clears it.
    let r = app
        .call_with(Method::DELETE, "/api/v1/sessions/current", None, None, &h)
        .await
        .expect(401);
    assert!(r.header("set-cookie").unwrap().contains("Max-Age=0"));
}

#[tokio::test]
async fn an_administrator_resets_a_password_and_ends_every_session_of_that_user() {
    let app = TestApp::new().await;
    let admin = app.admin().await;
    let bob = app.user("bob").await;
    let bob_cookie = cookie_pair(
        &cookie_sign_in(&app, "bob", "bob-password")
            .await
            .expect(201),
    );
    let carol = app.user("carol").await;
    let reset = |token: Option<String>, who: &'static str, password: &'static str| {
        put_password(&app, token, who, json!({"password": password}))
    };
    reset(None, "bob", "new-password-1").await.expect(401);
    reset(Some(carol.clone()), "bob", "new-password-1")
        .await
        .expect(403);
    reset(Some(admin.clone()), "nobody", "new-password-1")
        .await
        .expect(404);
    reset(Some(admin.clone()), "bob", "short").await.expect(400);
    // Nothing changed so far.
    app.get("/api/v1/me", Some(&bob)).await.expect(200);

    reset(Some(admin.clone()), "bob", "new-password-1")
        .await
        .expect(204);
    app.get("/api/v1/me", Some(&bob)).await.expect(401);
    app.call_with(
        Method::GET,
        "/api/v1/me",
        None,
        None,
        &[("cookie", bob_cookie.as_str())],
    )
    .await
    .expect(401);
    refused_sign_in(&app, "bob", "bob-password").await;
    let bob = app.sign_in("bob", "new-password-1").await;
    app.get("/api/v1/me", Some(&bob)).await.expect(200);
    // Other users keep their sessions.
    app.get("/api/v1/me", Some(&carol)).await.expect(200);
}

#[tokio::test]
async fn a_user_changes_their_own_password_and_keeps_only_the_session_asking() {
    let app = TestApp::new().await;
    let bob = app.user("bob").await;
    let bob_elsewhere = app.sign_in("bob", "bob-password").await;
    let carol = app.user("carol").await;
    let change = |token: Option<String>, who: &'static str, body: Value| {
        put_password(&app, token, who, body)
    };
    let asked = |current: &str| json!({"password": "bob-new-password", "currentPassword": current});
    change(None, "bob", asked("bob-password")).await.expect(401);
    // A wrong current password is 403: the caller's session is fine.
    let r = change(Some(bob.clone()), "bob", asked("not-bobs-password"))
        .await
        .expect(403);
    assert_eq!(r.json()["type"], "forbidden");
    // Without it, only an administrator may set a password.
    change(
        Some(bob.clone()),
        "bob",
        json!({"password": "bob-new-password"}),
    )
    .await
    .expect(403);
    // Another user's, even knowing it, is not theirs to change.
    change(Some(carol.clone()), "bob", asked("bob-password"))
        .await
        .expect(403);
    change(
        Some(bob.clone()),
        "bob",
        json!({"password": "short", "currentPassword": "bob-password"}),
    )
    .await
    .expect(400);
    // Nothing changed so far.
    app.get("/api/v1/me", Some(&bob_elsewhere))
        .await
        .expect(200);
    app.sign_in("bob", "bob-password").await;

    change(Some(bob.clone()), "bob", asked("bob-password"))
        .await
        .expect(204);
    app.get("/api/v1/me", Some(&bob)).await.expect(200);
    app.get("/api/v1/me", Some(&bob_elsewhere))
        .await
        .expect(401);
    refused_sign_in(&app, "bob", "bob-password").await;
    app.sign_in("bob", "bob-new-password").await;
    app.get("/api/v1/me", Some(&carol)).await.expect(200);
    // The old password is no longer the current one.
    change(Some(bob.clone()), "bob", asked("bob-password"))
        .await
        .expect(403);
}

/// `PUT /api/v1/users/{who}/password` with this body.
async fn put_password(app: &TestApp, token: Option<String>, who: &str, body: Value) -> Reply {
    app.call(
        Method::PUT,
        &format!("/api/v1/users/{who}/password"),
        token.as_deref(),
        Some(body),
    )
    .await
}

/// A sign-in with this password is refused.
async fn refused_sign_in(app: &TestApp, username: &str, password: &str) {
    app.call(
        Method::POST,
        "/api/v1/sessions",
        None,
        Some(json!({"username": username, "password": password})),
    )
    .await
    .expect(401);
}

/// A request as a browser's navigation sends it.
async fn navigate(app: &TestApp, path: &str) -> Reply {
    app.call_with(
        Method::GET,
        path,
        None,
        None,
        &[
            ("accept", "text/html,application/xhtml+xml,*/*;q=0.8"),
            ("accept-encoding", "gzip"),
        ],
    )
    .await
}

fn assert_strict_page(r: &Reply) {
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    let csp = r.header("content-security-policy").unwrap();
    for d in [
        "default-src 'self'",
        "script-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ] {
        assert!(csp.contains(d), "{d} in {csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
}

/// A built app as `npm run build` lays it out: the page, a content-hashed
/// script with its gzip twin, and a file at the root.
static FAKE_APP: &[WebFile] = &[
    WebFile {
        path: "/assets/index-1a2b3c.js",
        body: b"console.log('the app');",
        gzip: Some(b"\x1f\x8b-pretend-gzip"),
    },
    WebFile {
        path: "/favicon.svg",
        body: b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        gzip: None,
    },
    WebFile {
        path: "/index.html",
        body: b"<!doctype html><title>Tarn</title><script type=\"module\" crossorigin src=\"/assets/index-1a2b3c.js\"></script><div id=app></div>",
        gzip: Some(b"\x1f\x8b-pretend-gzip-page"),
    },
];

#[tokio::test]
async fn a_server_built_without_the_app_says_at_the_root_how_to_build_it() {
    let app = TestApp::with_web(&[]).await;
    for path in ["/", "/shared", "/items/abc"] {
        let r = navigate(&app, path).await.expect(200);
        assert_strict_page(&r);
        let text = r.text();
        assert_eq!(text, tarn_server::web::NOT_BUILT, "{path}");
        assert!(text.contains("make run"), "{text}");
        assert!(text.contains("npm run build"), "{text}");
        assert!(!text.contains("<script"), "{text}");
    }
    // The API is all there.
    app.get("/api/v1/health", None).await.expect(200);
    navigate(&app, "/api/v1/nothing").await.expect(404);
    navigate(&app, "/assets/index-1a2b3c.js").await.expect(404);
}

#[tokio::test]
async fn the_app_is_served_at_the_root_and_at_its_client_side_routes() {
    let app = TestApp::with_web(FAKE_APP).await;
    let root = navigate(&app, "/").await.expect(200);
    assert_strict_page(&root);
    assert_eq!(root.bytes, FAKE_APP[2].gzip.unwrap());
    assert_eq!(root.header("content-encoding"), Some("gzip"));
    assert_eq!(root.header("vary"), Some("accept-encoding"));
    for route in ["/shared", "/items/abc", "/admin/indexes", "/chat/room-1"] {
        let r = navigate(&app, route).await.expect(200);
        assert_strict_page(&r);
        assert_eq!(r.bytes, root.bytes, "{route} is the app's page");
    }
    // Without gzip, the page itself.
    let plain = app.get("/", None).await.expect(200);
    assert_strict_page(&plain);
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.bytes, FAKE_APP[2].body);
    // Content-hashed assets are immutable; other files are revalidated.
    let js = app.get("/assets/index-1a2b3c.js", None).await.expect(200);
    assert_eq!(js.bytes, FAKE_APP[0].body);
    assert_eq!(
        js.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_eq!(
        js.header("cache-control"),
        Some("public, max-age=31536000, immutable")
    );
    assert_eq!(js.header("x-content-type-options"), Some("nosniff"));
    let icon = app.get("/favicon.svg", None).await.expect(200);
    assert_eq!(icon.header("content-type"), Some("image/svg+xml"));
    assert_eq!(icon.header("cache-control"), Some("no-cache"));

    // What is not a page, or is the API's, stays a problem.
    for path in ["/items/abc", "/nothing-here"] {
        let r = app
            .call_with(
                Method::GET,
                path,
                None,
                None,
                &[("accept", "application/json")],
            )
            .await
            .expect(404);
        assert_eq!(r.json()["type"], "not-found");
    }
    for path in ["/api/v1/nothing", "/api/v1/items/a/b", "/api", "/api/"] {
        navigate(&app, path).await.expect(404);
    }
    app.call(Method::POST, "/", None, None).await.expect(404);
    // An asset of another build is gone: never the page in its place.
    navigate(&app, "/assets/gone-0000.js").await.expect(404);
}

#[tokio::test]
async fn the_app_built_into_this_binary_has_no_inline_script() {
    let app = TestApp::new().await;
    let root = app.get("/", None).await.expect(200);
    assert_strict_page(&root);
    let html = root.text();
    if tarn_server::web::built() {
        let mut scripts = 0;
        for tag in html.split("<script").skip(1) {
            let open = &tag[..tag.find('>').unwrap()];
            let src = open
                .split("src=\"")
                .nth(1)
                .map(|s| &s[..s.find('"').unwrap()])
                .unwrap_or_else(|| panic!("an inline script: <script{open}>"));
            assert!(src.starts_with("/assets/"), "{src}");
            let r = app.get(src, None).await.expect(200);
            assert_eq!(
                r.header("content-type"),
                Some("text/javascript; charset=utf-8")
            );
            assert!(r.bytes.len() > 1000);
            scripts += 1;
        }
        assert!(scripts >= 1, "{html}");
        assert!(!html.contains(" style="), "no inline style: {html}");
    } else {
        // Built without web/dist: the page that says how to build it.
        assert_eq!(html, tarn_server::web::NOT_BUILT);
    }
}

#[tokio::test]
async fn the_document_describes_the_cookie_and_the_new_operations() {
    let app = TestApp::new().await;
    let doc: Value = app
        .get("/api/v1/openapi.json", None)
        .await
        .expect(200)
        .json();
    let cookie = &doc["components"]["securitySchemes"]["cookie"];
    assert_eq!(cookie["type"], "apiKey");
    assert_eq!(cookie["in"], "cookie");
    assert_eq!(cookie["name"], "tarn_session");
    let me = &doc["paths"]["/api/v1/me"]["get"];
    assert!(me["security"].to_string().contains("cookie"), "{me}");
    // Every operation that takes a bearer token takes the cookie, and every
    // one of them that changes something documents the CSRF refusal.
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let security = op["security"].to_string();
            assert_eq!(
                security.contains("bearer"),
                security.contains("cookie"),
                "{method} {path}"
            );
            if security.contains("cookie") && method != "get" {
                assert!(
                    op["responses"].get("403").is_some(),
                    "{method} {path} documents 403"
                );
            }
        }
    }
    let sign_in = &doc["paths"]["/api/v1/sessions/cookie"]["post"];
    assert_eq!(sign_in["operationId"], "signInCookie");
    assert!(sign_in["responses"]["201"]["headers"]
        .get("Set-Cookie")
        .is_some());
    let reset = &doc["paths"]["/api/v1/users/{username}/password"]["put"];
    assert_eq!(reset["operationId"], "resetPassword");
}
