//! SQLite allocates through mimalloc, as the broker's own code does (its `#[global_allocator]`).
//! SQLite calls its allocator for every statement step, row and page it touches, and its default
//! is glibc's `malloc`: about a tenth of the writer thread's time at the 64-agent peak
//! (docs/benchmarks-notes.md, "SQLite's allocations and the checkpointer's interval"). A program
//! calls [`install`] first thing, before any thread or database: the broker, and
//! `approval-bench`, whose raw storage loop so allocates as the broker's writer does.
//!
//! `sqlite3_config` refuses once SQLite is initialised; the caller then keeps SQLite's own
//! allocator and says so.

use std::ffi::{c_int, c_void};

use rusqlite::ffi;
// Links mimalloc's C library (the `mimalloc` crate's own `libmimalloc-sys`) into every program
// built on this crate, whether or not it makes mimalloc its global allocator.
use mimalloc as _;

// mimalloc's C functions, declared here: `libmimalloc-sys` exports `mi_usable_size` only behind a
// feature that would add a crate.
unsafe extern "C" {
    fn mi_malloc(size: usize) -> *mut c_void;
    fn mi_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn mi_free(p: *mut c_void);
    fn mi_usable_size(p: *const c_void) -> usize;
}

unsafe extern "C" fn malloc(size: c_int) -> *mut c_void {
    // SQLite never asks for a negative size; refuse one as an allocation failure.
    match usize::try_from(size) {
        Ok(size) => unsafe { mi_malloc(size) },
        Err(_) => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn free(p: *mut c_void) {
    unsafe { mi_free(p) }
}

unsafe extern "C" fn realloc(p: *mut c_void, size: c_int) -> *mut c_void {
    match usize::try_from(size) {
        Ok(size) => unsafe { mi_realloc(p, size) },
        Err(_) => std::ptr::null_mut(),
    }
}

/// What SQLite may use of an allocation (at least what it asked for).
unsafe extern "C" fn size(p: *mut c_void) -> c_int {
    let usable = unsafe { mi_usable_size(p) };
    c_int::try_from(usable).unwrap_or(c_int::MAX)
}

/// Sizes rounded up to 8 bytes, as SQLite's default allocator does; 0 (SQLite then fails the
/// allocation) for a size that cannot be.
unsafe extern "C" fn roundup(size: c_int) -> c_int {
    size.checked_add(7).map_or(0, |size| size & !7)
}

unsafe extern "C" fn init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn shutdown(_: *mut c_void) {}

/// Hands SQLite mimalloc's functions; `Err` with SQLite's code if it refused (it was already
/// initialised). Call it before anything uses SQLite and while no other thread can (first thing
/// in `main`, before a runtime starts its threads): `sqlite3_config` is not thread-safe.
pub fn install() -> Result<(), c_int> {
    let methods = methods();
    // SQLite copies the methods.
    let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &raw const methods) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rc)
    }
}

/// Whether SQLite allocates through mimalloc now ([`install`] took): its configured `xFree` is
/// mimalloc's, and its rounding is ours.
pub fn in_use() -> bool {
    let mut used = std::mem::MaybeUninit::<ffi::sqlite3_mem_methods>::zeroed();
    // SQLite writes its current methods into `used`.
    let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETMALLOC, used.as_mut_ptr()) };
    if rc != ffi::SQLITE_OK {
        return false;
    }
    let used = unsafe { used.assume_init() };
    let address = |f: Option<unsafe extern "C" fn(*mut c_void)>| f.map(|f| f as usize);
    address(used.xFree) == address(methods().xFree)
        && used
            .xRoundup
            .is_some_and(|round| unsafe { round(13) } == 16)
}

/// SQLite's allocator interface over mimalloc.
pub fn methods() -> ffi::sqlite3_mem_methods {
    ffi::sqlite3_mem_methods {
        xMalloc: Some(malloc),
        xFree: Some(free),
        xRealloc: Some(realloc),
        xSize: Some(size),
        xRoundup: Some(roundup),
        xInit: Some(init),
        xShutdown: Some(shutdown),
        pAppData: std::ptr::null_mut(),
    }
}
