//! The OpenAPI 3.1 document, served at `/api/v1/openapi.json`.
//!
//! Its operations come from the handlers' `#[utoipa::path]` declarations,
//! gathered by [`crate::routes::router`]; its schemas from the types of
//! [`crate::json`]; its error responses from the table in
//! [`crate::error`]. This module adds what belongs to the whole document:
//! its description, the bearer and cookie security schemes and the problem
//! schema, and what the cookie means for every operation (see [`refine`]).

use std::sync::OnceLock;

use axum::body::Bytes;
use axum::http::Method;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{OpenApi as Document, RefOr};
use utoipa::{Modify, OpenApi};

use crate::error::Problem;
use crate::json::{
    Cursor, GivenCursor, Id, IndexDeclaration, IndexName, MemberName, Name, PrincipalName,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tarn HTTP API",
        description = "A collaboration content server: users, nested groups, items shared per user, group, everyone or link, and listings served by indexes that hold the reader.\n\nErrors are RFC 9457 problem JSON whose `type` is a stable slug. A method a path does not take answers `405 method-not-allowed` with `Allow`; a path outside this document answers `404 not-found`. Requests without a token act as the anonymous caller (principal `everyone`); an item the caller may not read answers `404`, exactly like one that does not exist.",
    ),
    // Schemas that parameters name: utoipa collects only the schemas of
    // bodies.
    components(schemas(
        Problem,
        Name,
        PrincipalName,
        MemberName,
        IndexName,
        Id,
        Cursor,
        GivenCursor
    )),
    modifiers(&Security),
    tags(
        (name = "system", description = "Health, metrics and this document"),
        (name = "users", description = "Users and sessions"),
        (name = "groups", description = "Nested groups, their members and managers"),
        (name = "items", description = "Items, their sharing and links, and listings"),
        (name = "bodies", description = "Item bodies, streamed"),
        (name = "search", description = "Full-text search over text indexes"),
        (name = "changes", description = "The change feed, paged and live"),
        (name = "indexes", description = "Index declarations (administrators)"),
    ),
)]
struct ApiDoc;

/// The bearer token scheme of `POST /api/v1/sessions` and the cookie of
/// `POST /api/v1/sessions/cookie`.
struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "`Authorization: Bearer <token>`, the token of `POST /api/v1/sessions`",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "cookie",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                crate::extract::SESSION_COOKIE,
                "The web app's session: the HttpOnly cookie set by `POST /api/v1/sessions/cookie` (named `__Host-tarn_session` when a trusted proxy says the client spoke HTTPS). A bearer token wins over it; two different session cookies in one request are no credential. A request signed in by it that changes something (any method but GET and HEAD) must carry `X-Tarn-CSRF: 1`, and its `Origin` and `Sec-Fetch-Site`, when present, must name this origin; otherwise `403 forbidden`.",
            ))),
        );
    }
}

/// What the routes extend: the document's description, security scheme and
/// shared schemas.
pub fn base() -> Document {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// The whole document.
pub fn document() -> &'static Document {
    static DOC: OnceLock<Document> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = crate::routes::router().into_openapi();
        refine(&mut doc);
        doc
    })
}

/// Adds what the derives cannot state: constraints between fields, and
/// the session cookie. Every operation that takes a bearer token takes the
/// cookie as well (the same extractor reads both), and every such operation
/// that changes something may refuse a cookie without the CSRF proofs with
/// `403`: stated here once, for all of them.
fn refine(doc: &mut Document) {
    for item in doc.paths.paths.values_mut() {
        let unsafe_ops = [
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        let safe_ops = [&mut item.get, &mut item.head];
        for (changes, op) in unsafe_ops
            .into_iter()
            .map(|op| (true, op))
            .chain(safe_ops.into_iter().map(|op| (false, op)))
        {
            let Some(op) = op.as_mut() else { continue };
            let Some(security) = op.security.as_mut() else {
                continue;
            };
            let takes_bearer = serde_json::to_value(&*security)
                .map(|v| v.to_string().contains("\"bearer\""))
                .unwrap_or(false);
            if !takes_bearer {
                continue;
            }
            security.push(SecurityRequirement::new("cookie", Vec::<String>::new()));
            if changes {
                op.responses
                    .responses
                    .entry("403".to_string())
                    .or_insert_with(|| {
                        RefOr::T(crate::error::problem_response(
                            axum::http::StatusCode::FORBIDDEN,
                        ))
                    });
            }
        }
    }
    // No bytes are an empty body: an upload's bytes may be left out.
    if let Some(RefOr::T(body)) = doc
        .paths
        .paths
        .get_mut("/api/v1/items/{id}/body")
        .and_then(|item| item.put.as_mut())
        .and_then(|op| op.request_body.as_mut())
    {
        body.required = None;
    }
    let schemas = &mut doc.components.get_or_insert_with(Default::default).schemas;
    if let Some(RefOr::T(Schema::Object(declaration))) = schemas.get_mut("IndexDeclaration") {
        let extensions = declaration.extensions.get_or_insert_with(Default::default);
        extensions.insert("anyOf".into(), IndexDeclaration::field_budget());
        extensions.insert("allOf".into(), IndexDeclaration::shape());
    }
}

/// Every operation of the document: method and path template.
pub fn operations() -> Vec<(Method, String)> {
    let mut out = Vec::new();
    for (path, item) in &document().paths.paths {
        let methods = [
            (Method::GET, &item.get),
            (Method::PUT, &item.put),
            (Method::POST, &item.post),
            (Method::DELETE, &item.delete),
            (Method::OPTIONS, &item.options),
            (Method::HEAD, &item.head),
            (Method::PATCH, &item.patch),
            (Method::TRACE, &item.trace),
        ];
        for (method, op) in methods {
            if op.is_some() {
                out.push((method, path.clone()));
            }
        }
    }
    out
}

/// The document as served: JSON, rendered once.
pub fn json() -> Bytes {
    static JSON: OnceLock<Bytes> = OnceLock::new();
    JSON.get_or_init(|| {
        Bytes::from(serde_json::to_vec(document()).expect("the document serialises"))
    })
    .clone()
}
