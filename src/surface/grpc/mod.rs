//! The gRPC surface: one file per service, plus the two translations at the edge (`parse`:
//! protobuf to validated domain values; `render`: domain values to protobuf). Services are thin:
//! parse, call the [`Broker`](crate::broker::Broker), render.

pub mod admin;
pub mod agent;
pub mod approver;
pub mod codec;
pub mod decide;
mod escalation_messages;
pub mod health;
pub mod observed;
pub mod oversize;
mod paging;
pub mod parse;
mod passkey_messages;
pub mod queue;
pub mod reflection;
mod render;
pub mod replay;
mod shadow_messages;
mod webhook_messages;

/// A stream is over for the broker: its client went away, or was told why it ends (it fell
/// behind, the broker drains). Whoever sees it stops working for that stream.
struct StreamOver;
