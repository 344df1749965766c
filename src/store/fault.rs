//! The store's edge for errors: the one place that reads the database drivers' errors
//! (rusqlite's, sqlx's, sqlx's migrations') and turns them into the broker's driver-free
//! [`Error::Storage`], classified once: which storage fault it is (SQLite's result codes,
//! Postgres's SQLSTATEs, the pool's own failures) and whether the database aborted the
//! transaction for a conflict. Past this file no code, and no `domain/` type, depends on a driver.

use crate::error::{Error, StorageFault};

impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        Error::Storage {
            fault: sqlx_fault(&err),
            conflict: is_conflict(&err),
            cause: err.to_string(),
        }
    }
}

/// From SQLite's writer, which runs its statements itself (see `store::sqlite::writer`).
impl From<rusqlite::Error> for Error {
    fn from(err: rusqlite::Error) -> Self {
        let fault = match &err {
            rusqlite::Error::SqliteFailure(failure, _) => sqlite_fault(failure.code),
            _ => None,
        };
        Error::Storage {
            fault,
            conflict: false,
            cause: err.to_string(),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(err.to_string())
    }
}

/// Whether the database aborted the transaction to break a deadlock or a serialization
/// conflict (Postgres's SQLSTATE 40P01 or 40001).
fn is_conflict(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .is_some_and(|pg| matches!(pg.code(), "40P01" | "40001")),
        _ => false,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{STORAGE_FULL, STORAGE_UNAVAILABLE};
    use tonic::{Code, Status};

    fn sqlite(code: i32) -> Error {
        Error::from(rusqlite::Error::SqliteFailure(
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
            Error::from(sqlx::Error::PoolTimedOut),
            Error::from(sqlx::Error::Io(std::io::Error::from(
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
