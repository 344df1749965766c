//! The broker's one error type, and its one mapping to `tonic::Status`.
//!
//! Client mistakes carry a message meant for the client (naming the field at fault). Internal
//! causes (storage, migrations) are logged where they are mapped and never sent to clients.
//!
//! Storage faults are told apart here too, in one place for both backends: a database that
//! cannot be reached or written (Postgres down, a file made read-only or deleted, I/O errors, a
//! corrupt page) is UNAVAILABLE, a full disk RESOURCE_EXHAUSTED, each with a message a client can
//! act on (retry later) and no internal detail. Neither is INTERNAL: the broker did nothing wrong,
//! and a client should retry, not report a bug. Which driver error is which fault is read once,
//! at the store's edge (`store::fault`), so this type (and `domain/`, which uses it) depends on
//! no database driver.

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
    /// An error of the database, as the store read it at its edge (`store::fault`, the one
    /// place that knows the drivers): the driver's text for the log, the kind of storage fault
    /// it is (if any), and whether the database aborted the transaction to break a deadlock or
    /// a serialization conflict. Nothing here depends on a driver.
    #[error("storage error: {cause}")]
    Storage {
        cause: String,
        fault: Option<StorageFault>,
        conflict: bool,
    },
    #[error("migration error: {0}")]
    Migrate(String),
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

    /// Which storage fault this is, if it is one (classified by `store::fault`: SQLite's result
    /// codes, Postgres's SQLSTATEs, and the connection pool's own failures).
    pub fn storage_fault(&self) -> Option<StorageFault> {
        match self {
            Error::StorageFault { fault, .. } => Some(*fault),
            Error::Storage { fault, .. } => *fault,
            _ => None,
        }
    }

    /// Whether the database aborted the transaction to break a deadlock or a serialization
    /// conflict (Postgres's SQLSTATE 40P01 or 40001): the transaction did nothing wrong, and the
    /// same work run again in a new one may well succeed.
    pub fn is_transaction_conflict(&self) -> bool {
        matches!(self, Error::Storage { conflict: true, .. })
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
            Error::Storage { .. }
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
        let cause = Error::Storage {
            cause: "secret table calls_v2 is corrupt".into(),
            fault: None,
            conflict: false,
        };
        let status = Status::from(cause);
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("secret"), "{}", status.message());
        assert_eq!(status.message(), "internal error; see the broker's log");
        // A client's own mistake is told as it is, naming the field.
        let status = Status::from(Error::invalid("batch.session_id", "must not be empty"));
        assert_eq!(status.message(), "batch.session_id: must not be empty");
    }
}
