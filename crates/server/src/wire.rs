//! The server's connections: requests that are not HTTP enough to reach a
//! handler are answered with problem JSON too.
//!
//! hyper answers a request it cannot parse by itself, before any handler
//! sees it, with an empty body: `414` for a request target over 65,534
//! bytes (hyper's fixed bound), `431` for a head over its buffer or with
//! over 100 headers, `400` for anything else malformed. api.md answers
//! every error with problem JSON and a `q` over its limit with `400`, and
//! a client cannot tell how long a request line it sends is too long for
//! hyper. So each connection's writes pass through [`Wire`], which
//! recognises those answers (exactly the bytes hyper writes: the status
//! line, `connection: close`, `content-length: 0`, `date`, nothing else)
//! and writes problem JSON in their place; the connection closes after
//! them, as before. Only the first write after bytes were read is looked
//! at: hyper refuses right after reading the request it refuses, while
//! the app's responses start with a head hyper writes (every one carries
//! `x-request-id`, so none is a refusal's bytes) and go on with bodies
//! after it. An item's body that holds a refusal's bytes is therefore
//! served as it is, unless its own client sends more bytes while it
//! streams, which only that client's own connection would see.
//!
//! A connection closed while its client may still be sending (a request
//! refused before its body was read: `413`, or an upload refused before
//! its bytes) lingers, as nginx's do: [`Wire`] sends its end of the
//! connection, then reads and drops what the client still sends, until
//! the client closes its end or [`LINGER`] has passed. Closed at once,
//! the bytes still arriving would make the kernel reset the connection,
//! and a reset throws away the answer the client has not read yet: a
//! client that writes its whole body before reading (Python's `urllib`,
//! Node's `fetch`) got a broken pipe instead of the `413`.

use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::error::Problem;

/// A TCP listener whose connections are [`Wire`]s.
pub struct Listening(TcpListener);

impl Listening {
    /// Serves the connections `listener` accepts.
    pub fn new(listener: TcpListener) -> Listening {
        Listening(listener)
    }
}

impl axum::serve::Listener for Listening {
    type Io = Wire<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = axum::serve::Listener::accept(&mut self.0).await;
        (Wire::new(io), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// How long a closing connection whose client may still be sending
/// reads and drops what it sends, at most.
pub const LINGER: Duration = Duration::from_secs(5);

/// A connection whose writes of hyper's bodiless refusals become problem
/// JSON, and which lingers when it closes while its client may still be
/// sending.
pub struct Wire<T> {
    inner: T,
    /// A refusal's answer, not yet all written.
    pending: Vec<u8>,
    /// Whether bytes were read since the last write: only the first write
    /// after a read may be a refusal.
    read: bool,
    /// Whether closing lingers: set by whoever left a request unread.
    linger: Arc<AtomicBool>,
    /// How far closing has gone.
    closing: Closing,
}

/// How far a [`Wire`]'s closing has gone.
enum Closing {
    /// Not begun, or its end not yet sent.
    Open,
    /// Its end sent; reading and dropping until this sleep ends.
    Lingering(Pin<Box<tokio::time::Sleep>>),
    /// Done.
    Closed,
}

impl<T> Wire<T> {
    /// Wraps a connection.
    pub fn new(inner: T) -> Wire<T> {
        Wire {
            inner,
            pending: Vec::new(),
            read: false,
            linger: Arc::new(AtomicBool::new(false)),
            closing: Closing::Open,
        }
    }

    /// What makes this connection linger when it closes: set it when a
    /// request is answered before its body was read to its end.
    pub fn linger(&self) -> Arc<AtomicBool> {
        self.linger.clone()
    }
}

impl<T: AsyncRead + Unpin> Wire<T> {
    /// Reads and drops what the client sends until it closes its end (or
    /// the connection fails), or the lingering time is over.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut sink = [0u8; 8192];
        loop {
            let Closing::Lingering(until) = &mut self.closing else {
                return Poll::Ready(());
            };
            if until.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            let mut buf = ReadBuf::new(&mut sink);
            match ready!(Pin::new(&mut self.inner).poll_read(cx, &mut buf)) {
                Ok(()) if !buf.filled().is_empty() => {}
                // The client's end closed, or the connection failed:
                // nothing is left to wait for.
                Ok(()) | Err(_) => return Poll::Ready(()),
            }
        }
    }
}

/// The longest head hyper writes for a refusal (status line, three
/// headers): anything longer is not one.
const REFUSAL_MAX: usize = 160;

/// How each of them starts.
const REFUSAL_START: &[u8] = b"HTTP/1.1 4";

/// The problem JSON answer to one of hyper's bodiless refusals, or `None`
/// when `head` is not exactly one.
pub fn answer_to(head: &[u8]) -> Option<Vec<u8>> {
    if head.len() > REFUSAL_MAX || !head.starts_with(REFUSAL_START) {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let (status_line, rest) = text.split_once("\r\n")?;
    let date = rest
        .strip_prefix("connection: close\r\ncontent-length: 0\r\ndate: ")?
        .strip_suffix("\r\n\r\n")?;
    if date.len() != 29 || date.contains('\r') {
        return None;
    }
    let (status, slug, detail) = match status_line {
        "HTTP/1.1 414 URI Too Long" => (
            StatusCode::BAD_REQUEST,
            "invalid-input",
            format!(
                "the request target (path and query) is over 65,534 bytes; q has at most {} bytes",
                tarn_engine::MAX_QUERY
            ),
        ),
        "HTTP/1.1 431 Request Header Fields Too Large" => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "too-large",
            "the request's line and headers are over 400 KiB, or it has over 100 headers".into(),
        ),
        "HTTP/1.1 400 Bad Request" => (
            StatusCode::BAD_REQUEST,
            "invalid-input",
            "the request is not well-formed HTTP/1.1".into(),
        ),
        _ => return None,
    };
    let reason = status.canonical_reason().unwrap_or("Error");
    let body = serde_json::to_vec(&Problem {
        slug,
        title: reason,
        status: status.as_u16(),
        detail: &detail,
    })
    .expect("a problem serialises");
    let mut answer = format!(
        "HTTP/1.1 {} {reason}\r\nconnection: close\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\ndate: {date}\r\n\r\n",
        status.as_u16(),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    Some(answer)
}

impl<T: AsyncWrite + Unpin> Wire<T> {
    /// Writes what is left of a refusal's answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..n);
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `head` (`len` bytes hyper asked to write) as written when it
    /// is a refusal, its answer to be written instead.
    fn poll_refusal(
        &mut self,
        cx: &mut Context<'_>,
        head: &[u8],
        len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        if !std::mem::take(&mut self.read) {
            return None;
        }
        let answer = answer_to(head)?;
        self.pending = answer;
        // hyper refuses as soon as it reads what it refuses: more may follow.
        self.linger.store(true, Ordering::Relaxed);
        // Written now if the socket takes it; else on the next write,
        // flush or shutdown, which hyper makes next.
        Some(match self.poll_pending(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(len)),
        })
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Wire<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        self.read |= buf.filled().len() > before;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Wire<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if let Some(done) = self.poll_refusal(cx, buf, buf.len()) {
            return done;
        }
        self.read = false;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if len <= REFUSAL_MAX && bufs.first().is_some_and(|b| b.starts_with(REFUSAL_START)) {
            let head: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            if let Some(done) = self.poll_refusal(cx, &head, len) {
                return done;
            }
        }
        self.read = false;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Closing::Open = self.closing {
            ready!(self.poll_pending(cx))?;
            ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
            self.closing = if self.linger.load(Ordering::Relaxed) {
                Closing::Lingering(Box::pin(tokio::time::sleep(LINGER)))
            } else {
                Closing::Closed
            };
        }
        ready!(self.poll_drain(cx));
        self.closing = Closing::Closed;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{answer_to, Wire};

    const DATE: &str = "Thu, 26 Nov 2026 16:38:26 GMT";

    fn refusal(status_line: &str) -> Vec<u8> {
        format!("{status_line}\r\nconnection: close\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n")
            .into_bytes()
    }

    #[test]
    fn hypers_refusals_become_problems() {
        for (line, status, slug) in [
            ("HTTP/1.1 414 URI Too Long", 400, "invalid-input"),
            (
                "HTTP/1.1 431 Request Header Fields Too Large",
                431,
                "too-large",
            ),
            ("HTTP/1.1 400 Bad Request", 400, "invalid-input"),
        ] {
            let answer = String::from_utf8(answer_to(&refusal(line)).unwrap()).unwrap();
            let (head, body) = answer.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
            assert!(head.contains("content-type: application/problem+json"));
            assert!(head.contains("connection: close"));
            assert!(head.contains(&format!("content-length: {}", body.len())));
            assert!(head.ends_with(&format!("date: {DATE}")));
            let p: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(
                (p["type"].as_str(), p["status"].as_u64()),
                (Some(slug), Some(status))
            );
            assert!(!p["detail"].as_str().unwrap().is_empty());
        }
    }

    #[test]
    fn nothing_else_is_touched() {
        let ok =
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\ndate: Thu, 26 Nov 2026 16:38:26 GMT\r\n\r\n";
        let mut others = vec![
            ok.as_bytes().to_vec(),
            refusal("HTTP/1.1 404 Not Found"),
            refusal("HTTP/1.1 413 Payload Too Large"),
            b"HTTP/1.1 400 Bad Request\r\n".to_vec(),
            Vec::new(),
        ];
        // A refusal with anything before or after it, or a header more.
        let whole = refusal("HTTP/1.1 400 Bad Request");
        others.push([b"x".as_slice(), &whole].concat());
        others.push([whole.as_slice(), b"x"].concat());
        others.push(
            String::from_utf8(whole.clone())
                .unwrap()
                .replace("connection: close\r\n", "connection: close\r\nx-a: b\r\n")
                .into_bytes(),
        );
        for other in others {
            assert_eq!(
                answer_to(&other),
                None,
                "{}",
                String::from_utf8_lossy(&other)
            );
        }
    }

    /// Only the first write after a read can be a refusal: the same bytes
    /// written as part of a response (an item body holding them) go out
    /// as they are.
    #[tokio::test]
    async fn only_a_write_right_after_a_read_is_looked_at() {
        let refusal = refusal("HTTP/1.1 400 Bad Request");
        let (server, mut client) = tokio::io::duplex(4096);
        let mut wire = Wire::new(server);
        // Nothing read yet.
        wire.write_all(&refusal).await.unwrap();
        // A request read, answered, then the same bytes as a body chunk.
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut request = [0u8; 18];
        wire.read_exact(&mut request).await.unwrap();
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 95\r\n\r\n";
        wire.write_all(head).await.unwrap();
        wire.write_all(&refusal).await.unwrap();
        wire.flush().await.unwrap();
        let mut got = vec![0u8; refusal.len() + head.len() + refusal.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [refusal.as_slice(), head, &refusal].concat());
        // A refusal right after reading what it refuses is answered.
        client.write_all(b"BAD\r\n\r\n").await.unwrap();
        let mut bad = [0u8; 7];
        wire.read_exact(&mut bad).await.unwrap();
        wire.write_all(&refusal).await.unwrap();
        // Closing lingers (more of what was refused may follow) until the
        // client closes its end.
        let mut answer = Vec::new();
        let (closed, read) = tokio::join!(wire.shutdown(), async {
            client.read_to_end(&mut answer).await?;
            client.shutdown().await
        });
        closed.unwrap();
        read.unwrap();
        assert_eq!(answer, answer_to(&refusal).unwrap());
    }

    /// A connection closes at once unless told to linger; lingering, it
    /// reads and drops what the client sends, and lets a client that
    /// neither sends nor closes go after [`LINGER`].
    #[tokio::test(start_paused = true)]
    async fn closing_lingers_only_when_told_and_not_for_ever() {
        use std::sync::atomic::Ordering;

        use super::LINGER;

        // Not told: closed though the client keeps its end open.
        let (server, _client) = tokio::io::duplex(4096);
        let mut wire = Wire::new(server);
        let began = tokio::time::Instant::now();
        wire.shutdown().await.unwrap();
        assert_eq!(began.elapsed(), std::time::Duration::ZERO);
        // Told: what the client still sends is taken, and a silent client
        // is let go when the time is up.
        let (server, mut client) = tokio::io::duplex(4096);
        let mut wire = Wire::new(server);
        wire.linger().store(true, Ordering::Relaxed);
        let began = tokio::time::Instant::now();
        let (closed, sent) = tokio::join!(wire.shutdown(), async {
            // More than the pipe holds: only a reader lets it all through.
            client.write_all(&[0u8; 64 * 1024]).await
        });
        closed.unwrap();
        sent.unwrap();
        assert_eq!(began.elapsed(), LINGER);
    }
}
