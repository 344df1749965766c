//! The broker's one error type, and its one mapping to `tonic::Status`.
//!
//! Client mistakes carry a message meant for the client (naming the field at fault). Internal
//! causes (storage, migrations) are logged where they are mapped and never sent to clients.

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
    #[error("{0}")]
    ResourceExhausted(String),
    /// The broker cannot take this now (shutting down); the client should retry elsewhere.
    #[error("{0}")]
    Unavailable(String),
    #[error("storage error: {0}")]
    Storage(#[from] sqlx::Error),
    /// From SQLite's writer, which runs its statements itself (see `store::sqlite::write`).
    #[error("storage error: {0}")]
    SqliteWrite(#[from] rusqlite::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Storage(_) | Error::SqliteWrite(_) | Error::Migrate(_) | Error::Internal(_) => {
                Code::Internal
            }
        }
    }

    /// The message a client may see: the error itself for client mistakes, a generic text for
    /// internal failures (whose cause is logged here instead).
    pub fn client_message(&self) -> String {
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
}
