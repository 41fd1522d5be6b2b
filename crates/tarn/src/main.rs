//! The `tarn` binary: `tarn serve` runs the server, `tarn admin` works on a
//! stopped data directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;
use tarn_engine::{Caller, Engine, EngineConfig, IndexState, NewUser, Order, SortField};
use tarn_server::extract::Cidr;
use tarn_server::{AppState, ServerConfig};
use tarn_store::Store;
use tarn_store_sqlite::{SqliteOptions, SqliteStore};
use tokio::signal::unix::{signal, SignalKind};

/// Tarn: a collaboration content server.
///
/// Users and nested groups, one pool of items shared per user, group,
/// everyone or link, and listings that respect sharing at any pool size.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (on the embedded SQLite store unless --store).
    Serve(ServeArgs),
    /// Administer a stopped data directory.
    Admin(AdminArgs),
    /// Run a load-kit workload and keep everything it measured.
    Bench(BenchArgs),
    /// Write every user, group, membership, item, link, body and index
    /// declaration as NDJSON (to stdout, or --out).
    Export(ExportArgs),
    /// Read an export (from stdin, or --in) into an empty store; index rows
    /// are rebuilt.
    Import(ImportArgs),
    /// Print the HTTP API's OpenAPI document (what the server serves at
    /// /api/v1/openapi.json), without a server; clients/typescript is
    /// generated from it.
    Openapi,
}

/// The store an export reads or an import writes.
#[derive(Args)]
struct MoveStore {
    /// The embedded store's directory (the server must be stopped).
    #[arg(long, env = "TARN_DATA", default_value = "./tarn-data")]
    data: PathBuf,
    /// Another store instead of the embedded one (postgres://…).
    #[arg(long, env = "TARN_STORE")]
    store: Option<String>,
}

#[derive(Args)]
struct ExportArgs {
    #[command(flatten)]
    at: MoveStore,
    /// The file to write [default: stdout].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct ImportArgs {
    #[command(flatten)]
    at: MoveStore,
    /// The file to read [default: stdin].
    #[arg(long = "in")]
    input: Option<PathBuf>,
    /// Take a file without the end record (an export made before
    /// 2026-11-25); a file cut short then goes unnoticed.
    #[arg(long)]
    no_end_record: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BenchWorkload {
    /// Sorting on a property deep inside each item, over growing pools.
    UserHome,
    /// A project-hosting site's daily mix: 80% reads, 20% writes.
    Kenai,
    /// Twelve uploaders beside readers: writers must not stall readers.
    UploadStorm,
    /// Thirty people start at the same instant on fifty shared items.
    Custard,
    /// Search: words, relevance and sharing at once, over growing pools.
    Search,
    /// Chat: rooms, posts and live event streams for every user.
    Chat,
}

#[derive(Args)]
struct BenchArgs {
    /// The workload (not needed with --report).
    #[arg(required_unless_present = "report")]
    workload: Option<BenchWorkload>,
    /// Re-render the plots and report.html of a finished run's directory
    /// from its results.json, and print its summary; runs nothing.
    #[arg(long, conflicts_with_all = ["url", "quick"])]
    report: Option<PathBuf>,
    /// A running server (one node or a load balancer); without it the kit
    /// starts `tarn serve` itself on a temp directory and a free port.
    #[arg(long)]
    url: Option<String>,
    /// The admin password of the server at --url (the kit declares indexes).
    #[arg(long, env = "TARN_ADMIN_PASSWORD")]
    admin_password: Option<String>,
    /// Where to write results.json, report.html and the plots
    /// [default: bench-results/<workload>-<timestamp>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Small sizes and short steps (seconds per workload), as CI runs them.
    #[arg(long)]
    quick: bool,
    /// Seconds measured per step (overrides the workload's own).
    #[arg(long, value_parser = positive_seconds)]
    step_seconds: Option<f64>,
    /// Seconds each step runs its users before measuring them (overrides
    /// the workload's own, 0.5–2; custard's burst and chat do not warm up
    /// and ignore it): for a database whose JIT compiler warms up under
    /// load, as Cassandra's does.
    #[arg(long, value_parser = seconds)]
    warmup_seconds: Option<f64>,
    /// Seconds to wait after loading each pool size before measuring it
    /// (user-home), for background work the load started (Cassandra's
    /// compactions) to finish [default: 0].
    #[arg(long, value_parser = seconds)]
    settle_seconds: Option<f64>,
    /// A shell command run after loading each pool size, before the settle
    /// (user-home): for example flushing Cassandra's memtables
    /// (`nodetool flush KEYSPACE` on every node), so that every size is
    /// read from the same kind of storage. The run stops if it fails.
    #[arg(long)]
    after_load: Option<String>,
    /// With --url: server processes on this machine whose CPU and memory to
    /// report (comma-separated pids, summed).
    #[arg(long, value_delimiter = ',')]
    server_pid: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Signup {
    /// Anyone may create an account.
    Open,
    /// Only administrators create accounts.
    Closed,
}

#[derive(Args)]
struct ServeArgs {
    /// Address (or host name) and port to listen on [default: 127.0.0.1:7700].
    #[arg(long, env = "TARN_LISTEN")]
    listen: Option<String>,
    /// Directory of the embedded store, created if missing [default: ./tarn-data].
    #[arg(long, env = "TARN_DATA")]
    data: Option<PathBuf>,
    /// Another store instead of the embedded one, e.g.
    /// postgres://user@host:5432/tarn or cassandra://h1:9042,h2:9042/tarn?replication=3
    /// (PostgreSQL takes ?schema=NAME, ?pool_size=N (16) and ?pool_wait=MS (1000)).
    #[arg(long, env = "TARN_STORE")]
    store: Option<String>,
    /// Whether anyone may sign up [default: open].
    #[arg(long, env = "TARN_SIGNUP")]
    signup: Option<Signup>,
    /// A TOML file with any of: listen, data, store, signup, grace_seconds,
    /// max_json_bytes, body_idle_seconds, session_ttl_hours, max_properties_bytes,
    /// max_body_bytes, trusted_proxies, feed_retention_hours, max_streams,
    /// max_streams_per_user, groups_per_hour, upload_share, app_indexes. Flags and
    /// environment win over it.
    #[arg(long, env = "TARN_CONFIG")]
    config: Option<PathBuf>,
    /// Seconds requests in flight get to finish after SIGTERM or SIGINT [default: 10].
    #[arg(long, env = "TARN_GRACE_SECONDS")]
    grace_seconds: Option<u64>,
    /// Largest JSON request body in bytes [default: 1048576].
    #[arg(long, env = "TARN_MAX_JSON_BYTES")]
    max_json_bytes: Option<usize>,
    /// A request body must bring 16 KiB (or its end) for every this many
    /// seconds the server waits on it, else it is answered 400 [default: 30].
    #[arg(long, env = "TARN_BODY_IDLE_SECONDS")]
    body_idle_seconds: Option<u64>,
    /// How long a session lasts, in hours [default: 720].
    #[arg(long, env = "TARN_SESSION_TTL_HOURS")]
    session_ttl_hours: Option<u64>,
    /// Largest `properties` of an item, user or group, in bytes [default: 65536].
    #[arg(long, env = "TARN_MAX_PROPERTIES_BYTES")]
    max_properties_bytes: Option<usize>,
    /// Largest item body, in bytes [default: 1073741824].
    #[arg(long, env = "TARN_MAX_BODY_BYTES")]
    max_body_bytes: Option<u64>,
    /// Proxies (addresses or networks, comma-separated) whose forwarding
    /// headers are believed: X-Forwarded-For names the client (its rightmost
    /// address that is not one of them), X-Forwarded-Proto/Forwarded say
    /// HTTPS, X-Forwarded-Host names the origin [default: none, the TCP peer
    /// is the client].
    #[arg(long, env = "TARN_TRUSTED_PROXIES", value_delimiter = ',')]
    trusted_proxies: Option<Vec<Cidr>>,
    /// How long changes are kept for /changes and /events, in hours [default: 168].
    #[arg(long, env = "TARN_FEED_RETENTION_HOURS")]
    feed_retention_hours: Option<u64>,
    /// Event streams open at once on this node [default: 10000].
    #[arg(long, env = "TARN_MAX_STREAMS")]
    max_streams: Option<usize>,
    /// Event streams one user may hold open on this node [default: 16].
    #[arg(long, env = "TARN_MAX_STREAMS_PER_USER")]
    max_streams_per_user: Option<usize>,
    /// Groups one user may create per hour (administrators are not counted) [default: 1000].
    #[arg(long, env = "TARN_GROUPS_PER_HOUR")]
    groups_per_hour: Option<u32>,
    /// The share of the time (above 0, at most 1) uploads may keep this
    /// node's upload places working; they rest the remainder, so readers
    /// keep the rest of the CPU. 1: uploads never rest [default: 0.5].
    #[arg(long, env = "TARN_UPLOAD_SHARE", value_parser = parse_share)]
    upload_share: Option<f64>,
    /// Declare the indexes the web app's pages use (chat-history: a chat
    /// room's messages, newest first) at start, unless they exist; without
    /// it an administrator declares them (Indexes page) [default: false].
    #[arg(long, env = "TARN_APP_INDEXES")]
    app_indexes: Option<bool>,
}

/// The settings a config file may hold.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data: Option<PathBuf>,
    store: Option<String>,
    signup: Option<Signup>,
    grace_seconds: Option<u64>,
    max_json_bytes: Option<usize>,
    body_idle_seconds: Option<u64>,
    session_ttl_hours: Option<u64>,
    max_properties_bytes: Option<usize>,
    max_body_bytes: Option<u64>,
    trusted_proxies: Option<Vec<String>>,
    feed_retention_hours: Option<u64>,
    max_streams: Option<usize>,
    max_streams_per_user: Option<usize>,
    groups_per_hour: Option<u32>,
    upload_share: Option<f64>,
    app_indexes: Option<bool>,
}

#[derive(Args)]
struct AdminArgs {
    /// The data directory (the server must be stopped).
    #[arg(long, env = "TARN_DATA", default_value = "./tarn-data")]
    data: PathBuf,
    #[command(subcommand)]
    action: AdminAction,
}

#[derive(Subcommand)]
enum AdminAction {
    /// Create a user.
    CreateUser {
        /// The username.
        #[arg(long)]
        username: String,
        /// The password (at least 8 characters).
        #[arg(long, env = "TARN_USER_PASSWORD")]
        password: String,
        /// Make the user an administrator.
        #[arg(long)]
        admin: bool,
    },
    /// Set a user's password and end all their sessions.
    ResetPassword {
        /// The username.
        #[arg(long)]
        username: String,
        /// The new password.
        #[arg(long, env = "TARN_USER_PASSWORD")]
        password: String,
    },
    /// Declare an index and build it before returning.
    DeclareIndex {
        /// The index name.
        name: String,
        /// The kind it covers.
        #[arg(long)]
        kind: String,
        /// Where-fields, comma-separated.
        #[arg(long, value_delimiter = ',')]
        r#where: Vec<String>,
        /// Sort fields, comma-separated, -field for descending.
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
        sort: Vec<String>,
    },
}

/// mimalloc instead of glibc's allocator: a listing allocates and frees
/// many small blocks, and glibc's malloc, free and consolidation were an
/// eighth of a listing's CPU (perf); callgrind: 22% fewer instructions a
/// listing, 11% an item read. It also hands the 19 MiB blocks of each
/// password hash back to the system after use, which glibc's arenas did
/// not without a fixed mmap threshold. Its cost: it keeps pages per thread,
/// so a node starts at 39 MiB resident instead of 21, and is at 45 after
/// 400 sign-ins instead of 22 (scripts/measure-signin-rss.sh).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // What went wrong and why, without the backtrace anyhow adds
            // when RUST_BACKTRACE is set: a refusal is no crash.
            eprintln!("Error: {e}");
            let mut causes = e.chain().skip(1).peekable();
            if causes.peek().is_some() {
                eprintln!("\nCaused by:");
                for (n, cause) in causes.enumerate() {
                    eprintln!("    {n}: {cause}");
                }
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new()?;
    match cli.command {
        Command::Serve(args) => rt.block_on(serve(args)),
        Command::Admin(args) => rt.block_on(admin(args)),
        Command::Bench(args) => rt.block_on(bench(args)),
        Command::Export(args) => rt.block_on(export(args)),
        Command::Import(args) => rt.block_on(import(args)),
        Command::Openapi => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // Keys sorted: some of the document's maps are hash maps, and
            // clients/typescript's staleness check compares bytes.
            let doc = sorted_keys(serde_json::to_value(tarn_server::openapi::document())?);
            let written = serde_json::to_writer_pretty(&mut out, &doc)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n"));
            match written {
                // A reader that stopped early (`tarn openapi | head`) had
                // what it wanted.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => Ok(other?),
            }
        }
    }
}

/// The SQLite settings of a command: `tarn serve` gets the default pool;
/// `export` and `import` read one batch at a time, so two read connections
/// do, and their page caches (8 MiB each, filled as the whole store passes
/// through them) stay the only memory that grows with the store, up to a
/// bound: with sixteen, exporting 100,000 items peaked at 153 MiB.
fn sqlite_options(moving: bool) -> SqliteOptions {
    if moving {
        SqliteOptions {
            readers: 2,
            map: false,
            ..SqliteOptions::default()
        }
    } else {
        SqliteOptions::default()
    }
}

async fn open_store(
    store: Option<&str>,
    data: &Path,
    sqlite: SqliteOptions,
) -> anyhow::Result<Arc<dyn Store>> {
    match store {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => Ok(Arc::new(
            tarn_store_postgres::PgStore::connect(url)
                .await
                .context("cannot open the PostgreSQL store")?,
        )),
        None => Ok(Arc::new(SqliteStore::open_with(data, sqlite).with_context(
            || format!("cannot open the data directory {}", data.display()),
        )?)),
        Some(url) if url.starts_with("cassandra://") => Ok(Arc::new(
            tarn_store_cassandra::CassandraStore::connect(url)
                .await
                .context("cannot open the Cassandra store")?,
        )),
        Some(url) if url.starts_with("sqlite://") => {
            let path = Path::new(url.trim_start_matches("sqlite://"));
            if path.as_os_str().is_empty() {
                bail!("sqlite:// names a directory: sqlite://DIR");
            }
            Ok(Arc::new(SqliteStore::open_with(path, sqlite).with_context(
                || format!("cannot open the data directory {}", path.display()),
            )?))
        }
        // Only the scheme is shown: the rest may hold a password.
        Some(url) => bail!(
            "tarn has no store for URLs starting {:?}: use postgres://…, cassandra://…, sqlite://DIR, or no --store for the embedded one",
            url.split(':').next().unwrap_or_default()
        ),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let file: FileConfig = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("{} is not valid", path.display()))?
        }
        None => FileConfig::default(),
    };
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| "127.0.0.1:7700".to_string());
    let data = args
        .data
        .or(file.data)
        .unwrap_or_else(|| PathBuf::from("./tarn-data"));
    let store_url = args.store.or(file.store);
    let signup = args.signup.or(file.signup).unwrap_or(Signup::Open);
    let app_indexes = args.app_indexes.or(file.app_indexes).unwrap_or(false);
    let grace = Duration::from_secs(args.grace_seconds.or(file.grace_seconds).unwrap_or(10));
    let trusted_proxies = match args.trusted_proxies {
        Some(t) => t,
        None => file
            .trusted_proxies
            .unwrap_or_default()
            .iter()
            .map(|s| s.parse::<Cidr>().map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()
            .context("trusted_proxies in the config file")?,
    };
    let server_config = ServerConfig {
        trusted_proxies,
        signup_open: signup == Signup::Open,
        max_json: args
            .max_json_bytes
            .or(file.max_json_bytes)
            .unwrap_or(1024 * 1024),
        body_idle: args
            .body_idle_seconds
            .or(file.body_idle_seconds)
            .map_or(ServerConfig::default().body_idle, |s| {
                Duration::from_secs(s.max(1))
            }),
    };
    let defaults = EngineConfig::default();
    let engine_config = EngineConfig {
        session_ttl: Duration::from_secs(
            3600 * args
                .session_ttl_hours
                .or(file.session_ttl_hours)
                .unwrap_or(720),
        ),
        max_properties: args
            .max_properties_bytes
            .or(file.max_properties_bytes)
            .unwrap_or(defaults.max_properties),
        max_body: args
            .max_body_bytes
            .or(file.max_body_bytes)
            .unwrap_or(defaults.max_body),
        feed_retention: args
            .feed_retention_hours
            .or(file.feed_retention_hours)
            .map_or(defaults.feed_retention, |h| Duration::from_secs(h * 3600)),
        max_streams: args
            .max_streams
            .or(file.max_streams)
            .unwrap_or(defaults.max_streams),
        max_streams_per_user: args
            .max_streams_per_user
            .or(file.max_streams_per_user)
            .unwrap_or(defaults.max_streams_per_user),
        groups_per_hour: args
            .groups_per_hour
            .or(file.groups_per_hour)
            .unwrap_or(defaults.groups_per_hour),
        upload_share: match args.upload_share.or(file.upload_share) {
            Some(share) => check_share(share).map_err(|e| anyhow::anyhow!("upload_share: {e}"))?,
            None => defaults.upload_share,
        },
        ..defaults
    };

    let store = open_store(store_url.as_deref(), &data, sqlite_options(false)).await?;
    let open_files = tarn_server::serve::raise_open_files_limit();
    tracing::info!(open_files, "descriptors this process may open");
    // A trusted proxy speaks for many clients: its connections are not
    // counted against one address.
    let limits = tarn_server::serve::Limits {
        exempt: server_config.trusted_proxies.clone(),
        ..Default::default()
    };
    let state = AppState::new(store, engine_config, server_config);
    if state.engine.import_unfinished().await? {
        bail!("{PARTIAL}: serving it would serve part of a file");
    }
    if let Ok(password) = std::env::var("TARN_ADMIN_PASSWORD") {
        state
            .engine
            .ensure_admin(&password)
            .await
            .context("TARN_ADMIN_PASSWORD")?;
    }
    state.engine.start().await?;
    // The web app's own index, when asked for; the API works without it,
    // so a failure is only logged.
    if app_indexes {
        if let Err(e) = tarn_server::web::declare_app_indexes(&state.engine).await {
            tracing::warn!(error = %e, "the web app's chat-history index could not be declared");
        }
    }
    let streams = state.clone();
    let metrics = state.metrics.clone();
    let app = tarn_server::app(state);
    // A host name is resolved, and the first of its addresses that can be
    // bound is taken (`localhost:7700`).
    let listener = tokio::net::TcpListener::bind(listen.as_str())
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // Listened for before the line below: a stop asked for as soon as a
    // script reads it must find the handlers, not the default (a kill).
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    println!("tarn listening on http://{}", listener.local_addr()?);

    let stop = Arc::new(tokio::sync::Notify::new());
    let stopping = stop.clone();
    let mut server = tokio::spawn(tarn_server::serve::serve(
        tarn_server::wire::Listening::new(listener),
        app,
        metrics,
        limits,
        async move { stopping.notified().await },
    ));
    tokio::select! {
        done = &mut server => {
            streams.engine.store().stop().await;
            done?;
            return Ok(());
        }
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!(
        grace_seconds = grace.as_secs(),
        "stopping: finishing requests in flight"
    );
    streams.end_streams();
    stop.notify_one();
    let served = tokio::time::timeout(grace, server).await;
    // The store lets go of what it holds for other nodes (on Cassandra,
    // its feed mark, once its writes in flight have landed; it refuses
    // changes from then, so a request that outlived the grace is answered
    // 503).
    streams.engine.store().stop().await;
    match served {
        Ok(done) => done?,
        Err(_) => tracing::warn!("grace period over; closing the remaining connections"),
    }
    Ok(())
}

fn parse_sort(fields: &[String]) -> Vec<SortField> {
    fields
        .iter()
        .map(|f| match f.strip_prefix('-') {
            Some(rest) => SortField {
                field: rest.to_string(),
                order: Order::Desc,
            },
            None => SortField {
                field: f.clone(),
                order: Order::Asc,
            },
        })
        .collect()
}

async fn admin(args: AdminArgs) -> anyhow::Result<()> {
    let store = open_store(None, &args.data, sqlite_options(false)).await?;
    let engine = Engine::new(store, EngineConfig::default());
    if engine.import_unfinished().await? {
        bail!("{PARTIAL}");
    }
    let admin = Caller::User {
        username: "admin".into(),
        admin: true,
    };
    match args.action {
        AdminAction::CreateUser {
            username,
            password,
            admin: make_admin,
        } => {
            let user = engine
                .create_user(
                    &admin,
                    NewUser {
                        username,
                        password,
                        properties: Default::default(),
                        admin: make_admin,
                    },
                    false,
                )
                .await?;
            println!("created user {} (admin: {})", user.username, user.admin);
        }
        AdminAction::ResetPassword { username, password } => {
            engine
                .set_password(&username, &password, None, false)
                .await?;
            println!("password of {username} set; their sessions are ended");
        }
        AdminAction::DeclareIndex {
            name,
            kind,
            r#where,
            sort,
        } => {
            let (def, created) = engine
                .declare_index(&admin, &name, &kind, r#where, parse_sort(&sort))
                .await?;
            if !created && def.state == IndexState::Building {
                // Left unfinished by a server that stopped: build it here.
                engine.resume_index_work().await?;
            }
            if def.state == IndexState::Building {
                loop {
                    let def = engine.get_index(&admin, &name).await?;
                    if def.state == IndexState::Ready {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            println!("index {name} is ready");
        }
    }
    Ok(())
}

async fn export(args: ExportArgs) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // Opening an embedded store creates it: a mistyped directory would
    // export an empty store and look like a backup.
    let embedded = match args.at.store.as_deref() {
        None => Some(args.at.data.as_path()),
        Some(url) => url.strip_prefix("sqlite://").map(Path::new),
    };
    if let Some(dir) = embedded.filter(|d| !SqliteStore::exists(d)) {
        bail!("{} holds no Tarn store: nothing to export", dir.display());
    }
    let store = open_store(
        args.at.store.as_deref(),
        &args.at.data,
        sqlite_options(true),
    )
    .await?;
    let engine = Engine::new(store, EngineConfig::default());
    if engine.import_unfinished().await? {
        bail!("{PARTIAL}");
    }
    // Opening a PostgreSQL schema or a Cassandra keyspace makes it too.
    if engine.holds_nothing().await? {
        bail!("the store holds nothing (no server started on it and nothing was imported into it: is its schema or keyspace named right?): nothing to export");
    }
    let mut out: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            // Readable by its owner alone: it holds every password hash
            // (a file that was there keeps no wider mode either).
            {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(p)
                    .with_context(|| format!("cannot create {}", p.display()))?;
                f.set_permissions(std::fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("cannot make {} private", p.display()))?;
                f
            },
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let moved = engine
        .export(|r| {
            serde_json::to_writer(&mut out, r)?;
            out.write_all(b"\n")
        })
        .await?;
    out.flush()?;
    eprintln!("exported {}", serde_json::to_string(&moved.records)?);
    Ok(())
}

/// How each store is emptied.
macro_rules! emptying {
    () => {
        "the embedded store: remove its directory; PostgreSQL: drop its schema, or its tables named tarn_*; Cassandra: drop its keyspace"
    };
}

/// What a store left by a failed import is told to be.
const PARTIAL: &str = concat!(
    "the store holds an import that did not finish: empty it (",
    emptying!(),
    ") and import again"
);

/// The longest line an import reads: far past any record an export writes
/// (a chunk of a body is 256 KiB, base64 a third more; an item's
/// properties 64 KiB, six times that escaped), so memory stays bounded
/// whatever a file holds.
const MAX_LINE: usize = 16 << 20;

async fn import(args: ImportArgs) -> anyhow::Result<()> {
    use std::io::{BufRead, Read};
    // The file first: a path mistyped makes no store.
    let mut input: Box<dyn BufRead> = match &args.input {
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?,
        )),
        None => Box::new(std::io::BufReader::new(std::io::stdin().lock())),
    };
    let store = open_store(
        args.at.store.as_deref(),
        &args.at.data,
        sqlite_options(true),
    )
    .await?;
    let engine = Engine::new(store, EngineConfig::default());
    if engine.import_unfinished().await? {
        bail!("{PARTIAL}");
    }
    if !engine.is_empty().await? {
        bail!("the target store holds users (other than admin), groups or items, or has held index declarations: import into an empty one");
    }
    let mut importer = engine.importer();
    if args.no_end_record {
        importer = importer.without_end_record();
    }
    // Until the importer writes, the store holds nothing of the file.
    let failed = |at: String, wrote: bool| {
        if wrote {
            format!("{at}; the store now holds part of the file, so empty it ({}) before importing again", emptying!())
        } else {
            format!("{at}; nothing was written")
        }
    };
    let mut buf = Vec::new();
    for n in 1u64.. {
        buf.clear();
        let read = (&mut input)
            .take(MAX_LINE as u64 + 2)
            .read_until(b'\n', &mut buf)
            .with_context(|| failed(format!("line {n}: cannot read"), importer.wrote()))?;
        if read == 0 {
            break;
        }
        if buf.len() - usize::from(buf.ends_with(b"\n")) > MAX_LINE {
            bail!(failed(
                format!("line {n} is longer than {MAX_LINE} bytes: no record of tarn export is"),
                importer.wrote()
            ));
        }
        let line = std::str::from_utf8(&buf).map_err(|e| {
            anyhow::anyhow!(failed(
                format!("line {n}: not UTF-8 ({e})"),
                importer.wrote()
            ))
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let record: tarn_engine::Record = serde_json::from_str(line).with_context(|| {
            failed(
                format!("line {n}: not a record of tarn export"),
                importer.wrote(),
            )
        })?;
        if let Err(e) = importer.add(record).await {
            let wrote = importer.wrote();
            return Err(anyhow::Error::new(e).context(failed(format!("line {n}"), wrote)));
        }
    }
    importer
        .check_ended()
        .with_context(|| failed("the file does not hold together".into(), importer.wrote()))?;
    let moved = importer
        .finish()
        .await
        .with_context(|| failed("the file does not hold together".into(), true))?;
    eprintln!("imported {}", serde_json::to_string(&moved.records)?);
    Ok(())
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(dir) = args.report {
        let results = tarn_bench::report::rerender(&dir)?;
        println!("{}", tarn_bench::report::summary(&results, &dir));
        return Ok(());
    }
    let workload = match args.workload.expect("clap requires it") {
        BenchWorkload::UserHome => tarn_bench::Workload::UserHome,
        BenchWorkload::Kenai => tarn_bench::Workload::Kenai,
        BenchWorkload::UploadStorm => tarn_bench::Workload::UploadStorm,
        BenchWorkload::Custard => tarn_bench::Workload::Custard,
        BenchWorkload::Search => tarn_bench::Workload::Search,
        BenchWorkload::Chat => tarn_bench::Workload::Chat,
    };
    let (results, out) = tarn_bench::run(tarn_bench::Options {
        workload,
        url: args.url,
        admin_password: args.admin_password,
        out: args.out,
        quick: args.quick,
        server_exe: std::env::current_exe()?,
        step_seconds: args.step_seconds,
        warmup_seconds: args.warmup_seconds,
        settle_seconds: args.settle_seconds.unwrap_or(0.0),
        after_load: args.after_load,
        server_pids: args.server_pid,
    })
    .await?;
    println!("{}", tarn_bench::report::summary(&results, &out));
    Ok(())
}

/// The same JSON with every object's keys in sorted order, so that its
/// text does not depend on a hash map's iteration order.
fn sorted_keys(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sorted_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted_keys).collect()),
        other => other,
    }
}

/// A share of the time: above 0 and at most 1.
fn parse_share(s: &str) -> Result<f64, String> {
    check_share(s.parse().map_err(|_| format!("{s:?} is not a number"))?)
}

fn check_share(share: f64) -> Result<f64, String> {
    if share > 0.0 && share <= 1.0 {
        Ok(share)
    } else {
        Err(format!("{share} is not above 0 and at most 1"))
    }
}

/// A span of seconds: at least 0 and at most a day.
fn seconds(s: &str) -> Result<f64, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=86_400.0).contains(&secs) {
        Ok(secs)
    } else {
        Err(format!("{secs} is not from 0 to 86400 seconds"))
    }
}

/// A span of seconds of at least a millisecond (a step's measured time,
/// which its rates divide by).
fn positive_seconds(s: &str) -> Result<f64, String> {
    let secs = seconds(s)?;
    if secs >= 0.001 {
        Ok(secs)
    } else {
        Err(format!("{secs} seconds measure nothing: at least 0.001"))
    }
}
