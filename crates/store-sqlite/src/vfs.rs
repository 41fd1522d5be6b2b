//! The store's VFS: SQLite's default one, with three changes.
//!
//! **A commit's appends to the WAL reach the kernel in one `pwrite`** (one
//! per [`MAX_WRITE`] bytes) instead of two a page. SQLite writes each WAL frame as two writes (its
//! 24-byte header, then the page), each a system call: a create at 16
//! connections dirtied about 19 pages, so about 38 `pwrite`s, a third of
//! the writer thread's time. Here a WAL file gathers writes that continue
//! the previous one in a buffer (at most [`MAX_PENDING`] bytes, written in
//! pieces of at most [`MAX_WRITE`]), and hands them to the kernel before
//! anything that could observe the file: a read, a sync, a size, a
//! truncation, a file control, closing, or a write elsewhere. Readers never
//! see a frame still in the buffer: other connections learn of new frames
//! only from the WAL index, which the writer updates after the commit's
//! sync, and the sync empties the buffer first. That needs the WAL synced
//! at every commit: a database file of this VFS refuses
//! `PRAGMA synchronous` below `FULL` (and `open_writer` sets `FULL`). A
//! write of gathered bytes that fails answers `SQLITE_IOERR_WRITE`, which
//! makes SQLite roll the whole transaction back: frames it believed
//! written are never left out of a commit.
//!
//! **Readers share one memory map of the database, made once** ([`Map`]).
//! SQLite's own VFS maps the file once per connection, and a read
//! transaction that finds any new commit makes it drop that whole map
//! (`pagerBeginReadTransaction` calls `xUnfetch(0, 0)`): under writes every
//! read paid a `munmap`, TLB shootdowns on every core and page faults to
//! map the file again; and with a map per connection each of the sixteen
//! readers faulted every page into its own map, and each counted it in
//! the process's resident memory (1.4 GiB for a 100 MB file after a
//! `tarn bench kenai`). Here the first read of a page by any connection
//! maps a range far larger than the file, once, and every connection reads
//! its pages there until the last one closes. The file grows into the
//! range without a new map: a page past the size last seen is checked
//! against the file's size first. Pages in the database file do not change
//! under a map while a reader needs them (a checkpoint writes back only
//! frames no reader's snapshot predates, and the kernel's page cache keeps
//! a shared map and `pwrite` coherent). Nothing here ever shrinks the file
//! (no `VACUUM`, no auto-vacuum, and a checkpoint truncates it only to its
//! page count, which never falls), so no page handed out is ever past its
//! end.
//!
//! **The WAL's locks are counts in this process** ([`ShmLocks`]), taken
//! without a mutex or a system call. Connections of any other VFS, in this
//! process or another (a `sqlite3` shell, a backup tool), could not see
//! them: so the first connection of the store to map the shared memory
//! also takes every one of those locks exclusively through the default
//! VFS, and keeps them, and such a connection is answered `SQLITE_BUSY`
//! instead of reading or writing beside the store.
//!
//! Every other file (journals, shared memory) is the default VFS's own.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use rusqlite::ffi;

/// The VFS's name, for `Connection::open_with_flags_and_vfs`.
pub(crate) const NAME: &CStr = c"tarn";

/// The most bytes gathered before they are written anyway.
const MAX_PENDING: usize = 4 << 20;

/// The address range reserved for a database's map: the largest file read
/// through it (past it, pages are read with `pread`). Only the pages read
/// take memory. Where the process may not reserve that much, half as much
/// is tried, down to [`LEAST_MAP`]; below that, nothing is mapped.
const MAP_RANGE: usize = if usize::BITS >= 64 {
    1 << (40 % usize::BITS)
} else {
    1 << 30
};
/// The smallest range tried for a map.
const LEAST_MAP: usize = 1 << 30;

/// Bytes the map must hold past a page it hands out, as SQLite's own VFS
/// asks of its map (`nEofBuffer`): reading a corrupt page may run a little
/// past its end, which SQLite reports, where a read past the end of the
/// file through the map would kill the process.
const MAP_SLACK: i64 = 256;

/// The most bytes one write hands the default VFS: its `unixWrite` writes
/// only the low 17 bits of a length (`seekAndWriteFd`), and answers
/// `SQLITE_FULL` for the rest.
const MAX_WRITE: usize = 0x1_ffff;

/// The default VFS, which does the work.
static DEFAULT: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

/// A WAL or main database file of this VFS: the default VFS's file follows
/// it in the same allocation, at [`REAL_AT`].
#[repr(C)]
struct OurFile {
    base: ffi::sqlite3_file,
    /// A WAL's bytes written but not yet handed to the kernel, to go at
    /// `at`.
    pending: Vec<u8>,
    at: i64,
    /// A database file's share of what every connection of this process to
    /// it shares, and the shared-memory locks this connection holds
    /// (shared, exclusive; a bit a lock).
    db: Option<Arc<Database>>,
    shared_mask: u32,
    excl_mask: u32,
    /// Whether this connection holds [`ShmLocks::guarded`]'s locks.
    guards: bool,
}

/// The shared-memory locks of one database (the WAL's write, checkpoint
/// and recovery locks and its read marks' locks), for every connection of
/// this process to it: a count of shared holders each, or -1 for an
/// exclusive one.
///
/// SQLite's unix VFS keeps the same counts behind a mutex and mirrors them
/// in `fcntl` locks for other processes: every read transaction took that
/// mutex (contended, so a `futex` call and a wake-up on the other core) and
/// usually two `fcntl` calls, about a tenth of an item read's CPU under
/// wrk. No other process opens the database while a store has it open (the
/// `LOCK` file of its directory), so the counts are enough. The database
/// file's own lock, and the one SQLite takes on shared memory to tell
/// whether it is the first to open it (after a crash: recovery), are still
/// the default VFS's `fcntl` locks.
struct ShmLocks {
    slots: [AtomicI32; NLOCKS],
    /// Whether a connection holds the default VFS's locks (all of them,
    /// exclusively) for the store's connections, against everyone else's.
    guarded: AtomicBool,
}

const NLOCKS: usize = ffi::SQLITE_SHM_NLOCK as usize;

/// What every connection of this process to one database shares.
struct Database {
    /// The database file's full path.
    path: Vec<u8>,
    locks: ShmLocks,
    /// Made at the first page read through it.
    map: OnceLock<Map>,
}

/// The databases open in this process: read and changed only when a
/// database file is opened or closed.
static DATABASES: Mutex<Vec<Weak<Database>>> = Mutex::new(Vec::new());

/// The database at `path`, shared with every connection of this process to
/// it.
fn database(path: &[u8]) -> Arc<Database> {
    let mut all = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    if let Some(db) = all
        .iter()
        .filter_map(Weak::upgrade)
        .find(|db| db.path == path)
    {
        return db;
    }
    let db = Arc::new(Database {
        path: path.to_vec(),
        locks: ShmLocks {
            slots: std::array::from_fn(|_| AtomicI32::new(0)),
            guarded: AtomicBool::new(false),
        },
        map: OnceLock::new(),
    });
    all.push(Arc::downgrade(&db));
    db
}

/// A read-only map of a database file over [`MAP_RANGE`] bytes (or less,
/// see there), whatever the file's size, kept until the last connection to
/// the database closes.
struct Map {
    /// The range's start; null when nothing could be mapped.
    base: *mut u8,
    len: usize,
    /// Bytes the file was last seen to hold: it only grows.
    seen: AtomicI64,
}

// SAFETY: the range is only read, and only unmapped when the map is
// dropped, after every connection that read through it has closed.
unsafe impl Send for Map {}
unsafe impl Sync for Map {}

/// The descriptor of the default VFS's file `real`, if it is the file at
/// `path`. SQLite has no call that answers it: it is the fourth field of
/// its `unixFile`, after three pointers, and checked here by device and
/// inode against the path, so that a SQLite of another layout maps
/// nothing rather than something else.
///
/// The map must use SQLite's own descriptor: opening the file once more
/// and closing that descriptor would drop every `fcntl` lock this process
/// holds on the file (POSIX locks belong to the process, not to a
/// descriptor), and with them the locks that keep other processes off the
/// store (see [`ShmLocks`]).
///
/// # Safety
/// `real` is an open file of the default unix VFS.
unsafe fn descriptor(real: *mut ffi::sqlite3_file, path: &[u8]) -> Option<c_int> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let at = 3 * std::mem::size_of::<*const c_void>();
    // SAFETY: the default VFS's files are `szOsFile` bytes, checked to
    // reach past the field read.
    let fd = unsafe {
        if ((*default_vfs()).szOsFile as usize) < at + std::mem::size_of::<c_int>() {
            return None;
        }
        ptr::read_unaligned(real.cast::<u8>().add(at).cast::<c_int>())
    };
    let named = std::fs::metadata(std::ffi::OsStr::from_bytes(path)).ok()?;
    // SAFETY: `fstat` only writes the buffer it is given.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let same = fd >= 0
        && unsafe { libc::fstat(fd, &mut st) } == 0
        && st.st_dev == named.dev()
        && st.st_ino == named.ino();
    same.then_some(fd)
}

impl Map {
    /// Maps the database file that `fd` (SQLite's own descriptor, see
    /// [`descriptor`]) has open; nothing when `fd` is `None`.
    fn new(fd: Option<c_int>) -> Map {
        let mut map = Map {
            base: ptr::null_mut(),
            len: 0,
            seen: AtomicI64::new(0),
        };
        let Some(fd) = fd else {
            tracing::warn!("sqlite: the database file could not be mapped; pages are read instead");
            return map;
        };
        let mut len = MAP_RANGE;
        while len >= LEAST_MAP {
            // SAFETY: a new read-only shared map of an open file, at an
            // address the kernel picks; past the file's end it is only
            // ever read once the file has grown there (`Map::at`).
            let p = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                map.base = p.cast();
                map.len = len;
                break;
            }
            len /= 2;
        }
        if map.base.is_null() {
            tracing::warn!(
                "sqlite: no address range for a map of the database; pages are read instead"
            );
        }
        map
    }

    /// Where `amount` bytes at `offset` are, if the map covers them and the
    /// file holds them, [`MAP_SLACK`] more included (`size` answers the
    /// file's size now); else null.
    fn at(&self, offset: i64, amount: c_int, size: impl FnOnce() -> Option<i64>) -> *mut c_void {
        let end = offset
            .saturating_add(i64::from(amount))
            .saturating_add(MAP_SLACK);
        if self.base.is_null() || offset < 0 || end > self.len as i64 {
            return ptr::null_mut();
        }
        if end > self.seen.load(Ordering::Acquire) {
            let Some(size) = size() else {
                return ptr::null_mut();
            };
            self.seen.fetch_max(size, Ordering::AcqRel);
            if end > size {
                return ptr::null_mut();
            }
        }
        // SAFETY: `offset` is within the mapped range (checked above).
        unsafe { self.base.add(offset as usize).cast() }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        if !self.base.is_null() {
            // SAFETY: the range this map made; nothing reads it any more.
            unsafe { libc::munmap(self.base.cast(), self.len) };
        }
    }
}

const REAL_AT: usize = (std::mem::size_of::<OurFile>() + 15) & !15;

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
                return Err(format!("registering the store's VFS failed: {rc}"));
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
/// `file` is an `OurFile` this VFS opened.
unsafe fn real(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    unsafe { file.cast::<u8>().add(REAL_AT).cast() }
}

/// The default VFS's methods of the file inside one of ours.
///
/// # Safety
/// `file` is an `OurFile` this VFS opened and has not closed.
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
    // VFS's file at its start or after an OurFile.
    unsafe {
        let open = (*default).xOpen.expect("every VFS opens files");
        let ours: &'static ffi::sqlite3_io_methods = if flags & ffi::SQLITE_OPEN_WAL != 0 {
            &WAL_METHODS
        } else if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
            &DB_METHODS
        } else {
            // The default VFS's file itself, methods and all.
            return open(default, name, file, flags, out_flags);
        };
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
        // A main database always has a name: the full path.
        let db = (flags & ffi::SQLITE_OPEN_MAIN_DB != 0)
            .then(|| database(CStr::from_ptr(name).to_bytes()));
        ptr::write(
            file.cast::<OurFile>(),
            OurFile {
                base: ffi::sqlite3_file { pMethods: ours },
                pending: Vec::new(),
                at: 0,
                db,
                shared_mask: 0,
                excl_mask: 0,
                guards: false,
            },
        );
        ffi::SQLITE_OK
    }
}

/// Hands a WAL's gathered bytes to the kernel, in writes of at most
/// [`MAX_WRITE`] bytes (a database file never has any). On failure they
/// are dropped and the answer is `SQLITE_IOERR_WRITE`, whatever the
/// write's own error (`SQLITE_FULL` included): an I/O error always rolls
/// the whole transaction back, where `SQLITE_FULL` met by a read (a flush
/// before it) might undo only one statement and let frames the WAL index
/// already counts be committed unwritten. Later transactions write those
/// frames again.
///
/// # Safety
/// `file` is an open `OurFile`.
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let ours = &mut *file.cast::<OurFile>();
        let write = methods(file).xWrite.expect("files are written");
        let mut rc = ffi::SQLITE_OK;
        let mut at = ours.at;
        for piece in ours.pending.chunks(MAX_WRITE) {
            rc = write(real(file), piece.as_ptr().cast(), piece.len() as c_int, at);
            if rc != ffi::SQLITE_OK {
                rc = ffi::SQLITE_IOERR_WRITE;
                break;
            }
            at += piece.len() as i64;
        }
        ours.pending.clear();
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
        release_all(file);
        let flushed = flush(file);
        let closed = (methods(file).xClose.expect("files close"))(real(file));
        ptr::drop_in_place(file.cast::<OurFile>());
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

unsafe extern "C" fn wal_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // Fields are reached through the raw pointer, never a reference held
    // across `flush`, which takes its own.
    unsafe {
        let ours = file.cast::<OurFile>();
        let n = amount.max(0) as usize;
        let gathered = (*ours).pending.len();
        let follows = gathered > 0 && offset == (*ours).at + gathered as i64;
        if !follows || gathered + n > MAX_PENDING {
            flushed!(file);
            (*ours).at = offset;
        }
        (*ours)
            .pending
            .extend_from_slice(std::slice::from_raw_parts(buf.cast::<u8>(), n));
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn db_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    unsafe { (methods(file).xWrite.expect("files are written"))(real(file), buf, amount, offset) }
}

/// `xUnfetch`: nothing to do. A page given back stays mapped, and when
/// SQLite asks to drop the whole map (`p` null) the map stays too: it is
/// every connection's, until the last one closes ([`Map`]).
unsafe extern "C" fn db_unfetch(
    _file: *mut ffi::sqlite3_file,
    _offset: i64,
    _p: *mut c_void,
) -> c_int {
    ffi::SQLITE_OK
}

/// `xFetch`: a page from the map every connection of this process to the
/// database shares ([`Map`]), or none (then SQLite reads it). SQLite only
/// asks for pages of its snapshot that are not in the WAL, which the file
/// holds. The default VFS's own map is never made.
unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    unsafe {
        *out = ptr::null_mut();
        if let Some(db) = (*file.cast::<OurFile>()).db.as_deref() {
            let size = || {
                let mut size = 0;
                let rc =
                    (methods(file).xFileSize.expect("files have sizes"))(real(file), &mut size);
                (rc == ffi::SQLITE_OK).then_some(size)
            };
            *out = db
                .map
                .get_or_init(|| Map::new(descriptor(real(file), &db.path)))
                .at(offset, amount, size);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    unsafe {
        let rc = (methods(file).xShmMap.expect("database files share memory"))(
            real(file),
            region,
            size,
            extend,
            out,
        );
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let ours = file.cast::<OurFile>();
        let Some(locks) = (*ours).db.as_deref().map(|db| &db.locks) else {
            return ffi::SQLITE_IOERR_SHMMAP;
        };
        if !(*ours).guards && !locks.guarded.swap(true, Ordering::SeqCst) {
            // The first connection to map takes the default VFS's locks,
            // all of them: any other VFS's connection, here or in another
            // process, then finds every lock held.
            let lock = methods(file).xShmLock.expect("database files lock memory");
            let rc = lock(
                real(file),
                0,
                NLOCKS as c_int,
                ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE,
            );
            if rc != ffi::SQLITE_OK {
                locks.guarded.store(false, Ordering::SeqCst);
                return rc;
            }
            (*ours).guards = true;
        }
        ffi::SQLITE_OK
    }
}

/// `xShmLock`, on [`ShmLocks`]: never waits, answers `SQLITE_BUSY` when
/// another connection holds a lock in the way, as the default VFS does.
unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        let ours = file.cast::<OurFile>();
        let Some(locks) = (*ours).db.as_deref().map(|db| &db.locks) else {
            return ffi::SQLITE_IOERR_SHMLOCK;
        };
        if offset < 0 || n < 1 || (offset + n) as usize > NLOCKS {
            return ffi::SQLITE_IOERR_SHMLOCK;
        }
        let range = offset as usize..(offset + n) as usize;
        let mask = range.clone().fold(0u32, |m, i| m | 1 << i);
        if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
            for i in range {
                if (*ours).shared_mask & 1 << i != 0 {
                    locks.slots[i].fetch_sub(1, Ordering::SeqCst);
                } else if (*ours).excl_mask & 1 << i != 0 {
                    locks.slots[i].store(0, Ordering::SeqCst);
                }
            }
            (*ours).shared_mask &= !mask;
            (*ours).excl_mask &= !mask;
            return ffi::SQLITE_OK;
        }
        if flags & ffi::SQLITE_SHM_SHARED != 0 {
            for i in range {
                if (*ours).shared_mask & 1 << i != 0 {
                    continue;
                }
                let taken = locks.slots[i].fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                    (v >= 0).then_some(v + 1)
                });
                if taken.is_err() {
                    return ffi::SQLITE_BUSY;
                }
                (*ours).shared_mask |= 1 << i;
            }
            return ffi::SQLITE_OK;
        }
        let mut taken = 0u32;
        for i in range {
            if (*ours).excl_mask & 1 << i != 0 {
                continue;
            }
            if locks.slots[i]
                .compare_exchange(0, -1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                for j in 0..NLOCKS {
                    if taken & 1 << j != 0 {
                        locks.slots[j].store(0, Ordering::SeqCst);
                    }
                }
                return ffi::SQLITE_BUSY;
            }
            taken |= 1 << i;
        }
        (*ours).excl_mask |= mask;
        ffi::SQLITE_OK
    }
}

/// Gives back every shared-memory lock the connection still holds, and
/// the default VFS's locks if it holds them (unmapping gives them back).
///
/// # Safety
/// `file` is an open `OurFile`.
unsafe fn release_all(file: *mut ffi::sqlite3_file) {
    unsafe {
        let ours = file.cast::<OurFile>();
        if (*ours).guards {
            (*ours).guards = false;
            let lock = methods(file).xShmLock.expect("database files lock memory");
            lock(
                real(file),
                0,
                NLOCKS as c_int,
                ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE,
            );
            if let Some(db) = (*ours).db.as_deref() {
                db.locks.guarded.store(false, Ordering::SeqCst);
            }
        }
        if (*ours).db.is_some() && ((*ours).shared_mask | (*ours).excl_mask) != 0 {
            shm_lock(
                file,
                0,
                NLOCKS as c_int,
                ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_SHARED,
            );
        }
    }
}

/// `xShmBarrier`: a full memory fence. (The default VFS's also takes and
/// drops a process-wide mutex, and every read transaction calls it.)
unsafe extern "C" fn shm_barrier(_file: *mut ffi::sqlite3_file) {
    std::sync::atomic::fence(Ordering::SeqCst);
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    unsafe {
        release_all(file);
        (methods(file)
            .xShmUnmap
            .expect("database files share memory"))(real(file), delete)
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
        if op == ffi::SQLITE_FCNTL_PRAGMA && !arg.is_null() {
            // azArg: [0] the error to answer, [1] the pragma, [2] its value.
            let args = arg.cast::<*mut std::ffi::c_char>();
            let (name, value) = (*args.add(1), *args.add(2));
            if !name.is_null()
                && !value.is_null()
                && CStr::from_ptr(name)
                    .to_bytes()
                    .eq_ignore_ascii_case(b"synchronous")
                && !syncs_every_commit(CStr::from_ptr(value).to_bytes())
            {
                *args = ffi::sqlite3_mprintf(
                    c"the store's VFS needs synchronous=FULL or EXTRA (the WAL synced at every commit)"
                        .as_ptr(),
                );
                return ffi::SQLITE_ERROR;
            }
        }
        (methods(file).xFileControl.expect("files take controls"))(real(file), op, arg)
    }
}

/// Whether a `synchronous` setting syncs the WAL at every commit.
fn syncs_every_commit(value: &[u8]) -> bool {
    [b"full".as_slice(), b"extra", b"2", b"3"]
        .iter()
        .any(|v| value.eq_ignore_ascii_case(v))
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

/// A WAL's methods: version 1, since a WAL file has no shared memory or
/// memory map of its own (those belong to the database file).
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(wal_write),
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

/// A database file's methods: the default VFS's (version 3), with
/// [`db_unfetch`]. Nothing is ever gathered for a database file, so the
/// methods shared with the WAL flush nothing here.
static DB_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(db_write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(db_unfetch),
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
        // The reader on the same VFS: the store's VFS refuses others.
        let reader = match vfs {
            Some(name) => {
                Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), name).unwrap()
            }
            None => Connection::open(&path).unwrap(),
        };
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
        // one a commit, two or three for a commit whose page splits pass
        // `MAX_WRITE` bytes (a clean-clone run once counted 81).
        assert!(plain >= 40 * 20, "plain: {plain} writes");
        assert!(coalesced <= 40 * 3, "coalesced: {coalesced} writes");
    }
}

#[cfg(test)]
mod map_tests {
    use rusqlite::{Connection, OpenFlags};

    /// Minor page faults this thread has taken so far.
    fn faults_so_far() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("Linux task stat");
        // Fields after the command's closing parenthesis: state is the 3rd
        // field of the line, minflt the 10th.
        let rest = &stat[stat.rfind(')').expect("a command") + 2..];
        rest.split(' ')
            .nth(7)
            .and_then(|n| n.parse().ok())
            .expect("minflt")
    }

    /// Sums every value of `t` in one read transaction.
    fn read_all(reader: &Connection) -> (i64, i64) {
        reader
            .query_row("SELECT count(*), sum(length(v)) FROM t", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap()
    }

    /// Reads a 3 MiB table through a map after each of five commits by
    /// another connection; answers the page faults those reads took, and
    /// checks what each read saw.
    fn faults_reading_after_commits(vfs: Option<&std::ffi::CStr>) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let writer = match vfs {
            Some(name) => {
                Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), name).unwrap()
            }
            None => Connection::open(&path).unwrap(),
        };
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer
            .execute_batch(
                "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);
                 WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 2999)
                 INSERT INTO t SELECT i, zeroblob(1000) FROM n;
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let reader = match vfs {
            Some(name) => Connection::open_with_flags_and_vfs(&path, flags, name).unwrap(),
            None => Connection::open_with_flags(&path, flags).unwrap(),
        };
        reader.pragma_update(None, "mmap_size", 1i64 << 30).unwrap();
        assert_eq!(read_all(&reader), (3000, 3_000_000));
        let before = faults_so_far();
        for round in 1..=5 {
            writer
                .execute(
                    "INSERT INTO t VALUES (?1, zeroblob(1000))",
                    [10_000 + round],
                )
                .unwrap();
            assert_eq!(read_all(&reader), (3000 + round, (3000 + round) * 1000));
        }
        let faults = faults_so_far() - before;
        // The file grows by 12 MB past what the map saw, and the reader
        // sees all of it.
        writer
            .execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 11999)
                 INSERT INTO t SELECT 20000 + i, zeroblob(1000) FROM n;
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        assert_eq!(read_all(&reader), (15_005, 15_005_000));
        writer
            .execute("DELETE FROM t WHERE k >= 20000", [])
            .unwrap();
        writer
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        assert_eq!(read_all(&reader), (3005, 3_005_000));
        faults
    }

    /// Maps of `path` in this process.
    fn maps_of(path: &std::path::Path) -> usize {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("Linux maps");
        let path = path.to_str().expect("a UTF-8 temp path");
        maps.lines().filter(|l| l.ends_with(path)).count()
    }

    /// Eight readers, open together, each read a 3 MB table through a map,
    /// one after the other on this thread; answers the page faults the
    /// first one took, those the seven others took, and the file's maps.
    fn eight_readers(vfs: Option<&std::ffi::CStr>) -> (u64, u64, usize) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let writer = Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);
                 WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 2999)
                 INSERT INTO t SELECT i, zeroblob(1000) FROM n;
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        drop(writer);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let readers: Vec<Connection> = (0..8)
            .map(|_| {
                let reader = match vfs {
                    Some(name) => Connection::open_with_flags_and_vfs(&path, flags, name),
                    None => Connection::open_with_flags(&path, flags),
                }
                .unwrap();
                reader.pragma_update(None, "mmap_size", 1i64 << 30).unwrap();
                reader
            })
            .collect();
        let start = faults_so_far();
        assert_eq!(read_all(&readers[0]), (3000, 3_000_000));
        let first = faults_so_far() - start;
        for reader in &readers[1..] {
            assert_eq!(read_all(reader), (3000, 3_000_000));
        }
        let others = faults_so_far() - start - first;
        (first, others, maps_of(&path))
    }

    #[test]
    fn readers_share_one_map() {
        super::register().unwrap();
        let (first, others, maps) = eight_readers(None);
        eprintln!("SQLite's own VFS: {first} faults, then {others}, {maps} maps");
        assert_eq!(maps, 8, "SQLite's own VFS maps the file once a connection");
        assert!(
            others >= 5 * first,
            "SQLite's own VFS: {first}, then {others} faults"
        );
        let (first, others, maps) = eight_readers(Some(super::NAME));
        eprintln!("the store's VFS: {first} faults, then {others}, {maps} maps");
        assert_eq!(maps, 1, "the store's VFS maps the file once");
        assert!(
            others <= first / 2,
            "the store's VFS: {first}, then {others} faults"
        );
    }

    /// Mapping the file keeps the process's locks on it: a read through
    /// the map, then another descriptor asks whether the database's shared
    /// lock (`SHARED_FIRST`, 510 bytes) is held against a write lock.
    #[test]
    fn the_map_keeps_the_locks_on_the_file() {
        use std::os::fd::AsRawFd;
        super::register().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let writer =
            Connection::open_with_flags_and_vfs(&path, OpenFlags::default(), super::NAME).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);
                 INSERT INTO t VALUES (1, zeroblob(1000));
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let reader = Connection::open_with_flags_and_vfs(&path, flags, super::NAME).unwrap();
        reader.pragma_update(None, "mmap_size", 1i64 << 30).unwrap();
        assert_eq!(read_all(&reader), (1, 1000));
        assert_eq!(maps_of(&path), 1, "read through the map");
        let other = std::fs::File::open(&path).unwrap();
        // SAFETY: `fcntl` only fills the lock description it is given.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = 0x4000_0002;
        lock.l_len = 510;
        let rc = unsafe { libc::fcntl(other.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) };
        assert_eq!(rc, 0);
        assert_ne!(
            lock.l_type,
            libc::F_UNLCK as libc::c_short,
            "the shared lock is gone"
        );
        drop(other);
        drop((reader, writer));
    }

    #[test]
    fn a_reader_keeps_its_map_across_commits() {
        super::register().unwrap();
        let dropped = faults_reading_after_commits(None);
        let kept = faults_reading_after_commits(Some(super::NAME));
        // About 750 pages of 4 KiB mapped again after each commit with
        // SQLite's own VFS (a fault maps 16 of them: the kernel's
        // fault-around); with the map kept, none of them.
        eprintln!("faults: SQLite's own VFS {dropped}, the store's {kept}");
        assert!(dropped >= 5 * 30, "SQLite's own VFS: {dropped} faults");
        assert!(kept <= dropped / 10, "the store's VFS: {kept} faults");
    }
}

#[cfg(test)]
mod lock_tests {
    use rusqlite::{Connection, OpenFlags};

    fn open(path: &std::path::Path) -> Connection {
        Connection::open_with_flags_and_vfs(path, OpenFlags::default(), super::NAME).unwrap()
    }

    /// A reader's snapshot holds, through the store's own locks, against
    /// another connection's commits and its attempts to restart the WAL;
    /// once the reader is done, the restart goes through.
    #[test]
    fn a_reader_holds_its_snapshot_against_a_restart() {
        super::register().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let writer = open(&path);
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer.pragma_update(None, "synchronous", "FULL").unwrap();
        writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer.busy_timeout(std::time::Duration::ZERO).unwrap();
        writer
            .execute_batch(
                "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'old');",
            )
            .unwrap();
        let reader = open(&path);
        let count = |c: &Connection| -> i64 {
            c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap()
        };
        reader.execute_batch("BEGIN").unwrap();
        assert_eq!(count(&reader), 1);
        writer
            .execute("INSERT INTO t VALUES (2, 'new')", [])
            .unwrap();
        // RESTART needs every reader on the last snapshot: answered busy (1).
        let busy: i64 = writer
            .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get(0))
            .unwrap();
        assert_eq!(busy, 1, "the reader's snapshot holds the restart off");
        assert_eq!(count(&reader), 1, "the reader still sees its snapshot");
        reader.execute_batch("COMMIT").unwrap();
        assert_eq!(count(&reader), 2);
        let busy: i64 = writer
            .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get(0))
            .unwrap();
        assert_eq!(busy, 0, "with the reader done, the WAL restarts");
        // A second writer is refused while the first holds the write lock.
        let other = open(&path);
        other.busy_timeout(std::time::Duration::ZERO).unwrap();
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        let refused = other.execute_batch("BEGIN IMMEDIATE");
        assert!(refused.is_err(), "two writers at once");
        writer.execute_batch("COMMIT").unwrap();
        other
            .execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (3, 'x'); COMMIT")
            .unwrap();
        assert_eq!(count(&reader), 3);
    }

    /// A connection of another VFS (SQLite's own, as a `sqlite3` shell or a
    /// backup tool would open the file) cannot read or write beside the
    /// store's connections, whose locks it could not see: it is refused.
    #[test]
    fn another_vfs_is_refused_beside_the_store() {
        super::register().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let ours = open(&path);
        ours.pragma_update(None, "journal_mode", "WAL").unwrap();
        ours.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY); INSERT INTO t VALUES (1);")
            .unwrap();
        let theirs = Connection::open(&path).unwrap();
        theirs.busy_timeout(std::time::Duration::ZERO).unwrap();
        let read = theirs.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0));
        assert!(read.is_err(), "another VFS read beside the store: {read:?}");
        let wrote = theirs.execute("INSERT INTO t VALUES (2)", []);
        assert!(wrote.is_err(), "another VFS wrote beside the store");
        // Once the store's connections are closed, the file is anyone's.
        drop(ours);
        let n: i64 = theirs
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }

    /// The WAL must be synced at every commit (readers learn of frames the
    /// VFS may still hold only after that sync): lower settings are refused.
    #[test]
    fn synchronous_below_full_is_refused() {
        super::register().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("t.sqlite"));
        for refused in ["OFF", "normal", "0", "1"] {
            let r = conn.pragma_update(None, "synchronous", refused);
            assert!(r.is_err(), "synchronous={refused} was taken");
        }
        for taken in ["FULL", "extra", "2"] {
            conn.pragma_update(None, "synchronous", taken).unwrap();
        }
        let now: i64 = conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        assert_eq!(now, 2);
    }
}
