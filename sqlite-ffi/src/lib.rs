//! Every line of `unsafe` the approval broker needs, in a crate of its own, so that the broker's
//! crate can say `#![forbid(unsafe_code)]`: both are SQLite's C interface, used for speed
//! (docs/benchmarks-notes.md).
//!
//! - [`allocator`]: SQLite allocates through mimalloc, as the broker's own code does.
//! - [`coalesced_wal`]: the write connection's VFS, which writes a commit's WAL frames in one
//!   `pwrite` instead of two per page.
//!
//! Both expose safe functions only; their tests live in the broker (`store::sqlite`), which
//! uses them as it runs.

pub mod allocator;
pub mod coalesced_wal;
