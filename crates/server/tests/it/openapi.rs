//! The generated OpenAPI document and the server agree: every documented
//! operation is routed and every routed path answers only its documented
//! methods; every operation documents the error statuses it can answer;
//! request bodies that refuse unknown fields say so; and the document is
//! what the server serves.

use axum::http::Method;
use serde_json::{json, Value};

use crate::support::TestApp;

const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

fn document() -> Value {
    serde_json::to_value(tarn_server::openapi::document()).unwrap()
}

/// The path parameters of a template, in order.
fn path_params(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .collect()
}

/// A path with a well-formed sample for each parameter.
fn concrete(path: &str) -> String {
    let mut p = path.to_string();
    for name in path_params(path) {
        let sample = match name {
            "principal" => "user:nobody",
            _ => "sample",
        };
        p = p.replace(&format!("{{{name}}}"), sample);
    }
    p
}

/// Follows a `$ref` into the document's components.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r.strip_prefix("#/components/schemas/").unwrap();
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

/// Every operation: method, path and the operation object.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            out.push((method.clone(), path.clone(), op.clone()));
        }
    }
    out
}

#[tokio::test]
async fn document_and_router_agree() {
    let app = TestApp::new().await;
    let r = app.get("/api/v1/openapi.json", None).await.expect(200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let served = r.json();
    assert_eq!(served["openapi"], "3.1.0");
    assert_eq!(
        served,
        document(),
        "the served document is the generated one"
    );
    let paths = served["paths"].as_object().unwrap();
    assert!(paths.len() >= 18, "{:?}", paths.keys().collect::<Vec<_>>());

    for (path, ops) in paths {
        let ops = ops.as_object().unwrap();
        let url = concrete(path);
        for m in METHODS {
            let r = app.call(m.clone(), &url, None, None).await;
            let doc_has = ops.contains_key(&m.as_str().to_ascii_lowercase());
            let body = r.json();
            if doc_has {
                // Routed: whatever it answers, it is not the router's own
                // 404 or 405.
                assert_ne!(
                    r.status.as_u16(),
                    405,
                    "{m} {path} is documented but not routed"
                );
                assert_ne!(
                    body["detail"], "no such route",
                    "{m} {path} is documented but not routed"
                );
            } else {
                assert_eq!(
                    r.status.as_u16(),
                    405,
                    "{m} {path} answers but is not documented: {}",
                    r.text()
                );
                r.assert_problem();
                let allow = r.header("allow").unwrap_or_default().to_ascii_lowercase();
                for documented in ops.keys() {
                    assert!(allow.contains(documented.as_str()), "{path}: Allow {allow}");
                }
            }
        }
        for (method, op) in ops {
            assert!(op["operationId"].is_string(), "{method} {path}");
            assert!(op["summary"].is_string(), "{method} {path}");
            for name in path_params(path) {
                let param = op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["name"] == name && p["in"] == "path")
                    .unwrap_or_else(|| panic!("{method} {path} documents {name}"));
                assert_eq!(param["required"], true, "{method} {path} {name}");
                let schema = resolve(&served, &param["schema"]);
                assert!(
                    schema["pattern"].is_string(),
                    "{method} {path}: {name} has a pattern"
                );
            }
        }
    }
    // Every schema referenced exists.
    let text = served.to_string();
    let schemas = served["components"]["schemas"].as_object().unwrap();
    for part in text.split("#/components/schemas/").skip(1) {
        let name: String = part.chars().take_while(|c| c.is_alphanumeric()).collect();
        assert!(schemas.contains_key(&name), "missing schema {name}");
    }
    // Paths under /api/ outside the document are not served (other paths
    // are the web app's: tests/it/web.rs).
    for url in [
        "/api/v1",
        "/api/v1/items/a/b",
        "/api/v2/health",
        "/api/v1/groups/x/others/y",
    ] {
        let r = app.get(url, None).await;
        assert_eq!(r.status.as_u16(), 404, "{url}");
        let v: Value = r.json();
        assert_eq!(v["type"], "not-found");
    }
}

#[test]
fn every_operation_documents_the_errors_it_can_answer() {
    let doc = document();
    let ops = operations(&doc);
    for (method, path, op) in &ops {
        let id = op["operationId"].as_str().unwrap();
        let responses = op["responses"].as_object().unwrap();
        let has = |status: u16| responses.contains_key(&status.to_string());
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        let has_param = |name: &str| params.iter().any(|p| p["name"] == name);
        let json_body = op["requestBody"]["content"]
            .as_object()
            .is_some_and(|c| c.contains_key("application/json"));
        let reads_store = !["health", "metrics", "openapi"].contains(&id);
        let reads_token = op.get("security").is_some();

        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{method} {path}: a success"
        );
        // Anything with input to read can be malformed.
        if !params.is_empty() || op.get("requestBody").is_some() {
            assert!(has(400), "{method} {path} documents 400");
        }
        // A malformed or unknown token is refused wherever one is read;
        // sign-in refuses wrong credentials; nothing else answers 401.
        assert_eq!(
            has(401),
            reads_token || id == "signIn" || id == "signInCookie",
            "{method} {path}: 401 exactly when it reads a token"
        );
        // Whatever names a thing in its path may not find it (a
        // declaration makes the index it names).
        if path.contains('{') && id != "declareIndex" {
            assert!(has(404), "{method} {path} documents 404");
        }
        // Every operation on the store may find it busy.
        assert_eq!(has(503), reads_store, "{method} {path}: 503");
        if json_body {
            assert!(has(413) && has(415), "{method} {path}: 413 and 415");
        }
        if has_param("If-Match") {
            assert!(has(412), "{method} {path}: 412");
        }
        if has_param("Range") {
            assert!(has(416), "{method} {path}: 416");
        }
        assert!(
            !has(500),
            "{method} {path}: 500 is never an answer to document"
        );
        for (status, response) in responses {
            let code: u16 = status.parse().unwrap();
            if code < 400 {
                continue;
            }
            assert_eq!(
                response["content"]["application/problem+json"]["schema"]["$ref"],
                "#/components/schemas/Problem",
                "{method} {path} {status}"
            );
            let retry = response["headers"].get("Retry-After").is_some();
            assert_eq!(
                retry,
                code == 429 || code == 503,
                "{method} {path} {status}: Retry-After"
            );
        }
    }
    let problem = &doc["components"]["schemas"]["Problem"];
    let slugs = problem["properties"]["type"]["enum"].as_array().unwrap();
    for slug in ["invalid-input", "no-index", "rate-limited", "unavailable"] {
        assert!(slugs.contains(&json!(slug)), "{slug}");
    }
    let bearer = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!(bearer["type"], "http");
    assert_eq!(bearer["scheme"], "bearer");
}

/// A request body refuses unknown fields exactly when its schema says
/// `additionalProperties: false`: the server is asked, with a body holding
/// nothing but an unknown field.
#[tokio::test]
async fn request_bodies_refuse_unknown_fields_as_documented() {
    let app = TestApp::new().await;
    let alice = app.user("alice").await;
    let doc = document();
    let mut checked = 0;
    for (method, path, op) in operations(&doc) {
        let Some(schema) = op["requestBody"]["content"]["application/json"].get("schema") else {
            continue;
        };
        let schema = resolve(&doc, schema);
        let closed = schema["additionalProperties"] == false;
        let m: Method = method.to_ascii_uppercase().parse().unwrap();
        let r = app
            .call(
                m,
                &concrete(&path),
                Some(&alice),
                Some(json!({"surely_unknown": 1})),
            )
            .await;
        let refused = r.status.as_u16() == 400
            && r.json()["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("unknown field");
        assert_eq!(
            refused,
            closed,
            "{method} {path}: refuses unknown fields: {refused}, documented: {closed}; {}",
            r.text()
        );
        checked += 1;
    }
    assert!(checked >= 8, "{checked} bodies");
}

#[tokio::test]
async fn malformed_query_strings_and_paths_are_problems() {
    let app = TestApp::new().await;
    let alice = app.user("alice").await;
    for url in [
        "/api/v1/groups/g/members?limit=abc",
        "/api/v1/groups/g/members?limit=0&limit=1",
        "/api/v1/groups/g/members?other=1",
        "/api/v1/items?kind=doc&limit=x",
        "/api/v1/items?kind=Not%20A%20Kind",
        "/api/v1/items?kind=doc&kind=doc",
        "/api/v1/items?kind=doc&scope=all",
        "/api/v1/items/%FF",
        "/api/v1/users/%FF%FE",
    ] {
        let r = app.get(url, Some(&alice)).await;
        assert_eq!(r.status.as_u16(), 400, "{url}: {}", r.text());
        r.assert_problem();
        assert_eq!(r.json()["type"], "invalid-input", "{url}");
    }
}
