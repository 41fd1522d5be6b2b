//! `PgStore`: Tarn's store contract on PostgreSQL, for many stateless nodes
//! sharing one database.
//!
//! - One table `tarn_rows (tbl, part bytea, clus bytea, value bytea, version
//!   int8)` with primary key `(tbl, part, clus)`; `bytea` compares bytewise,
//!   exactly as the contract orders clustering keys.
//! - Pooled connections (deadpool), statements prepared once per connection.
//!   Several reads of one call are pipelined on one connection.
//! - A write is one transaction in two round trips: `BEGIN` and every
//!   statement go out together, then `COMMIT` (or `ROLLBACK` when a guard
//!   failed). Guards come first, in key order: `SELECT … FOR UPDATE` for a
//!   version guard on a row the write changes, `FOR SHARE` on a row it only
//!   depends on (so writers depending on one row do not queue behind each
//!   other); for an absent guard, an `INSERT … ON CONFLICT DO NOTHING` of a
//!   placeholder, whose uniqueness check makes a concurrent inserter wait for
//!   our outcome and then see the row. The ops follow as one bulk upsert and
//!   a delete a key, deduplicated and sorted by key, and run whatever the
//!   guards found: a failed guard is reported after the fact and the whole
//!   transaction rolled back. Placeholders not overwritten are removed
//!   before commit. A write runs in a task of its own, so a request that
//!   goes away cannot leave its connection inside the transaction.
//! - Deadlocks and serialization failures surface as
//!   [`StoreError::Conflict`], connection trouble as
//!   [`StoreError::Unavailable`]: the engine retries both with backoff.
//! - Schema creation runs at every start under an advisory lock, so any
//!   number of nodes may start at once.
//!
//! The URL is a libpq-style `postgres://` URL; Tarn adds one parameter,
//! `schema=NAME`, to keep the table in a schema of its own (created if
//! missing).

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::str::FromStr;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::future::try_join_all;
use futures_util::FutureExt;
use tarn_store::{
    check_read, Batch, Consistency, Direction, Expect, FeedEntry, Key, Op, ReadResult, Row, Scan,
    Snapshot, Store, StoreError, StoreResult, Table,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

/// How long a new connection (TCP, TLS and PostgreSQL's start-up) may take:
/// a server that accepts connections and never answers is refused after
/// it, rather than waited for for ever (`tarn serve` printed nothing and
/// never started).
const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Marks a placeholder row written to lock an absent guarded key.
const PLACEHOLDER: i64 = -1;

/// Settings of a [`PgStore`].
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Connections in the pool.
    pub pool_size: usize,
    /// How long a snapshot or a write waits for a free connection before
    /// it is refused as [`StoreError::Unavailable`] (the server answers
    /// 503): overload is answered, not queued for ever.
    pub wait: std::time::Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            pool_size: 16,
            wait: std::time::Duration::from_secs(1),
        }
    }
}

/// The PostgreSQL store. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
}

fn map_err(e: tokio_postgres::Error) -> StoreError {
    let text = match e.as_db_error() {
        Some(db) => format!("{} ({}): {}", db.severity(), db.code().code(), db.message()),
        None => format!(
            "{e}: {}",
            std::error::Error::source(&e).map_or(String::new(), |s| s.to_string())
        ),
    };
    map_code(&e, text)
}

fn map_code(e: &tokio_postgres::Error, text: String) -> StoreError {
    if let Some(code) = e.code() {
        if *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::LOCK_NOT_AVAILABLE
        {
            return StoreError::Conflict(text);
        }
        if code.code().starts_with("08")
            || code.code().starts_with("57")
            || code.code().starts_with("53")
        {
            return StoreError::Unavailable(text);
        }
        if *code == SqlState::DATA_CORRUPTED || *code == SqlState::INDEX_CORRUPTED {
            return StoreError::Corrupt(text);
        }
        return StoreError::Other(text);
    }
    // No SQL state: the connection failed or closed.
    StoreError::Unavailable(text)
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => map_err(e),
        deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) => {
            StoreError::Unavailable("every connection of the pool stayed busy".into())
        }
        deadpool_postgres::PoolError::Timeout(_) => StoreError::Unavailable(format!(
            "PostgreSQL did not answer a connection's start or check within {} s",
            CONNECT_WAIT.as_secs()
        )),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// Tarn's own parameters of a PostgreSQL URL, split off before the rest
/// goes to the driver.
#[derive(Debug, Default, PartialEq, Eq)]
struct Params {
    /// `schema=NAME`: keep Tarn's tables in a schema of their own.
    schema: Option<String>,
    /// `sslmode=disable|prefer|require|verify-ca|verify-full` (libpq's).
    sslmode: Option<String>,
    /// `sslrootcert=FILE`: the CA certificates (PEM) to trust.
    sslrootcert: Option<String>,
    /// `pool_size=N`: connections in the pool ([`PgOptions::pool_size`]).
    pool_size: Option<String>,
    /// `pool_wait=MS`: milliseconds a snapshot or a write waits for a free
    /// connection ([`PgOptions::wait`]).
    pool_wait: Option<String>,
}

impl Params {
    /// `options` with the pool's settings this URL gives.
    fn pool(&self, mut options: PgOptions) -> StoreResult<PgOptions> {
        if let Some(n) = &self.pool_size {
            options.pool_size = match n.parse::<usize>() {
                Ok(n) if (MIN_POOL_SIZE..=MAX_POOL_SIZE).contains(&n) => n,
                _ => {
                    return Err(StoreError::Invalid(format!(
                        "pool_size {n:?}: a number of connections from {MIN_POOL_SIZE} to {MAX_POOL_SIZE}"
                    )))
                }
            };
        }
        if let Some(ms) = &self.pool_wait {
            options.wait = match ms.parse::<u64>() {
                Ok(ms) if (1..=MAX_POOL_WAIT_MS).contains(&ms) => {
                    std::time::Duration::from_millis(ms)
                }
                _ => {
                    return Err(StoreError::Invalid(format!(
                        "pool_wait {ms:?}: milliseconds from 1 to {MAX_POOL_WAIT_MS}"
                    )))
                }
            };
        }
        Ok(options)
    }
}

/// The fewest connections `pool_size` may ask for: some writes are made
/// while their snapshot still holds a connection (a group's nesting), and
/// index builds keep half of them.
const MIN_POOL_SIZE: usize = 4;

/// The most connections `pool_size` may ask for (a server configured for
/// many: PostgreSQL's own default `max_connections` is 100, shared by
/// every node).
const MAX_POOL_SIZE: usize = 1_000;

/// The longest `pool_wait`: a request waits for a connection this long at
/// each of the engine's twelve attempts, so ten seconds already answers
/// overload two minutes late.
const MAX_POOL_WAIT_MS: u64 = 10_000;

/// Splits Tarn's own parameters off a URL.
fn split_params(url: &str) -> (String, Params) {
    let mut params = Params::default();
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), params);
    };
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let slot = match k {
                "schema" => &mut params.schema,
                "sslmode" => &mut params.sslmode,
                "sslrootcert" => &mut params.sslrootcert,
                "pool_size" => &mut params.pool_size,
                "pool_wait" => &mut params.pool_wait,
                _ => return true,
            };
            *slot = Some(v.to_string());
            false
        })
        .collect();
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, params)
}

/// How a connection is secured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsMode {
    /// No TLS (`disable`, `prefer`, or no `sslmode`).
    Off,
    /// TLS, the server's certificate not checked (`require`, as libpq).
    Encrypt,
    /// TLS, the certificate checked against the CA, not the host name.
    VerifyCa,
    /// TLS, the certificate checked against the CA and the host name.
    VerifyFull,
}

fn tls_mode(sslmode: Option<&str>) -> StoreResult<TlsMode> {
    match sslmode {
        None | Some("disable") | Some("prefer") => Ok(TlsMode::Off),
        Some("require") => Ok(TlsMode::Encrypt),
        Some("verify-ca") => Ok(TlsMode::VerifyCa),
        Some("verify-full") => Ok(TlsMode::VerifyFull),
        Some(other) => Err(StoreError::Invalid(format!(
            "sslmode {other:?}: use disable, prefer, require, verify-ca or verify-full"
        ))),
    }
}

mod tls {
    //! Certificate checks for the three TLS modes.

    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{ClientConfig, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
    use tarn_store::{StoreError, StoreResult};

    use super::TlsMode;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// The trusted roots: the file's certificates, or Mozilla's.
    fn roots(file: Option<&str>) -> StoreResult<RootCertStore> {
        let mut roots = RootCertStore::empty();
        match file {
            Some(f) => {
                let certs = CertificateDer::pem_file_iter(f)
                    .map_err(|e| StoreError::Invalid(format!("sslrootcert {f}: {e}")))?;
                for c in certs {
                    let c = c.map_err(|e| StoreError::Invalid(format!("sslrootcert {f}: {e}")))?;
                    roots
                        .add(c)
                        .map_err(|e| StoreError::Invalid(format!("sslrootcert {f}: {e}")))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        Ok(roots)
    }

    /// Checks the chain, and the host name only if `hostname`; or nothing
    /// at all without `inner` (libpq's `require`).
    #[derive(Debug)]
    struct Verifier {
        inner: Option<Arc<WebPkiServerVerifier>>,
        hostname: bool,
        provider: Arc<CryptoProvider>,
    }

    impl ServerCertVerifier for Verifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            let Some(inner) = &self.inner else {
                return Ok(ServerCertVerified::assertion());
            };
            match inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
                Err(Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
                | Err(Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForNameContext { .. },
                )) if !self.hostname => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    }

    /// The client configuration of a TLS mode.
    pub(super) fn config(mode: TlsMode, rootcert: Option<&str>) -> StoreResult<ClientConfig> {
        let provider = provider();
        let inner = match mode {
            TlsMode::Off | TlsMode::Encrypt => None,
            TlsMode::VerifyCa | TlsMode::VerifyFull => Some(
                WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots(rootcert)?),
                    provider.clone(),
                )
                .build()
                .map_err(|e| StoreError::Invalid(format!("TLS roots: {e}")))?,
            ),
        };
        let verifier = Verifier {
            inner,
            hostname: mode == TlsMode::VerifyFull,
            provider: provider.clone(),
        };
        Ok(ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Invalid(format!("TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth())
    }
}

fn check_schema_name(s: &str) -> StoreResult<()> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "schema {s:?}: use lower-case letters, digits and _"
        )))
    }
}

impl PgStore {
    /// Connects to `url`, creating the schema and table if needed.
    pub async fn connect(url: &str) -> StoreResult<PgStore> {
        PgStore::connect_with(url, PgOptions::default()).await
    }

    /// Connects with options; the URL's `pool_size` and `pool_wait`
    /// override theirs.
    pub async fn connect_with(url: &str, options: PgOptions) -> StoreResult<PgStore> {
        let (url, params) = split_params(url);
        let options = params.pool(options)?;
        let schema = params.schema.clone();
        let mut config = tokio_postgres::Config::from_str(&url)
            .map_err(|e| StoreError::Invalid(format!("PostgreSQL URL: {e}")))?;
        if let Some(s) = &schema {
            check_schema_name(s)?;
            config.options(format!("-c search_path={s}"));
        }
        let mode = tls_mode(params.sslmode.as_deref())?;
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match mode {
            TlsMode::Off => Manager::from_config(config, NoTls, manager_config),
            mode => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                let tls = tls::config(mode, params.sslrootcert.as_deref())?;
                Manager::from_config(
                    config,
                    tokio_postgres_rustls::MakeRustlsConnect::new(tls),
                    manager_config,
                )
            }
        };
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .wait_timeout(Some(options.wait))
            .create_timeout(Some(CONNECT_WAIT))
            .recycle_timeout(Some(CONNECT_WAIT))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Other(format!("pool: {e}")))?;
        let store = PgStore { pool };
        store.migrate(schema.as_deref()).await?;
        Ok(store)
    }

    /// Idempotent schema setup, serialised across nodes by an advisory lock.
    async fn migrate(&self, schema: Option<&str>) -> StoreResult<()> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client.transaction().await.map_err(map_err)?;
        tx.execute("SELECT pg_advisory_xact_lock(74261157)", &[])
            .await
            .map_err(map_err)?;
        if let Some(s) = schema {
            tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))
                .await
                .map_err(map_err)?;
        }
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS tarn_rows (
                 tbl text COLLATE \"C\" NOT NULL,
                 part bytea NOT NULL,
                 clus bytea NOT NULL,
                 value bytea NOT NULL,
                 version int8 NOT NULL,
                 PRIMARY KEY (tbl, part, clus)
             );
             CREATE SEQUENCE IF NOT EXISTS tarn_feed_seq;
             CREATE TABLE IF NOT EXISTS tarn_feed (
                 tbl text COLLATE \"C\" NOT NULL,
                 xid xid8 NOT NULL,
                 seq int8 NOT NULL,
                 value bytea NOT NULL,
                 PRIMARY KEY (tbl, xid, seq)
             );
             CREATE TABLE IF NOT EXISTS tarn_schema (version int8 NOT NULL);
             INSERT INTO tarn_schema (version) SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM tarn_schema);",
        )
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)
    }
}

const GET: &str = "SELECT value, version FROM tarn_rows WHERE tbl = $1 AND part = $2 AND clus = $3";

fn scan_sql(scan: &Scan) -> String {
    let mut sql =
        String::from("SELECT clus, value, version FROM tarn_rows WHERE tbl = $1 AND part = $2");
    let mut n = 2;
    for (b, lt, le) in [(&scan.lower, ">", ">="), (&scan.upper, "<", "<=")] {
        match b {
            Bound::Unbounded => {}
            Bound::Included(_) => {
                n += 1;
                sql.push_str(&format!(" AND clus {le} ${n}"));
            }
            Bound::Excluded(_) => {
                n += 1;
                sql.push_str(&format!(" AND clus {lt} ${n}"));
            }
        }
    }
    n += 1;
    sql.push_str(match scan.direction {
        Direction::Forward => " ORDER BY clus ASC",
        Direction::Reverse => " ORDER BY clus DESC",
    });
    sql.push_str(&format!(" LIMIT ${n}"));
    sql
}

async fn get_on(client: &deadpool_postgres::Client, key: &Key) -> StoreResult<Option<Row>> {
    let stmt = client.prepare_cached(GET).await.map_err(map_err)?;
    let row = client
        .query_opt(&stmt, &[&key.table.name(), &key.partition, &key.clustering])
        .await
        .map_err(map_err)?;
    Ok(row.map(|r| Row {
        clustering: key.clustering.clone(),
        value: r.get(0),
        version: r.get::<_, i64>(1) as u64,
    }))
}

async fn scan_on(client: &deadpool_postgres::Client, scan: &Scan) -> StoreResult<Vec<Row>> {
    if scan.limit == 0 {
        return Ok(Vec::new());
    }
    let stmt = client
        .prepare_cached(&scan_sql(scan))
        .await
        .map_err(map_err)?;
    let table = scan.table.name();
    let limit = i64::try_from(scan.limit).unwrap_or(i64::MAX);
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&table, &scan.partition];
    for b in [&scan.lower, &scan.upper] {
        if let Bound::Included(k) | Bound::Excluded(k) = b {
            params.push(k);
        }
    }
    params.push(&limit);
    let rows = client.query(&stmt, &params).await.map_err(map_err)?;
    Ok(rows
        .into_iter()
        .map(|r| Row {
            clustering: r.get(0),
            value: r.get(1),
            version: r.get::<_, i64>(2) as u64,
        })
        .collect())
}

/// One pooled connection holding one `REPEATABLE READ READ ONLY`
/// transaction, begun with the first read (pipelined with it, so it costs no
/// round trip of its own) and ended when the snapshot is dropped.
struct PgSnapshot {
    client: Option<deadpool_postgres::Client>,
    begun: bool,
}

#[async_trait::async_trait]
impl Snapshot for PgSnapshot {
    async fn read(&mut self, gets: &[Key], scans: &[Scan]) -> StoreResult<ReadResult> {
        check_read(gets, scans)?;
        // Marked begun before BEGIN goes out: a read dropped half-way still
        // has its transaction ended when the snapshot is.
        let begin_now = !std::mem::replace(&mut self.begun, true);
        let client = self.client.as_ref().expect("held until drop");
        let begin = async {
            if begin_now {
                client
                    .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await
                    .map_err(map_err)
            } else {
                Ok(())
            }
        };
        // Polled together, the statements go out in this order on one
        // connection and their answers come back in one round trip.
        let (begun, rows, scans) = tokio::join!(
            begin,
            try_join_all(gets.iter().map(|k| get_on(client, k))),
            try_join_all(scans.iter().map(|s| scan_on(client, s))),
        );
        begun?;
        Ok(ReadResult {
            rows: rows?,
            scans: scans?,
        })
    }

    async fn read_feed(
        &mut self,
        feed: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<Vec<FeedEntry>> {
        let (xid, seq) = feed_cursor(after)?;
        let limit = limit.min(tarn_store::MAX_READ_ROWS) as i64;
        let client = self.begun().await?;
        // Only below the oldest transaction still running that may write
        // here: one that took its id earlier but commits later can still
        // add entries there. Ordered by the table's columns, named with the
        // table: a bare `xid` is the selected `int8`, which no index orders,
        // and every read sorted all the entries after its cursor.
        let stmt = client
            .prepare_cached(&format!(
                "SELECT xid::text::int8, seq, value FROM tarn_feed
                 WHERE tbl = $1 AND (xid, seq) > ($2::bigint::text::xid8, $3)
                   AND xid < ({FEED_HORIZON})::text::xid8
                 ORDER BY tarn_feed.xid, tarn_feed.seq LIMIT $4"
            ))
            .await
            .map_err(map_err)?;
        let rows = client
            .query(&stmt, &[&feed.name(), &xid, &seq, &limit])
            .await
            .map_err(map_err)?;
        Ok(rows
            .into_iter()
            .map(|r| FeedEntry {
                cursor: cursor_bytes(r.get(0), r.get(1)),
                value: r.get(2),
            })
            .collect())
    }

    async fn scan_all(
        &mut self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<(Vec<(Key, Row)>, Option<Vec<u8>>)> {
        let after = cursor.map(tarn_store::decode_row_cursor).transpose()?;
        let limit = limit.clamp(1, tarn_store::MAX_READ_ROWS);
        let client = self.begun().await?;
        let rows = match &after {
            None => {
                let stmt = client
                    .prepare_cached(
                        "SELECT tbl, part, clus, value, version FROM tarn_rows
                         ORDER BY tbl, part, clus LIMIT $1",
                    )
                    .await
                    .map_err(map_err)?;
                client.query(&stmt, &[&(limit as i64)]).await
            }
            Some(k) => {
                let stmt = client
                    .prepare_cached(
                        "SELECT tbl, part, clus, value, version FROM tarn_rows
                         WHERE (tbl, part, clus) > ($1, $2, $3)
                         ORDER BY tbl, part, clus LIMIT $4",
                    )
                    .await
                    .map_err(map_err)?;
                client
                    .query(
                        &stmt,
                        &[
                            &k.table.name(),
                            &k.partition,
                            &k.clustering,
                            &(limit as i64),
                        ],
                    )
                    .await
            }
        }
        .map_err(map_err)?;
        let full = rows.len() == limit;
        let mut out = Vec::with_capacity(rows.len());
        let mut last = None;
        for r in rows {
            let t: String = r.get(0);
            let table =
                Table::named(&t).ok_or_else(|| StoreError::Corrupt(format!("table name {t:?}")))?;
            let clustering: Vec<u8> = r.get(2);
            let key = Key::new(table, r.get::<_, Vec<u8>>(1), clustering.clone());
            last = Some(tarn_store::encode_row_cursor(&key));
            // Placeholders of guards in flight are not rows.
            if r.get::<_, i64>(4) == PLACEHOLDER {
                continue;
            }
            out.push((
                key,
                Row {
                    clustering,
                    value: r.get(3),
                    version: r.get::<_, i64>(4) as u64,
                },
            ));
        }
        Ok((out, if full { last } else { None }))
    }

    async fn feed_end(&mut self, _feed: Table) -> StoreResult<Vec<u8>> {
        let client = self.begun().await?;
        let row = client
            .query_one(&format!("SELECT {FEED_HORIZON}"), &[])
            .await
            .map_err(map_err)?;
        // Every entry readable now has a smaller transaction id; every later
        // one has this id or a larger one, with a sequence number above 0.
        Ok(cursor_bytes(row.get(0), 0))
    }

    /// The end is the horizon below which every entry is committed or
    /// never will be: readable through it.
    async fn feed_readable(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        self.feed_end(feed).await
    }
}

/// The feed's horizon in this snapshot, as an int8 transaction id: the
/// oldest transaction still running that may write entries (every one of
/// this database, and any whose database cannot be told), or, when none
/// is, the first id not yet given. Every entry below it is committed or
/// never will be, and every later entry is at or above it.
///
/// PostgreSQL's own horizon (`pg_snapshot_xmin`) counts every database of
/// the server: a transaction left open in another one held back `/changes`
/// and `/events` on every node for as long as it stayed open. Only ids
/// known to belong to a session outside this database (another database's,
/// or one of no database) are left out; an id this cannot place (a
/// prepared transaction, a session of a role whose ids are not shown)
/// still holds the feed back, as before. Why it is safe:
///
/// - Only a session connected to this database writes its feed, and a
///   session never changes database, so an id seen in another database's
///   session is never a writer's here.
/// - `pg_stat_activity` is read at or after the snapshot; an id it shows
///   that was given after the snapshot is not in the snapshot's running
///   ids, so leaving it out changes nothing.
/// - Writers record their top-level id (`pg_current_xact_id()`), which is
///   among the running ids until it ends.
/// - Low 32 bits are compared: ids running at once are less than 2^31
///   apart.
const FEED_HORIZON: &str = "(SELECT coalesce(min(x::text::int8),
            pg_snapshot_xmax(pg_current_snapshot())::text::int8)
       FROM pg_snapshot_xip(pg_current_snapshot()) AS x
      WHERE x::text::int8 % 4294967296 NOT IN (
            SELECT backend_xid::text::int8 FROM pg_stat_activity
             WHERE backend_xid IS NOT NULL
               AND datname IS DISTINCT FROM current_database()))";

/// A feed cursor: the writing transaction's id and the entry's sequence
/// number, 8 bytes each, big-endian (so bytes order as the pair does).
fn feed_cursor(c: Option<&[u8]>) -> StoreResult<(i64, i64)> {
    match c {
        None => Ok((0, 0)),
        Some(c) if c.len() == 16 => {
            let xid = u64::from_be_bytes(c[..8].try_into().expect("8 bytes"));
            let seq = u64::from_be_bytes(c[8..].try_into().expect("8 bytes"));
            Ok((
                xid.min(i64::MAX as u64) as i64,
                seq.min(i64::MAX as u64) as i64,
            ))
        }
        Some(_) => Err(StoreError::Invalid("not a cursor of this feed".into())),
    }
}

fn cursor_bytes(xid: i64, seq: i64) -> Vec<u8> {
    let mut c = (xid as u64).to_be_bytes().to_vec();
    c.extend_from_slice(&(seq as u64).to_be_bytes());
    c
}

impl PgSnapshot {
    /// The snapshot's connection, its transaction begun.
    async fn begun(&mut self) -> StoreResult<&deadpool_postgres::Client> {
        // Marked first, as in `read`.
        let begin_now = !std::mem::replace(&mut self.begun, true);
        let client = self.client.as_ref().expect("held until drop");
        if begin_now {
            client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .await
                .map_err(map_err)?;
        }
        Ok(client)
    }
}

impl Drop for PgSnapshot {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if !self.begun {
            return;
        }
        // COMMIT is sent now and the connection goes back to the pool at
        // once: the next holder's statements follow it on the wire, so they
        // run after the transaction ended, and the answer to COMMIT is
        // discarded by the connection. A read-only transaction's COMMIT
        // fails only with its connection, which the pool then drops; one
        // that could not even be sent is never returned.
        if let Some(Err(_)) = client.batch_execute("COMMIT").now_or_never() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        Ok(Box::new(PgSnapshot {
            client: Some(client),
            begun: false,
        }))
    }

    fn consistency(&self) -> Consistency {
        Consistency::Snapshot
    }

    fn feed_lag(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    fn connections(&self) -> Option<usize> {
        Some(self.pool.status().max_size)
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        let pool = self.pool.clone();
        // In a task of its own: were this future dropped after the batch
        // went out (a client gone), the connection would return to the pool
        // inside the transaction, and the next holder's COMMIT would commit
        // it, failed guards and all. The task always ends it.
        tokio::spawn(async move { write_on(&pool, &batch).await })
            .await
            .map_err(|e| StoreError::Other(format!("a write's task failed: {e}")))?
    }

    async fn trim_feed(&self, feed: Table, through: &[u8], limit: usize) -> StoreResult<usize> {
        let (xid, seq) = feed_cursor(Some(through))?;
        let client = self.pool.get().await.map_err(pool_err)?;
        let stmt = client
            .prepare_cached(
                "DELETE FROM tarn_feed WHERE (tbl, xid, seq) IN (
                     SELECT tbl, xid, seq FROM tarn_feed
                     WHERE tbl = $1 AND (xid, seq) <= ($2::bigint::text::xid8, $3)
                     ORDER BY xid, seq LIMIT $4)",
            )
            .await
            .map_err(map_err)?;
        let n = client
            .execute(
                &stmt,
                &[
                    &feed.name(),
                    &xid,
                    &seq,
                    &(limit.min(i64::MAX as usize) as i64),
                ],
            )
            .await
            .map_err(map_err)?;
        Ok(n as usize)
    }
}

/// A write on a pooled connection: `BEGIN` goes out with the batch's
/// statements (one round trip), then `COMMIT` or `ROLLBACK` (the second).
async fn write_on(pool: &Pool, batch: &Batch) -> StoreResult<()> {
    let client = pool.get().await.map_err(pool_err)?;
    let (begun, applied) = tokio::join!(client.batch_execute("BEGIN"), apply(&client, batch));
    let applied = begun.map_err(map_err).and(applied);
    let end = match &applied {
        Ok(()) => client.batch_execute("COMMIT").await.map_err(map_err),
        Err(_) => client.batch_execute("ROLLBACK").await.map_err(map_err),
    };
    match (applied, end) {
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(_)) => {
            // The connection may be in a transaction: never reuse it.
            drop(deadpool_postgres::Object::take(client));
            Err(e)
        }
        (Ok(()), end) => end,
    }
}

/// Applies a batch inside the transaction open on `tx`, without ending it;
/// the caller commits or rolls back.
///
/// Every statement goes out at once and their answers come back in one
/// round trip: the guards first, in key order (a guarded key the batch
/// writes is locked `FOR UPDATE`, one it only reads `FOR SHARE`, so writers
/// that merely depend on a row do not queue behind each other; an absent
/// key is claimed with a placeholder row), then the rows, in key order, and
/// the feed entries. The rows are written whether or not a guard held: a
/// failed guard is reported after the fact and the caller rolls everything
/// back.
async fn apply(tx: &deadpool_postgres::Client, batch: &Batch) -> StoreResult<()> {
    let lock_update = tx
        .prepare_cached(
            "SELECT version FROM tarn_rows WHERE tbl = $1 AND part = $2 AND clus = $3 FOR UPDATE",
        )
        .await
        .map_err(map_err)?;
    let lock_share = tx
        .prepare_cached(
            "SELECT version FROM tarn_rows WHERE tbl = $1 AND part = $2 AND clus = $3 FOR SHARE",
        )
        .await
        .map_err(map_err)?;
    let claim = tx
        .prepare_cached(
            "INSERT INTO tarn_rows (tbl, part, clus, value, version) VALUES ($1, $2, $3, ''::bytea, $4)
             ON CONFLICT (tbl, part, clus) DO NOTHING RETURNING 1",
        )
        .await
        .map_err(map_err)?;
    let upsert = tx
        .prepare_cached(
            "INSERT INTO tarn_rows (tbl, part, clus, value, version)
             SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bytea[], $5::int8[])
             ON CONFLICT (tbl, part, clus) DO UPDATE SET value = EXCLUDED.value, version = EXCLUDED.version",
        )
        .await
        .map_err(map_err)?;
    // A delete is one statement a key, not one joined with `unnest` as the
    // upsert is: PostgreSQL plans a prepared statement once per connection
    // and keeps the plan. Planned while the table was small, the join was a
    // hash join over a sequential scan of the whole table, kept as the table
    // grew: every write that deleted then read all of it (78 ms at 200,000
    // rows), and an index build's writes took a node's connections for tens
    // of seconds. A key's own statement has one plan, its primary key.
    let delete = tx
        .prepare_cached("DELETE FROM tarn_rows WHERE tbl = $1 AND part = $2 AND clus = $3")
        .await
        .map_err(map_err)?;
    let unclaim = tx
        .prepare_cached(
            "DELETE FROM tarn_rows WHERE tbl = $1 AND part = $2 AND clus = $3 AND version = $4",
        )
        .await
        .map_err(map_err)?;
    let append = tx
        .prepare_cached(
            "INSERT INTO tarn_feed (tbl, xid, seq, value)
             SELECT t, pg_current_xact_id(), nextval('tarn_feed_seq'), v
             FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS a(t, v, n) ORDER BY n",
        )
        .await
        .map_err(map_err)?;

    // The last op on a key wins; key order is lock order.
    let mut last: BTreeMap<&Key, &Op> = BTreeMap::new();
    for op in &batch.ops {
        last.insert(op.key(), op);
    }
    let mut puts = Columns::default();
    let mut deletes = Vec::new();
    for (key, op) in &last {
        match op {
            Op::Put { value, version, .. } => {
                puts.push(key);
                puts.values.push(value.as_slice());
                puts.versions.push(
                    i64::try_from(*version)
                        .map_err(|_| StoreError::Invalid("version above i64::MAX".into()))?,
                );
            }
            Op::Delete { .. } => deletes.push(*key),
        }
    }
    let mut guards: Vec<(usize, &tarn_store::Guard)> = batch.guards.iter().enumerate().collect();
    guards.sort_by(|a, b| a.1.key.cmp(&b.1.key));
    // Placeholders of absent keys the batch does not put are removed again.
    let unclaims: Vec<&Key> = guards
        .iter()
        .filter(|(_, g)| {
            matches!(g.expect, Expect::Absent) && !matches!(last.get(&g.key), Some(Op::Put { .. }))
        })
        .map(|(_, g)| &g.key)
        .collect();

    let checks = guards.iter().map(|(_, g)| {
        let k = &g.key;
        let (lock, claim) = (
            if last.contains_key(k) {
                &lock_update
            } else {
                &lock_share
            },
            &claim,
        );
        async move {
            let table = k.table.name();
            let held = match g.expect {
                Expect::Version(v) => tx
                    .query_opt(lock, &[&table, &k.partition, &k.clustering])
                    .await
                    .map_err(map_err)?
                    .is_some_and(|r| r.get::<_, i64>(0) as u64 == v),
                Expect::Absent => tx
                    .query_opt(claim, &[&table, &k.partition, &k.clustering, &PLACEHOLDER])
                    .await
                    .map_err(map_err)?
                    .is_some(),
            };
            Ok::<_, StoreError>(held)
        }
    });
    let feeds: Vec<&str> = batch.appends.iter().map(|a| a.feed.name()).collect();
    let values: Vec<&[u8]> = batch.appends.iter().map(|a| a.value.as_slice()).collect();
    let put_params = puts.params_with_values();
    let append_params: [&(dyn ToSql + Sync); 2] = [&feeds, &values];
    let (delete, unclaim) = (&delete, &unclaim);
    let deleting = deletes.iter().map(|k| async move {
        let table = k.table.name();
        tx.execute(delete, &[&table, &k.partition, &k.clustering])
            .await
    });
    let unclaiming = unclaims.iter().map(|k| async move {
        let table = k.table.name();
        tx.execute(
            unclaim,
            &[&table, &k.partition, &k.clustering, &PLACEHOLDER],
        )
        .await
    });
    // Polled together, in this order: the statements go out in it.
    let (held, written) = tokio::join!(futures_util::future::join_all(checks), async {
        let (upserted, deleted, unclaimed, appended) = tokio::join!(
            run_if(!puts.is_empty(), tx, &upsert, &put_params),
            try_join_all(deleting),
            try_join_all(unclaiming),
            run_if(!feeds.is_empty(), tx, &append, &append_params),
        );
        upserted
            .and(deleted.map_err(map_err).map(drop))
            .and(unclaimed.map_err(map_err).map(drop))
            .and(appended)
    });
    let mut failed = None;
    for ((i, _), held) in guards.iter().zip(held) {
        if !held? {
            // The smallest index among failures: "the first failing guard".
            failed = Some(failed.map_or(*i, |f: usize| f.min(*i)));
        }
    }
    if let Some(guard) = failed {
        return Err(StoreError::GuardFailed { guard });
    }
    written
}

/// The puts of a write, column by column, as arrays for `unnest`.
#[derive(Default)]
struct Columns<'a> {
    tables: Vec<&'static str>,
    partitions: Vec<&'a [u8]>,
    clusterings: Vec<&'a [u8]>,
    values: Vec<&'a [u8]>,
    versions: Vec<i64>,
}

impl<'a> Columns<'a> {
    fn push(&mut self, key: &'a Key) {
        self.tables.push(key.table.name());
        self.partitions.push(&key.partition);
        self.clusterings.push(&key.clustering);
    }

    fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    fn params_with_values(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.tables,
            &self.partitions,
            &self.clusterings,
            &self.values,
            &self.versions,
        ]
    }
}

/// Executes `stmt` when `wanted`, else nothing.
async fn run_if(
    wanted: bool,
    tx: &deadpool_postgres::Client,
    stmt: &tokio_postgres::Statement,
    params: &[&(dyn ToSql + Sync)],
) -> StoreResult<()> {
    if wanted {
        tx.execute(stmt, params).await.map_err(map_err)?;
    }
    Ok(())
}

impl PgStore {
    /// The plan of each statement prepared on one of the pool's
    /// connections (`statement`, `EXPLAIN`'s lines), as the connection
    /// would run it now, for tests: with a pool of one connection, the
    /// plans PostgreSQL kept for this store.
    #[doc(hidden)]
    pub async fn kept_plans(&self) -> StoreResult<Vec<(String, String)>> {
        let client = self.pool.get().await.map_err(pool_err)?;
        client
            .batch_execute("SET plan_cache_mode = force_generic_plan")
            .await
            .map_err(map_err)?;
        let statements = client
            .query(
                "SELECT name, statement, parameter_types::text[] FROM pg_prepared_statements",
                &[],
            )
            .await
            .map_err(map_err)?;
        let mut plans = Vec::new();
        for s in &statements {
            let (name, sql, types): (String, String, Vec<String>) = (s.get(0), s.get(1), s.get(2));
            let args: Vec<String> = types.iter().map(|t| format!("NULL::{t}")).collect();
            let args = if args.is_empty() {
                String::new()
            } else {
                format!("({})", args.join(", "))
            };
            let lines: Vec<String> = client
                .query(&format!("EXPLAIN EXECUTE {name}{args}"), &[])
                .await
                .map_err(map_err)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            plans.push((sql, lines.join("\n")));
        }
        client
            .batch_execute("RESET plan_cache_mode")
            .await
            .map_err(map_err)?;
        Ok(plans)
    }

    /// Whether this store's connections use TLS (asks the server).
    #[doc(hidden)]
    pub async fn uses_tls(&self) -> StoreResult<bool> {
        let client = self.pool.get().await.map_err(pool_err)?;
        let row = client
            .query_one(
                "SELECT coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)",
                &[],
            )
            .await
            .map_err(map_err)?;
        Ok(row.get(0))
    }
}

/// A write applied but not yet committed (tests make transactions commit
/// in another order than they started).
#[doc(hidden)]
pub struct HeldWrite {
    client: deadpool_postgres::Client,
}

impl HeldWrite {
    /// Commits the held write.
    pub async fn commit(self) -> StoreResult<()> {
        self.client.batch_execute("COMMIT").await.map_err(map_err)
    }
}

impl PgStore {
    /// Applies `batch` and keeps its transaction open until
    /// [`HeldWrite::commit`]: for tests of commit order.
    #[doc(hidden)]
    pub async fn write_held(&self, batch: Batch) -> StoreResult<HeldWrite> {
        batch.validate()?;
        let client = self.pool.get().await.map_err(pool_err)?;
        client.batch_execute("BEGIN").await.map_err(map_err)?;
        if let Err(e) = apply(&client, &batch).await {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(e);
        }
        Ok(HeldWrite { client })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tarns_parameters_are_its_own() {
        assert_eq!(
            split_params("postgres://u@h/db"),
            ("postgres://u@h/db".into(), Params::default())
        );
        let (url, p) = split_params("postgres://u@h/db?schema=t1");
        assert_eq!(
            (url.as_str(), p.schema.as_deref()),
            ("postgres://u@h/db", Some("t1"))
        );
        let (url, p) = split_params(
            "postgres://u@h/db?connect_timeout=5&sslmode=verify-full&schema=t1&sslrootcert=/ca.pem",
        );
        assert_eq!(url, "postgres://u@h/db?connect_timeout=5");
        assert_eq!(p.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/ca.pem"));
        assert_eq!(tls_mode(Some("verify-ca")).unwrap(), TlsMode::VerifyCa);
        assert_eq!(tls_mode(None).unwrap(), TlsMode::Off);
        assert!(tls_mode(Some("always")).is_err());
        assert!(check_schema_name("t_1").is_ok());
        assert!(check_schema_name("x; drop").is_err());
    }

    #[test]
    fn the_pool_is_sized_by_the_url() {
        let (url, p) =
            split_params("postgres://u@h/db?pool_size=40&connect_timeout=5&pool_wait=250");
        assert_eq!(url, "postgres://u@h/db?connect_timeout=5");
        let options = p.pool(PgOptions::default()).unwrap();
        assert_eq!(options.pool_size, 40);
        assert_eq!(options.wait, std::time::Duration::from_millis(250));
        let options = Params::default().pool(PgOptions::default()).unwrap();
        assert_eq!(options.pool_size, 16);
        assert_eq!(options.wait, std::time::Duration::from_secs(1));
        for bad in [
            "pool_size=0",
            "pool_size=x",
            "pool_size=1001",
            "pool_size=",
            "pool_wait=0",
            "pool_wait=-1",
            "pool_wait=60001",
            "pool_wait=1s",
        ] {
            let (_, p) = split_params(&format!("postgres://u@h/db?{bad}"));
            let e = p.pool(PgOptions::default()).unwrap_err().to_string();
            assert!(e.contains(bad.split('=').next().unwrap()), "{bad}: {e}");
        }
    }
}
