//! The database the crash harness's broker runs on (a temp SQLite file, or a fresh Postgres
//! schema dropped at the end), kept with the broker's log for a post-mortem when a run fails.
//! The broker process itself, killed with SIGKILL and started again on the same port and
//! database, is the test kit's [`BrokerProcess`]: what survives is only what it made durable.

use std::path::PathBuf;

use testkit::{BrokerProcess, Launch, Schema};

pub use testkit::{connect, lazy_channel};

/// Where the broker keeps its state, plus a directory for its log.
pub struct Database {
    pub url: String,
    pub backend: &'static str,
    pub dir: tempfile::TempDir,
    schema: Option<Schema>,
}

impl Database {
    pub fn sqlite() -> Database {
        let dir = temp_dir();
        let url = format!("sqlite://{}", dir.path().join("approvals.db").display());
        Database {
            url,
            backend: "sqlite",
            dir,
            schema: None,
        }
    }

    /// A new schema in the database `base_url` names.
    pub async fn postgres(base_url: &str) -> Database {
        let schema = Schema::create(base_url, "crash")
            .await
            .unwrap_or_else(|e| panic!("crash: {e}"));
        Database {
            url: schema.url(),
            backend: "postgres",
            dir: temp_dir(),
            schema: Some(schema),
        }
    }

    /// The broker binary on this database, every other setting at its default
    /// (`synchronous=FULL` on SQLite) whatever the test's environment says, its log in
    /// [`Database::dir`]; serving when this returns.
    pub async fn start_broker(&self) -> BrokerProcess {
        Launch::new(env!("CARGO_BIN_EXE_approval-broker"), &self.url)
            .log(self.dir.path().join("broker.log"))
            .start()
            .await
            .unwrap_or_else(|e| panic!("crash: {e}"))
    }

    /// Keeps the directory (the SQLite file and the broker's log) and the Postgres schema for a
    /// post-mortem; returns the directory.
    pub fn keep(self) -> PathBuf {
        let Database {
            dir, mut schema, ..
        } = self;
        if let Some(schema) = schema.as_mut() {
            eprintln!("crash: keeping the Postgres schema {}", schema.name());
            schema.keep();
        }
        dir.keep()
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("approvals-crash-")
        .tempdir()
        .expect("temp dir")
}
