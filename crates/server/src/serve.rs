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
//! fast as it can still leaves descriptors to everyone else; and the node
//! keeps at most [`Limits::max_open`] of all addresses, so that however
//! many share them, a connection past it is answered too, not left to
//! `accept` failing for everyone.
//!
//! A response to a request whose body the server did not read to its end
//! (one refused `413`, or an upload refused before its bytes) says
//! `Connection: close`: hyper closes such a connection after the
//! response, since the rest of the body stands where the next request
//! would, and a client told nothing would send its next request on it.
//! The connection lingers as it closes ([`crate::wire`]), so that a client
//! still sending that body reads the answer instead of a reset.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::Router;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt;
use tower_service::Service;

use crate::extract::{counted_as, Cidr};
use crate::metrics::Metrics;
use crate::wire::{Listening, Wire};

/// How long a connection may take to send a request's head, counted from
/// when the server starts waiting for it.
pub const HEAD_WAIT: Duration = Duration::from_secs(30);

/// Connections one client address may keep open at once, by default: a
/// fifth of the descriptors the process may open (`ulimit -n`; `tarn serve`
/// raises its soft limit to the hard one first), and never fewer than 256
/// — far more than a browser opens (six a host).
pub fn per_address_default() -> usize {
    (open_files_limit() / 5).max(256)
}

/// Connections the node keeps open at once, by default: all the
/// descriptors the process may open but a reserve (a tenth, at least 256)
/// for the store's files and connections and everything else, so that
/// however many addresses share them, a connection past it is answered
/// `503` instead of `accept` failing for everyone (`EMFILE`).
pub fn max_open_default() -> usize {
    let limit = open_files_limit();
    limit.saturating_sub((limit / 10).max(256)).max(64)
}

/// The longest request head taken (hyper's own bound depends on how the
/// bytes arrive); past it, `431`.
pub const MAX_HEAD: usize = 400 * 1024;

/// The descriptors this process may open (its soft `RLIMIT_NOFILE`).
fn open_files_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    if read {
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    }
}

/// Raises this process's soft limit of open descriptors to its hard limit
/// (as Go's runtime does at start): every connection takes one, and the
/// usual soft limit of 1,024 is far below what a server needs. Answers the
/// limit now in force.
pub fn raise_open_files_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one rlimit through a
    // valid pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                tracing::warn!(
                    soft = limit.rlim_cur,
                    hard = limit.rlim_max,
                    "could not raise the limit of open files"
                );
            }
        }
    }
    open_files_limit()
}

/// Bounds on the connections a node keeps.
#[derive(Clone, Debug)]
pub struct Limits {
    /// How long a connection may take to send a request's head.
    pub head_wait: Duration,
    /// The most connections one client address keeps open at once.
    pub per_address: usize,
    /// The most connections the node keeps open at once, of every address.
    pub max_open: usize,
    /// Peers whose connections are not counted: the trusted proxies, each
    /// of which speaks for many clients.
    pub exempt: Vec<Cidr>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            head_wait: HEAD_WAIT,
            per_address: per_address_default(),
            max_open: max_open_default(),
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
    hasher: std::hash::RandomState,
}

/// One connection counted against its address until dropped.
struct AddressSlot {
    counts: Arc<PerAddress>,
    key: IpAddr,
    stripe: usize,
}

impl PerAddress {
    fn new() -> Arc<PerAddress> {
        Arc::new(PerAddress {
            stripes: (0..STRIPES).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::hash::RandomState::new(),
        })
    }

    fn lock(&self, stripe: usize) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.stripes[stripe]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for one more connection of `ip`, if it has fewer than `max`.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressSlot> {
        use std::hash::BuildHasher;
        let key = counted_as(ip);
        let stripe = self.hasher.hash_one(key) as usize % STRIPES;
        let mut counts = self.lock(stripe);
        let n = counts.entry(key).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            counts: self.clone(),
            key,
            stripe,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock(self.stripe);
        match counts.get_mut(&self.key) {
            Some(1) => {
                counts.remove(&self.key);
            }
            Some(n) => *n -= 1,
            None => {
                debug_assert!(false, "a connection of {} was not counted", self.key);
                tracing::error!(address = %self.key, "a connection was not counted");
            }
        }
    }
}

/// What a connection past its address's bound is told before it closes.
fn overload_answer() -> Vec<u8> {
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

/// Answers a connection past a bound `503` and closes it, lingering (what
/// the client sent meanwhile is read and dropped, so that closing does not
/// reset the connection before the client has read the answer) for a
/// second at most: this connection is one too many.
async fn refuse<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: Wire<T>) {
    let answer = overload_answer();
    io.linger().store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        io.write_all(&answer).await?;
        io.shutdown().await
    })
    .await;
}

/// One connection counted among the node's open ones until dropped.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    /// A place among `max`, if one is free.
    fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Counted> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()
        .map(|_| Counted(open.clone()))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
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
        .header_read_timeout(limits.head_wait)
        .max_header_size(MAX_HEAD);
    let graceful = GracefulShutdown::new();
    let per_address = PerAddress::new();
    let open_now = Arc::new(AtomicUsize::new(0));
    let mut stop = std::pin::pin!(stop);
    loop {
        let (io, addr) = tokio::select! {
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
            () = &mut stop => break,
        };
        let ip = addr.ip();
        let counted = Counted::take(&open_now, limits.max_open);
        let slot = if counted.is_none() {
            None
        } else if limits.exempt.iter().any(|c| c.contains(ip)) {
            Some(None)
        } else {
            per_address.take(ip, limits.per_address).map(Some)
        };
        let (Some(counted), Some(slot)) = (counted, slot) else {
            tracing::debug!(address = %ip, "a connection past a bound refused");
            tokio::spawn(refuse(io));
            continue;
        };
        let open = metrics.open_connection();
        let app = app.clone();
        let linger = io.linger();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo::<SocketAddr>(addr));
            let mut app = app.clone();
            let linger = linger.clone();
            async move {
                let (req, read) = ReadToEnd::wrap(req);
                let mut res = app.call(req).await.unwrap_or_else(|e| match e {});
                if !read.load(Ordering::Relaxed) {
                    linger.store(true, Ordering::Relaxed);
                    res.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, Infallible>(res)
            }
        });
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                // A head not sent in time, a client gone mid-request.
                tracing::debug!(error = %e, "a connection ended with an error");
            }
            drop((open, slot, counted));
        });
    }
    // Refuse new connections at once while those open finish, so that a
    // balancer turns to another node instead of waiting here.
    drop(listener);
    graceful.shutdown().await;
}

/// A request's body that notes when it has been read to its end.
struct ReadToEnd {
    body: Incoming,
    read: Arc<AtomicBool>,
}

impl ReadToEnd {
    /// The request with its body wrapped, and the flag that says whether
    /// the body was read to its end (at once, for a request without one).
    fn wrap(req: hyper::Request<Incoming>) -> (axum::extract::Request, Arc<AtomicBool>) {
        let read = Arc::new(AtomicBool::new(req.body().is_end_stream()));
        let flag = read.clone();
        let req = req.map(|body| Body::new(ReadToEnd { body, read: flag }));
        (req, read)
    }
}

impl HttpBody for ReadToEnd {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.body.is_end_stream() {
            self.read.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
