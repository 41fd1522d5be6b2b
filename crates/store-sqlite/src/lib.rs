//! `SqliteStore`: the embedded default backend of Tarn's store contract.
//!
//! One SQLite database in WAL mode inside a data directory:
//!
//! - **Readers** are a fixed pool of threads, each owning a read connection.
//!   In WAL mode they read the last committed state and never wait for the
//!   writer.
//! - **The writer** is one thread owning the write connection. Writes queue
//!   to it; it takes every write waiting, applies each inside its own
//!   `SAVEPOINT` (so a failed guard or error undoes only that write), commits
//!   them in one transaction with one fsync (`synchronous=FULL`), and only then
//!   answers each write. This is group commit: write throughput is not one
//!   fsync per request.
//! - Nothing blocks the async executor: every SQLite call runs on these
//!   threads and answers through a oneshot channel.
//! - A lock file (`LOCK`, an OS advisory lock) refuses a second process on the
//!   same directory.

#![warn(missing_docs)]

use std::fs::File;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};
use tarn_store::{Batch, Direction, Expect, Key, Op, Row, Scan, Store, StoreError, StoreResult};
use tokio::sync::oneshot;

/// The most writes combined into one transaction.
const MAX_GROUP: usize = 256;

/// Settings of a [`SqliteStore`].
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// Number of reader threads (and read connections).
    pub readers: usize,
    /// Page cache per connection, in KiB.
    pub cache_kib: u32,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        SqliteOptions {
            readers: (cores * 2).max(4),
            cache_kib: 16 * 1024,
        }
    }
}

type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

struct WriteJob {
    batch: Batch,
    reply: oneshot::Sender<StoreResult<()>>,
}

/// The embedded store. Cheap to clone: clones share the same threads.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    reads: Option<Sender<ReadJob>>,
    writes: Option<Sender<WriteJob>>,
    threads: Vec<JoinHandle<()>>,
    // Held for the store's lifetime; released by the OS if the process dies.
    _lock: File,
    dir: PathBuf,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channels ends the threads once their queues drain; join
        // them so the lock is released only after the last commit.
        self.reads.take();
        self.writes.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl SqliteStore {
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
        let db = dir.join("tarn.sqlite");
        let writer = open_writer(&db, &options).map_err(map_err)?;
        let (read_tx, read_rx) = crossbeam_channel::unbounded::<ReadJob>();
        let (write_tx, write_rx) = crossbeam_channel::unbounded::<WriteJob>();
        let mut threads = Vec::with_capacity(options.readers + 1);
        for i in 0..options.readers {
            let conn = open_reader(&db, &options).map_err(map_err)?;
            let rx = read_rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("sqlite-read-{i}"))
                    .spawn(move || reader_loop(conn, rx))
                    .map_err(|e| StoreError::Other(format!("cannot start reader: {e}")))?,
            );
        }
        threads.push(
            std::thread::Builder::new()
                .name("sqlite-write".into())
                .spawn(move || writer_loop(writer, write_rx))
                .map_err(|e| StoreError::Other(format!("cannot start writer: {e}")))?,
        );
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                reads: Some(read_tx),
                writes: Some(write_tx),
                threads,
                _lock: lock,
                dir,
            }),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> StoreResult<T> {
        let (tx, rx) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn| {
            let _ = tx.send(f(conn).map_err(map_err));
        });
        self.inner
            .reads
            .as_ref()
            .and_then(|s| s.send(job).ok())
            .ok_or_else(closed)?;
        rx.await.map_err(|_| closed())?
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("the SQLite store is shut down".into())
}

fn configure(conn: &Connection, options: &SqliteOptions) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "cache_size", -i64::from(options.cache_kib))?;
    Ok(())
}

fn open_writer(db: &Path, options: &SqliteOptions) -> rusqlite::Result<Connection> {
    let conn = Connection::open(db)?;
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
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS rows (
             tbl TEXT NOT NULL,
             part BLOB NOT NULL,
             clus BLOB NOT NULL,
             value BLOB NOT NULL,
             version INTEGER NOT NULL,
             PRIMARY KEY (tbl, part, clus)
         ) WITHOUT ROWID;",
    )?;
    Ok(conn)
}

fn open_reader(db: &Path, options: &SqliteOptions) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    configure(&conn, options)?;
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

fn reader_loop(conn: Connection, jobs: Receiver<ReadJob>) {
    while let Ok(job) = jobs.recv() {
        job(&conn);
    }
}

fn get_row(conn: &Connection, key: &Key) -> rusqlite::Result<Option<Row>> {
    let mut stmt = conn.prepare_cached(
        "SELECT value, version FROM rows WHERE tbl = ?1 AND part = ?2 AND clus = ?3",
    )?;
    stmt.query_row(
        params![key.table.name(), key.partition, key.clustering],
        |r| {
            Ok(Row {
                clustering: key.clustering.clone(),
                value: r.get(0)?,
                version: r.get::<_, i64>(1)? as u64,
            })
        },
    )
    .optional()
}

fn scan_rows(conn: &Connection, scan: &Scan) -> rusqlite::Result<Vec<Row>> {
    if scan.limit == 0 {
        return Ok(Vec::new());
    }
    let mut sql =
        String::from("SELECT clus, value, version FROM rows WHERE tbl = ?1 AND part = ?2");
    let lower = match &scan.lower {
        Bound::Unbounded => None,
        Bound::Included(k) => {
            sql.push_str(" AND clus >= ?3");
            Some(k)
        }
        Bound::Excluded(k) => {
            sql.push_str(" AND clus > ?3");
            Some(k)
        }
    };
    let upper = match &scan.upper {
        Bound::Unbounded => None,
        Bound::Included(k) => {
            sql.push_str(" AND clus <= ?4");
            Some(k)
        }
        Bound::Excluded(k) => {
            sql.push_str(" AND clus < ?4");
            Some(k)
        }
    };
    sql.push_str(match scan.direction {
        Direction::Forward => " ORDER BY clus ASC LIMIT ?5",
        Direction::Reverse => " ORDER BY clus DESC LIMIT ?5",
    });
    let mut stmt = conn.prepare_cached(&sql)?;
    let limit = i64::try_from(scan.limit).unwrap_or(i64::MAX);
    let mut rows = stmt.query(params![
        scan.table.name(),
        scan.partition,
        lower,
        upper,
        limit
    ])?;
    let mut out = Vec::with_capacity(scan.limit.min(1024));
    while let Some(r) = rows.next()? {
        out.push(Row {
            clustering: r.get(0)?,
            value: r.get(1)?,
            version: r.get::<_, i64>(2)? as u64,
        });
    }
    Ok(out)
}

/// Runs `f` inside one read transaction, so several reads see one state and
/// take the file locks once.
fn in_read_txn<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.execute_batch("BEGIN")?;
    let out = f(conn);
    conn.execute_batch("COMMIT")?;
    out
}

fn writer_loop(mut conn: Connection, jobs: Receiver<WriteJob>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let outcomes = commit_group(&mut conn, &group);
        for (job, outcome) in group.into_iter().zip(outcomes) {
            let _ = job.reply.send(outcome);
        }
    }
}

/// Applies every write of the group in one transaction, each in its own
/// savepoint, and commits once. Returns one outcome per write; if the commit
/// itself fails, every write that would have applied fails with it.
fn commit_group(conn: &mut Connection, group: &[WriteJob]) -> Vec<StoreResult<()>> {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let e = map_err(e);
        return group.iter().map(|_| Err(clone_err(&e))).collect();
    }
    let mut outcomes: Vec<StoreResult<()>> = Vec::with_capacity(group.len());
    for job in group {
        outcomes.push(apply_one(conn, &job.batch));
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        let e = map_err(e);
        let _ = conn.execute_batch("ROLLBACK");
        for o in outcomes.iter_mut() {
            if o.is_ok() {
                *o = Err(clone_err(&e));
            }
        }
    }
    outcomes
}

fn clone_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::Conflict(m) => StoreError::Conflict(m.clone()),
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
        other => StoreError::Other(other.to_string()),
    }
}

fn apply_one(conn: &Connection, batch: &Batch) -> StoreResult<()> {
    conn.execute_batch("SAVEPOINT w").map_err(map_err)?;
    let result = guards_then_ops(conn, batch);
    let end = if result.is_ok() {
        "RELEASE w"
    } else {
        "ROLLBACK TO w; RELEASE w"
    };
    conn.execute_batch(end).map_err(map_err)?;
    result
}

fn guards_then_ops(conn: &Connection, batch: &Batch) -> StoreResult<()> {
    for (i, g) in batch.guards.iter().enumerate() {
        let current = get_row(conn, &g.key).map_err(map_err)?.map(|r| r.version);
        let holds = match (g.expect, current) {
            (Expect::Absent, None) => true,
            (Expect::Version(want), Some(have)) => want == have,
            _ => false,
        };
        if !holds {
            return Err(StoreError::GuardFailed { guard: i });
        }
    }
    let mut put = conn
        .prepare_cached(
            "INSERT OR REPLACE INTO rows (tbl, part, clus, value, version) VALUES (?1, ?2, ?3, ?4, ?5)",
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
                put.execute(params![
                    key.table.name(),
                    key.partition,
                    key.clustering,
                    value,
                    version
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
    Ok(())
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: Key) -> StoreResult<Option<Row>> {
        self.read(move |conn| get_row(conn, &key)).await
    }

    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Row>>> {
        self.read(move |conn| {
            in_read_txn(conn, |conn| keys.iter().map(|k| get_row(conn, k)).collect())
        })
        .await
    }

    async fn scan(&self, scan: Scan) -> StoreResult<Vec<Row>> {
        self.read(move |conn| scan_rows(conn, &scan)).await
    }

    async fn scan_many(&self, scans: Vec<Scan>) -> StoreResult<Vec<Vec<Row>>> {
        self.read(move |conn| {
            in_read_txn(conn, |conn| {
                scans.iter().map(|s| scan_rows(conn, s)).collect()
            })
        })
        .await
    }

    async fn write(&self, batch: Batch) -> StoreResult<()> {
        batch.validate()?;
        if batch.is_empty() {
            return Ok(());
        }
        let (reply, rx) = oneshot::channel();
        self.inner
            .writes
            .as_ref()
            .and_then(|s| s.send(WriteJob { batch, reply }).ok())
            .ok_or_else(closed)?;
        rx.await.map_err(|_| closed())?
    }
}
