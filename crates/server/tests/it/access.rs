//! The access-control table: for each role × each item operation, the
//! expected status, and responses never contain what the role may not see.

use axum::http::Method;
use serde_json::{json, Value};

use crate::support::{Reply, TestApp};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Anonymous,
    Stranger,
    NestedViewer,
    Editor,
    Manager,
    ViewLink,
    EditLink,
    /// A signed-in stranger with the view key.
    StrangerLink,
    Admin,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Read,
    Patch,
    PutBody,
    GetBody,
    SetAcl,
    MakeLink,
    DeleteLink,
    /// Removes a link named by its id, as the item's links list it.
    DeleteLinkById,
    ListLinks,
    Delete,
    Listed,
}

const ROLES: [Role; 9] = [
    Role::Anonymous,
    Role::Stranger,
    Role::NestedViewer,
    Role::Editor,
    Role::Manager,
    Role::ViewLink,
    Role::EditLink,
    Role::StrangerLink,
    Role::Admin,
];
const OPS: [Op; 11] = [
    Op::Read,
    Op::Patch,
    Op::PutBody,
    Op::GetBody,
    Op::SetAcl,
    Op::MakeLink,
    Op::DeleteLink,
    Op::DeleteLinkById,
    Op::ListLinks,
    Op::Delete,
    Op::Listed,
];

/// The table itself. For `Listed`, 200 means the item is in the caller's
/// listing and 404 that it is not.
fn expected(role: Role, op: Op) -> u16 {
    use Op::*;
    use Role::*;
    match (role, op) {
        (Anonymous | Stranger, _) => 404,
        (NestedViewer, Read | GetBody | Listed) => 200,
        (NestedViewer, _) => 403,
        (Editor, Read | GetBody | Listed | Patch | PutBody) => 200,
        (Editor, _) => 403,
        (Manager, MakeLink) => 201,
        (Manager, Delete | DeleteLink | DeleteLinkById) => 204,
        (Manager, _) => 200,
        // Links work on the item's own routes, never in listings, and never
        // reach sharing, links or deletion: the key makes the item readable,
        // so what its role does not allow is forbidden, not absent.
        (ViewLink | StrangerLink, Read | GetBody) => 200,
        (ViewLink | StrangerLink, Patch | PutBody) => 403,
        (EditLink, Read | GetBody | Patch | PutBody) => 200,
        (ViewLink | EditLink | StrangerLink, Listed) => 404,
        (ViewLink | EditLink | StrangerLink, _) => 403,
        (Admin, MakeLink) => 201,
        (Admin, Delete | DeleteLink | DeleteLinkById) => 204,
        (Admin, Listed) => 404,
        (Admin, _) => 200,
    }
}

struct World {
    app: TestApp,
    owner: String,
    tokens: Vec<(Role, Option<String>)>,
}

const SECRET: &str = "the-secret-title";

async fn world() -> World {
    let app = TestApp::new().await;
    let owner = app.user("owner").await;
    let viewer = app.user("viewer").await;
    let editor = app.user("editor").await;
    let stranger = app.user("stranger").await;
    let admin = app.admin().await;
    // viewer ∈ inner ⊂ outer; the item is shared with outer.
    for g in ["inner", "outer"] {
        app.call(
            Method::POST,
            "/api/v1/groups",
            Some(&owner),
            Some(json!({"id": g})),
        )
        .await
        .expect(201);
    }
    app.call(
        Method::PUT,
        "/api/v1/groups/inner/members/user:viewer",
        Some(&owner),
        None,
    )
    .await
    .expect(204);
    app.call(
        Method::PUT,
        "/api/v1/groups/outer/members/group:inner",
        Some(&owner),
        None,
    )
    .await
    .expect(204);
    World {
        app,
        owner: owner.clone(),
        tokens: vec![
            (Role::Anonymous, None),
            (Role::Stranger, Some(stranger.clone())),
            (Role::NestedViewer, Some(viewer)),
            (Role::Editor, Some(editor)),
            (Role::Manager, Some(owner)),
            (Role::ViewLink, None),
            (Role::EditLink, None),
            (Role::StrangerLink, Some(stranger)),
            (Role::Admin, Some(admin)),
        ],
    }
}

/// A fresh item with a body, shared as the table assumes; returns its id and
/// its two link keys.
async fn fresh_item(w: &World) -> (String, String, String) {
    let acl = json!([
        {"principal": "group:outer", "role": "viewer"},
        {"principal": "user:editor", "role": "editor"},
    ]);
    let item = w
        .app
        .item(&w.owner, "doc", json!({"title": SECRET}), acl)
        .await;
    let id = item["id"].as_str().unwrap().to_string();
    w.app
        .put_body(
            Some(&w.owner),
            &format!("/api/v1/items/{id}/body"),
            SECRET.as_bytes().to_vec(),
            "text/plain",
        )
        .await
        .expect(200);
    let link = |role: &'static str| {
        let w = &w;
        let id = id.clone();
        async move {
            let r = w
                .app
                .call(
                    Method::POST,
                    &format!("/api/v1/items/{id}/links"),
                    Some(&w.owner),
                    Some(json!({"role": role})),
                )
                .await
                .expect(201);
            r.json()["key"].as_str().unwrap().to_string()
        }
    };
    let view = link("viewer").await;
    let edit = link("editor").await;
    (id, view, edit)
}

async fn perform(w: &World, role: Role, token: Option<&str>, op: Op) -> Reply {
    let (id, view_key, edit_key) = fresh_item(w).await;
    let key = match role {
        Role::ViewLink | Role::StrangerLink => Some(view_key.clone()),
        Role::EditLink => Some(edit_key.clone()),
        _ => None,
    };
    let q = key.map(|k| format!("?key={k}")).unwrap_or_default();
    let item = format!("/api/v1/items/{id}");
    let app = &w.app;
    match op {
        Op::Read => app.get(&format!("{item}{q}"), token).await,
        Op::Patch => {
            app.call(
                Method::PATCH,
                &format!("{item}{q}"),
                token,
                Some(json!({"properties": {"n": 1}})),
            )
            .await
        }
        Op::PutBody => {
            app.put_body(
                token,
                &format!("{item}/body{q}"),
                b"new".to_vec(),
                "text/plain",
            )
            .await
        }
        Op::GetBody => app.get(&format!("{item}/body{q}"), token).await,
        Op::SetAcl => {
            let acl = json!({"acl": [{"principal": "user:owner", "role": "manager"}]});
            app.call(Method::PUT, &format!("{item}/acl{q}"), token, Some(acl))
                .await
        }
        Op::MakeLink => {
            app.call(
                Method::POST,
                &format!("{item}/links{q}"),
                token,
                Some(json!({"role": "viewer"})),
            )
            .await
        }
        Op::DeleteLink => {
            // The editor key goes; a view key holder presents their own.
            app.call(
                Method::DELETE,
                &format!("{item}/links/{edit_key}{q}"),
                token,
                None,
            )
            .await
        }
        Op::DeleteLinkById => {
            let listed = app
                .get(&format!("{item}/links"), Some(&w.owner))
                .await
                .expect(200)
                .json();
            let link = listed["links"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["role"] == "editor")
                .unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string();
            app.call(
                Method::DELETE,
                &format!("{item}/links/{link}{q}"),
                token,
                None,
            )
            .await
        }
        Op::ListLinks => {
            let r = app.get(&format!("{item}/links{q}"), token).await;
            // A link's key is its holders' alone: never listed.
            for key in [&view_key, &edit_key] {
                assert!(!r.text().contains(key.as_str()), "{role:?}: a key listed");
            }
            r
        }
        Op::Delete => {
            app.call(Method::DELETE, &format!("{item}{q}"), token, None)
                .await
        }
        Op::Listed => {
            // A link holder lists as who they are: links never list.
            let r = app
                .get("/api/v1/items?kind=doc&limit=1000", token)
                .await
                .expect(200);
            // Other cells' items are in the pool too: look for this one.
            let found = r.json()["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["id"] == id.as_str());
            let status = if found { 200 } else { 404 };
            Reply {
                status: status.try_into().unwrap(),
                headers: r.headers,
                bytes: r.bytes,
            }
        }
    }
}

#[tokio::test]
async fn role_by_operation_table() {
    let w = world().await;
    let mut failures = Vec::new();
    assert_eq!(w.tokens.iter().map(|t| t.0).collect::<Vec<_>>(), ROLES);
    for (role, token) in w.tokens.clone() {
        for op in OPS {
            let want = expected(role, op);
            let r = perform(&w, role, token.as_deref(), op).await;
            if r.status.as_u16() != want {
                failures.push(format!(
                    "{role:?} × {op:?}: want {want}, got {} {}",
                    r.status,
                    r.text()
                ));
                continue;
            }
            if r.status.as_u16() >= 400 && !matches!(op, Op::Listed) {
                r.assert_problem();
            }
            // Never leak: errors carry nothing of the item; the ACL is for
            // managers only.
            let text = r.text();
            if r.status.as_u16() >= 400 && !matches!(op, Op::Listed) {
                assert!(!text.contains(SECRET), "{role:?} × {op:?} leaked: {text}");
            }
            if matches!(op, Op::Read | Op::Patch | Op::PutBody) && r.status.is_success() {
                let v: Value = r.json();
                let manager = matches!(role, Role::Manager | Role::Admin);
                assert_eq!(
                    v.get("acl").is_some(),
                    manager,
                    "{role:?} × {op:?}: acl shown = {}",
                    !manager
                );
            }
            if let Op::Listed = op {
                let v: Value = r.json();
                for it in v["items"].as_array().into_iter().flatten() {
                    if it["role"] != "manager" {
                        assert!(it.get("acl").is_none(), "{role:?}: listing shows an ACL");
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cells differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
