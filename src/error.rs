//! The broker's one error type, and its one mapping to `tonic::Status`.
//!
//! Client mistakes carry a message meant for the client (naming the field at fault). Internal
//! causes (storage, migrations) are logged where they are mapped and never sent to clients.
//!
//! Storage faults are told apart here too, in one place for both backends: a database that
//! cannot be reached or written (Postgres down, a file made read-only or deleted, I/O errors, a
//! corrupt page) is UNAVAILABLE, a full disk RESOURCE_EXHAUSTED, each with a message a client can
//! act on (retry later) and no internal detail. Neither is INTERNAL: the broker did nothing wrong,
//! and a client should retry, not report a bug.

use tonic::{Code, Status};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; `field` names the offending field (e.g. `calls[2].input_json`).
    #[error("{field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("{0}")]
    NotFound(String),
    /// Same identity, different content (a call id reused for another tool or input).
    #[error("{0}")]
    AlreadyExists(String),
    /// The request conflicts with state that stands (e.g. a call decided otherwise).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The caller may not do this to this thing (an approver outside a call's groups, an
    /// approver approving their own call); the message names the requirement or rule.
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// The broker cannot take this now (shutting down); the client should retry elsewhere.
    #[error("{0}")]
    Unavailable(String),
    /// A resume point below what retention pruned: the events after it are not all kept, so
    /// serving from it would skip some. `through` is the highest sequence number pruned.
    #[error(
        "after_seq={after} is older than the event log keeps: retention (--retain-decided) \
         pruned events up to seq {through}; resume with after_seq={through} or later, or \
         subscribe without after_seq for a fresh snapshot"
    )]
    Pruned { after: u64, through: u64 },
    #[error("storage error: {0}")]
    Storage(#[from] sqlx::Error),
    /// From SQLite's writer, which runs its statements itself (see `store::sqlite::write`).
    #[error("storage error: {0}")]
    SqliteWrite(#[from] rusqlite::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A storage fault the broker found itself (a database file deleted while it ran) or kept
    /// from a failed commit; `cause` is for the log.
    #[error("storage fault ({fault}): {cause}")]
    StorageFault { fault: StorageFault, cause: String },
    #[error("internal error: {0}")]
    Internal(String),
}

/// What kind of storage fault an error is: what the client is told, and what the log says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// The disk (or the database's quota) is full: RESOURCE_EXHAUSTED.
    Full,
    /// The database cannot be reached, opened or written (connection lost, server shutting
    /// down, pool exhausted, read-only file, I/O error, file deleted): UNAVAILABLE.
    Unavailable,
    /// The database is damaged (a corrupt page, not a database): UNAVAILABLE to the client, the
    /// same as any other storage it cannot use, and logged as corruption for the operator,
    /// who must restore it.
    Corrupt,
}

impl std::fmt::Display for StorageFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StorageFault::Full => "disk full",
            StorageFault::Unavailable => "unavailable",
            StorageFault::Corrupt => "corrupt",
        })
    }
}

/// What a client is told when the database cannot be written.
pub const STORAGE_UNAVAILABLE: &str =
    "storage unavailable: the database cannot be written; retry later";
/// What a client is told when the database's disk is full.
pub const STORAGE_FULL: &str =
    "storage full: the database's disk is full; retry later, once an operator has freed space";

impl Error {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The error a write gets when the transaction it was part of failed to commit because of
    /// `cause`: a storage fault stays one (so the client is told to retry), anything else is
    /// internal.
    pub fn not_committed(cause: &Error) -> Self {
        let cause_text = format!("the write was not committed: {cause}");
        // Concurrent writes kept aborting it: nothing is wrong, the client should retry.
        if matches!(cause, Error::Unavailable(_)) || cause.is_transaction_conflict() {
            return Error::Unavailable(cause_text);
        }
        match cause.storage_fault() {
            Some(fault) => Error::StorageFault {
                fault,
                cause: cause_text,
            },
            None => Error::Internal(cause_text),
        }
    }

    /// Which storage fault this is, if it is one. The one classification of both backends'
    /// errors: SQLite's result codes (from rusqlite or sqlx), Postgres's SQLSTATEs, and the
    /// connection pool's own failures.
    pub fn storage_fault(&self) -> Option<StorageFault> {
        match self {
            Error::StorageFault { fault, .. } => Some(*fault),
            Error::SqliteWrite(rusqlite::Error::SqliteFailure(failure, _)) => {
                sqlite_fault(failure.code)
            }
            Error::Storage(err) => sqlx_fault(err),
            _ => None,
        }
    }

    /// Whether the database aborted the transaction to break a deadlock or a serialization
    /// conflict (Postgres's SQLSTATE 40P01 or 40001): the transaction did nothing wrong, and the
    /// same work run again in a new one may well succeed.
    pub fn is_transaction_conflict(&self) -> bool {
        match self {
            Error::Storage(sqlx::Error::Database(db)) => db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some_and(|pg| matches!(pg.code(), "40P01" | "40001")),
            _ => false,
        }
    }

    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        if let Some(fault) = self.storage_fault() {
            return match fault {
                StorageFault::Full => Code::ResourceExhausted,
                StorageFault::Unavailable | StorageFault::Corrupt => Code::Unavailable,
            };
        }
        match self {
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Pruned { .. } => Code::OutOfRange,
            Error::Storage(_)
            | Error::SqliteWrite(_)
            | Error::Migrate(_)
            | Error::StorageFault { .. }
            | Error::Internal(_) => Code::Internal,
        }
    }

    /// The message a client may see: the error itself for client mistakes, a generic text for
    /// storage faults and internal failures (whose cause is logged here instead).
    pub fn client_message(&self) -> String {
        match self.storage_fault() {
            Some(StorageFault::Full) => {
                tracing::warn!(error = %self, "a request failed: the database's disk is full");
                return STORAGE_FULL.to_owned();
            }
            Some(StorageFault::Corrupt) => {
                tracing::error!(error = %self, "a request failed: the database is corrupt; restore it from a backup");
                return STORAGE_UNAVAILABLE.to_owned();
            }
            Some(StorageFault::Unavailable) => {
                tracing::warn!(error = %self, "a request failed: the database is unavailable");
                return STORAGE_UNAVAILABLE.to_owned();
            }
            None => {}
        }
        match self.code() {
            Code::Internal => {
                tracing::error!(error = %self, "internal error");
                "internal error; see the broker's log".to_owned()
            }
            _ => self.to_string(),
        }
    }
}

/// SQLite's primary result codes that mean the storage, not the statement, is at fault.
fn sqlite_fault(code: rusqlite::ErrorCode) -> Option<StorageFault> {
    use rusqlite::ErrorCode as C;
    match code {
        C::DiskFull => Some(StorageFault::Full),
        C::ReadOnly
        | C::CannotOpen
        | C::SystemIoFailure
        | C::PermissionDenied
        | C::DatabaseBusy
        | C::DatabaseLocked
        | C::NoLargeFileSupport => Some(StorageFault::Unavailable),
        C::DatabaseCorrupt | C::NotADatabase => Some(StorageFault::Corrupt),
        _ => None,
    }
}

fn sqlx_fault(err: &sqlx::Error) -> Option<StorageFault> {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Some(StorageFault::Unavailable),
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                postgres_fault(pg.code())
            } else if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                let extended: i32 = db.code()?.parse().ok()?;
                sqlite_fault(rusqlite::ffi::Error::new(extended).code)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Postgres SQLSTATEs that mean the server, not the statement, is at fault
/// (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
fn postgres_fault(sqlstate: &str) -> Option<StorageFault> {
    match sqlstate {
        "53100" => Some(StorageFault::Full), // disk_full
        // data_corrupted, index_corrupted
        "XX001" | "XX002" => Some(StorageFault::Corrupt),
        // admin_shutdown, crash_shutdown, cannot_connect_now, database_dropped;
        // read_only_sql_transaction (a standby, or a database set read-only); the broker's
        // role refused (invalid authorization, no privilege on its schema)
        "57P01" | "57P02" | "57P03" | "57P04" | "25006" | "28000" | "28P01" | "42501" => {
            Some(StorageFault::Unavailable)
        }
        // Classes 08 (connection exception), 53 (insufficient resources: out of memory, too many
        // connections), 58 (system error: I/O).
        _ if sqlstate.starts_with("08")
            || sqlstate.starts_with("53")
            || sqlstate.starts_with("58") =>
        {
            Some(StorageFault::Unavailable)
        }
        _ => None,
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        Status::new(err.code(), err.client_message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_causes_go_to_the_log_never_to_the_client() {
        let cause = Error::Storage(sqlx::Error::Protocol(
            "secret table calls_v2 is corrupt".into(),
        ));
        let status = Status::from(cause);
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("secret"), "{}", status.message());
        assert_eq!(status.message(), "internal error; see the broker's log");
        // A client's own mistake is told as it is, naming the field.
        let status = Status::from(Error::invalid("batch.session_id", "must not be empty"));
        assert_eq!(status.message(), "batch.session_id: must not be empty");
    }

    fn sqlite(code: i32) -> Error {
        Error::SqliteWrite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(code),
            Some("/var/lib/approvals/approvals.db: details for the log".into()),
        ))
    }

    /// Every storage fault reaches the client as something to retry (UNAVAILABLE) or a full
    /// disk (RESOURCE_EXHAUSTED), with a message that says so and no internal detail; never
    /// as INTERNAL.
    #[test]
    fn storage_faults_are_unavailable_or_resource_exhausted_never_internal() {
        use rusqlite::ffi;
        let unavailable = [
            sqlite(ffi::SQLITE_READONLY),
            sqlite(ffi::SQLITE_CANTOPEN),
            sqlite(ffi::SQLITE_IOERR_WRITE),
            sqlite(ffi::SQLITE_IOERR_FSYNC),
            sqlite(ffi::SQLITE_BUSY),
            sqlite(ffi::SQLITE_CORRUPT),
            sqlite(ffi::SQLITE_NOTADB),
            Error::Storage(sqlx::Error::PoolTimedOut),
            Error::Storage(sqlx::Error::Io(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            ))),
            Error::StorageFault {
                fault: StorageFault::Unavailable,
                cause: "the database file /x.db was deleted".into(),
            },
        ];
        for err in unavailable {
            let text = err.to_string();
            let status = Status::from(err);
            assert_eq!(status.code(), Code::Unavailable, "{text}");
            assert_eq!(status.message(), STORAGE_UNAVAILABLE, "{text}");
        }
        for err in [
            sqlite(ffi::SQLITE_FULL),
            Error::not_committed(&sqlite(ffi::SQLITE_FULL)),
        ] {
            let status = Status::from(err);
            assert_eq!(status.code(), Code::ResourceExhausted);
            assert_eq!(status.message(), STORAGE_FULL);
        }
        // A commit that failed for a storage fault keeps its kind; for anything else it stays
        // internal.
        let failed = Error::not_committed(&sqlite(ffi::SQLITE_IOERR));
        assert_eq!(failed.code(), Code::Unavailable);
        assert!(failed.to_string().contains("not committed"), "{failed}");
        let failed = Error::not_committed(&sqlite(ffi::SQLITE_CONSTRAINT_FOREIGNKEY));
        assert_eq!(failed.code(), Code::Internal);
        // A statement's own fault is no storage fault.
        assert_eq!(sqlite(ffi::SQLITE_CONSTRAINT).code(), Code::Internal);
    }

    #[test]
    fn postgres_faults_are_classified_by_sqlstate() {
        assert_eq!(postgres_fault("53100"), Some(StorageFault::Full));
        for sqlstate in [
            "57P01", "57P02", "57P03", "08006", "08001", "25006", "53300", "58030", "28000",
        ] {
            assert_eq!(
                postgres_fault(sqlstate),
                Some(StorageFault::Unavailable),
                "{sqlstate}"
            );
        }
        assert_eq!(postgres_fault("XX001"), Some(StorageFault::Corrupt));
        // Unique violations and serialization failures are the statement's, not the storage's.
        assert_eq!(postgres_fault("23505"), None);
        assert_eq!(postgres_fault("40001"), None);
    }
}
