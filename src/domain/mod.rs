//! The broker's domain: calls, batches, outcomes and events as plain, validated types, and the
//! rules that need no I/O (what text a model reads for each outcome, which decision conflicts
//! with which; which rule or grant decides a call). Nothing here touches the network or the
//! database.

pub mod action;
mod batch;
mod call;
mod cancel;
mod codes;
pub mod escalation;
mod event;
pub mod identity;
mod ids;
mod input;
pub mod invisible;
pub mod json;
mod listing;
mod outcome;
pub mod passkey;
pub mod policy;
pub mod receipt;
pub mod time;
mod visibility;
pub mod webhook;

pub use action::{Action, Host, Kind};
pub use batch::{MAX_BATCH_CALLS, NewBatch, OnDeny, SubmitItem, SubmitReport, SubmitResult};
pub use call::{Call, CallKey, NewCall, Status};
pub use cancel::{CancelReport, CancelScope, CancelTarget};
pub(crate) use codes::code;
pub use event::{Event, EventKind};
pub use identity::Identity;
pub use ids::{AgentId, BatchId, CallId, SessionId, ToolName, refuse_invisible};
pub use input::{DEFAULT_MAX_INPUT_BYTES, ToolInput};
pub use listing::{CallPage, CallQuery, Cursor, DecidedByFilter, GrantPage, GrantQuery};
pub use outcome::{
    DecideReport, DecidedBy, Decision, Outcome, OutcomeKind, ToolResultTexts, Verdict,
};
pub use time::{MAX_DEADLINE_AHEAD, PROTO_TIMESTAMP_SECONDS, Timestamp};
pub use visibility::Viewer;
