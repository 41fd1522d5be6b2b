//! `SqliteStore`: the embedded default backend of Tarn's store contract.
//!
//! One SQLite database in WAL mode inside a data directory:
//!
//! - **Reads** go through a pool of read connections. A snapshot checks one
//!   out, runs its reads in one read transaction on the calling thread (no
//!   hand-off to another thread: a point read costs what SQLite costs, a few
//!   microseconds), and puts it back when dropped. In WAL mode a reader sees
//!   the last commit before its first read and never waits for the writer.
//!   Each call is bounded by the contract ([`tarn_store::MAX_READ_ROWS`]),
//!   so no call holds a thread for longer than a bounded scan.
//! - **The writer** is one thread owning the write connection. Writes queue
//!   to it; it takes every small write waiting and at most one large one
//!   (a body chunk), applies each (all of a write's guards first, so a
//!   failed guard changes nothing; a write that fails after changing rows
//!   makes the group run again with a `SAVEPOINT` around each write, so the
//!   error undoes that write alone), commits them in one
//!   transaction with one fsync (`synchronous=FULL`), and only then answers
//!   each write. This is group commit: under load many commits share an
//!   fsync, and a lone write is answered as soon as its own fsync is done.
//!   A large write never waits behind more than one other large write, and
//!   a small write never waits behind more than one group.
//!   The writer's connection hands a commit's WAL frames to the kernel in
//!   one `pwrite` instead of two a page (`vfs`).
//! - **Readers** read through one memory map of the database file that they
//!   all share and keep, and take the WAL's locks without a mutex or a
//!   system call (`vfs`). Every connection of the store uses its VFS; while
//!   the store is open, no other connection may use the database: the
//!   `LOCK` file below refuses other Tarn processes, and a connection of
//!   any other VFS (a `sqlite3` shell, a backup tool) finds every lock of
//!   the WAL held and is answered `SQLITE_BUSY`. Stop the server, or use
//!   `tarn export`, to read the file.
//! - **Checkpoints** run on their own thread, so neither the writer's
//!   commits nor the readers wait for them.
//! - **Values past 64 KiB** (body chunks) live in `values.dat` beside the
//!   database, written once and fsynced before the commit that points at
//!   them, instead of through the WAL and again by the checkpointer
//!   (`values`). A snapshot reads them like any row; their space is given
//!   back and reused only once no open snapshot can still read them.
//! - Both queues are bounded: past the bound a write is refused at once
//!   with [`StoreError::Unavailable`] (the server answers 503), and a
//!   snapshot that finds every read connection busy for longer than a short
//!   wait is refused the same way. Overload is answered, not buffered.
//! - A lock file (`LOCK`, an OS advisory lock) refuses a second process on the
//!   same directory.

#![warn(missing_docs)]

mod values;
mod vfs;

use std::fs::File;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};
use tarn_store::{
    check_read, Batch, Consistency, Direction, Expect, FeedEntry, Key, Op, ReadResult, Row, Scan,
    Snapshot, Store, StoreError, StoreResult, Table, MAX_READ_ROWS,
};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::values::{Horizon, ValueFile};

/// The most writes combined into one transaction.
const MAX_GROUP: usize = 512;
/// A reader's `mmap_size`: any positive value makes SQLite read pages
/// through the store's VFS's map (`vfs::Map`, a single one that every
/// connection shares, over up to 1 TiB of the file); the value itself is
/// not used.
const MMAP_BYTES: i64 = 1 << 40;
/// How long a connection waits for a lock another holds.
const BUSY_WAIT: Duration = Duration::from_secs(10);

/// A write of more bytes than this is large: a group takes at most one.
const LARGE_WRITE: usize = 64 * 1024;

/// Settings of a [`SqliteStore`].
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// Read connections in the pool: the most snapshots open at once.
    pub readers: usize,
    /// Page cache per connection, in KiB.
    pub cache_kib: u32,
    /// Most writes queued for the writer; past it writes are refused.
    pub max_queued_writes: usize,
    /// Most bytes of writes queued for the writer; past it writes are refused.
    pub max_queued_bytes: usize,
    /// How long a snapshot waits for a free read connection before it is
    /// refused.
    pub reader_wait: Duration,
    /// How often the checkpointer copies the WAL back.
    pub checkpoint_every: Duration,
    /// WAL pages past which the WAL is restarted.
    pub checkpoint_pages: u32,
    /// Whether readers map the database file. Faster reads for a server;
    /// but every page a reader touches then counts in the process's
    /// resident memory, so a tool that reads the whole store once (export,
    /// import's check) reads without the map to stay small.
    pub map: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        SqliteOptions {
            readers: (cores * 8).max(16),
            cache_kib: 8 * 1024,
            max_queued_writes: 8192,
            max_queued_bytes: 256 * 1024 * 1024,
            reader_wait: Duration::from_secs(1),
            checkpoint_every: Duration::from_millis(200),
            checkpoint_pages: 16384,
            map: true,
        }
    }
}

struct WriteJob {
    work: Work,
    bytes: usize,
    reply: oneshot::Sender<StoreResult<usize>>,
}

/// What the writer does for one job.
enum Work {
    /// Apply a batch (answers 0).
    Batch(Batch),
    /// Remove the oldest entries of a feed (answers how many).
    Trim {
        feed: &'static str,
        through: u64,
        limit: usize,
    },
}

/// The embedded store. Cheap to clone: clones share the same pool and writer.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

/// What the writer and the store share: the queues' fill and counters.
#[derive(Default)]
struct Shared {
    queued_writes: AtomicUsize,
    queued_bytes: AtomicUsize,
    commits: AtomicU64,
    groups: AtomicU64,
    refused_writes: AtomicU64,
    refused_snapshots: AtomicU64,
    /// Rows put, deleted or appended by committed writes.
    rows_written: AtomicU64,
    /// Frames in the WAL after the writer's last commit.
    wal_frames: AtomicU64,
    /// The checkpointer has just copied the WAL back, and it is past its
    /// bound: the writer restarts it before its next group.
    restart_wanted: AtomicBool,
    /// WAL restarts done, and given up because readers held on.
    wal_restarts: AtomicU64,
    wal_restart_failures: AtomicU64,
    /// Groups applied again with a savepoint per write, after a write
    /// failed halfway.
    groups_redone: AtomicU64,
}

struct Inner {
    readers: Arc<ReadPool>,
    small: Option<Sender<WriteJob>>,
    large: Option<Sender<WriteJob>>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
    options: SqliteOptions,
    stop_checkpoints: Option<Sender<()>>,
    // Held for the store's lifetime; released by the OS if the process dies.
    _lock: File,
    dir: PathBuf,
}

/// The read connections: a semaphore counts free ones, a channel holds them,
/// each with its slot in the horizon.
struct ReadPool {
    free: Arc<Semaphore>,
    put: Sender<(Connection, usize)>,
    take: Receiver<(Connection, usize)>,
    /// Where each connection's snapshot began (see `values`).
    horizon: Arc<Horizon>,
    /// The value file, read through by every snapshot.
    values: Arc<File>,
    shared: Arc<Shared>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channels ends the writer once its queue drains; join
        // it so the lock is released only after the last commit.
        self.small.take();
        self.large.take();
        self.stop_checkpoints.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The database file inside a data directory.
const DB_FILE: &str = "tarn.sqlite";

impl SqliteStore {
    /// Whether `dir` holds a store (opening one creates it).
    pub fn exists(dir: &Path) -> bool {
        dir.join(DB_FILE).is_file()
    }

    /// Opens (creating if needed) the store in `dir` with default options.
    pub fn open(dir: impl AsRef<Path>) -> StoreResult<SqliteStore> {
        SqliteStore::open_with(dir, SqliteOptions::default())
    }

    /// Opens (creating if needed) the store in `dir`.
    ///
    /// Fails with [`StoreError::Unavailable`] if another process holds the
    /// directory.
    pub fn open_with(dir: impl AsRef<Path>, options: SqliteOptions) -> StoreResult<SqliteStore> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot create data directory {}: {e}",
                dir.display()
            ))
        })?;
        let lock_path = dir.join("LOCK");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot open {}: {e}", lock_path.display()))
            })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Unavailable(format!(
                    "data directory {} is in use by another process (it holds {})",
                    dir.display(),
                    lock_path.display()
                )))
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Unavailable(format!(
                    "cannot lock {}: {e}",
                    lock_path.display()
                )))
            }
        }
        let db = dir.join(DB_FILE);
        let mut writer = open_writer(&db, &options).map_err(map_err)?;
        let readers = options.readers.max(1);
        let horizon = Arc::new(Horizon::new(readers));
        let value_file = ValueFile::open(&dir, &writer, horizon.clone()).map_err(map_err)?;
        let (put, take) = crossbeam_channel::bounded(readers);
        for slot in 0..readers {
            let conn = open_reader(&db, &options).map_err(map_err)?;
            put.send((conn, slot))
                .expect("the pool has room for every connection");
        }
        let shared = Arc::new(Shared::default());
        let pool = Arc::new(ReadPool {
            free: Arc::new(Semaphore::new(readers)),
            put,
            take,
            horizon,
            values: value_file.file(),
            shared: shared.clone(),
        });
        let (small_tx, small_rx) = crossbeam_channel::unbounded::<WriteJob>();
        let (large_tx, large_rx) = crossbeam_channel::unbounded::<WriteJob>();
        let mut threads = Vec::with_capacity(2);
        let writer_shared = shared.clone();
        let frames = shared.clone();
        writer
            .wal_hook(Some(
                move |_: &mut rusqlite::hooks::Wal, n: std::ffi::c_int| {
                    frames.wal_frames.store(n.max(0) as u64, Ordering::Relaxed);
                    Ok(())
                },
            ))
            .map_err(map_err)?;
        let wal_pages = options.checkpoint_pages;
        threads.push(
            std::thread::Builder::new()
                .name("sqlite-write".into())
                .spawn(move || {
                    writer_loop(
                        writer,
                        value_file,
                        small_rx,
                        large_rx,
                        writer_shared,
                        wal_pages,
                    )
                })
                .map_err(|e| StoreError::Other(format!("cannot start writer: {e}")))?,
        );
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let checkpointer = open_checkpointer(&db, &options).map_err(map_err)?;
        let (every, pages) = (options.checkpoint_every, options.checkpoint_pages);
        let checkpoint_shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("sqlite-checkpoint".into())
                .spawn(move || {
                    checkpoint_loop(checkpointer, stop_rx, every, pages, checkpoint_shared)
                })
                .map_err(|e| StoreError::Other(format!("cannot start checkpointer: {e}")))?,
        );
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                readers: pool,
                small: Some(small_tx),
                large: Some(large_tx),
                threads,
                shared,
                options,
                stop_checkpoints: Some(stop_tx),
                _lock: lock,
                dir,
            }),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Queues work for the writer, or refuses it at once when the queue is
    /// full; answers what the writer answers, once durable.
    async fn submit(&self, work: Work, bytes: usize) -> StoreResult<usize> {
        let inner = &self.inner;
        let shared = &inner.shared;
        let writes = shared.queued_writes.fetch_add(1, Ordering::Relaxed);
        let queued = shared.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        if writes >= inner.options.max_queued_writes
            || queued + bytes > inner.options.max_queued_bytes
        {
            shared.queued_writes.fetch_sub(1, Ordering::Relaxed);
            shared.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            shared.refused_writes.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable("the write queue is full".into()));
        }
        let (reply, rx) = oneshot::channel();
        let queue = if bytes > LARGE_WRITE {
            &inner.large
        } else {
            &inner.small
        };
        let job = WriteJob { work, bytes, reply };
        match queue.as_ref().map(|q| q.try_send(job)) {
            Some(Ok(())) => {}
            Some(Err(TrySendError::Full(_) | TrySendError::Disconnected(_))) | None => {
                shared.queued_writes.fetch_sub(1, Ordering::Relaxed);
                shared.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                return Err(closed());
            }
        }
        rx.await.map_err(|_| closed())?
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("the SQLite store is shut down".into())
}

fn configure(conn: &Connection, options: &SqliteOptions) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_WAIT)?;
    conn.pragma_update(None, "cache_size", -i64::from(options.cache_kib))?;
    // Every statement is prepared once per connection and kept: 18 scan
    // shapes, point reads, the feed's and the writer's statements, and
    // the transaction statements (parsing `SAVEPOINT`/`RELEASE` for every
    // write was a sixth of a create's instructions under callgrind). The
    // default of 16 would evict some of them under a mixed load.
    conn.set_prepared_statement_cache_capacity(64);
    // The query planner stability guarantee: plans never look at bound
    // values. Without it a statement whose plan peeked at a parameter is
    // re-prepared at its next step each time that parameter is bound again
    // (callgrind: `sqlite3Reprepare` was 29% of an item read's
    // instructions). Every statement here is a primary-key lookup or range
    // whose plan does not depend on the values.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

fn open_writer(db: &Path, options: &SqliteOptions) -> rusqlite::Result<Connection> {
    vfs::register().map_err(rusqlite::Error::InvalidParameterName)?;
    let conn = Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs::NAME)?;
    configure(&conn, options)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "journal_mode is {mode}, not WAL"
        )));
    }
    // FULL: in WAL mode the WAL is fsynced at every commit, so an
    // acknowledged write survives a crash or power loss.
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Statement journals and the sub-journals of savepoints (writes run
    // again after a failure halfway, see `commit_group`) stay in memory:
    // SQLite spills them to a temporary file past 64 KiB, and when every
    // write had its savepoint that put a create's few dozen pages through
    // the kernel (perf: a fifth of the CPU under 16 writers). A sub-journal
    // holds one write's pages at most and is emptied when its savepoint is
    // released.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // The checkpointer thread does this work, not the writer's commits.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS rows (
             tbl TEXT NOT NULL,
             part BLOB NOT NULL,
             clus BLOB NOT NULL,
             value BLOB NOT NULL,
             version INTEGER NOT NULL,
             big INTEGER,
             PRIMARY KEY (tbl, part, clus)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS big (
             id INTEGER PRIMARY KEY,
             value BLOB NOT NULL
         );
         CREATE TABLE IF NOT EXISTS feed (
             tbl TEXT NOT NULL,
             seq INTEGER NOT NULL,
             value BLOB NOT NULL,
             big INTEGER,
             PRIMARY KEY (tbl, seq)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS feed_seq (
             tbl TEXT NOT NULL PRIMARY KEY,
             last INTEGER NOT NULL
         );
         CREATE TABLE IF NOT EXISTS values_freed (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             off INTEGER NOT NULL,
             len INTEGER NOT NULL
         );
         CREATE TABLE IF NOT EXISTS values_free (
             off INTEGER PRIMARY KEY,
             len INTEGER NOT NULL
         );
         CREATE INDEX IF NOT EXISTS values_free_len ON values_free (len, off);",
    )?;
    // Stores made before values could live in `big` have no `big` columns,
    // and stores made before the value file (`values`) have no ranges in
    // `big`: their large values stay where they are (and read as before)
    // until written again.
    for (table, column) in [
        ("rows", "big"),
        ("feed", "big"),
        ("big", "off"),
        ("big", "len"),
    ] {
        let has: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
            .exists([table, column])?;
        if !has {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} INTEGER"))?;
        }
    }
    // A value in `big` goes with its row: replaced, or deleted; its range
    // of the value file, if it has one, waits in `values_freed` until no
    // snapshot can read it.
    conn.execute_batch(
        "CREATE TRIGGER IF NOT EXISTS big_range_freed AFTER DELETE ON big
             WHEN old.off IS NOT NULL
             BEGIN INSERT INTO values_freed (off, len)
                 VALUES (old.off, (old.len + 4095) / 4096 * 4096); END;",
    )?;
    conn.execute_batch(
        "CREATE TRIGGER IF NOT EXISTS rows_big_replaced AFTER UPDATE OF big ON rows
             WHEN old.big IS NOT NULL AND old.big IS NOT new.big
             BEGIN DELETE FROM big WHERE id = old.big; END;
         CREATE TRIGGER IF NOT EXISTS rows_big_deleted AFTER DELETE ON rows
             WHEN old.big IS NOT NULL
             BEGIN DELETE FROM big WHERE id = old.big; END;
         CREATE TRIGGER IF NOT EXISTS feed_big_deleted AFTER DELETE ON feed
             WHEN old.big IS NOT NULL
             BEGIN DELETE FROM big WHERE id = old.big; END;",
    )?;
    Ok(conn)
}

fn open_reader(db: &Path, options: &SqliteOptions) -> rusqlite::Result<Connection> {
    vfs::register().map_err(rusqlite::Error::InvalidParameterName)?;
    let conn = Connection::open_with_flags_and_vfs(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        vfs::NAME,
    )?;
    configure(&conn, options)?;
    // Pages read through a memory map of the file, shared by every reader,
    // instead of copied by `pread` into each connection's own cache, which
    // SQLite empties whenever a read transaction finds a new commit. The
    // store's VFS makes that map once and keeps it (`vfs`); with SQLite's
    // own, each connection had its own map and every such transaction
    // dropped and made it again, and readers beside uploads did worse with
    // a map than without.
    if options.map {
        conn.pragma_update(None, "mmap_size", MMAP_BYTES)?;
    }
    Ok(conn)
}

fn open_checkpointer(db: &Path, options: &SqliteOptions) -> rusqlite::Result<Connection> {
    // The store's VFS, like every connection of the store: its locks on
    // shared memory are seen only by connections of the same VFS.
    let conn = Connection::open_with_flags_and_vfs(db, OpenFlags::default(), vfs::NAME)?;
    configure(&conn, options)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(conn)
}

fn map_err(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            StoreError::Conflict(e.to_string())
        }
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            StoreError::Corrupt(e.to_string())
        }
        Some(
            ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::OutOfMemory,
        ) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Other(e.to_string()),
    }
}

/// How long a restart of the WAL may hold writes back while it waits for
/// the readers of older snapshots to finish (one request's read each).
const RESTART_WAIT: Duration = Duration::from_millis(100);

/// Copies the WAL back into the database every `every` (at least 1 ms),
/// without ever blocking readers or the writer (`PASSIVE`); when the WAL has
/// grown past `pages` and at most a quarter of that is left to copy, or past
/// twice `pages`, asks the writer to restart it (see [`restart_wal`]).
fn checkpoint_loop(
    conn: Connection,
    stop: Receiver<()>,
    every: Duration,
    pages: u32,
    shared: Arc<Shared>,
) {
    loop {
        match stop.recv_timeout(every.max(Duration::from_millis(1))) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let wal: rusqlite::Result<(i64, i64)> =
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(1)?, r.get(2)?))
            });
        let bound = i64::from(pages);
        match wal {
            // Past the bound, and little left to copy: the restart holds
            // writes back for a small copy and the readers' wait only.
            // Past twice the bound, whatever is left: this copy cannot keep
            // up with the writes (the snapshots of readers reading all the
            // time hold it back by the last few milliseconds of writes,
            // which a fast writer makes more than a quarter of the bound),
            // and writes wait for the writer's copy instead.
            Ok((log, done)) if log > bound && (log - done <= bound / 4 || log > 2 * bound) => {
                shared.restart_wanted.store(true, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("sqlite: checkpoint failed: {e}"),
        }
    }
}

/// Restarts the WAL between two commit groups once it holds more than the
/// checkpoint bound, so that the next write begins again at its start.
///
/// A WAL is only reused when a write begins after every frame has been
/// copied and while no reader still reads from it. Under steady writes and
/// reads that moment never comes, and the WAL grew without bound (10 GB
/// for a 1.7 GB database while the search workload loaded). A `RESTART`
/// from another connection never got the write lock from this busy writer,
/// so the writer itself runs it between groups, right after a copy: it
/// copies what is left (at most a quarter of the bound) and waits for the
/// readers of older snapshots for at most [`RESTART_WAIT`], while writes
/// queue. If they are not done by then it gives up, writes go on, and it
/// tries again when the WAL has doubled. The file keeps its largest size:
/// writing over it costs less than growing it again (cutting it back with
/// `journal_size_limit` made creates slower still). A WAL left large by an
/// older version stays that size on disk, written over from its start.
fn restart_wal(conn: &Connection) -> Restart {
    let restarted = conn.busy_timeout(RESTART_WAIT).and_then(|()| {
        conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get::<_, i64>(0))
    });
    if let Err(e) = conn.busy_timeout(BUSY_WAIT) {
        tracing::warn!("sqlite: cannot restore the writer's busy timeout: {e}");
    }
    match restarted {
        Ok(0) => Restart::Done,
        Ok(_) => Restart::ReadersHold,
        Err(e) => {
            // The checkpointer's copy holds the checkpoint lock (answered
            // at once, without waiting), or the pragma failed.
            tracing::debug!("sqlite: WAL restart not done: {e}");
            Restart::NotNow
        }
    }
}

/// What a restart of the WAL came to.
enum Restart {
    Done,
    /// Readers of older snapshots held on past [`RESTART_WAIT`].
    ReadersHold,
    /// It could not start (the checkpointer was copying): try after the
    /// next group.
    NotNow,
}

/// Longest record SQLite keeps whole in a cell of `rows` (an index b-tree
/// of 4096-byte pages: `(4096 - 12) * 64 / 255 - 23`); a longer one spills
/// onto overflow pages.
const MAX_LOCAL: usize = 1002;

/// Whether a row's value is kept in `big` rather than in its row.
///
/// `rows` is a `WITHOUT ROWID` table: its whole row is its b-tree key, and
/// a descent compares the key sought with the cells on its way, reading
/// every overflow page of a cell it compares with. With 256 KiB body
/// chunks in `rows`, a point read that passed one read 64 pages (perf
/// under `tarn bench upload-storm`: half of the readers' CPU in
/// `accessPayload` and `pread`). Kept apart, values of any size cost a
/// descent nothing; the row keeps the id of its value in `big` (a rowid
/// table, looked up by integer) and an empty `value`.
fn stored_apart(key: &Key, value: &[u8]) -> bool {
    spills(key.table.name().len() + key.partition.len() + key.clustering.len() + value.len())
}

/// Whether a record of these column bytes, plus a header of a few bytes a
/// column and an integer or two, would spill. The same holds for `feed`,
/// whose entries carry whole items.
fn spills(bytes: usize) -> bool {
    bytes + 32 > MAX_LOCAL
}

/// Keeps a value in `big`, or, past [`values::FILE_VALUE`] bytes, in the
/// value file with its range in `big`; answers its id in `big`.
fn put_big(conn: &Connection, value_file: &mut ValueFile, value: &[u8]) -> rusqlite::Result<i64> {
    if value.len() > values::FILE_VALUE {
        let off = value_file.put(conn, value)?;
        conn.prepare_cached("INSERT INTO big (value, off, len) VALUES (x'', ?1, ?2)")?
            .execute(params![off, value.len() as i64])?;
    } else {
        conn.prepare_cached("INSERT INTO big (value) VALUES (?1)")?
            .execute(params![value])?;
    }
    Ok(conn.last_insert_rowid())
}

/// The columns a read takes, after `clus` where it takes it: the value
/// kept in the row, the version, and where in `big` the value is instead.
const GET_SQL: &str =
    "SELECT value, version, big FROM rows WHERE tbl = ?1 AND part = ?2 AND clus = ?3";

/// A row's value: the one in column `value` of the row, or the one in
/// `big` that column `big` points to, or the range of the value file that
/// row of `big` points to.
fn value_of(
    conn: &Connection,
    file: &File,
    r: &rusqlite::Row<'_>,
    value: usize,
    big: usize,
) -> rusqlite::Result<Vec<u8>> {
    match r.get::<_, Option<i64>>(big)? {
        None => r.get(value),
        Some(id) => {
            let found: Option<(Vec<u8>, Option<i64>, Option<i64>)> = conn
                .prepare_cached("SELECT value, off, len FROM big WHERE id = ?1")?
                .query_row(params![id], |b| Ok((b.get(0)?, b.get(1)?, b.get(2)?)))
                .optional()?;
            match found {
                Some((_, Some(off), Some(len))) => values::read(file, off, len),
                Some((value, _, _)) => Ok(value),
                None => Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
                    Some(format!("the value {id} of a row is missing from big")),
                )),
            }
        }
    }
}

/// A row's version, for a guard: no value is read.
fn version_of(conn: &Connection, key: &Key) -> rusqlite::Result<Option<u64>> {
    conn.prepare_cached("SELECT version FROM rows WHERE tbl = ?1 AND part = ?2 AND clus = ?3")?
        .query_row(
            params![key.table.name(), key.partition, key.clustering],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .map(|v| v.map(|v| v as u64))
}

/// A point read with a statement already prepared from [`GET_SQL`]: a read
/// of many keys takes the statement from the cache once, not once a key.
fn get_with(
    conn: &Connection,
    file: &File,
    stmt: &mut rusqlite::Statement<'_>,
    key: &Key,
) -> rusqlite::Result<Option<Row>> {
    stmt.raw_bind_parameter(1, key.table.name())?;
    stmt.raw_bind_parameter(2, &key.partition[..])?;
    stmt.raw_bind_parameter(3, &key.clustering[..])?;
    let mut rows = stmt.raw_query();
    let Some(r) = rows.next()? else {
        return Ok(None);
    };
    Ok(Some(Row {
        clustering: key.clustering.clone(),
        value: value_of(conn, file, r, 0, 2)?,
        version: r.get::<_, i64>(1)? as u64,
    }))
}

/// The SQL of a scan; there are 18 shapes (3 × 3 bounds × 2 directions), each
/// prepared once per connection.
fn scan_sql(scan: &Scan) -> &'static str {
    macro_rules! shapes {
        ($($lo:literal, $hi:literal);*) => {
            [$(
                concat!("SELECT clus, value, version, big FROM rows WHERE tbl = ?1 AND part = ?2", $lo, $hi, " ORDER BY clus ASC"),
                concat!("SELECT clus, value, version, big FROM rows WHERE tbl = ?1 AND part = ?2", $lo, $hi, " ORDER BY clus DESC"),
            )*]
        };
    }
    // No `LIMIT ?`: SQLite re-prepares a statement at its next step
    // whenever a parameter its plan looked at (here the LIMIT's value) is
    // bound again, and that cost a third of an item read (callgrind). The plan here is
    // the primary key's whatever the limit, so the caller stops reading
    // after `limit` rows instead. Parameters are numbered as bound: the
    // bounds present, lower first.
    const SQL: [&str; 18] = shapes!(
        "", "";
        "", " AND clus <= ?3";
        "", " AND clus < ?3";
        " AND clus >= ?3", "";
        " AND clus >= ?3", " AND clus <= ?4";
        " AND clus >= ?3", " AND clus < ?4";
        " AND clus > ?3", "";
        " AND clus > ?3", " AND clus <= ?4";
        " AND clus > ?3", " AND clus < ?4"
    );
    let lo = match scan.lower {
        Bound::Unbounded => 0,
        Bound::Included(_) => 1,
        Bound::Excluded(_) => 2,
    };
    let hi = match scan.upper {
        Bound::Unbounded => 0,
        Bound::Included(_) => 1,
        Bound::Excluded(_) => 2,
    };
    let dir = (scan.direction == Direction::Reverse) as usize;
    SQL[(lo * 3 + hi) * 2 + dir]
}

fn scan_rows(conn: &Connection, file: &File, scan: &Scan) -> rusqlite::Result<Vec<Row>> {
    if scan.limit == 0 {
        return Ok(Vec::new());
    }
    let bound = |b: &Bound<Vec<u8>>| match b {
        Bound::Unbounded => None,
        Bound::Included(k) | Bound::Excluded(k) => Some(k.clone()),
    };
    let mut stmt = conn.prepare_cached(scan_sql(scan))?;
    let table = scan.table.name();
    let (lower, upper) = (bound(&scan.lower), bound(&scan.upper));
    let mut values: Vec<&dyn rusqlite::ToSql> = vec![&table, &scan.partition];
    values.extend(lower.as_ref().map(|k| k as &dyn rusqlite::ToSql));
    values.extend(upper.as_ref().map(|k| k as &dyn rusqlite::ToSql));
    let mut rows = stmt.query(&*values)?;
    let mut out = Vec::with_capacity(scan.limit.min(64));
    while out.len() < scan.limit {
        let Some(r) = rows.next()? else { break };
        out.push(Row {
            clustering: r.get(0)?,
            value: value_of(conn, file, r, 1, 3)?,
            version: r.get::<_, i64>(2)? as u64,
        });
    }
    Ok(out)
}

/// A checked-out read connection with an open read transaction.
struct SqliteSnapshot {
    conn: Option<Connection>,
    /// The connection's slot in the pool's horizon.
    slot: usize,
    pool: Arc<ReadPool>,
    in_txn: bool,
    _permit: OwnedSemaphorePermit,
}

impl SqliteSnapshot {
    fn read_now(&mut self, gets: &[Key], scans: &[Scan]) -> rusqlite::Result<ReadResult> {
        let (conn, file) = self.conn_and_values()?;
        let rows = if gets.is_empty() {
            Vec::new()
        } else {
            let mut stmt = conn.prepare_cached(GET_SQL)?;
            gets.iter()
                .map(|k| get_with(conn, file, &mut stmt, k))
                .collect::<rusqlite::Result<_>>()?
        };
        let scans = scans
            .iter()
            .map(|s| scan_rows(conn, file, s))
            .collect::<rusqlite::Result<_>>()?;
        Ok(ReadResult { rows, scans })
    }
}

impl Drop for SqliteSnapshot {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if self.in_txn && run_cached(&conn, "COMMIT").is_err() {
            // Ending a read transaction does not fail short of a broken
            // connection; make sure it is not left open to pin the WAL.
            let _ = conn.execute_batch("ROLLBACK");
        }
        self.pool.horizon.leave(self.slot);
        let _ = self.pool.put.try_send((conn, self.slot));
    }
}

impl SqliteSnapshot {
    fn conn(&mut self) -> rusqlite::Result<&Connection> {
        begun(&self.conn, &mut self.in_txn)
    }

    /// The connection, in its read transaction, and the value file: borrowed
    /// apart, so a read takes no reference count of the shared pool.
    fn conn_and_values(&mut self) -> rusqlite::Result<(&Connection, &File)> {
        Ok((begun(&self.conn, &mut self.in_txn)?, &self.pool.values))
    }
}

/// The connection of a snapshot, its read transaction begun at first use.
fn begun<'a>(conn: &'a Option<Connection>, in_txn: &mut bool) -> rusqlite::Result<&'a Connection> {
    let conn = conn.as_ref().expect("held until drop");
    if !*in_txn {
        run_cached(conn, "BEGIN")?;
        *in_txn = true;
    }
    Ok(conn)
}

/// Runs a statement without parameters from the connection's cache
/// (`execute_batch` parses it again every time).
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

fn feed_seq(cursor: Option<&[u8]>) -> StoreResult<i64> {
    match cursor {
        None => Ok(0),
        Some(c) => c
            .try_into()
            .map(|b| u64::from_be_bytes(b).min(i64::MAX as u64) as i64)
            .map_err(|_| StoreError::Invalid("not a cursor of this feed".into())),
    }
}

#[async_trait::async_trait]
impl Snapshot for SqliteSnapshot {
    async fn read(&mut self, gets: &[Key], scans: &[Scan]) -> StoreResult<ReadResult> {
        check_read(gets, scans)?;
        self.read_now(gets, scans).map_err(map_err)
    }

    async fn read_feed(
        &mut self,
        feed: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<Vec<FeedEntry>> {
        let after = feed_seq(after)?;
        let limit = limit.min(MAX_READ_ROWS);
        let (conn, file) = self.conn_and_values().map_err(map_err)?;
        let read = || -> rusqlite::Result<Vec<FeedEntry>> {
            // No `LIMIT ?` (see `scan_sql`): read `limit` rows and stop.
            let mut stmt = conn.prepare_cached(
                "SELECT seq, value, big FROM feed WHERE tbl = ?1 AND seq > ?2 ORDER BY seq",
            )?;
            let rows = stmt.query_map(params![feed.name(), after], |r| {
                Ok(FeedEntry {
                    cursor: (r.get::<_, i64>(0)? as u64).to_be_bytes().to_vec(),
                    value: value_of(conn, file, r, 1, 2)?,
                })
            })?;
            rows.take(limit).collect()
        };
        read().map_err(map_err)
    }

    async fn scan_all(
        &mut self,
        cursor: Option<&[u8]>,
        limit: usize,
    ) -> StoreResult<(Vec<(Key, Row)>, Option<Vec<u8>>)> {
        let after = cursor.map(tarn_store::decode_row_cursor).transpose()?;
        let limit = limit.clamp(1, MAX_READ_ROWS);
        let (conn, file) = self.conn_and_values().map_err(map_err)?;
        let read = || -> rusqlite::Result<Vec<(String, Vec<u8>, Row)>> {
            let map = |r: &rusqlite::Row<'_>| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    Row {
                        clustering: r.get(2)?,
                        value: value_of(conn, file, r, 3, 5)?,
                        version: r.get::<_, i64>(4)? as u64,
                    },
                ))
            };
            match &after {
                None => conn
                    .prepare_cached(
                        "SELECT tbl, part, clus, value, version, big FROM rows
                         ORDER BY tbl, part, clus LIMIT ?1",
                    )?
                    .query_map(params![limit as i64], map)?
                    .collect(),
                Some(k) => conn
                    .prepare_cached(
                        "SELECT tbl, part, clus, value, version, big FROM rows
                         WHERE (tbl, part, clus) > (?1, ?2, ?3)
                         ORDER BY tbl, part, clus LIMIT ?4",
                    )?
                    .query_map(
                        params![k.table.name(), k.partition, k.clustering, limit as i64],
                        map,
                    )?
                    .collect(),
            }
        };
        let rows = read().map_err(map_err)?;
        let full = rows.len() == limit;
        let mut out = Vec::with_capacity(rows.len());
        for (t, part, row) in rows {
            let table =
                Table::named(&t).ok_or_else(|| StoreError::Corrupt(format!("table name {t:?}")))?;
            out.push((Key::new(table, part, row.clustering.clone()), row));
        }
        let next = if full {
            out.last().map(|(k, _)| tarn_store::encode_row_cursor(k))
        } else {
            None
        };
        Ok((out, next))
    }

    async fn feed_end(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        let conn = self.conn().map_err(map_err)?;
        let last: Option<i64> = conn
            .prepare_cached("SELECT last FROM feed_seq WHERE tbl = ?1")
            .and_then(|mut s| s.query_row(params![feed.name()], |r| r.get(0)).optional())
            .map_err(map_err)?;
        Ok((last.unwrap_or(0) as u64).to_be_bytes().to_vec())
    }

    /// The feed does not lag: readable through its end.
    async fn feed_readable(&mut self, feed: Table) -> StoreResult<Vec<u8>> {
        self.feed_end(feed).await
    }
}

/// The writer's numbering of feed entries: the last sequence number given
/// per feed, loaded when first needed and saved with every group that
/// appends. Numbers are given in commit order (one writer, one transaction
/// per group); a rolled-back write, or a group run again after a failure
/// halfway, leaves gaps, never a reuse, so a reader polling past its last
/// cursor skips nothing.
#[derive(Default)]
struct Sequences {
    last: std::collections::HashMap<&'static str, u64>,
    /// Feeds appended to in the group being committed.
    touched: Vec<&'static str>,
}

impl Sequences {
    fn next(&mut self, conn: &Connection, feed: &'static str) -> rusqlite::Result<u64> {
        let last = match self.last.get(feed) {
            Some(n) => *n,
            None => {
                let saved: Option<i64> = conn
                    .prepare_cached("SELECT last FROM feed_seq WHERE tbl = ?1")?
                    .query_row(params![feed], |r| r.get(0))
                    .optional()?;
                let max: Option<i64> = conn
                    .prepare_cached("SELECT max(seq) FROM feed WHERE tbl = ?1")?
                    .query_row(params![feed], |r| r.get(0))?;
                saved.unwrap_or(0).max(max.unwrap_or(0)) as u64
            }
        };
        let n = last + 1;
        self.last.insert(feed, n);
        if !self.touched.contains(&feed) {
            self.touched.push(feed);
        }
        Ok(n)
    }

    /// Saves the last numbers of the feeds this group appended to.
    fn save(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        for feed in self.touched.drain(..) {
            conn.prepare_cached("INSERT OR REPLACE INTO feed_seq (tbl, last) VALUES (?1, ?2)")?
                .execute(params![feed, self.last[feed] as i64])?;
        }
        Ok(())
    }
}

fn writer_loop(
    mut conn: Connection,
    mut value_file: ValueFile,
    small: Receiver<WriteJob>,
    large: Receiver<WriteJob>,
    shared: Arc<Shared>,
    wal_pages: u32,
) {
    let mut seqs = Sequences::default();
    let mut restart_at = u64::from(wal_pages);
    loop {
        // Small writes first; a large one when no small one waits.
        let first = match small.try_recv() {
            Ok(j) => j,
            Err(_) => {
                let got = crossbeam_channel::select! {
                    recv(small) -> j => j,
                    recv(large) -> j => j,
                };
                match got {
                    Ok(j) => j,
                    // One queue closed: both close together; drain the other.
                    Err(_) => match small.recv().or_else(|_| large.recv()) {
                        Ok(j) => j,
                        Err(_) => return,
                    },
                }
            }
        };
        let has_large = first.bytes > LARGE_WRITE;
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match small.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        if !has_large {
            if let Ok(job) = large.try_recv() {
                group.push(job);
            }
        }
        let bytes: usize = group.iter().map(|j| j.bytes).sum();
        let outcomes = commit_group(&mut conn, &mut value_file, &group, &mut seqs, &shared);
        let rows: usize = group
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| o.is_ok())
            .map(|(j, _)| match &j.work {
                Work::Batch(b) => b.ops.len() + b.appends.len(),
                Work::Trim { .. } => 0,
            })
            .sum();
        shared
            .rows_written
            .fetch_add(rows as u64, Ordering::Relaxed);
        // After the commit, and seen by snapshots as they begin (see
        // `values::Horizon`).
        let number = shared.groups.fetch_add(1, Ordering::SeqCst) + 1;
        shared
            .commits
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        shared
            .queued_writes
            .fetch_sub(group.len(), Ordering::Relaxed);
        shared.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        for (job, outcome) in group.into_iter().zip(outcomes) {
            let _ = job.reply.send(outcome);
        }
        // After the replies: punching freed ranges adds nothing to a
        // write's wait.
        if let Err(e) = value_file.after_group(&conn, number) {
            tracing::warn!(error = %e, "sqlite: freed ranges of the value file wait for a later group");
        }
        let frames = shared.wal_frames.load(Ordering::Relaxed);
        if frames <= u64::from(wal_pages) {
            // Restarted, by us or by SQLite itself: the bound holds again.
            restart_at = u64::from(wal_pages);
        }
        if shared.restart_wanted.swap(false, Ordering::Relaxed) && frames > restart_at {
            match restart_wal(&conn) {
                Restart::Done => {
                    shared.wal_restarts.fetch_add(1, Ordering::Relaxed);
                    restart_at = u64::from(wal_pages);
                }
                Restart::ReadersHold => {
                    // Try again once the WAL has doubled, so holding writes
                    // back stays rare however long a reader holds on.
                    shared.wal_restart_failures.fetch_add(1, Ordering::Relaxed);
                    restart_at = frames * 2;
                }
                Restart::NotNow => shared.restart_wanted.store(true, Ordering::Relaxed),
            }
        }
    }
}

/// Applies every write of the group in one transaction and commits once.
/// Returns one outcome per write; if the commit itself fails, every write
/// that would have applied fails with it.
///
/// A write's guards are all checked before any of its ops runs, so a failed
/// guard leaves nothing behind, and the writes go without savepoints (a
/// savepoint copies each page a write changes first into a sub-journal:
/// about a tenth of the writer's time for creates). Only an error after a
/// write began changing rows could leave part of it applied; then the
/// transaction is rolled back and the group applied again with a savepoint
/// around each write, so that the error undoes that write alone.
fn commit_group(
    conn: &mut Connection,
    value_file: &mut ValueFile,
    group: &[WriteJob],
    seqs: &mut Sequences,
    shared: &Shared,
) -> Vec<StoreResult<usize>> {
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
        return fail_all(group, &map_err(e));
    }
    let mut outcomes = match apply_each(conn, value_file, group, seqs) {
        Ok(outcomes) => outcomes,
        Err(e) => {
            shared.groups_redone.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, writes = group.len(),
                "a write failed halfway; its group runs again with a savepoint per write");
            let undone = rollback(conn);
            value_file.rolled_back();
            if let Err(e) = undone {
                return fail_all(group, &e);
            }
            if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
                return fail_all(group, &map_err(e));
            }
            let mut outcomes = Vec::with_capacity(group.len());
            for job in group {
                let mark = value_file.mark();
                let outcome = match apply_one(conn, value_file, &job.work, seqs) {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        // Its savepoint could not be undone or released:
                        // what the write changed may stand, so nothing of
                        // the group does.
                        if let Err(r) = rollback(conn) {
                            tracing::error!(error = %r, "rolling back a failed group failed");
                        }
                        value_file.rolled_back();
                        return fail_all(group, &e);
                    }
                };
                if conn.is_autocommit() {
                    // SQLite ended the whole transaction (a full disk, an
                    // I/O error): nothing of the group stands.
                    value_file.rolled_back();
                    let e = outcome.err().unwrap_or_else(|| {
                        StoreError::Other("the group's transaction ended early".into())
                    });
                    return fail_all(group, &e);
                }
                if outcome.is_err() {
                    // Undone alone: the ranges it took past the end are
                    // free again (those it took from the free ones went
                    // back with the savepoint).
                    value_file.undo_to(mark);
                }
                outcomes.push(outcome);
            }
            outcomes
        }
    };
    // The value file's bytes are durable before the rows that point at
    // them commit.
    let commit = seqs
        .save(conn)
        .and_then(|()| value_file.before_commit(conn))
        .and_then(|()| run_cached(conn, "COMMIT"));
    match commit {
        Ok(()) => value_file.committed(),
        Err(e) => {
            let e = map_err(e);
            if let Err(r) = rollback(conn) {
                tracing::error!(error = %r, "rolling back a failed commit failed");
            }
            // A commit that failed at its fsync may still be found in the
            // WAL after a crash: its ranges are not handed out again.
            value_file.commit_failed();
            for o in outcomes.iter_mut() {
                if o.is_ok() {
                    *o = Err(clone_err(&e));
                }
            }
        }
    }
    outcomes
}

/// Ends the open transaction without applying it, unless SQLite already
/// ended it (some errors roll a whole transaction back).
fn rollback(conn: &Connection) -> StoreResult<()> {
    if conn.is_autocommit() {
        return Ok(());
    }
    conn.execute_batch("ROLLBACK").map_err(map_err)
}

fn fail_all(group: &[WriteJob], e: &StoreError) -> Vec<StoreResult<usize>> {
    group.iter().map(|_| Err(clone_err(e))).collect()
}

/// Applies each write of a group without savepoints; fails as soon as a
/// write fails otherwise than by a guard (it may have changed rows).
fn apply_each(
    conn: &Connection,
    value_file: &mut ValueFile,
    group: &[WriteJob],
    seqs: &mut Sequences,
) -> StoreResult<Vec<StoreResult<usize>>> {
    let mut outcomes = Vec::with_capacity(group.len());
    for job in group {
        let outcome = match &job.work {
            Work::Batch(batch) => match check_guards(conn, batch) {
                Ok(()) => apply_ops(conn, value_file, batch, seqs).map(|()| 0),
                Err(e) => Err(e),
            },
            Work::Trim {
                feed,
                through,
                limit,
            } => trim(conn, feed, *through, *limit),
        };
        match outcome {
            Err(e) if !matches!(e, StoreError::GuardFailed { .. }) => return Err(e),
            outcome => outcomes.push(outcome),
        }
    }
    Ok(outcomes)
}

fn clone_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::Conflict(m) => StoreError::Conflict(m.clone()),
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
        other => StoreError::Other(other.to_string()),
    }
}

/// Applies one write inside a savepoint, so that its failure undoes it
/// alone. The outer error says the savepoint itself failed (the write's
/// changes may stand); the inner result is the write's.
fn apply_one(
    conn: &Connection,
    value_file: &mut ValueFile,
    work: &Work,
    seqs: &mut Sequences,
) -> StoreResult<StoreResult<usize>> {
    run_cached(conn, "SAVEPOINT w").map_err(map_err)?;
    let result = match work {
        Work::Batch(batch) => check_guards(conn, batch)
            .and_then(|()| apply_ops(conn, value_file, batch, seqs))
            .map(|()| 0),
        Work::Trim {
            feed,
            through,
            limit,
        } => trim(conn, feed, *through, *limit),
    };
    if conn.is_autocommit() {
        // SQLite ended the transaction, savepoint and all: the caller
        // fails the group.
        return Ok(result);
    }
    if result.is_err() {
        run_cached(conn, "ROLLBACK TO w").map_err(map_err)?;
    }
    run_cached(conn, "RELEASE w").map_err(map_err)?;
    Ok(result)
}

fn trim(conn: &Connection, feed: &str, through: u64, limit: usize) -> StoreResult<usize> {
    conn.prepare_cached(
        "DELETE FROM feed WHERE tbl = ?1 AND seq IN
         (SELECT seq FROM feed WHERE tbl = ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3)",
    )
    .and_then(|mut s| {
        s.execute(params![
            feed,
            through.min(i64::MAX as u64) as i64,
            limit.min(i64::MAX as usize) as i64
        ])
    })
    .map_err(map_err)
}

/// Checks every guard of a batch; changes nothing.
fn check_guards(conn: &Connection, batch: &Batch) -> StoreResult<()> {
    for (i, g) in batch.guards.iter().enumerate() {
        let current = version_of(conn, &g.key).map_err(map_err)?;
        let holds = match (g.expect, current) {
            (Expect::Absent, None) => true,
            (Expect::Version(want), Some(have)) => want == have,
            _ => false,
        };
        if !holds {
            return Err(StoreError::GuardFailed { guard: i });
        }
    }
    Ok(())
}

/// Applies a batch's puts, deletes and feed appends.
fn apply_ops(
    conn: &Connection,
    value_file: &mut ValueFile,
    batch: &Batch,
    seqs: &mut Sequences,
) -> StoreResult<()> {
    let mut put = conn
        .prepare_cached(
            "INSERT INTO rows (tbl, part, clus, value, version, big) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (tbl, part, clus) DO UPDATE
             SET value = excluded.value, version = excluded.version, big = excluded.big",
        )
        .map_err(map_err)?;
    let mut delete = conn
        .prepare_cached("DELETE FROM rows WHERE tbl = ?1 AND part = ?2 AND clus = ?3")
        .map_err(map_err)?;
    for op in &batch.ops {
        match op {
            Op::Put {
                key,
                value,
                version,
            } => {
                let version = i64::try_from(*version)
                    .map_err(|_| StoreError::Invalid("version above i64::MAX".into()))?;
                let (inline, big): (&[u8], Option<i64>) = if stored_apart(key, value) {
                    (
                        &[],
                        Some(put_big(conn, value_file, value).map_err(map_err)?),
                    )
                } else {
                    (value, None)
                };
                put.execute(params![
                    key.table.name(),
                    key.partition,
                    key.clustering,
                    inline,
                    version,
                    big
                ])
                .map_err(map_err)?;
            }
            Op::Delete { key } => {
                delete
                    .execute(params![key.table.name(), key.partition, key.clustering])
                    .map_err(map_err)?;
            }
        }
    }
    if !batch.appends.is_empty() {
        let mut append = conn
            .prepare_cached("INSERT INTO feed (tbl, seq, value, big) VALUES (?1, ?2, ?3, ?4)")
            .map_err(map_err)?;
        for a in &batch.appends {
            let seq = seqs.next(conn, a.feed.name()).map_err(map_err)?;
            let (inline, big): (&[u8], Option<i64>) =
                if spills(a.feed.name().len() + 8 + a.value.len()) {
                    (
                        &[],
                        Some(put_big(conn, value_file, &a.value).map_err(map_err)?),
                    )
                } else {
                    (&a.value, None)
                };
            append
                .execute(params![a.feed.name(), seq as i64, inline, big])
                .map_err(map_err)?;
        }
    }
    Ok(())
}

fn batch_bytes(batch: &Batch) -> usize {
    let rows: usize = batch
        .ops
        .iter()
        .map(|op| {
            let k = op.key();
            let v = match op {
                Op::Put { value, .. } => value.len(),
                Op::Delete { .. } => 0,
            };
            k.partition.len() + k.clustering.len() + v + 32
        })
        .sum();
    rows + batch
        .appends
        .iter()
        .map(|a| a.value.len() + 32)
        .sum::<usize>()
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn snapshot(&self) -> StoreResult<Box<dyn Snapshot>> {
        let pool = &self.inner.readers;
        let permit = match pool.free.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                match tokio::time::timeout(
                    self.inner.options.reader_wait,
                    pool.free.clone().acquire_owned(),
                )
                .await
                {
                    Ok(Ok(p)) => p,
                    Ok(Err(_)) => return Err(closed()),
                    Err(_) => {
                        self.inner
                            .shared
                            .refused_snapshots
                            .fetch_add(1, Ordering::Relaxed);
                        return Err(StoreError::Unavailable(
                            "every read connection is busy".into(),
                        ));
                    }
                }
            }
        };
        let (conn, slot) = pool
            .take
            .try_recv()
            .map_err(|_| StoreError::Other("read pool out of step with its permits".into()))?;
        // Before the read transaction begins (see `values::Horizon`).
        pool.horizon
            .enter(slot, pool.shared.groups.load(Ordering::SeqCst));
        Ok(Box::new(SqliteSnapshot {
            conn: Some(conn),
            slot,
            pool: pool.clone(),
            in_txn: false,
            _permit: permit,
        }))
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        let bytes = batch_bytes(&batch);
        self.submit(Work::Batch(batch), bytes).await.map(|_| ())
    }

    async fn trim_feed(&self, feed: Table, through: &[u8], limit: usize) -> StoreResult<usize> {
        let through = feed_seq(Some(through))? as u64;
        self.submit(
            Work::Trim {
                feed: feed.name(),
                through,
                limit,
            },
            64,
        )
        .await
    }

    fn consistency(&self) -> Consistency {
        Consistency::Snapshot
    }

    fn feed_lag(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    fn connections(&self) -> Option<usize> {
        None
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = &self.inner.shared;
        vec![
            ("sqlite_commits_total", s.commits.load(Ordering::Relaxed)),
            (
                "sqlite_wal_restarts_total",
                s.wal_restarts.load(Ordering::Relaxed),
            ),
            (
                "sqlite_wal_restart_failures_total",
                s.wal_restart_failures.load(Ordering::Relaxed),
            ),
            (
                "sqlite_commit_groups_total",
                s.groups.load(Ordering::Relaxed),
            ),
            (
                "sqlite_commit_groups_redone_total",
                s.groups_redone.load(Ordering::Relaxed),
            ),
            (
                "sqlite_refused_writes_total",
                s.refused_writes.load(Ordering::Relaxed),
            ),
            (
                "sqlite_refused_snapshots_total",
                s.refused_snapshots.load(Ordering::Relaxed),
            ),
            (
                "sqlite_rows_written_total",
                s.rows_written.load(Ordering::Relaxed),
            ),
            (
                "sqlite_queued_writes",
                s.queued_writes.load(Ordering::Relaxed) as u64,
            ),
        ]
    }
}
