//! The approval broker: a gRPC service between LLM agents and the humans who approve their tool
//! calls. `main.rs` only wires configuration to [`startup::run`]; everything else lives here so
//! the black-box tests in `tests/` can start the real server on port 0.
//!
//! # Layout
//!
//! A call travels from the surface, through the facade and one operation, to the store, and its
//! committed event travels back out through the fan-out:
//!
//! ```text
//! grpc/ (hook/, mcp/, inbox/)  ->  broker.rs  ->  operations/<one per operation>  ->  store/
//!                                                                                     |
//!                      streams  <-  events.rs  <-  the durable event log  <-----------+
//! ```
//!
//! - `grpc/`: the gRPC surface, one file per service (`agent`, `approver`, `admin`), plus `parse`
//!   (protobuf to validated domain values) and `render` (back). It talks to the broker only.
//! - `hook/`, `mcp/`, `inbox/`: the other surfaces, for agent hosts' approval hooks, MCP clients
//!   and servers, and the approver web inbox; like `grpc/`, they go through the broker.
//! - `broker.rs`: the one facade every surface calls; it runs an operation, then tells the event
//!   fan-out and the deadline sweeper.
//! - `operations/`: what the broker does, one file per operation: `submit`, `decide`, `cancel`,
//!   `expire`, policy administration (`policy`), `explain`; `tx` holds the transaction
//!   primitives they are written over, and the lock order they keep.
//! - `domain/`: plain, validated types and rules with no I/O: ids, inputs in canonical JSON,
//!   calls, batches, outcomes, events, policy rules and grants, and the requests and reports the
//!   operations take and return.
//! - `store/`: storage behind small traits (writes, API reads, the event log, the sweeper's
//!   reads), one backend each: `sqlite/` (with its single writer thread and group commit) and
//!   `postgres`; SQL shared by both is written once.
//! - `events.rs`: the in-memory fan-out of committed events to every stream; `expiry.rs`: the
//!   deadline sweeper.
//! - `startup.rs` wires the parts and serves them; `config.rs` parses the settings once;
//!   `connections/`, `auth.rs` and `limits.rs` guard the door (connection caps, bearer tokens,
//!   stream caps); `error.rs` is the one error type and its gRPC status; `telemetry.rs` and
//!   `meters.rs` are logs and metrics; `proto.rs` is generated code.

pub mod auth;
pub mod broker;
pub mod config;
pub mod connections;
pub mod domain;
pub mod error;
pub mod events;
pub mod expiry;
pub mod grpc;
pub mod hook;
pub mod inbox;
pub mod meters;
pub mod operations;
pub mod proto;
pub mod startup;
pub mod store;
pub mod stream_slots;
pub mod telemetry;

pub use error::{Error, Result};
