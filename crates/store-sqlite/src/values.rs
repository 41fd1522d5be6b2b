//! The value file: values of more than [`FILE_VALUE`] bytes (body chunks)
//! live in `values.dat` beside the database, not in its pages.
//!
//! Kept in the database, a 256 KiB chunk was copied into 64 overflow pages,
//! written to the WAL and fsynced, then read back from the WAL and written
//! into the database by the checkpointer: every byte written twice and read
//! once more (`scripts/measure-upload-cost.sh`: the writer and checkpointer
//! were half of an upload's CPU). In the file it is written once.
//!
//! - A value's bytes go to a range of whole blocks, taken from the free
//!   ranges or past the end, before its row commits; the file is fsynced
//!   before the commit that points at them, so a committed row never points
//!   at bytes that are not durable. Its `big` row holds the range (`off`,
//!   `len`) and an empty `value`.
//! - A range whose row went (a trigger on `big` records it in
//!   `values_freed`) is not reused at once: a snapshot that began before
//!   may still read it. Once every snapshot open began after the group that
//!   freed it (see [`Horizon`]), the writer punches it out of the file
//!   (its disk space goes back) and, with its next group, makes it free
//!   for reuse (`values_free`). So the file stays about as large as the
//!   values it holds.
//! - A group that rolls back gives back what it took past the end; bytes it
//!   wrote into a free range stay free (nothing points at them).
//! - At open, no snapshot exists: the file is cut back to the end of the
//!   last range in use (bytes of a group that never committed) and every
//!   freed range is punched and made free.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

/// Values longer than this live in the value file.
pub(crate) const FILE_VALUE: usize = 64 * 1024;
/// Ranges are whole blocks of the file system, so that a freed one can be
/// punched out.
const BLOCK: u64 = 4096;
/// The value file inside a data directory.
pub(crate) const VALUE_FILE: &str = "values.dat";

fn blocks(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

/// An I/O error of the value file, as SQLite reports its own.
pub(crate) fn io_err(what: &str, e: std::io::Error) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
        Some(format!("value file: {what}: {e}")),
    )
}

fn corrupt(what: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
        Some(format!("value file: {what}")),
    )
}

/// Reads `len` bytes at `off` of the value file.
pub(crate) fn read(file: &File, off: i64, len: i64) -> rusqlite::Result<Vec<u8>> {
    let (Ok(off), Ok(len)) = (u64::try_from(off), usize::try_from(len)) else {
        return Err(corrupt(format!("a range at {off} of {len} bytes")));
    };
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, off)
        .map_err(|e| io_err("read", e))?;
    Ok(buf)
}

/// Where each read connection's snapshot began: the count of commit groups
/// when it was taken (`IDLE` when none is open). A snapshot taken when
/// `groups` was `g` sees every group up to `g` at least.
pub(crate) struct Horizon {
    slots: Vec<AtomicU64>,
}

const IDLE: u64 = u64::MAX;

impl Horizon {
    pub(crate) fn new(readers: usize) -> Horizon {
        Horizon {
            slots: (0..readers).map(|_| AtomicU64::new(IDLE)).collect(),
        }
    }

    /// Marks connection `slot`'s snapshot as begun after group `groups`.
    /// Called before its read transaction begins: a writer that does not
    /// see the mark checked before the transaction began, so the snapshot
    /// sees whatever that writer had committed.
    pub(crate) fn enter(&self, slot: usize, groups: u64) {
        self.slots[slot].store(groups, Ordering::SeqCst);
    }

    /// Marks connection `slot` as holding no snapshot (after its read
    /// transaction ended).
    pub(crate) fn leave(&self, slot: usize) {
        self.slots[slot].store(IDLE, Ordering::SeqCst);
    }

    /// The oldest group an open snapshot may not see past (`IDLE` if none
    /// is open): what a group after it freed no snapshot can read.
    fn oldest(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.load(Ordering::SeqCst))
            .min()
            .unwrap_or(IDLE)
    }
}

/// The writer's side of the value file.
pub(crate) struct ValueFile {
    file: Arc<File>,
    horizon: Arc<Horizon>,
    /// One past the last block any range uses or used.
    end: u64,
    /// `end` as of the last commit, for a rollback to give back.
    committed_end: u64,
    /// Whether the open transaction wrote bytes (fsynced before it commits).
    dirty: bool,
    /// Whether free ranges may be handed out: not after a commit failed,
    /// until the next open (see [`ValueFile::commit_failed`]).
    reuse: bool,
    /// Whether a failed punch was reported (once: the file system may not
    /// punch at all).
    punch_reported: bool,
    /// Freed ranges not yet punched: the last `values_freed` id each
    /// committed group left, with that group's number.
    waiting: VecDeque<(u64, i64)>,
    /// The highest `values_freed` id seen.
    seen: i64,
    /// `values_freed` rows up to this id are punched ...
    punched: i64,
    /// ... and up to this one made free.
    freed: i64,
}

impl ValueFile {
    /// Opens (creating) the value file of the database `conn` in `dir`, cuts
    /// off bytes no committed row points at, and punches and frees every
    /// range freed before (no snapshot is open yet).
    pub(crate) fn open(
        dir: &Path,
        conn: &Connection,
        horizon: Arc<Horizon>,
    ) -> rusqlite::Result<ValueFile> {
        let path = dir.join(VALUE_FILE);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_err("open", e))?;
        // The last byte a value in use holds, and the end of the last
        // range in use or freed.
        let (used, end): (i64, i64) = conn.query_row(
            "SELECT (SELECT max(off + len) FROM big WHERE off IS NOT NULL),
                    max(e) FROM (
                 SELECT max(off + (len + 4095) / 4096 * 4096) AS e FROM big WHERE off IS NOT NULL
                 UNION ALL SELECT max(off + len) FROM values_free
                 UNION ALL SELECT max(off + len) FROM values_freed)",
            [],
            |r| {
                Ok((
                    r.get::<_, Option<i64>>(0)?.unwrap_or(0),
                    r.get::<_, Option<i64>>(1)?.unwrap_or(0),
                ))
            },
        )?;
        let (used, end) = (used.max(0) as u64, end.max(0) as u64);
        let size = file.metadata().map_err(|e| io_err("size", e))?.len();
        if size < used {
            return Err(corrupt(format!(
                "{} holds {size} bytes where the database has values up to {used}: \
                 it is missing or short (was it copied with tarn.sqlite?)",
                path.display()
            )));
        }
        if size > end {
            file.set_len(end).map_err(|e| io_err("cut back", e))?;
            file.sync_all().map_err(|e| io_err("sync", e))?;
        }
        // The file's name is durable before any row points into it.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err("sync its directory", e))?;
        let mut vf = ValueFile {
            file: Arc::new(file),
            horizon,
            end,
            committed_end: end,
            dirty: false,
            reuse: true,
            punch_reported: false,
            waiting: VecDeque::new(),
            seen: 0,
            punched: 0,
            freed: 0,
        };
        let last: Option<i64> =
            conn.query_row("SELECT max(id) FROM values_freed", [], |r| r.get(0))?;
        if let Some(last) = last {
            vf.seen = last;
            vf.punch_through(conn, last)?;
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let moved = vf.free_punched(conn);
            let done = moved.and_then(|()| conn.execute_batch("COMMIT"));
            if let Err(e) = done {
                if let Err(r) = conn.execute_batch("ROLLBACK") {
                    tracing::error!(error = %r, "value file: rolling back at open failed");
                }
                return Err(e);
            }
            vf.committed();
        }
        Ok(vf)
    }

    /// The file, for readers.
    pub(crate) fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// Writes `value` to a range (a free one that fits, else past the end)
    /// and answers where: the caller puts `(off, len)` in `big` in the same
    /// transaction.
    pub(crate) fn put(&mut self, conn: &Connection, value: &[u8]) -> rusqlite::Result<i64> {
        let need = blocks(value.len() as u64) as i64;
        let fit: Option<(i64, i64)> = if self.reuse {
            conn.prepare_cached(
                "SELECT off, len FROM values_free WHERE len >= ?1 ORDER BY len, off LIMIT 1",
            )?
            .query_row(params![need], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?
        } else {
            None
        };
        let off = match fit {
            Some((off, len)) => {
                conn.prepare_cached("DELETE FROM values_free WHERE off = ?1")?
                    .execute(params![off])?;
                if len > need {
                    conn.prepare_cached("INSERT INTO values_free (off, len) VALUES (?1, ?2)")?
                        .execute(params![off + need, len - need])?;
                }
                off
            }
            None => {
                let off = self.end as i64;
                self.end += need as u64;
                off
            }
        };
        self.file
            .write_all_at(value, off as u64)
            .map_err(|e| io_err("write", e))?;
        self.dirty = true;
        Ok(off)
    }

    /// Where the end is now, to give back to with [`ValueFile::undo_to`]
    /// if the write about to run is undone alone.
    pub(crate) fn mark(&self) -> u64 {
        self.end
    }

    /// Gives back what was taken past the end since `mark`.
    pub(crate) fn undo_to(&mut self, mark: u64) {
        self.end = mark;
    }

    /// Before the transaction commits: makes the bytes it wrote durable, and
    /// frees the ranges punched since the last commit.
    pub(crate) fn before_commit(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        if self.dirty {
            self.file.sync_data().map_err(|e| io_err("sync", e))?;
        }
        self.free_punched(conn)
    }

    /// After the transaction committed.
    pub(crate) fn committed(&mut self) {
        self.committed_end = self.end;
        self.dirty = false;
        self.freed = self.punched;
    }

    /// After the transaction rolled back.
    pub(crate) fn rolled_back(&mut self) {
        self.end = self.committed_end;
        self.dirty = false;
    }

    /// After its `COMMIT` failed. A commit that failed at its fsync may
    /// have reached the WAL whole and be found there after a crash, with
    /// rows pointing at the ranges it took: none of them is handed out
    /// again while this process runs (the end is kept, free ranges are
    /// not reused). The next open reads which ranges are in use.
    pub(crate) fn commit_failed(&mut self) {
        self.committed_end = self.end;
        self.dirty = false;
        if self.reuse {
            tracing::warn!("value file: a commit failed; free ranges are not reused until restart");
        }
        self.reuse = false;
    }

    /// After group number `group` committed: notes the ranges it freed and
    /// punches those no snapshot can read any more.
    pub(crate) fn after_group(&mut self, conn: &Connection, group: u64) -> rusqlite::Result<()> {
        let last: Option<i64> = conn
            .prepare_cached("SELECT max(id) FROM values_freed")?
            .query_row([], |r| r.get(0))?;
        if let Some(last) = last.filter(|l| *l > self.seen) {
            self.seen = last;
            self.waiting.push_back((group, last));
        }
        let oldest = self.horizon.oldest();
        let mut through = None;
        while let Some(&(g, id)) = self.waiting.front() {
            if g > oldest {
                break;
            }
            through = Some(id);
            self.waiting.pop_front();
        }
        match through {
            Some(id) => self.punch_through(conn, id),
            None => Ok(()),
        }
    }

    /// Punches out the ranges freed up to `values_freed` id `through`.
    fn punch_through(&mut self, conn: &Connection, through: i64) -> rusqlite::Result<()> {
        let ranges: Vec<(i64, i64)> = conn
            .prepare_cached("SELECT off, len FROM values_freed WHERE id > ?1 AND id <= ?2")?
            .query_map(params![self.punched, through], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        for (off, len) in ranges {
            if let Err(e) = punch(&self.file, off as u64, len as u64) {
                // The range is still made free and reused; only its disk
                // space waits for that.
                if !self.punch_reported {
                    self.punch_reported = true;
                    tracing::warn!(error = %e,
                        "value file: cannot punch freed ranges out (they are reused, but their disk space is not given back)");
                }
            }
        }
        self.punched = through;
        Ok(())
    }

    /// Moves the punched ranges to the free ones, in the open transaction.
    fn free_punched(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        if self.punched <= self.freed {
            return Ok(());
        }
        conn.prepare_cached(
            "INSERT INTO values_free (off, len) SELECT off, len FROM values_freed WHERE id <= ?1",
        )?
        .execute(params![self.punched])?;
        conn.prepare_cached("DELETE FROM values_freed WHERE id <= ?1")?
            .execute(params![self.punched])?;
        Ok(())
    }
}

/// Gives a range's disk space back; its bytes read as zeros after.
#[cfg(target_os = "linux")]
fn punch(file: &File, off: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a file descriptor we own, with plain integers.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn punch(_file: &File, _off: u64, _len: u64) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}
