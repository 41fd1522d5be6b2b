//! Runs `target/.../tarn` as a separate process.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::http::{call, connect, head, read_response, spawn_serve};

const TARN: &str = env!("CARGO_BIN_EXE_tarn");

struct Server {
    child: Child,
    addr: SocketAddr,
}

fn start(data: &Path) -> Server {
    start_as(data, Some("admin-password"))
}

/// A server on `data`, made to ensure `admin` with `admin_password` if any.
fn start_as(data: &Path, admin_password: Option<&str>) -> Server {
    let (child, addr) = spawn_serve(|c| {
        c.args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data);
        if let Some(password) = admin_password {
            c.env("TARN_ADMIN_PASSWORD", password);
        }
    });
    Server { child, addr }
}

fn terminate(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "server did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sign_in(addr: SocketAddr, user: &str, password: &str) -> String {
    let r = call(
        addr,
        "POST",
        "/api/v1/sessions",
        None,
        Some(json!({"username": user, "password": password})),
    );
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    r.json()["token"].as_str().unwrap().to_string()
}

#[test]
fn serve_stop_gracefully_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = start(dir.path());
    let a = s.addr;
    assert_eq!(
        call(a, "GET", "/api/v1/health", None, None).json(),
        json!({"status": "ok"})
    );

    // A first session: sign up, sign in, create, share, list.
    for u in ["alice", "bob"] {
        let r = call(
            a,
            "POST",
            "/api/v1/users",
            None,
            Some(json!({"username": u, "password": format!("{u}-password")})),
        );
        assert_eq!(r.status, 201);
    }
    let alice = sign_in(a, "alice", "alice-password");
    let bob = sign_in(a, "bob", "bob-password");
    let r = call(
        a,
        "POST",
        "/api/v1/items",
        Some(&alice),
        Some(json!({"kind": "doc", "properties": {"title": "plan"}})),
    );
    assert_eq!(r.status, 201);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r = call(
        a,
        "PUT",
        &format!("/api/v1/items/{id}/acl"),
        Some(&alice),
        Some(
            json!({"acl": [{"principal": "user:alice", "role": "manager"}, {"principal": "user:bob", "role": "viewer"}]}),
        ),
    );
    assert_eq!(r.status, 200);
    let r = call(a, "GET", "/api/v1/items?kind=doc", Some(&bob), None);
    assert_eq!(r.json()["items"][0]["id"], id.as_str());
    // A second process on the same directory is refused, clearly: also
    // where RUST_BACKTRACE is set, a refusal is no crash.
    let second = Command::new(TARN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path())
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("in use by another process"), "{err}");
    assert!(!err.contains("backtrace"), "{err}");

    // SIGTERM while an upload is half sent: it still completes.
    let body = vec![7u8; 1 << 20];
    let mut conn = connect(a);
    conn.write_all(
        head(
            "PUT",
            &format!("/api/v1/items/{id}/body"),
            Some(&alice),
            Some("application/octet-stream"),
            body.len(),
        )
        .as_bytes(),
    )
    .unwrap();
    conn.write_all(&body[..body.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    terminate(&s.child);
    std::thread::sleep(Duration::from_millis(300));
    conn.write_all(&body[body.len() / 2..]).unwrap();
    let r = read_response(conn);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["body"]["size"], 1 << 20);
    let status = wait_exit(&mut s.child);
    assert!(status.success(), "exit status {status:?}");

    // Restart on the same data: everything is still there.
    let mut s = start(dir.path());
    let a = s.addr;
    // Sessions are stored: bob's token from before the restart still works.
    let r = call(a, "GET", &format!("/api/v1/items/{id}"), Some(&bob), None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["properties"]["title"], "plan");
    let r = call(
        a,
        "GET",
        &format!("/api/v1/items/{id}/body"),
        Some(&bob),
        None,
    );
    assert_eq!(r.body, body);
    assert!(r
        .headers
        .iter()
        .any(|(k, v)| k == "content-type" && v == "application/octet-stream"));
    let admin = sign_in(a, "admin", "admin-password");
    assert_eq!(
        call(a, "GET", "/api/v1/me", Some(&admin), None).json()["admin"],
        true
    );
    terminate(&s.child);
    assert!(wait_exit(&mut s.child).success());
}

/// A stopping server ends its event streams instead of waiting its grace
/// period out for them: a stream is not a request that finishes.
#[test]
fn a_stop_ends_event_streams() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, a) = spawn_serve(|c| {
        c.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--grace-seconds",
            "600",
            "--data",
        ])
        .arg(dir.path());
    });
    let r = call(
        a,
        "POST",
        "/api/v1/users",
        None,
        Some(json!({"username": "carol", "password": "carol-password"})),
    );
    assert_eq!(r.status, 201);
    let carol = sign_in(a, "carol", "carol-password");
    let mut stream = connect(a);
    stream
        .write_all(head("GET", "/api/v1/events", Some(&carol), None, 0).as_bytes())
        .unwrap();
    let mut first = [0u8; 64];
    let n = stream.read(&mut first).unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    terminate(&child);
    // The stream ends (read to its end), and the server exits 0 well
    // before its grace period (`wait_exit` gives it 30 s of 600).
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    let status = wait_exit(&mut child);
    assert!(status.success(), "exit status {status:?}");
}

/// `/metrics` counts open connections (api.md), idle ones too, and each
/// leaves the count when it closes.
#[test]
fn metrics_count_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = start(dir.path());
    let a = s.addr;
    let open = || -> i64 {
        let r = call(a, "GET", "/metrics", None, None);
        let text = String::from_utf8_lossy(&r.body).to_string();
        text.lines()
            .find_map(|l| l.strip_prefix("tarn_http_open_connections "))
            .expect("the gauge")
            .parse()
            .unwrap()
    };
    // Until the server has seen what the client did (bounded tries).
    let settle = |want: i64| {
        let mut seen = open();
        for _ in 0..200 {
            if seen == want {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            seen = open();
        }
        seen
    };
    // The scrape's own connection.
    let base = settle(1);
    assert_eq!(base, 1);
    let idle: Vec<_> = (0..3).map(|_| connect(a)).collect();
    assert_eq!(settle(base + 3), base + 3);
    drop(idle);
    assert_eq!(settle(base), base);
    terminate(&s.child);
    assert!(wait_exit(&mut s.child).success());
}

#[test]
fn admin_commands_work_on_a_stopped_directory() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(TARN)
            .args(["admin", "--data"])
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(run(&[
        "create-user",
        "--username",
        "carol",
        "--password",
        "carol-password",
        "--admin"
    ])
    .contains("created user carol"));
    run(&[
        "reset-password",
        "--username",
        "carol",
        "--password",
        "another-password",
    ]);
    assert!(run(&[
        "declare-index",
        "docs-by-title",
        "--kind",
        "doc",
        "--sort",
        "-title"
    ])
    .contains("ready"));
    let mut s = start(dir.path());
    let carol = sign_in(s.addr, "carol", "another-password");
    let me = call(s.addr, "GET", "/api/v1/me", Some(&carol), None).json();
    assert_eq!(me["admin"], true);
    let r = call(
        s.addr,
        "GET",
        "/api/v1/items?kind=doc&sort=-title",
        Some(&carol),
        None,
    );
    assert_eq!(r.status, 200, "the declared index serves");
    terminate(&s.child);
    assert!(wait_exit(&mut s.child).success());
}

/// A store URL that names no store is refused without showing its
/// password, and `sqlite://` with no directory leaves no file behind
/// (found by a black-box audit: the whole URL was printed, and the
/// embedded store's files were made in the working directory).
#[test]
fn store_urls_that_name_no_store_are_refused_quietly() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "postgress://tarn:hunter2secret@127.0.0.1:1/tarn",
        "postgres:/tarn:hunter2secret@127.0.0.1:1/tarn",
        "cassandra://tarn:hunter2secret@127.0.0.1:1/tarn",
        "sqlite://",
    ] {
        let out = Command::new(TARN)
            .args(["serve", "--listen", "127.0.0.1:0", "--store", url])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}: {said}");
        assert!(!said.contains("hunter2secret"), "{url}: {said}");
        assert!(out.stdout.is_empty(), "{url}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left: {left:?}");
}

#[test]
fn help_explains_every_setting() {
    let out = Command::new(TARN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("serve") && text.contains("admin"), "{text}");
    let out = Command::new(TARN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--data",
        "--store",
        "--signup",
        "--config",
        "TARN_LISTEN",
        "TARN_DATA",
        "TARN_STORE",
        "--trusted-proxies",
        "TARN_TRUSTED_PROXIES",
        "--feed-retention-hours",
        "TARN_FEED_RETENTION_HOURS",
        "--max-streams",
        "--max-streams-per-user",
        "--app-indexes",
        "TARN_APP_INDEXES",
        "pool_size",
        "pool_wait",
    ] {
        assert!(text.contains(flag), "serve --help lacks {flag}: {text}");
    }
}

/// A stop asked for as soon as the server says it listens finds the
/// handlers installed: exit 0, never the default action of SIGTERM (a CI run
/// under load once saw the server killed by it).
#[test]
fn a_stop_right_after_listening_exits_cleanly() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, _addr) = spawn_serve(|c| {
            c.args(["serve", "--listen", "127.0.0.1:0", "--data"])
                .arg(dir.path());
        });
        terminate(&child);
        let status = wait_exit(&mut child);
        assert!(status.success(), "{status:?}");
    }
}

#[test]
fn config_file_sets_what_flags_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tarn.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nsignup = \"closed\"\nmax_json_bytes = 300\ndata = {:?}\n",
            dir.path().join("data")
        ),
    )
    .unwrap();
    let (mut child, addr) = spawn_serve(|c| {
        c.args(["serve", "--config"]).arg(&config);
    });
    let r = call(
        addr,
        "POST",
        "/api/v1/users",
        None,
        Some(json!({"username": "x", "password": "long enough"})),
    );
    assert_eq!(r.status, 401, "sign-up is closed by the file");
    let big = json!({"username": "x", "password": "y".repeat(400)});
    let r = call(addr, "POST", "/api/v1/users", None, Some(big));
    assert_eq!(r.status, 413, "the JSON limit comes from the file");
    assert!(dir.path().join("data").join("LOCK").exists());
    terminate(&child);
    assert!(wait_exit(&mut child).success());
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "listen = 5\n").unwrap();
    let out = Command::new(TARN)
        .args(["serve", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn export_and_import_move_a_data_directory() {
    let from = tempfile::tempdir().unwrap();
    let to = tempfile::tempdir().unwrap();
    let file = from.path().join("export.ndjson");
    let admin = |dir: &std::path::Path, args: &[&str]| {
        let out = Command::new(TARN)
            .args(["admin", "--data"])
            .arg(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    admin(
        from.path(),
        &[
            "create-user",
            "--username",
            "dora",
            "--password",
            "dora-password",
        ],
    );
    admin(
        from.path(),
        &["declare-index", "by-t", "--kind", "doc", "--sort", "t"],
    );
    let out = Command::new(TARN)
        .args(["export", "--data"])
        .arg(from.path())
        .arg("--out")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A directory with no store is no backup: refused, and left alone.
    let missing = from.path().join("mistyped");
    let out = Command::new(TARN)
        .args(["export", "--data"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no Tarn store"));
    assert!(!missing.exists());
    // It holds every password hash: its owner's alone (it was 0644).
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.lines().next().unwrap().contains("\"type\":\"index\""));
    assert!(text.contains("\"username\":\"dora\""));
    let import = |dir: &std::path::Path| {
        Command::new(TARN)
            .args(["import", "--data"])
            .arg(dir)
            .arg("--in")
            .arg(&file)
            .output()
            .unwrap()
    };
    // The target was served once with TARN_ADMIN_PASSWORD: it holds only
    // that admin, and is still empty enough to import into.
    let mut target = start(to.path());
    terminate(&target.child);
    assert!(wait_exit(&mut target.child).success());
    let out = import(to.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("imported"));
    // Not twice into the same store.
    let again = import(to.path());
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("empty"));
    // A file that does not hold together (a member of a group it lacks)
    // fails at its end, and leaves a store that says so: it neither serves
    // nor takes another import.
    let bad = from.path().join("bad.ndjson");
    // Before the end record, which is last, and counted there.
    let (body, end) = text.trim_end().rsplit_once('\n').unwrap();
    let mut end: serde_json::Value = serde_json::from_str(end).unwrap();
    end["records"]["member"] = (end["records"]["member"].as_u64().unwrap_or(0) + 1).into();
    std::fs::write(
        &bad,
        format!("{body}\n{{\"type\":\"member\",\"group\":\"nogroup\",\"member\":\"user:dora\"}}\n{end}\n"),
    )
    .unwrap();
    let partial = tempfile::tempdir().unwrap();
    let bad_import = || {
        Command::new(TARN)
            .args(["import", "--data"])
            .arg(partial.path())
            .arg("--in")
            .arg(&bad)
            .output()
            .unwrap()
    };
    let out = bad_import();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("nogroup") && said.contains("part of the file"),
        "{said}"
    );
    let out = bad_import();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("did not finish"), "{said}");
    let out = Command::new(TARN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(partial.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("did not finish"));
    // Nor administered (a user made there would be served once it was
    // emptied and imported again, or not at all).
    let out = Command::new(TARN)
        .args(["admin", "--data"])
        .arg(partial.path())
        .args([
            "create-user",
            "--username",
            "eve",
            "--password",
            "eve-password",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("did not finish"));
    // Nor is it exported as if it were whole.
    let out = Command::new(TARN)
        .args(["export", "--data"])
        .arg(partial.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("did not finish"));
    // A file cut short (its last line lost) is refused, not imported in
    // part.
    std::fs::write(&bad, format!("{body}\n")).unwrap();
    let import_bad = |flags: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        Command::new(TARN)
            .arg("import")
            .args(flags)
            .arg("--data")
            .arg(dir.path())
            .arg("--in")
            .arg(&bad)
            .output()
            .unwrap()
    };
    let out = import_bad(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cut short"));
    // An export from before the end record was written is taken when
    // asked (here the same file: what it lacks goes unnoticed).
    let out = import_bad(&["--no-end-record"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The moved store serves: dora signs in, the index is there and ready;
    // the administrator the target's server made is gone (the file has
    // none).
    let Server { mut child, addr } = start_as(to.path(), None);
    let token = sign_in(addr, "dora", "dora-password");
    let r = call(addr, "GET", "/api/v1/indexes/by-t", Some(&token), None);
    assert_eq!(r.json()["state"], "ready");
    let admin_signs_in = |addr: SocketAddr, password: &str| {
        call(
            addr,
            "POST",
            "/api/v1/sessions",
            None,
            Some(json!({"username": "admin", "password": password})),
        )
        .status
    };
    assert_eq!(admin_signs_in(addr, "admin-password"), 401);
    let _ = child.kill();
    let _ = child.wait();
    // Served with TARN_ADMIN_PASSWORD it has one again, and a file with
    // an admin takes the place of the one another target's server made,
    // whose sessions end.
    let mut server = start(to.path());
    terminate(&server.child);
    assert!(wait_exit(&mut server.child).success());
    let out = Command::new(TARN)
        .args(["export", "--data"])
        .arg(to.path())
        .arg("--out")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let third = tempfile::tempdir().unwrap();
    let Server { mut child, addr } = start_as(third.path(), Some("third-admin-password"));
    let old_token = sign_in(addr, "admin", "third-admin-password");
    terminate(&child);
    assert!(wait_exit(&mut child).success());
    let out = import(third.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let Server { mut child, addr } = start_as(third.path(), None);
    let admin = sign_in(addr, "admin", "admin-password");
    let r = call(addr, "GET", "/api/v1/me", Some(&admin), None);
    assert_eq!(r.json()["admin"], true);
    assert_eq!(admin_signs_in(addr, "third-admin-password"), 401);
    let r = call(addr, "GET", "/api/v1/me", Some(&old_token), None);
    assert_eq!(r.status, 401);
    let _ = child.kill();
    let _ = child.wait();
}

/// An import reads a line at most 16 MiB long (memory grew with the
/// longest line, 450 MB for one of 200 MB), says which line is not UTF-8,
/// and says when it failed before writing anything (it said the store held
/// part of the file); a store holding only an index declaration is no
/// import's target (its import failed halfway, "too many concurrent
/// changes", and left the store refused by everything).
#[test]
fn imports_refuse_long_lines_bad_text_and_stores_with_declarations() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.ndjson");
    // Whether the import of `file` into `data` succeeded, and what it said.
    let import = |data: &Path| {
        let out = Command::new(TARN)
            .args(["import", "--data"])
            .arg(data)
            .arg("--in")
            .arg(&file)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), said)
    };
    let refused = |data: &Path| {
        let (ok, said) = import(data);
        assert!(!ok, "imported: {said}");
        said
    };
    let mut long = b"{\"type\":\"user\",\"x\":\"".to_vec();
    long.resize(17 << 20, b'x');
    long.extend_from_slice(b"\"}\n");
    std::fs::write(&file, &long).unwrap();
    let fresh = dir.path().join("fresh");
    let said = refused(&fresh);
    assert!(said.contains("line 1 is longer than"), "{said}");
    assert!(said.contains("nothing was written"), "{said}");
    std::fs::write(&file, b"\n{\"type\":\"user\",\"x\":\"\xff\"}\n").unwrap();
    let said = refused(&fresh);
    assert!(said.contains("line 2: not UTF-8"), "{said}");
    // A file that is not there makes no store.
    let nowhere = dir.path().join("nowhere");
    let out = Command::new(TARN)
        .args(["import", "--data"])
        .arg(&nowhere)
        .arg("--in")
        .arg(dir.path().join("mistyped.ndjson"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open"));
    assert!(!nowhere.exists());
    // An empty file (a command's output lost) holds no end record.
    std::fs::write(&file, b"").unwrap();
    let said = refused(&fresh);
    assert!(said.contains("cut short"), "{said}");
    assert!(said.contains("nothing was written"), "{said}");
    // Nothing was written: the store takes an import.
    std::fs::write(&file, b"{\"type\":\"end\",\"records\":{}}\n").unwrap();
    let (ok, said) = import(&fresh);
    assert!(ok, "{said}");
    let declared = dir.path().join("declared");
    let out = Command::new(TARN)
        .args(["admin", "--data"])
        .arg(&declared)
        .args(["declare-index", "by-x", "--kind", "misc", "--sort", "x"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let said = refused(&declared);
    assert!(said.contains("index declarations"), "{said}");
    assert!(!said.contains("did not finish"), "{said}");
    // A user named admin who is no administrator is a user like others:
    // the store is not empty.
    let named = dir.path().join("named");
    let out = Command::new(TARN)
        .args(["admin", "--data"])
        .arg(&named)
        .args([
            "create-user",
            "--username",
            "admin",
            "--password",
            "admin-password",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let said = refused(&named);
    assert!(said.contains("holds users"), "{said}");
}

/// Requests no handler sees, refused by hyper itself (a request target
/// over its 65,534 bytes, over 100 headers, a broken header line), are
/// answered with problem JSON like every other error: hyper's own answers
/// had no body, and a `q` too long for hyper was `414`, not `400`.
#[test]
fn requests_hyper_refuses_are_answered_with_problems() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path());
    let many_headers: String = (0..120).map(|i| format!("X-H{i}: v\r\n")).collect();
    for (raw, status, slug, says) in [
        (
            format!(
                "GET /api/v1/search?q={} HTTP/1.1\r\nHost: t\r\n\r\n",
                "a".repeat(70_000)
            ),
            400,
            "invalid-input",
            "1024",
        ),
        (
            format!("GET /api/v1/health HTTP/1.1\r\nHost: t\r\n{many_headers}\r\n"),
            431,
            "too-large",
            "100 headers",
        ),
        (
            "GET /api/v1/health HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n".to_string(),
            400,
            "invalid-input",
            "HTTP/1.1",
        ),
    ] {
        let mut s = connect(server.addr);
        s.write_all(raw.as_bytes()).unwrap();
        let r = read_response(s);
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            header("content-type").as_deref(),
            Some("application/problem+json")
        );
        assert_eq!(header("connection").as_deref(), Some("close"));
        let p: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(p["type"], slug);
        assert_eq!(p["status"], status);
        assert!(p["detail"].as_str().unwrap().contains(says), "{p}");
    }
    // After an answered request on the same connection too.
    let mut s = connect(server.addr);
    s.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut first = Vec::new();
    while !first.ends_with(b"{\"status\":\"ok\"}") {
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).unwrap();
        first.push(byte[0]);
    }
    assert!(first.starts_with(b"HTTP/1.1 200 OK"));
    s.write_all(b"GARBAGE\r\n\r\n").unwrap();
    let r = read_response(s);
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("\"type\":\"invalid-input\""));
    // A body that holds exactly what hyper writes to refuse is served as
    // it is, whole and in part.
    let refusal = "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Thu, 26 Nov 2026 16:38:26 GMT\r\n\r\n";
    let user = json!({"username": "ann", "password": "ann-password"});
    assert_eq!(
        call(server.addr, "POST", "/api/v1/users", None, Some(user)).status,
        201
    );
    let ann = sign_in(server.addr, "ann", "ann-password");
    let item = call(
        server.addr,
        "POST",
        "/api/v1/items",
        Some(&ann),
        Some(json!({"kind": "doc"})),
    );
    let path = format!("/api/v1/items/{}/body", item.json()["id"].as_str().unwrap());
    let mut s = connect(server.addr);
    s.write_all(head("PUT", &path, Some(&ann), Some("text/plain"), refusal.len()).as_bytes())
        .unwrap();
    s.write_all(refusal.as_bytes()).unwrap();
    assert_eq!(read_response(s).status, 200);
    let r = call(server.addr, "GET", &path, Some(&ann), None);
    assert_eq!((r.status, r.body.as_slice()), (200, refusal.as_bytes()));
    let mut s = connect(server.addr);
    s.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {ann}\r\nRange: bytes=0-24\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let r = read_response(s);
    assert_eq!(
        (r.status, r.body.as_slice()),
        (206, &refusal.as_bytes()[..25])
    );
    // A q over the documented limit, but short enough for hyper, is the
    // handler's refusal, as before.
    let r = call(
        server.addr,
        "GET",
        &format!("/api/v1/search?q={}", "a".repeat(2_000)),
        None,
        None,
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        call(server.addr, "GET", "/api/v1/health", None, None).status,
        200
    );
    terminate(&server.child);
    wait_exit(&mut server.child);
}

/// `--listen` takes a host name too: the server binds the first of its
/// addresses it can and says which.
#[test]
fn a_host_name_is_listened_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = spawn_serve(|c| {
        c.args(["serve", "--listen", "localhost:0", "--data"])
            .arg(dir.path());
    });
    assert!(addr.ip().is_loopback(), "{addr}");
    let r = call(addr, "GET", "/api/v1/health", None, None);
    assert_eq!(r.status, 200);
    terminate(&child);
    assert!(wait_exit(&mut child).success());
}

/// `tarn openapi | head`: a reader that stops early ends the command
/// quietly, with success, not with "Broken pipe".
#[test]
fn openapi_to_a_reader_that_stops_early_succeeds() {
    let mut child = Command::new(TARN)
        .arg("openapi")
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"{"), "{first:?}");
    // The pipe's read end is closed here, the document far from written
    // (about 160 KB, past the pipe's 64 KiB buffer).
    let status = wait_exit(&mut child);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert!(err.is_empty(), "{err}");
}
