//! The approval broker's test kit: what the API tests (`tests/api`), the crash harness
//! (`tests/crash`) and `approval-bench` share, written once. A dev-dependency of the broker (and
//! a dependency of the bench): nothing here may be reached from the broker itself.
//!
//! - [`broker`]: the real binary as a child process ([`BrokerProcess`], started by a
//!   [`Launch`]), which never inherits the developer's `APPROVALS_*` / `DATABASE_URL` settings;
//!   a fresh Postgres [`Schema`]; [`free_port`].
//! - [`paging::every_page`]: a paged listing read to its end.
//! - [`postgres_url`]: the database the Postgres variants run on.

pub mod broker;
pub mod paging;

pub use broker::{
    BrokerProcess, Launch, Schema, TempDir, block_on_own_thread, broker_command, connect,
    free_port, is_broker_setting, lazy_channel, log_tail, serving,
};
pub use paging::every_page;

/// The environment variable naming the Postgres database the Postgres variants of the tests run
/// on, e.g. `postgres://postgres@127.0.0.1:5432/test`; each test makes a schema of its own in it.
pub const POSTGRES_URL_VAR: &str = "APPROVALS_TEST_POSTGRES_URL";

/// The Postgres database named by [`POSTGRES_URL_VAR`]. Only Postgres tests call it, and they
/// are compiled as ignored when the variable was unset at build time (see the broker's
/// `build.rs`), so an unset variable here means it was unset after the build: say so.
pub fn postgres_url() -> String {
    match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "{POSTGRES_URL_VAR} was set when the tests were built but is not set now: set it \
             again (or unset it and rebuild, which marks the Postgres tests ignored)"
        ),
    }
}
