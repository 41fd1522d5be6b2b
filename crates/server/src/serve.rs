//! The accept loop: each connection served by hyper with a timer, so that
//! no client holds a connection it does not use, and no client address
//! holds more than its share of them.
//!
//! `axum::serve` gives hyper no timer, and hyper then waits for a request's
//! head for ever: a client that opens connections and sends nothing, or
//! half a head, kept each one, and enough of them took every file
//! descriptor of the process (accept failed with `EMFILE` and the server
//! answered no one). Here a connection waiting for a request's head, the
//! first one or the next on a kept-alive connection, is closed after
//! [`Limits::head_wait`]: its head must arrive whole within that time,
//! however slowly it trickles. A request being answered (a long download,
//! an event stream, a slow upload) is not timed. And one address keeps at
//! most [`Limits::per_address`] connections open at once: past it a new
//! one is answered `503` and closed, so one client opening connections as
//! fast as it can still leaves descriptors to everyone else.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt;
use tower_service::Service;

use crate::extract::Cidr;
use crate::metrics::Metrics;
use crate::wire::Listening;

/// How long a connection may take to send a request's head, counted from
/// when the server starts waiting for it.
pub const HEAD_WAIT: Duration = Duration::from_secs(30);

/// Connections one client address may keep open at once: far more than a
/// browser (six a host) or the load kit's thousand event streams need,
/// and a fifth of the 20,000 descriptors a process usually may open.
pub const PER_ADDRESS: usize = 4096;

/// Bounds on the connections a node keeps.
#[derive(Clone, Debug)]
pub struct Limits {
    /// How long a connection may take to send a request's head.
    pub head_wait: Duration,
    /// The most connections one client address keeps open at once.
    pub per_address: usize,
    /// Peers whose connections are not counted: the trusted proxies, each
    /// of which speaks for many clients.
    pub exempt: Vec<Cidr>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            head_wait: HEAD_WAIT,
            per_address: PER_ADDRESS,
            exempt: Vec::new(),
        }
    }
}

/// Stripes of the per-address counts: a connection's opening and closing
/// take one stripe's lock, never one lock of the whole node.
const STRIPES: usize = 64;

/// Open connections by client address.
struct PerAddress {
    stripes: Vec<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection counted against its address until dropped.
struct AddressSlot {
    counts: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    fn new() -> Arc<PerAddress> {
        Arc::new(PerAddress {
            stripes: (0..STRIPES).map(|_| Mutex::new(HashMap::new())).collect(),
        })
    }

    fn stripe(&self, ip: &IpAddr) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        use std::hash::{BuildHasher, RandomState};
        // One hasher for every node is fine: the stripe only spreads locks.
        thread_local!(static HASHER: RandomState = RandomState::new());
        let h = HASHER.with(|s| s.hash_one(ip)) as usize;
        self.stripes[h % STRIPES]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for one more connection of `ip`, if it has fewer than `max`.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressSlot> {
        let mut counts = self.stripe(&ip);
        let n = counts.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            counts: self.clone(),
            ip,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.stripe(&self.ip);
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// What a connection past its address's bound is told before it closes.
fn too_many() -> Vec<u8> {
    let body = serde_json::to_vec(&crate::error::Problem {
        slug: "unavailable",
        title: "Service Unavailable",
        status: StatusCode::SERVICE_UNAVAILABLE.as_u16(),
        detail: "this address has too many connections open; close some, or try again shortly",
    })
    .expect("a problem serialises");
    let mut out = format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Serves `app` on `listener` within `limits` until `stop` completes; then
/// stops accepting and asks every connection to close after its request
/// in flight, and completes when all have (the caller bounds that wait).
pub async fn serve(
    mut listener: Listening,
    app: Router,
    metrics: Arc<Metrics>,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    // HTTP/1.1 only: to tell HTTP/2 without TLS (h2c, which no browser
    // speaks) from it, hyper reads a connection's first bytes with no timer
    // at all, so a connection that sent nothing was kept for ever.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_wait);
    let graceful = GracefulShutdown::new();
    let per_address = PerAddress::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (mut io, addr) = tokio::select! {
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
            () = &mut stop => break,
        };
        let ip = addr.ip();
        let slot = if limits.exempt.iter().any(|c| c.contains(ip)) {
            None
        } else {
            match per_address.take(ip, limits.per_address) {
                Some(slot) => Some(slot),
                None => {
                    // Answered, not left waiting; a client that does not
                    // read the answer is let go of after a second.
                    tokio::spawn(async move {
                        let answer = too_many();
                        let _ = tokio::time::timeout(Duration::from_secs(1), async {
                            io.write_all(&answer).await?;
                            io.shutdown().await
                        })
                        .await;
                    });
                    continue;
                }
            }
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
            drop((open, slot));
        });
    }
    graceful.shutdown().await;
}
