//! The writer's VFS: the default one, except that a commit's appends to
//! the WAL reach the kernel as one `pwrite` instead of two a page.
//!
//! SQLite writes each WAL frame as two writes (its 24-byte header, then
//! the page), each a system call: a create at 16 connections dirtied about
//! 19 pages, so about 38 `pwrite`s, half of the writer thread's time. Here
//! the writer's WAL file gathers writes that continue the previous one in a
//! buffer (at most [`MAX_PENDING`] bytes, written in pieces of at most
//! [`MAX_WRITE`]), and hands them to the kernel
//! before anything that could observe the file: a read, a sync, a size, a
//! truncation, a file control, closing, or a write elsewhere.
//!
//! Why readers never see a frame still in the buffer: other connections
//! learn of new frames only from the WAL index, which the writer updates
//! after the commit's sync (`synchronous=FULL`, set by `open_writer`), and
//! the sync empties the buffer first. Every other file (the database, its
//! shared memory, journals) is the default VFS's own file, untouched.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The VFS's name, for `Connection::open_with_flags_and_vfs`.
pub(crate) const NAME: &CStr = c"tarn-coalesced-wal";

/// The most bytes gathered before they are written anyway.
const MAX_PENDING: usize = 4 << 20;

/// The most bytes one write hands the default VFS: its `unixWrite` writes
/// only the low 17 bits of a length (`seekAndWriteFd`), and answers
/// `SQLITE_FULL` for the rest.
const MAX_WRITE: usize = 0x1_ffff;

/// The default VFS, which does the work.
static DEFAULT: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

/// A WAL file of this VFS: the default VFS's file follows it in the same
/// allocation, at [`REAL_AT`].
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    /// Bytes written but not yet handed to the kernel, to go at `at`.
    pending: Vec<u8>,
    at: i64,
}

const REAL_AT: usize = (std::mem::size_of::<WalFile>() + 15) & !15;

/// Registers the VFS once per process (not as the default).
pub(crate) fn register() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find initialises SQLite and returns a VFS
        // that lives as long as the process; the copy made of it is leaked
        // on purpose, as SQLite keeps a pointer to it.
        unsafe {
            let default = ffi::sqlite3_vfs_find(ptr::null());
            if default.is_null() {
                return Err("SQLite has no default VFS".into());
            }
            DEFAULT.store(default, Ordering::Release);
            let mut vfs = *default;
            vfs.szOsFile = (REAL_AT + (*default).szOsFile as usize) as c_int;
            vfs.zName = NAME.as_ptr();
            vfs.pNext = ptr::null_mut();
            vfs.xOpen = Some(open);
            let rc = ffi::sqlite3_vfs_register(Box::leak(Box::new(vfs)), 0);
            if rc != ffi::SQLITE_OK {
                return Err(format!("registering the writer's VFS failed: {rc}"));
            }
        }
        Ok(())
    })
    .clone()
}

fn default_vfs() -> *mut ffi::sqlite3_vfs {
    DEFAULT.load(Ordering::Acquire)
}

/// The default VFS's file inside one of ours.
///
/// # Safety
/// `file` is a `WalFile` this VFS opened.
unsafe fn real(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    unsafe { file.cast::<u8>().add(REAL_AT).cast() }
}

/// The default VFS's methods of the file inside one of ours.
///
/// # Safety
/// `file` is a `WalFile` this VFS opened and has not closed.
unsafe fn methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    unsafe { &*(*real(file)).pMethods }
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let default = default_vfs();
    // SAFETY: SQLite gives `file` szOsFile bytes, enough for the default
    // VFS's file at its start or after a WalFile.
    unsafe {
        let open = (*default).xOpen.expect("every VFS opens files");
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            // Not a WAL: the default VFS's file itself, methods and all.
            return open(default, name, file, flags, out_flags);
        }
        (*file).pMethods = ptr::null();
        let real = real(file);
        (*real).pMethods = ptr::null();
        let rc = open(default, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            if !(*real).pMethods.is_null() {
                if let Some(close) = (*(*real).pMethods).xClose {
                    close(real);
                }
            }
            return rc;
        }
        ptr::write(
            file.cast::<WalFile>(),
            WalFile {
                base: ffi::sqlite3_file {
                    pMethods: &WAL_METHODS,
                },
                pending: Vec::new(),
                at: 0,
            },
        );
        ffi::SQLITE_OK
    }
}

/// Hands the gathered bytes to the kernel, in writes of at most
/// [`MAX_WRITE`] bytes. On failure they are dropped: the commit that wrote
/// them fails, and SQLite writes those frames again.
///
/// # Safety
/// `file` is an open `WalFile`.
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let wal = &mut *file.cast::<WalFile>();
        let write = methods(file).xWrite.expect("files are written");
        let mut rc = ffi::SQLITE_OK;
        let mut at = wal.at;
        for piece in wal.pending.chunks(MAX_WRITE) {
            rc = write(real(file), piece.as_ptr().cast(), piece.len() as c_int, at);
            if rc != ffi::SQLITE_OK {
                break;
            }
            at += piece.len() as i64;
        }
        wal.pending.clear();
        rc
    }
}

macro_rules! flushed {
    ($file:expr) => {{
        let rc = flush($file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }};
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let flushed = flush(file);
        let closed = (methods(file).xClose.expect("files close"))(real(file));
        ptr::drop_in_place(file.cast::<WalFile>());
        (*file).pMethods = ptr::null();
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    unsafe {
        flushed!(file);
        (methods(file).xRead.expect("files are read"))(real(file), buf, amount, offset)
    }
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // Fields are reached through the raw pointer, never a reference held
    // across `flush`, which takes its own.
    unsafe {
        let wal = file.cast::<WalFile>();
        let n = amount.max(0) as usize;
        let gathered = (*wal).pending.len();
        let follows = gathered > 0 && offset == (*wal).at + gathered as i64;
        if !follows || gathered + n > MAX_PENDING {
            flushed!(file);
            (*wal).at = offset;
        }
        (*wal)
            .pending
            .extend_from_slice(std::slice::from_raw_parts(buf.cast::<u8>(), n));
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    unsafe {
        flushed!(file);
        (methods(file).xTruncate.expect("files are truncated"))(real(file), size)
    }
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    unsafe {
        flushed!(file);
        (methods(file).xSync.expect("files are synced"))(real(file), flags)
    }
}

unsafe extern "C" fn file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    unsafe {
        flushed!(file);
        (methods(file).xFileSize.expect("files have sizes"))(real(file), size)
    }
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    unsafe { (methods(file).xLock.expect("files lock"))(real(file), level) }
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    unsafe { (methods(file).xUnlock.expect("files unlock"))(real(file), level) }
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    unsafe { (methods(file).xCheckReservedLock.expect("files check locks"))(real(file), out) }
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    unsafe {
        flushed!(file);
        (methods(file).xFileControl.expect("files take controls"))(real(file), op, arg)
    }
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe { (methods(file).xSectorSize.expect("files have sectors"))(real(file)) }
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        (methods(file)
            .xDeviceCharacteristics
            .expect("files have characteristics"))(real(file))
    }
}

/// The WAL's methods: version 1, since a WAL file has no shared memory or
/// memory map of its own (those belong to the database file).
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

#[cfg(test)]
mod tests {
    use rusqlite::{Connection, OpenFlags};

    /// Write system calls made by this thread so far.
    fn writes_so_far() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").expect("Linux task I/O counters");
        io.lines()
            .find_map(|l| l.strip_prefix("syscw: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("a syscw line")
    }

    /// Commits 40 transactions of 20 rows scattered over the table, each
    /// read back at once by a connection of the default VFS; answers the
    /// write system calls they took.
    fn commit_scattered(vfs: Option<&std::ffi::CStr>) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let conn = match vfs {
            Some(name) => {
                Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), name).unwrap()
            }
            None => Connection::open(&path).unwrap(),
        };
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "FULL").unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn.execute_batch("CREATE TABLE t (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
            .unwrap();
        // 2,000 rows of 300 bytes first: about 150 leaf pages to scatter over.
        conn.execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 1999)
             INSERT INTO t SELECT randomblob(16), zeroblob(300) FROM n",
        )
        .unwrap();
        let reader = Connection::open(&path).unwrap();
        let before = writes_so_far();
        for round in 0..40i64 {
            conn.execute_batch("BEGIN").unwrap();
            for _ in 0..20 {
                conn.execute("INSERT INTO t VALUES (randomblob(16), zeroblob(300))", [])
                    .unwrap();
            }
            conn.execute(
                "INSERT INTO t VALUES (?1, zeroblob(1))",
                [round.to_be_bytes()],
            )
            .unwrap();
            conn.execute_batch("COMMIT").unwrap();
            let seen: i64 = reader
                .query_row(
                    "SELECT count(*) FROM t WHERE k = ?1",
                    [round.to_be_bytes()],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(seen, 1, "a reader sees commit {round} at once");
        }
        let writes = writes_so_far() - before;
        let count: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, 2000 + 40 * 21);
        let check: String = reader
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        writes
    }

    #[test]
    fn a_commit_reaches_the_wal_in_one_write() {
        super::register().unwrap();
        let plain = commit_scattered(None);
        let coalesced = commit_scattered(Some(super::NAME));
        // Plainly, two writes a dirty page (about 20 pages a commit); here
        // one a commit.
        assert!(plain >= 40 * 20, "plain: {plain} writes");
        assert!(coalesced <= 40 * 2, "coalesced: {coalesced} writes");
    }
}
