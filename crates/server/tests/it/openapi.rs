//! The OpenAPI document and the router agree: every documented operation is
//! routed, every routed path answers only its documented methods, and the
//! document is what the server serves.

use axum::http::Method;
use serde_json::Value;
use tarn_server::openapi::path_params;
use tarn_server::routes::table;

use crate::support::TestApp;

const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

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

#[tokio::test]
async fn document_and_router_agree() {
    let app = TestApp::new().await;
    let served = app
        .get("/api/v1/openapi.json", None)
        .await
        .expect(200)
        .json();
    assert_eq!(served["openapi"], "3.1.0");
    assert_eq!(
        served,
        tarn_server::openapi::document(),
        "the served document is the generated one"
    );
    let paths = served["paths"].as_object().unwrap();

    let routes = table();
    let documented: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
    assert_eq!(
        documented,
        routes.len(),
        "one documented operation per route"
    );

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
            }
        }
        for (method, op) in ops {
            assert!(op["operationId"].is_string());
            assert!(op["responses"].is_object());
            for name in path_params(path) {
                let has = op["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["name"] == name && p["in"] == "path");
                assert!(has, "{method} {path} documents {name}");
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
    // Paths outside the document are not served.
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
