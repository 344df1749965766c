//! The numbers the database stores for a call's status, an event's kind and a grant's scope
//! (the same numbers as the protobuf enums), each written once. `code!` expands to a plain
//! literal, so the store's SQL text takes it with `concat!` at compile time (a partial index
//! `WHERE status = 1` is used only by a query that says `status = 1`, not a bound parameter),
//! and the domain's `code()` and `from_code()` read the same definition.
//!
//! Never renumber an arm: the numbers are in every database written so far (and in the
//! migrations' partial indexes and trigger).

/// The stored code of a status, event kind or scope: `code!(Status::Pending)`,
/// `code!(OutcomeKind::Denied)`, `code!(EventKind::Resolved)`, `code!(Scope::Workspace)`.
macro_rules! code {
    (Status::Pending) => {
        1
    };
    (OutcomeKind::Approved) => {
        2
    };
    (OutcomeKind::Denied) => {
        3
    };
    (OutcomeKind::Superseded) => {
        4
    };
    (OutcomeKind::Skipped) => {
        5
    };
    (OutcomeKind::Expired) => {
        6
    };
    (OutcomeKind::Cancelled) => {
        7
    };
    (EventKind::Requested) => {
        1
    };
    (EventKind::Resolved) => {
        2
    };
    (EventKind::Reminded) => {
        3
    };
    (EventKind::Escalated) => {
        4
    };
    (EventKind::ApprovalRecorded) => {
        5
    };
    (Scope::Once) => {
        1
    };
    (Scope::Session) => {
        2
    };
    (Scope::Workspace) => {
        3
    };
    (Scope::Always) => {
        4
    };
}

pub(crate) use code;
