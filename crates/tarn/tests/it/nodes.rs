//! Two `tarn serve` processes on one PostgreSQL database, one user session
//! driven across both, alternating nodes on every request.

use std::net::SocketAddr;
use std::process::{Child, Command};

use serde_json::json;

use crate::http::{call, spawn_serve};

struct Node {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn start(url: &str) -> Node {
    let (child, addr) = spawn_serve(|c| {
        c.args(["serve", "--listen", "127.0.0.1:0", "--store", url])
            .env("TARN_ADMIN_PASSWORD", "admin-password")
            .stderr(std::process::Stdio::inherit());
    });
    Node { child, addr }
}

fn fresh_url() -> String {
    let base = std::env::var("TARN_TEST_POSTGRES").expect(
        "TARN_TEST_POSTGRES is not set: run the tests through `make test` or scripts/with-postgres.sh",
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{base}?schema=n_{nanos:x}_{}", std::process::id())
}

#[test]
fn one_session_across_two_nodes() {
    let url = fresh_url();
    let a = start(&url);
    let b = start(&url);
    // Alternate on every request.
    let mut turn = 0usize;
    let mut next = || {
        turn += 1;
        if turn.is_multiple_of(2) {
            b.addr
        } else {
            a.addr
        }
    };
    for u in ["alice", "bob"] {
        let r = call(
            next(),
            "POST",
            "/api/v1/users",
            None,
            Some(json!({"username": u, "password": format!("{u}-password")})),
        );
        assert_eq!(r.status, 201);
    }
    // Sign-in on A works on B.
    let r = call(
        a.addr,
        "POST",
        "/api/v1/sessions",
        None,
        Some(json!({"username": "alice", "password": "alice-password"})),
    );
    let alice = r.json()["token"].as_str().unwrap().to_string();
    assert_eq!(
        call(b.addr, "GET", "/api/v1/me", Some(&alice), None).json()["username"],
        "alice"
    );
    let r = call(
        b.addr,
        "POST",
        "/api/v1/sessions",
        None,
        Some(json!({"username": "bob", "password": "bob-password"})),
    );
    let bob = r.json()["token"].as_str().unwrap().to_string();

    // A write on A is visible on B on the very next request.
    let r = call(
        a.addr,
        "POST",
        "/api/v1/items",
        Some(&alice),
        Some(json!({"kind": "doc", "properties": {"t": 1},
        "acl": [{"principal": "user:bob", "role": "editor"}]})),
    );
    assert_eq!(r.status, 201);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let item = format!("/api/v1/items/{id}");
    assert_eq!(call(b.addr, "GET", &item, Some(&bob), None).status, 200);
    let listed = call(b.addr, "GET", "/api/v1/items?kind=doc", Some(&bob), None).json();
    assert_eq!(listed["items"][0]["id"], id.as_str());
    let r = call(
        b.addr,
        "PATCH",
        &item,
        Some(&bob),
        Some(json!({"properties": {"t": 2}})),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        call(a.addr, "GET", &item, Some(&alice), None).json()["properties"]["t"],
        2
    );

    // Unsharing on A holds on B at once, listings included.
    let r = call(
        a.addr,
        "PUT",
        &format!("{item}/acl"),
        Some(&alice),
        Some(json!({"acl": [{"principal": "user:alice", "role": "manager"}]})),
    );
    assert_eq!(r.status, 200);
    assert_eq!(call(b.addr, "GET", &item, Some(&bob), None).status, 404);
    let listed = call(b.addr, "GET", "/api/v1/items?kind=doc", Some(&bob), None).json();
    assert_eq!(listed["items"], json!([]));

    // Group removal on A holds on B at once.
    assert_eq!(
        call(
            next(),
            "POST",
            "/api/v1/groups",
            Some(&alice),
            Some(json!({"id": "team"}))
        )
        .status,
        201
    );
    assert_eq!(
        call(
            next(),
            "PUT",
            "/api/v1/groups/team/members/user:bob",
            Some(&alice),
            None
        )
        .status,
        204
    );
    let r = call(
        next(),
        "PUT",
        &format!("{item}/acl"),
        Some(&alice),
        Some(
            json!({"acl": [{"principal": "user:alice", "role": "manager"}, {"principal": "group:team", "role": "viewer"}]}),
        ),
    );
    assert_eq!(r.status, 200);
    assert_eq!(call(b.addr, "GET", &item, Some(&bob), None).status, 200);
    assert_eq!(
        call(
            a.addr,
            "DELETE",
            "/api/v1/groups/team/members/user:bob",
            Some(&alice),
            None
        )
        .status,
        204
    );
    assert_eq!(call(b.addr, "GET", &item, Some(&bob), None).status, 404);
    assert_eq!(
        call(b.addr, "GET", "/api/v1/me", Some(&bob), None).json()["groups"],
        json!([])
    );

    // Logout on A holds on B at once.
    assert_eq!(
        call(
            a.addr,
            "DELETE",
            "/api/v1/sessions/current",
            Some(&bob),
            None
        )
        .status,
        204
    );
    assert_eq!(
        call(b.addr, "GET", "/api/v1/me", Some(&bob), None).status,
        401
    );

    // Concurrent If-Match edits through both nodes: one success per version.
    let first = call(a.addr, "GET", &item, Some(&alice), None).json()["version"]
        .as_u64()
        .unwrap();
    for version in first..first + 5 {
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let addr = if i % 2 == 0 { a.addr } else { b.addr };
                let (alice, item) = (alice.clone(), item.clone());
                std::thread::spawn(move || {
                    let body = json!({"properties": {"w": i}}).to_string();
                    let mut s = crate::http::connect(addr);
                    use std::io::Write;
                    let mut head = crate::http::head(
                        "PATCH",
                        &item,
                        Some(&alice),
                        Some("application/json"),
                        body.len(),
                    );
                    head.insert_str(head.len() - 2, &format!("If-Match: \"{version}\"\r\n"));
                    s.write_all(head.as_bytes()).unwrap();
                    s.write_all(body.as_bytes()).unwrap();
                    crate::http::read_response(s).status
                })
            })
            .collect();
        let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            1,
            "version {version}: {statuses:?}"
        );
        assert!(
            statuses.iter().all(|s| *s == 200 || *s == 412),
            "version {version}: {statuses:?}"
        );
    }
    let r = call(b.addr, "GET", &item, Some(&alice), None);
    assert_eq!(r.json()["version"], first + 5);
}
