//! The accept loop: each connection served by hyper with a timer, so that
//! no client holds a connection it does not use.
//!
//! `axum::serve` gives hyper no timer, and hyper then waits for a request's
//! head for ever: a client that opens connections and sends nothing, or
//! half a head, kept each one, and enough of them took every file
//! descriptor of the process (accept failed with `EMFILE` and the server
//! answered no one). Here a connection waiting for a request's head, the
//! first one or the next on a kept-alive connection, is closed after
//! [`HEAD_WAIT`]: its head must arrive whole within that time, however
//! slowly it trickles. A request being answered (a long download, an
//! event stream, a slow upload) is not timed.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tower_service::Service;

use crate::metrics::Metrics;
use crate::wire::Listening;

/// How long a connection may take to send a request's head, counted from
/// when the server starts waiting for it.
pub const HEAD_WAIT: Duration = Duration::from_secs(30);

/// Serves `app` on `listener`, closing a connection that takes longer than
/// `head_wait` to send a request's head, until `stop` completes; then stops accepting
/// and asks every connection to close after its request in flight, and
/// completes when all have (the caller bounds that wait).
pub async fn serve(
    mut listener: Listening,
    app: Router,
    metrics: Arc<Metrics>,
    head_wait: Duration,
    stop: impl Future<Output = ()>,
) {
    // HTTP/1.1 only: to tell HTTP/2 without TLS (h2c, which no browser
    // speaks) from it, hyper reads a connection's first bytes with no timer
    // at all, so a connection that sent nothing was kept for ever.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(head_wait);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (io, addr) = tokio::select! {
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
            () = &mut stop => break,
        };
        let open = metrics.open_connection();
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo::<SocketAddr>(addr));
            let mut app = app.clone();
            async move {
                Ok::<_, Infallible>(
                    app.call(req.map(Body::new))
                        .await
                        .unwrap_or_else(|e| match e {}),
                )
            }
        });
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "a connection ended with an error");
            }
            drop(open);
        });
    }
    graceful.shutdown().await;
}
