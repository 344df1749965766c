//! Where state lives, as the settings say it (`--database-url` and the backends' options), read
//! as text and parsed once, at start, into a [`Database`]. Owned here, by the store it
//! configures; `config` gathers it with the rest.

use clap::Args;

use super::{Database, Synchronous};

/// Where state lives (see the module).
#[derive(Debug, Clone, Args)]
pub struct StoreSettings {
    /// Where state lives: `postgres://USER@HOST:PORT/DB` (any number of replicas may share
    /// it), or `sqlite://PATH`, `sqlite:PATH` or a plain file path (one broker process).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://approvals.db",
        // It may carry a password: `--help` must not print it from the environment.
        hide_env_values = true,
        global = true
    )]
    pub database_url: String,

    /// Postgres only: the size of the connection pool.
    #[arg(long, env = "APPROVALS_DATABASE_MAX_CONNECTIONS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..), global = true)]
    pub database_max_connections: u32,

    /// Postgres only: each replica runs the submits, decisions and cancels queued meanwhile in
    /// one transaction that numbers its own events. Off by default: on a machine whose Postgres
    /// shares the broker's cores it measured slower than a transaction per write (one group at a
    /// time per replica queues every write's round trips behind one connection;
    /// docs/benchmarks.md).
    #[arg(long, env = "APPROVALS_POSTGRES_GROUP_COMMIT", global = true)]
    pub postgres_group_commit: bool,

    /// SQLite's `synchronous` setting: `full` (power-safe, the default) or `normal` (faster;
    /// survives a broker crash but NOT a power loss or OS crash).
    #[arg(
        long,
        env = "APPROVALS_SQLITE_SYNCHRONOUS",
        default_value = "full",
        global = true
    )]
    pub sqlite_synchronous: Synchronous,
}

impl StoreSettings {
    /// The database `--database-url` names, with the options of its backend; an error naming
    /// `DATABASE_URL` when it names none the broker can keep state in.
    pub fn database(&self) -> crate::Result<Database> {
        let mut database = Database::parse(
            &self.database_url,
            self.sqlite_synchronous,
            self.database_max_connections,
        )?;
        if let Database::Postgres { group_commit, .. } = &mut database {
            *group_commit = self.postgres_group_commit;
        }
        Ok(database)
    }
}
