//! The write connection's files, through a VFS that gathers a commit's WAL writes into one.
//!
//! SQLite writes each WAL frame with two system calls (its 24-byte header, then the page), so a
//! commit of one tool call made dozens of `pwrite`s before its `fdatasync`, a noticeable share
//! of the writer's time (docs/benchmarks-notes.md, "A commit's WAL writes in one").
//! This VFS wraps SQLite's own (`unix`) and changes one thing: the frames written to a WAL file
//! one after another are kept in memory and written together (one `pwrite` per 128 KiB) before anything
//! else is done with that file: before it is synced, read, sized, truncated, closed or sent a
//! file-control, and before a write anywhere else in it. Every other file, and every other
//! method, is SQLite's own.
//!
//! Why no commit is visible before its frames are in the file: other connections (the readers,
//! the checkpointer) read the WAL through their own handles, and only the frames the WAL-index
//! header (shared memory) counts. Under `synchronous = FULL`, SQLite syncs the WAL after writing
//! a commit's frames and only then updates that header (`walFrames` in the bundled
//! `sqlite3.c`), and the sync writes what was kept first, reporting any error to the commit.
//! That order holds only when SQLite does not pad commits to a sector (it does not when the
//! database file is power-safe, `SQLITE_IOCAP_POWERSAFE_OVERWRITE`, the unix VFS's default), so
//! the WAL of a database without that property is not coalesced, nor is any file of a connection under
//! `synchronous = NORMAL`, whose commits do not sync: the writer (`writer::connect`) opens only a
//! `FULL` write connection through this VFS. Frames SQLite writes for a transaction not yet
//! committed (a spilled cache) are not counted by the header either; if they are kept when the
//! process dies, they were never part of a commit. Those of a transaction rolled back may stay
//! kept until the next write of the file: they lie past the last committed frame, where the next
//! transaction writes over them, after them, through the same handle. That needs this
//! connection to be the file's only writer, which it is: one broker process per SQLite file
//! (`ProcessLock`), one write connection in it.

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name connections open this VFS by.
pub const VFS: &CStr = c"approvals-coalesced-wal";

/// At most this much is kept: the unix VFS writes at most 128 KiB less a byte in one call (it
/// masks a larger length, `seekAndWriteFd`), so a larger commit is written in such pieces
/// (about 31 frames of 4 KiB pages each).
const MAX_KEPT: usize = 0x1ffff;

/// `read` of what `conn`'s WAL file keeps; `None` when `conn` has no WAL file open, or not one
/// this VFS coalesces.
#[cfg(feature = "testing")]
fn with_kept<T>(conn: &rusqlite::Connection, read: impl FnOnce(&mut HeldFrames) -> T) -> Option<T> {
    let mut wal: *mut ffi::sqlite3_file = std::ptr::null_mut();
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
            (&raw mut wal).cast(),
        )
    };
    // Ours only if it has our methods: then it is a `File`, open while `conn` is, and used by
    // no one else while `conn` is borrowed here.
    if rc != ffi::SQLITE_OK || wal.is_null() || !std::ptr::eq(unsafe { (*wal).pMethods }, &METHODS)
    {
        return None;
    }
    unsafe { &mut *wal.cast::<File>() }.kept.as_mut().map(read)
}

/// The writes SQLite asked of `conn`'s WAL file and the writes that reached the file, so far;
/// `None` when that WAL is not coalesced.
#[cfg(feature = "testing")]
pub fn wal_writes(conn: &rusqlite::Connection) -> Option<(u64, u64)> {
    with_kept(conn, |kept| (kept.asked, kept.written))
}

/// Makes the next `writes` writes of what `conn`'s WAL keeps fail as on a full disk.
#[cfg(feature = "testing")]
pub fn fail_wal_writes(conn: &rusqlite::Connection, writes: u32) {
    with_kept(conn, |kept| kept.failing = writes).expect("a coalesced WAL");
}

/// The wrapped VFS (SQLite's default), registered once under [`VFS`]; `Err` with SQLite's code
/// if it could not be.
pub fn register() -> Result<(), c_int> {
    static REGISTERED: OnceLock<Result<(), c_int>> = OnceLock::new();
    *REGISTERED.get_or_init(|| unsafe {
        let root = ffi::sqlite3_vfs_find(std::ptr::null());
        if root.is_null() {
            return Err(ffi::SQLITE_ERROR);
        }
        ROOT.set(Root(root)).map_err(|_| ffi::SQLITE_MISUSE)?;
        // SQLite's own methods, but for how a file is opened and how big one is: the unix
        // methods other than `xOpen` use nothing of the VFS they are given but its name, path
        // length and `pAppData`, all copied.
        let mut vfs = *root;
        vfs.szOsFile = std::mem::size_of::<File>() as c_int;
        vfs.zName = VFS.as_ptr();
        vfs.pNext = std::ptr::null_mut();
        vfs.xOpen = Some(open);
        // SQLite keeps the pointer for as long as the process runs.
        let vfs = Box::leak(Box::new(vfs));
        match ffi::sqlite3_vfs_register(vfs, 0) {
            ffi::SQLITE_OK => Ok(()),
            rc => Err(rc),
        }
    })
}

struct Root(*mut ffi::sqlite3_vfs);
// SQLite's VFS objects are immutable once registered and used from every thread.
unsafe impl Send for Root {}
unsafe impl Sync for Root {}
static ROOT: OnceLock<Root> = OnceLock::new();

fn root() -> *mut ffi::sqlite3_vfs {
    ROOT.get().map_or(std::ptr::null_mut(), |root| root.0)
}

/// A file of this VFS: SQLite's handle first (so SQLite can treat it as an `sqlite3_file`), the
/// wrapped VFS's handle, and, for a coalesced WAL file, what is kept.
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    /// The wrapped VFS's file (its `szOsFile` bytes, 8-aligned).
    real: *mut ffi::sqlite3_file,
    real_storage: Vec<u64>,
    /// `None`: every write goes straight through.
    kept: Option<HeldFrames>,
}

/// Frames written one after another, from `offset`, not yet in the file; and how many writes
/// SQLite asked for and how many reached the file (see [`wal_writes`]).
struct HeldFrames {
    offset: i64,
    bytes: Vec<u8>,
    asked: u64,
    written: u64,
    /// Writes still to fail (see [`fail_wal_writes`]).
    #[cfg(feature = "testing")]
    failing: u32,
}

impl File {
    fn real_methods(&self) -> &ffi::sqlite3_io_methods {
        // Set by the wrapped VFS's successful `xOpen`, the only way to a `File` with methods.
        unsafe { &*(*self.real).pMethods }
    }

    /// Writes what is kept; SQLite's code on failure.
    fn write_kept(&mut self) -> c_int {
        let (real, write) = (self.real, self.real_methods().xWrite);
        match &mut self.kept {
            Some(kept) => kept.write_out(real, write),
            None => ffi::SQLITE_OK,
        }
    }
}

/// A file's `xWrite`.
type WriteFn = unsafe extern "C" fn(*mut ffi::sqlite3_file, *const c_void, c_int, i64) -> c_int;

impl HeldFrames {
    /// Writes what is kept to `real` with `write`; SQLite's code on failure. What failed to be
    /// written stays kept, to be written again at the next chance: SQLite was told it was
    /// written, and a transaction survives some errors (a statement that fails with a full
    /// disk is undone alone), so dropping it could let a later commit count frames never
    /// written. Until it is written, every sync, read or size of the file fails, and so does
    /// that commit.
    fn write_out(&mut self, real: *mut ffi::sqlite3_file, write: Option<WriteFn>) -> c_int {
        if self.bytes.is_empty() {
            return ffi::SQLITE_OK;
        }
        let Some(write) = write else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        self.written += 1;
        #[cfg(feature = "testing")]
        if self.failing > 0 {
            self.failing -= 1;
            return ffi::SQLITE_FULL;
        }
        // At most MAX_KEPT bytes.
        let len = self.bytes.len() as c_int;
        let rc = unsafe { write(real, self.bytes.as_ptr().cast(), len, self.offset) };
        if rc == ffi::SQLITE_OK {
            self.bytes.clear();
        }
        rc
    }
}

/// The `File` behind SQLite's pointer.
///
/// # Safety
/// `file` is a `File` this VFS opened and SQLite has not closed; SQLite calls a file's methods
/// from one thread at a time.
unsafe fn this<'a>(file: *mut ffi::sqlite3_file) -> &'a mut File {
    unsafe { &mut *file.cast::<File>() }
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let root = root();
    let Some(root_open) = (unsafe { root.as_ref() }).and_then(|root| root.xOpen) else {
        return ffi::SQLITE_ERROR;
    };
    let size = unsafe { (*root).szOsFile } as usize;
    let mut real_storage = vec![0u64; size.div_ceil(8).max(1)];
    let real = real_storage.as_mut_ptr().cast::<ffi::sqlite3_file>();
    unsafe {
        // Until it is open, SQLite must not call a method of it (nor close it).
        (*file).pMethods = std::ptr::null();
    }
    let rc = unsafe { root_open(root, name, real, flags, out_flags) };
    if rc != ffi::SQLITE_OK {
        // The wrapped VFS may have set methods on its failed file, to be closed.
        let methods = unsafe { (*real).pMethods };
        if let Some(close) = unsafe { methods.as_ref() }.and_then(|m| m.xClose) {
            unsafe { close(real) };
        }
        return rc;
    }
    let wal = flags & ffi::SQLITE_OPEN_WAL != 0;
    let kept = (wal && unsafe { database_is_power_safe(name) }).then(|| HeldFrames {
        offset: 0,
        bytes: Vec::new(),
        asked: 0,
        written: 0,
        #[cfg(feature = "testing")]
        failing: 0,
    });
    unsafe {
        file.cast::<File>().write(File {
            base: ffi::sqlite3_file {
                pMethods: &raw const METHODS,
            },
            real,
            real_storage,
            kept,
        });
    }
    ffi::SQLITE_OK
}

/// Whether the database file whose WAL is `wal` is power-safe: SQLite decides from the database
/// file (not the WAL) whether to pad a commit past its sync (`sqlite3WalOpen`), and it can say
/// no (`file:...?psow=0`, `SQLITE_FCNTL_POWERSAFE_OVERWRITE`), while a WAL file always says yes.
///
/// # Safety
/// `wal` is the name SQLite gave `xOpen` for a WAL file (its database is open).
unsafe fn database_is_power_safe(wal: ffi::sqlite3_filename) -> bool {
    let database = unsafe { ffi::sqlite3_database_file_object(wal) };
    let Some(methods) =
        (unsafe { database.as_ref() }).and_then(|db| unsafe { db.pMethods.as_ref() })
    else {
        return false;
    };
    methods
        .xDeviceCharacteristics
        .is_some_and(|characteristics| {
            (unsafe { characteristics(database) } & ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE) != 0
        })
}

/// Writes what is kept, or returns SQLite's code from the enclosing method if that failed.
macro_rules! kept_first {
    ($file:expr) => {
        let rc = $file.write_kept();
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    };
}

/// Calls the wrapped file's method `$method` with `$args`, or fails with `$missing`.
macro_rules! pass {
    ($file:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {
        match $file.real_methods().$method {
            Some(method) => unsafe { method($file.real $(, $arg)*) },
            None => $missing,
        }
    };
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    let this = unsafe { this(file) };
    let kept = this.write_kept();
    let closed = pass!(this, xClose, ffi::SQLITE_OK);
    // SQLite frees its handle's memory itself; ours (the wrapped file's storage) goes here.
    unsafe { std::ptr::drop_in_place(this) };
    if kept != ffi::SQLITE_OK { kept } else { closed }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let this = unsafe { this(file) };
    kept_first!(this);
    pass!(this, xRead, ffi::SQLITE_IOERR_READ, buf, amount, offset)
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let this = unsafe { this(file) };
    let (real, real_write) = (this.real, this.real_methods().xWrite);
    let Some(kept) = &mut this.kept else {
        return pass!(this, xWrite, ffi::SQLITE_IOERR_WRITE, buf, amount, offset);
    };
    kept.asked += 1;
    let len = usize::try_from(amount).unwrap_or(0);
    let follows = kept.bytes.is_empty() || kept.offset + kept.bytes.len() as i64 == offset;
    if !follows || kept.bytes.len() + len > MAX_KEPT {
        // Elsewhere in the file (SQLite rewriting a frame of the transaction, or a new WAL
        // header), or more than is kept: what is kept goes first, in the order SQLite wrote it.
        let rc = kept.write_out(real, real_write);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    if len > MAX_KEPT {
        kept.written += 1;
        return pass!(this, xWrite, ffi::SQLITE_IOERR_WRITE, buf, amount, offset);
    }
    if kept.bytes.is_empty() {
        kept.offset = offset;
    }
    kept.bytes
        .extend_from_slice(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) });
    ffi::SQLITE_OK
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let this = unsafe { this(file) };
    kept_first!(this);
    pass!(this, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let this = unsafe { this(file) };
    kept_first!(this);
    pass!(this, xSync, ffi::SQLITE_IOERR_FSYNC, flags)
}

unsafe extern "C" fn file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    let this = unsafe { this(file) };
    kept_first!(this);
    pass!(this, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let this = unsafe { this(file) };
    pass!(this, xLock, ffi::SQLITE_IOERR_LOCK, level)
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let this = unsafe { this(file) };
    pass!(this, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    let this = unsafe { this(file) };
    pass!(
        this,
        xCheckReservedLock,
        ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        out
    )
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    let this = unsafe { this(file) };
    // Some controls act on the file's contents or size (a size hint, the sync before `xSync`).
    kept_first!(this);
    pass!(this, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let this = unsafe { this(file) };
    pass!(this, xSectorSize, 4096)
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let this = unsafe { this(file) };
    pass!(this, xDeviceCharacteristics, 0)
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let this = unsafe { this(file) };
    pass!(
        this,
        xShmMap,
        ffi::SQLITE_IOERR_SHMMAP,
        region,
        size,
        extend,
        out
    )
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    let this = unsafe { this(file) };
    pass!(this, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, offset, n, flags)
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    let this = unsafe { this(file) };
    pass!(this, xShmBarrier, ())
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    let this = unsafe { this(file) };
    pass!(this, xShmUnmap, ffi::SQLITE_OK, delete)
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let this = unsafe { this(file) };
    kept_first!(this);
    match this.real_methods().xFetch {
        Some(method) => unsafe { method(this.real, offset, amount, out) },
        // No memory map: SQLite reads instead.
        None => {
            unsafe { *out = std::ptr::null_mut() };
            ffi::SQLITE_OK
        }
    }
}

unsafe extern "C" fn unfetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    page: *mut c_void,
) -> c_int {
    let this = unsafe { this(file) };
    pass!(this, xUnfetch, ffi::SQLITE_OK, offset, page)
}

/// Version 3: the unix VFS's (shared memory, memory maps).
static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
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
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};
