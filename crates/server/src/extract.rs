//! Extractors: who is calling, link keys, `If-Match`, path and query
//! parameters, JSON bodies. Every refusal is problem JSON (`400
//! invalid-input` for what cannot be read, never axum's plain-text 400 or
//! 422), and the extractors of headers and query parameters document
//! themselves ([`IntoParams`]).

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HOST, IF_MATCH, ORIGIN,
    TRANSFER_ENCODING,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use serde::de::DeserializeOwned;
use tarn_engine::Caller;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::Required;
use utoipa::IntoParams;

use crate::error::{ApiError, ApiResult, Code};
use crate::json::TOKEN;
use crate::AppState;

/// The name of the web app's session cookie over plain HTTP.
pub const SESSION_COOKIE: &str = "tarn_session";

/// The name of the session cookie when a trusted proxy says the client
/// spoke HTTPS. A browser keeps a `__Host-` cookie only if it was set
/// `Secure`, with `Path=/` and no `Domain`, by this very host over HTTPS,
/// so neither a sibling subdomain nor a plain-HTTP attacker can plant one
/// (session fixation); over HTTPS the server reads no other.
pub const SECURE_SESSION_COOKIE: &str = "__Host-tarn_session";

/// The session cookie's name for a request over TLS or not.
pub fn session_cookie_name(tls: bool) -> &'static str {
    if tls {
        SECURE_SESSION_COOKIE
    } else {
        SESSION_COOKIE
    }
}

/// A `Set-Cookie` value that clears the session cookie `name` (over TLS
/// with `Secure`, as it was set).
pub fn cleared_cookie(name: &str, tls: bool) -> String {
    let secure = if tls { "; Secure" } else { "" };
    format!("{name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
}

/// The header a cookie-authenticated request that changes something must
/// carry (with the value `1`). A page of another site cannot send it
/// without a CORS preflight, which this server never grants.
pub const CSRF_HEADER: &str = "x-tarn-csrf";

/// The caller, from `Authorization: Bearer <token>`, else from the web
/// app's session cookie; anonymous without either. Only parsed here: the
/// engine checks the token inside the operation, in the same snapshot as
/// the rest of the request.
///
/// A bearer token wins over the cookie. The cookie is taken on a request
/// that changes something (any method but GET and HEAD) only when
/// the request proves it comes from a page of this origin: it carries
/// `X-Tarn-CSRF: 1`, and its `Origin` and `Sec-Fetch-Site`, when present,
/// say the same origin; otherwise it is refused with `403 forbidden`.
pub struct Auth {
    /// Who is calling, as presented.
    pub caller: Caller,
    /// Whether the credential came from the session cookie.
    pub by_cookie: bool,
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> ApiResult<Auth> {
        let Some(value) = parts.headers.get(AUTHORIZATION) else {
            let via = Via::of(parts, s);
            return match session_cookie(&parts.headers, via.tls) {
                Some(token) => {
                    // Only GET and HEAD read without proof: `is_safe()`
                    // would also let OPTIONS and TRACE through.
                    if !matches!(parts.method, Method::GET | Method::HEAD) {
                        check_same_origin(&parts.headers, &via)?;
                    }
                    Ok(Auth {
                        caller: Caller::Token(token),
                        by_cookie: true,
                    })
                }
                None => Ok(Auth {
                    caller: Caller::Anonymous,
                    by_cookie: false,
                }),
            };
        };
        if parts.headers.get_all(AUTHORIZATION).iter().nth(1).is_some() {
            // Which one a proxy or client meant cannot be told.
            return Err(ApiError::new(
                Code::Unauthenticated,
                "send one Authorization header",
            ));
        }
        let token = value
            .to_str()
            .ok()
            // The scheme's name is case-insensitive (RFC 9110, 11.1).
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(token)
            })
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= 256)
            .ok_or_else(|| {
                ApiError::new(Code::Unauthenticated, "use Authorization: Bearer <token>")
            })?;
        Ok(Auth {
            caller: Caller::Token(token.to_string()),
            by_cookie: false,
        })
    }
}

/// The session token of the session cookie (`__Host-tarn_session` over
/// TLS, `tarn_session` otherwise), if the `Cookie` headers hold exactly one
/// plausible value of it. A malformed value is no credential, and neither
/// are two different ones: a browser sends a cookie planted for a parent
/// domain beside the server's own, in an order the server cannot trust.
pub fn session_cookie(headers: &HeaderMap, tls: bool) -> Option<String> {
    let name = session_cookie_name(tls);
    let mut found: Option<&str> = None;
    let pairs = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='));
    for (_, value) in pairs.filter(|(n, _)| *n == name) {
        let value = value.trim().trim_matches('"');
        match found {
            Some(f) if f != value => return None,
            _ => found = Some(value),
        }
    }
    found
        .filter(|t| !t.is_empty() && t.len() <= 256 && t.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
}

/// Refuses a request that does not prove it comes from a page of this
/// origin: `X-Tarn-CSRF: 1`, and, when the browser says, a same-origin
/// `Sec-Fetch-Site` and an `Origin` naming this scheme (`https` when the
/// request came over TLS, as a trusted proxy says) and host (`Host`, or
/// `X-Forwarded-Host` when the request came through a trusted proxy).
pub fn check_same_origin(headers: &HeaderMap, via: &Via) -> ApiResult<()> {
    let refuse = |why: &str| {
        Err(ApiError::new(
            Code::Forbidden,
            format!("a request signed in by cookie that changes something must come from this origin's pages: {why}"),
        ))
    };
    if headers.get(CSRF_HEADER).map(|v| v.as_bytes()) != Some(b"1") {
        return refuse("send X-Tarn-CSRF: 1");
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if site.as_bytes() != b"same-origin" {
            return refuse("Sec-Fetch-Site is not same-origin");
        }
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let scheme = if via.tls { "https" } else { "http" };
        let authority = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .filter(|(s, _)| s.eq_ignore_ascii_case(scheme))
            .map(|(_, rest)| rest.trim_end_matches('/'));
        let host = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let same = authority.is_some_and(|a| {
            host(HOST.as_str()).is_some_and(|h| h.eq_ignore_ascii_case(a))
                || (via.proxied
                    && host(X_FORWARDED_HOST).is_some_and(|h| h.eq_ignore_ascii_case(a)))
        });
        if !same {
            return refuse("Origin names another site");
        }
    }
    Ok(())
}

/// `X-Forwarded-Host`, as a proxy in front of the server sets it.
const X_FORWARDED_HOST: &str = "x-forwarded-host";

/// How a request reached the server: whether its peer is a trusted proxy
/// (only then are its forwarding headers believed), and whether such a
/// proxy says the client spoke HTTPS.
#[derive(Clone, Copy, Debug)]
pub struct Via {
    /// The peer is one of the configured trusted proxies.
    pub proxied: bool,
    /// A trusted proxy says the client spoke HTTPS.
    pub tls: bool,
}

impl Via {
    /// How the request of `parts` came.
    pub fn of(parts: &Parts, s: &AppState) -> Via {
        Via::from(&parts.extensions, &parts.headers, s)
    }

    /// How `req` came.
    pub fn of_request(req: &axum::extract::Request, s: &AppState) -> Via {
        Via::from(req.extensions(), req.headers(), s)
    }

    fn from(extensions: &axum::http::Extensions, headers: &HeaderMap, s: &AppState) -> Via {
        let proxied = extensions
            .get::<ConnectInfo<SocketAddr>>()
            .is_some_and(|c| {
                let peer = c.0.ip();
                s.config.trusted_proxies.iter().any(|t| t.contains(peer))
            });
        Via {
            proxied,
            tls: proxied && says_https(headers),
        }
    }
}

impl FromRequestParts<AppState> for Via {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> ApiResult<Via> {
        Ok(Via::of(parts, s))
    }
}

/// Whether a proxy's headers say the client spoke HTTPS.
pub fn says_https(headers: &HeaderMap) -> bool {
    let proto = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|v| v.trim().eq_ignore_ascii_case("https"));
    let forwarded = headers
        .get("forwarded")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|first| {
            first.split(';').any(|kv| {
                kv.trim().split_once('=').is_some_and(|(k, v)| {
                    k.eq_ignore_ascii_case("proto")
                        && v.trim_matches('"').eq_ignore_ascii_case("https")
                })
            })
        });
    proto.or(forwarded).unwrap_or(false)
}

/// A link key, from `?key=` or the `Tarn-Link-Key` header.
pub struct LinkKey(pub Option<String>);

/// The header a link key may come in.
pub const LINK_KEY_HEADER: &str = "tarn-link-key";

/// Whether a query string gives a link key (`key=`, its name encoded in
/// any way), read without allocating.
pub fn names_a_key(query: &str) -> bool {
    query.split('&').any(|pair| {
        let name = pair.split('=').next().unwrap_or("");
        percent_encoding::percent_decode_str(name).eq(b"key".iter().copied())
    })
}

impl<S: Send + Sync> FromRequestParts<S> for LinkKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<LinkKey> {
        let mut headers = Vec::new();
        for v in parts.headers.get_all(LINK_KEY_HEADER) {
            let v = v
                .to_str()
                .map_err(|_| ApiError::invalid("Tarn-Link-Key is not text"))?;
            headers.push(v.to_string());
        }
        let query = parts.uri.query().unwrap_or("");
        let mut keys: Vec<String> = serde_urlencoded_pairs(query)?
            .into_iter()
            .filter(|(k, _)| k == "key")
            .map(|(_, v)| v)
            .collect();
        // Two keys in one place are refused: which was meant cannot be
        // told, as with two `Authorization`s. (The header wins over the
        // query, as OpenAPI lets a client send both.)
        if headers.len() > 1 {
            return Err(ApiError::invalid("Tarn-Link-Key is given twice"));
        }
        if keys.len() > 1 {
            return Err(ApiError::invalid("key is given twice"));
        }
        // Every key presented must look like one: a malformed key is the
        // caller's mistake even when their own role would do.
        if let Some(bad) = headers.iter().chain(&keys).find(|k| !is_token(k)) {
            return Err(ApiError::invalid(format!("{bad:?} is not a link key")));
        }
        Ok(LinkKey(headers.pop().or_else(|| keys.pop())))
    }
}

/// Whether `s` has the shape of the server's ids and keys ([`TOKEN`]).
pub fn is_token(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl IntoParams for LinkKey {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let key = || {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(TOKEN))
        };
        vec![
            ParameterBuilder::new()
                .name("key")
                .parameter_in(ParameterIn::Query)
                .required(Required::False)
                .description(Some("A link key of this item"))
                .schema(Some(key()))
                .build(),
            ParameterBuilder::new()
                .name("Tarn-Link-Key")
                .parameter_in(ParameterIn::Header)
                .required(Required::False)
                .description(Some(
                    "A link key of this item, instead of ?key= (this one wins)",
                ))
                .schema(Some(key()))
                .build(),
        ]
    }
}

/// Parses a query string into pairs (`+` is a space, `%XX` a byte); a
/// pair that does not decode to UTF-8 is refused, never read with
/// replacement characters.
pub fn serde_urlencoded_pairs(query: &str) -> ApiResult<Vec<(String, String)>> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| ApiError::invalid("the query string does not decode to UTF-8"))
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// `If-Match: "<version>"`; `*` or absent means any version.
pub struct IfMatch(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<IfMatch> {
        let lines = parts.headers.get_all(IF_MATCH);
        if lines.iter().next().is_none() {
            return Ok(IfMatch(None));
        }
        let bad =
            || ApiError::invalid("If-Match takes ETags, like \"3\" (or a bare version, 3, or *)");
        // Several lines are one list (RFC 9110, 5.3).
        let lines = lines
            .iter()
            .map(|l| l.to_str().map_err(|_| bad()))
            .collect::<ApiResult<Vec<_>>>()?;
        let joined = lines.join(",");
        let v = joined.trim();
        if v == "*" {
            return Ok(IfMatch(None));
        }
        // Any listed tag may match (RFC 9110, 13.1.1), compared strongly:
        // a weak tag, or one this server never gives, never matches; so a
        // list names at most one version the item could be at.
        let tags = tag_list(v);
        if tags.is_empty() {
            return Err(bad());
        }
        let mut version = None;
        let mut never = tarn_engine::FOREIGN_TAG;
        for tag in tags {
            match parse_etag(tag).ok_or_else(bad)? {
                Tag::Version(n) if version.is_some_and(|v| v != n) => {
                    return Err(ApiError::invalid(
                        "If-Match names two versions; an item is at one",
                    ))
                }
                Tag::Version(n) => version = Some(n),
                Tag::Weak => never = tarn_engine::WEAK_TAG,
                Tag::Foreign => {}
            }
        }
        // Refused by the engine once the caller may know the item exists.
        Ok(IfMatch(Some(version.unwrap_or(never))))
    }
}

/// The elements of a list of entity tags: split at commas outside quotes
/// (an opaque tag may hold one), trimmed, empty ones left out (RFC 9110,
/// 5.6.1.2).
fn tag_list(v: &str) -> Vec<&str> {
    let mut tags = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in v.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                tags.push(&v[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    tags.push(&v[start..]);
    tags.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// One entity tag of an `If-Match`.
enum Tag {
    /// A strong tag of this server's: a version.
    Version(u64),
    /// A weak tag (`W/"3"`).
    Weak,
    /// A strong tag this server never gives (`"abc"`).
    Foreign,
}

/// Parses `"3"`, `W/"3"`, `"abc"`, or a bare version (`3`, taken as the
/// ETag `"3"`); `None` when it is no entity tag.
fn parse_etag(tag: &str) -> Option<Tag> {
    let weak = tag.starts_with("W/");
    let t = tag.strip_prefix("W/").unwrap_or(tag);
    let opaque = match t.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(quoted) => quoted,
        None if !weak && !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t,
        None => return None,
    };
    // etagc: any visible character but the quote (RFC 9110, 8.8.3).
    if opaque
        .bytes()
        .any(|b| b == b'"' || !(0x21..=0x7e).contains(&b))
    {
        return None;
    }
    // As this server writes versions: decimal, no leading zero (`"01"` is
    // another tag than `"1"`).
    let digits = !opaque.is_empty()
        && !opaque.starts_with('0')
        && opaque.bytes().all(|b| b.is_ascii_digit());
    let version = (digits && opaque.len() <= 19)
        .then(|| opaque.parse::<u64>().ok())
        .flatten()
        .filter(|&n| n < tarn_engine::FOREIGN_TAG);
    Some(match (weak, version) {
        (true, _) => Tag::Weak,
        (false, Some(n)) => Tag::Version(n),
        (false, None) => Tag::Foreign,
    })
}

impl IntoParams for IfMatch {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![ParameterBuilder::new()
            .name("If-Match")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "Change only if the item is at this version: its ETag (`\"3\"`), or the bare version (`3`); `*` means any; a list matches if any of its tags does; a weak tag (`W/\"3\"`), or one this server never gives (`\"abc\"`), never matches (412)",
            ))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(r#"^(\*|(W/)?"[0-9]{1,19}"|[0-9]{1,19})$"#)),
            ))
            .build()]
    }
}

/// Path parameters; what cannot be read is `400 invalid-input`.
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Path<T>> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|e| ApiError::invalid(e.body_text()))
    }
}

/// Query parameters; what cannot be read (an unknown name, a malformed
/// value, a name given twice) is `400 invalid-input`.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<Query<T>> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|q| Query(q.0))
            .map_err(|e| ApiError::invalid(e.body_text()))
    }
}

/// A network (`10.0.0.0/8`, `::1/128`, or one address) whose peers are
/// trusted to report the client's address in `X-Forwarded-For`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address or network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix is 0 to {max}"))?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl Cidr {
    /// Whether `ip` lies in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            (IpAddr::V6(_), IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
            (IpAddr::V4(_), IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => return false,
            },
            _ => ip,
        };
        let (a, b) = match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => (
                u128::from(u32::from(a)) << 96,
                u128::from(u32::from(b)) << 96,
            ),
            (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b)),
            _ => return false,
        };
        let mask = match self.prefix {
            0 => 0,
            bits => u128::MAX << (128 - u32::from(bits)),
        };
        a & mask == b & mask
    }
}

/// What a client is counted as, for its connections, its failed sign-ins
/// and its anonymous event streams: its address, or for IPv6 its /64 (one
/// host commonly holds a whole /64, and would otherwise count as many).
pub fn counted_as(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
        v4 => v4,
    }
}

/// The client's address, as it is counted ([`counted_as`]): the TCP
/// peer's, or, when the peer is a trusted proxy, the rightmost
/// `X-Forwarded-For` address that is not one.
pub struct ClientAddr(pub Option<String>);

/// The client address of a request from `peer` with these headers.
///
/// `X-Forwarded-For` is read from the right, where each trusted proxy
/// appended the address it was talking to, and only as far as the first
/// untrusted address: everything left of that was written by the client,
/// so garbage there cannot move its requests onto the proxy's address.
pub fn client_addr(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    let mut client = peer;
    if !is_trusted(peer) {
        return client;
    }
    let values: Vec<_> = headers.get_all("x-forwarded-for").iter().collect();
    for v in values.into_iter().rev() {
        // Split as bytes: a proxy appends to the client's own value, which
        // may hold bytes that are not text.
        for part in v.as_bytes().rsplit(|&b| b == b',') {
            // An entry a trusted proxy wrote that we cannot read: the
            // last address we could.
            let Some(ip) = std::str::from_utf8(part).ok().and_then(forwarded_hop) else {
                return client;
            };
            client = ip;
            if !is_trusted(ip) {
                return client;
            }
        }
    }
    client
}

/// One `X-Forwarded-For` entry: an address, with or without a port
/// (`192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`, `[2001:db8::1]:4711`).
fn forwarded_hop(part: &str) -> Option<IpAddr> {
    let part = part.trim();
    part.parse::<IpAddr>()
        .ok()
        .or_else(|| part.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            part.strip_prefix('[')
                .and_then(|p| p.strip_suffix(']'))
                .and_then(|p| p.parse::<IpAddr>().ok())
        })
}

impl FromRequestParts<AppState> for ClientAddr {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> ApiResult<ClientAddr> {
        Ok(ClientAddr(
            parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| {
                counted_as(client_addr(
                    c.0.ip(),
                    &parts.headers,
                    &s.config.trusted_proxies,
                ))
                .to_string()
            }),
        ))
    }
}

/// A request's `Content-Type`, if it has one: `400` when it is given
/// twice (which would the server take?) or is not ASCII.
pub fn content_type(headers: &HeaderMap) -> ApiResult<Option<&str>> {
    let mut values = headers.get_all(CONTENT_TYPE).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::invalid("Content-Type is given twice"));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| ApiError::invalid("Content-Type is ASCII"))
}

/// A JSON request body: `application/json` (or no `Content-Type` at all,
/// as a client that forgot the header sends it, unless a browser says
/// another site sent it), at most the configured size, refused before it
/// is read whole when it is larger. Another media type is refused (`415`).
/// (What keeps a cross-site page from writing with a visitor's session
/// cookie is [`check_same_origin`], not the media type.)
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> ApiResult<JsonBody<T>> {
        let limit = state.config.max_json;
        let headers = req.headers();
        let json = match content_type(headers)? {
            // No media type: JSON, unless a browser says another site's
            // page sent it (a `fetch` of an untyped body needs no
            // preflight; it could sign up accounts from its visitors).
            None => headers
                .get("sec-fetch-site")
                .is_none_or(|v| matches!(v.as_bytes(), b"same-origin" | b"none")),
            Some(ct) => matches!(
                tarn_engine::media_essence(ct).as_str(),
                "application/json" | "application/merge-patch+json"
            ),
        };
        if !json {
            return Err(ApiError::new(
                Code::UnsupportedMediaType,
                "send JSON with Content-Type: application/json",
            ));
        }
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(ApiError::too_large(format!(
                "a JSON body is at most {limit} bytes"
            )));
        }
        let mut body = BodyPieces::new(req, state)?;
        // Grown as bytes come: an announced length is no reason to hold
        // memory for a client that may never send it.
        let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(16 * 1024));
        while let Some(piece) = body.next().await? {
            if bytes.len() + piece.len() > limit {
                return Err(ApiError::too_large(format!(
                    "a JSON body is at most {limit} bytes"
                )));
            }
            bytes.extend_from_slice(&piece);
        }
        // Every JSON body of the API is an object: serde would take a
        // struct's fields by position from an array. (Any other value is
        // refused by serde itself, with a clearer message.)
        if bytes
            .iter()
            .find(|b| !b" \t\r\n".contains(b))
            .is_some_and(|b| *b == b'[')
        {
            return Err(ApiError::invalid(
                "a JSON body is an object: {...}, not an array",
            ));
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::invalid(format!("malformed JSON: {e}")))
    }
}

/// A request body's pieces as they arrive. A client must send
/// [`BODY_PACE`] bytes (or the rest of its body) for every `body_idle` the
/// server spends waiting on it, else it is refused: a client that stops,
/// or trickles a byte now and then, does not hold its connection (and an
/// upload) open. Time the server spends on the bytes is not counted.
pub struct BodyPieces {
    stream: axum::body::BodyDataStream,
    idle: std::time::Duration,
    /// Waited, and received, since the client last kept pace.
    waited: std::time::Duration,
    got: usize,
}

/// Bytes a request body must bring per `body_idle` of waiting.
pub const BODY_PACE: usize = 16 * 1024;

impl BodyPieces {
    /// The pieces of `req`'s body, refused (`415`) if it comes in a
    /// content coding, or a transfer coding other than `chunked` (which
    /// the connection undoes): bytes are taken and stored as sent, so a
    /// compressed body would be parsed, or kept, as garbage.
    pub fn new(req: Request, state: &AppState) -> ApiResult<BodyPieces> {
        let coded = |name, plain: &str| {
            req.headers()
                .get_all(name)
                .iter()
                .flat_map(|v| v.to_str().unwrap_or("?").split(','))
                .any(|c| !c.trim().eq_ignore_ascii_case(plain))
        };
        if coded(CONTENT_ENCODING, "identity") {
            return Err(ApiError::new(
                Code::UnsupportedMediaType,
                "send the body without Content-Encoding: the server takes no content coding",
            ));
        }
        if coded(TRANSFER_ENCODING, "chunked") {
            return Err(ApiError::new(
                Code::UnsupportedMediaType,
                "send the body with no Transfer-Encoding but chunked: the server takes no other coding",
            ));
        }
        Ok(BodyPieces {
            stream: req.into_body().into_data_stream(),
            idle: state.config.body_idle,
            waited: std::time::Duration::ZERO,
            got: 0,
        })
    }

    /// The next piece; `None` at the end.
    pub async fn next(&mut self) -> ApiResult<Option<axum::body::Bytes>> {
        use futures_util::StreamExt;
        let start = std::time::Instant::now();
        let left = self.idle.saturating_sub(self.waited);
        let next = tokio::time::timeout(left, self.stream.next()).await;
        self.waited += start.elapsed();
        match next {
            Err(_) => Err(ApiError::invalid(format!(
                "the request body stalled: less than {} KiB in {} s",
                BODY_PACE / 1024,
                self.idle.as_secs_f64()
            ))),
            Ok(None) => Ok(None),
            Ok(Some(Ok(piece))) => {
                self.got += piece.len();
                if self.got >= BODY_PACE {
                    self.waited = std::time::Duration::ZERO;
                    self.got = 0;
                }
                Ok(Some(piece))
            }
            Ok(Some(Err(e))) => Err(ApiError::invalid(format!(
                "the request body broke off: {e}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    async fn if_match(v: &str) -> Result<Option<u64>, u16> {
        let (mut parts, _) = axum::http::Request::builder()
            .header(IF_MATCH, v)
            .body(())
            .unwrap()
            .into_parts();
        IfMatch::from_request_parts(&mut parts, &())
            .await
            .map(|m| m.0)
            .map_err(|e| e.code.status().as_u16())
    }

    #[tokio::test]
    async fn if_match_takes_an_etag_a_bare_version_or_a_star() {
        assert_eq!(if_match("\"3\"").await, Ok(Some(3)));
        assert_eq!(
            if_match("W/\"3\"").await,
            Ok(Some(tarn_engine::WEAK_TAG)),
            "weak tags never match"
        );
        assert_eq!(if_match("3").await, Ok(Some(3)));
        assert_eq!(if_match("*").await, Ok(None));
        // Well-formed tags this server never gives match nothing (412),
        // as RFC 9110 has it; they are no malformed header.
        for foreign in [
            "\"+3\"",
            "\"\"",
            "\"abc\"",
            "\"99999999999999999999\"",
            "\"03\"",
            "\"0\"",
            "03",
        ] {
            assert_eq!(
                if_match(foreign).await,
                Ok(Some(tarn_engine::FOREIGN_TAG)),
                "{foreign}"
            );
        }
        // A list matches if any tag does: at most one can.
        assert_eq!(if_match("\"abc\", \"3\", W/\"4\"").await, Ok(Some(3)));
        assert_eq!(if_match("\"3\",\"3\"").await, Ok(Some(3)));
        // Empty elements are left out (RFC 9110, 5.6.1.2); an opaque tag
        // may hold a comma.
        assert_eq!(if_match("\"3\",").await, Ok(Some(3)));
        // Two lines are one list.
        let (mut parts, _) = axum::http::Request::builder()
            .header(IF_MATCH, "\"abc\"")
            .header(IF_MATCH, "\"3\"")
            .body(())
            .unwrap()
            .into_parts();
        let m = IfMatch::from_request_parts(&mut parts, &()).await;
        assert_eq!(m.ok().and_then(|m| m.0), Some(3));
        assert_eq!(if_match(", ,\"3\"").await, Ok(Some(3)));
        assert_eq!(
            if_match("\"a,b\"").await,
            Ok(Some(tarn_engine::FOREIGN_TAG))
        );
        assert_eq!(
            if_match("W/\"3\", \"abc\"").await,
            Ok(Some(tarn_engine::WEAK_TAG))
        );
        for bad in [
            "+3",
            "W/3",
            "\"3",
            "x",
            "\"a b\"",
            "\"3\", \"4\"",
            "",
            " , ,",
        ] {
            assert_eq!(if_match(bad).await, Err(400), "{bad}");
        }
    }

    #[test]
    fn a_query_names_a_key_however_it_is_encoded() {
        for q in ["key=a", "q=x&key=", "k%65y=a", "%6B%65%79=a", "key"] {
            assert!(names_a_key(q), "{q}");
        }
        for q in ["", "keys=a", "q=key", "monkey=a", "k%65=y"] {
            assert!(!names_a_key(q), "{q}");
        }
    }

    #[test]
    fn link_keys_have_the_shape_of_tokens() {
        assert!(is_token("aZ09_-"));
        for bad in ["", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(!is_token(bad), "{bad}");
        }
    }

    #[test]
    fn networks() {
        let n: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(n.contains(ip("10.1.2.3")));
        assert!(!n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.0.0.1")));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        for bad in ["10.0.0.0/33", "x", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted: Vec<Cidr> = vec!["127.0.0.1".parse().unwrap(), "10.0.0.0/8".parse().unwrap()];
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "1.2.3.4, 10.0.0.7".parse().unwrap());
        // Through two trusted proxies: the rightmost untrusted address.
        assert_eq!(client_addr(ip("127.0.0.1"), &h, &trusted), ip("1.2.3.4"));
        // A client cannot spoof it by talking to the server directly.
        assert_eq!(client_addr(ip("5.6.7.8"), &h, &trusted), ip("5.6.7.8"));
        // A client prepending a fake address is still seen as itself.
        h.insert("x-forwarded-for", "9.9.9.9, 1.2.3.4".parse().unwrap());
        assert_eq!(client_addr(ip("127.0.0.1"), &h, &trusted), ip("1.2.3.4"));
        // Garbage in the header: the peer.
        h.insert("x-forwarded-for", "nonsense".parse().unwrap());
        assert_eq!(client_addr(ip("127.0.0.1"), &h, &trusted), ip("127.0.0.1"));
        // Garbage the client sent ahead of what the proxy appended does
        // not move it onto the proxy's address.
        h.insert("x-forwarded-for", "nonsense, 1.2.3.4".parse().unwrap());
        assert_eq!(client_addr(ip("127.0.0.1"), &h, &trusted), ip("1.2.3.4"));
        let bytes = axum::http::HeaderValue::from_bytes(b"\xe9\xff, 1.2.3.4").unwrap();
        h.insert("x-forwarded-for", bytes);
        assert_eq!(client_addr(ip("127.0.0.1"), &h, &trusted), ip("1.2.3.4"));
        // Garbage behind a trusted hop: the last address that could be read.
        h.insert("x-forwarded-for", "1.2.3.4, ???, 10.0.0.7".parse().unwrap());
        assert_eq!(client_addr(ip("127.0.0.1"), &h, &trusted), ip("10.0.0.7"));
        // Entries with ports, as some proxies write them.
        for (value, want) in [
            ("1.2.3.4:4711", "1.2.3.4"),
            ("[2001:db8::1]:4711, 10.0.0.7:80", "2001:db8::1"),
            ("[2001:db8::2]", "2001:db8::2"),
        ] {
            h.insert("x-forwarded-for", value.parse().unwrap());
            assert_eq!(
                client_addr(ip("127.0.0.1"), &h, &trusted),
                ip(want),
                "{value}"
            );
        }
        // Several headers are one list, in order.
        h.insert("x-forwarded-for", "5.5.5.5".parse().unwrap());
        h.append("x-forwarded-for", "10.0.0.9".parse().unwrap());
        assert_eq!(client_addr(ip("127.0.0.1"), &h, &trusted), ip("5.5.5.5"));
        // No proxies trusted (the default): always the peer.
        h.insert("x-forwarded-for", "1.2.3.4".parse().unwrap());
        assert_eq!(client_addr(ip("127.0.0.1"), &h, &[]), ip("127.0.0.1"));
    }
}
