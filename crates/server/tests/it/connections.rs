//! The server's connections over real TCP: a client that sends no request,
//! or half of one, is closed, not kept for ever; one address keeps at most
//! its share of connections.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::TestApp;

/// Reads until the server closes the connection; what it sent.
async fn until_closed(c: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "{what}: still open after 20 s");
    got
}

/// A server of `app` on a free loopback port within `limits`: its address,
/// what stops it, and the task that ends when it has stopped.
fn serve(
    app: &TestApp,
    limits: tarn_server::serve::Limits,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let at = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(tarn_server::serve::serve(
        tarn_server::wire::Listening::new(TcpListener::from_std(listener).unwrap()),
        app.router.clone(),
        app.state.metrics.clone(),
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    (at, stop, server)
}

/// Stops a server [`serve`] started, and waits for it.
async fn stop(stopper: tokio::sync::oneshot::Sender<()>, server: tokio::task::JoinHandle<()>) {
    stopper.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_no_whole_head_are_closed() {
    let app = TestApp::new().await;
    let (at, stopper, server) = serve(
        &app,
        tarn_server::serve::Limits {
            head_wait: Duration::from_secs(1),
            ..Default::default()
        },
    );
    // Nothing sent.
    let mut silent = TcpStream::connect(at).await.unwrap();
    assert!(until_closed(&mut silent, "a silent connection")
        .await
        .is_empty());
    // Half a head, then a byte now and then, for longer than the closing
    // is waited for: only a bound on the whole head closes it, not one on
    // silence.
    let mut half = TcpStream::connect(at).await.unwrap();
    half.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if half.write_all(b"X").await.is_err() {
                break;
            }
        }
        half
    });
    // A whole request is answered, and the connection, kept alive, is
    // closed once it has waited as long for the next.
    let mut whole = TcpStream::connect(at).await.unwrap();
    whole
        .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answered = until_closed(&mut whole, "a kept-alive connection").await;
    let answered = String::from_utf8_lossy(&answered);
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(answered.contains("\"status\":\"ok\""), "{answered}");
    let mut half = trickle.await.unwrap();
    let refused = until_closed(&mut half, "a trickling head").await;
    assert!(
        !String::from_utf8_lossy(&refused).contains("200 OK"),
        "a head that never ended was answered"
    );
    stop(stopper, server).await;
}

/// One `GET /api/v1/health` on `c`: the first bytes of its answer.
async fn health(c: &mut TcpStream) -> String {
    if c.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .is_err()
    {
        return String::new();
    }
    let mut buf = vec![0; 4096];
    let n = c.read(&mut buf).await.unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).to_string()
}

/// A connection to `at` that was served (tried again while the server has
/// yet to notice that one closed before gave its place back).
async fn served(at: std::net::SocketAddr) -> Option<TcpStream> {
    for _ in 0..100 {
        let mut c = TcpStream::connect(at).await.unwrap();
        if health(&mut c).await.starts_with("HTTP/1.1 200") {
            return Some(c);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_keeps_at_most_its_share_of_connections() {
    two_at_once(tarn_server::serve::Limits {
        per_address: 2,
        ..Default::default()
    })
    .await;
}

/// However many addresses share them: a connection past the node's bound
/// is answered too, not left to fail `accept` for everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_keeps_at_most_its_connections() {
    two_at_once(tarn_server::serve::Limits {
        max_open: 2,
        // (Not counted by address: only the node's bound holds.)
        exempt: vec!["127.0.0.1".parse().unwrap()],
        ..Default::default()
    })
    .await;
}

/// A server within `limits` that allow two connections from here: more,
/// one after another, are served; a third open at once is answered 503
/// and closed; once one closes, there is room again.
async fn two_at_once(limits: tarn_server::serve::Limits) {
    let app = TestApp::new().await;
    let (at, stopper, server) = serve(&app, limits);
    // Connections one after another, more than the bound: each closed one
    // gives its place back, whichever thread ends it.
    for _ in 0..10 {
        assert!(
            served(at).await.is_some(),
            "a place came free after the last"
        );
    }
    let first = served(at).await.expect("a first connection");
    let second = served(at).await.expect("a second connection");
    // A third, while both stay open, is answered 503 and closed.
    let mut third = TcpStream::connect(at).await.unwrap();
    let refused =
        String::from_utf8_lossy(&until_closed(&mut third, "a third connection").await).to_string();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("retry-after: 1"), "{refused}");
    assert!(refused.contains("\"type\":\"unavailable\""), "{refused}");
    // Once one closes, there is room again.
    drop(first);
    assert!(served(at).await.is_some(), "a place came free");
    drop(second);
    stop(stopper, server).await;
}

/// The head of the answer read from `c`, up to its blank line.
async fn answer_head(c: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).await.unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
    })
    .await;
    assert!(read.is_ok(), "no answer in 20 s");
    String::from_utf8_lossy(&head).to_lowercase()
}

/// An answer to a request whose body the server did not read says
/// `Connection: close` before the connection closes, so that a client
/// sends its next request on another; one whose body was read keeps the
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_left_unread_closes_its_connection_and_says_so() {
    let app = TestApp::new().await;
    let (at, stopper, server) = serve(&app, tarn_server::serve::Limits::default());
    // An upload to no item, refused before its bytes are sent.
    let mut c = TcpStream::connect(at).await.unwrap();
    c.write_all(
        b"PUT /api/v1/items/nothing/body HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n",
    )
    .await
    .unwrap();
    let head = answer_head(&mut c).await;
    assert!(head.starts_with("http/1.1 404"), "{head}");
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    until_closed(&mut c, "a connection with a body left unread").await;
    // A body read whole, refused: the connection serves the next request.
    let mut c = TcpStream::connect(at).await.unwrap();
    let body = br#"{"username": "x"}"#;
    c.write_all(
        format!(
            "POST /api/v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    c.write_all(body).await.unwrap();
    let head = answer_head(&mut c).await;
    assert!(head.starts_with("http/1.1 400"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a content-length");
    let mut rest = vec![0; length];
    c.read_exact(&mut rest).await.unwrap();
    assert!(health(&mut c).await.starts_with("HTTP/1.1 200"));
    stop(stopper, server).await;
}

/// A client that writes its whole body before it reads (as Python's
/// `urllib` and Node's `fetch` do) reads the answer to a request refused
/// before its body was read, not a reset: the server reads and drops the
/// rest of the body before it lets the connection go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_a_refused_body_reads_the_answer() {
    let app = TestApp::new().await;
    let (at, stopper, server) = serve(&app, tarn_server::serve::Limits::default());
    let size = 8 << 20;
    for (head, status) in [
        // Over the JSON body limit.
        (
            format!("POST /api/v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"),
            "413",
        ),
        // An upload to no item.
        (
            format!("PUT /api/v1/items/nothing/body HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {size}\r\n\r\n"),
            "404",
        ),
    ] {
        let mut c = TcpStream::connect(at).await.unwrap();
        let chunk = vec![b' '; 64 << 10];
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(&chunk).await.unwrap();
        // The answer should have been sent and the server's end closed by
        // now: the rest of the body arrives after that.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for _ in 1..size / chunk.len() {
            c.write_all(&chunk)
                .await
                .unwrap_or_else(|e| panic!("{status}: the body could not be sent: {e}"));
        }
        let answer = answer_head(&mut c).await;
        assert!(answer.starts_with(&format!("http/1.1 {status}")), "{answer}");
        assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
        until_closed(&mut c, "a connection whose refused body was sent").await;
    }
    stop(stopper, server).await;
}
