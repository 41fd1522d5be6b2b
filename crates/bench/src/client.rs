//! The kit's HTTP client: hyper over a pool of keep-alive connections, so a
//! virtual user keeps reusing one connection.

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// One answer.
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// The body.
    pub body: Bytes,
    /// The `ETag` header, if any.
    pub etag: Option<String>,
    /// The `Retry-After` header in seconds, if any.
    pub retry_after: Option<u64>,
}

impl Reply {
    /// The body as JSON (`Null` if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A string field of the JSON body.
    pub fn str(&self, field: &str) -> Option<String> {
        self.json()[field].as_str().map(str::to_string)
    }
}

/// A client of one Tarn server (or load balancer).
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl Http {
    /// A client of `base` (`http://host:port`).
    pub fn new(base: &str) -> Http {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // A server closes a connection that waits 30 s for a request
        // (`tarn_server::serve::HEAD_WAIT`): let go of idle ones before,
        // so that none is reused as the server closes it.
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .pool_idle_timeout(std::time::Duration::from_secs(20))
            .build(connector);
        Http {
            client,
            base: base.trim_end_matches('/').to_string(),
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends one request.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        content_type: Option<&str>,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Result<Reply> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = self
            .client
            .request(req.body(Full::new(body))?)
            .await
            .context("request")?;
        let status = res.status().as_u16();
        let etag = res
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let retry_after = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let body = res
            .into_body()
            .collect()
            .await
            .context("response body")?
            .to_bytes();
        Ok(Reply {
            status,
            body,
            etag,
            retry_after,
        })
    }

    /// Sends JSON (or nothing) and reads the answer.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        json: Option<&Value>,
    ) -> Result<Reply> {
        match json {
            Some(v) => {
                self.send(
                    method,
                    path,
                    token,
                    Some("application/json"),
                    Bytes::from(v.to_string()),
                    &[],
                )
                .await
            }
            None => {
                self.send(method, path, token, None, Bytes::new(), &[])
                    .await
            }
        }
    }

    /// Opens a server-sent event stream (`GET path`), resuming after
    /// `last_event_id` when given.
    pub async fn events(
        &self,
        path: &str,
        token: Option<&str>,
        last_event_id: Option<&str>,
    ) -> Result<EventStream> {
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(format!("{}{path}", self.base))
            .header("accept", "text/event-stream");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let res = self
            .client
            .request(req.body(Full::new(Bytes::new()))?)
            .await
            .context("opening the stream")?;
        anyhow::ensure!(
            res.status() == 200,
            "the event stream answered {}",
            res.status()
        );
        Ok(EventStream {
            body: res.into_body(),
            text: String::new(),
        })
    }

    /// Like [`Http::json`], but any status other than `want` is an error.
    pub async fn expect(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        json: Option<&Value>,
        want: u16,
    ) -> Result<Reply> {
        let r = self.json(method.clone(), path, token, json).await?;
        if r.status != want {
            anyhow::bail!(
                "{method} {path} answered {} (wanted {want}): {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
        Ok(r)
    }

    /// Creates an item (any status but 201 is an error); answers its id.
    pub async fn create_item(&self, token: &str, body: &Value) -> Result<String> {
        let r = self
            .expect(Method::POST, "/api/v1/items", Some(token), Some(body), 201)
            .await?;
        r.str("id").context("the new item's id")
    }
}

/// One server-sent event.
#[derive(Clone, Debug)]
pub struct SseEvent {
    /// `event:` (`message` when absent).
    pub event: String,
    /// `id:`, if any.
    pub id: Option<String>,
    /// `data:` lines joined.
    pub data: String,
}

/// A server-sent event stream being read.
pub struct EventStream {
    body: hyper::body::Incoming,
    text: String,
}

impl EventStream {
    /// The next event (comments skipped); `None` when the stream ends.
    pub async fn next(&mut self) -> Result<Option<SseEvent>> {
        loop {
            if let Some(end) = self.text.find("\n\n") {
                let frame: String = self.text.drain(..end + 2).collect();
                let mut e = SseEvent {
                    event: "message".into(),
                    id: None,
                    data: String::new(),
                };
                let mut any = false;
                for line in frame.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        e.event = v.trim().to_string();
                        any = true;
                    } else if let Some(v) = line.strip_prefix("id:") {
                        e.id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        e.data.push_str(v.trim_start());
                        any = true;
                    }
                }
                if any {
                    return Ok(Some(e));
                }
                continue;
            }
            match self.body.frame().await {
                Some(frame) => {
                    let frame = frame.context("reading the stream")?;
                    if let Ok(data) = frame.into_data() {
                        self.text.push_str(&String::from_utf8_lossy(&data));
                    }
                }
                None => return Ok(None),
            }
        }
    }
}
