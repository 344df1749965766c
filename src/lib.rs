//! The approval broker: a gRPC service between LLM agents and the humans who approve their tool
//! calls. `main.rs` only wires configuration to [`startup::run`]; everything else lives here so
//! the black-box tests in `tests/` can start the real server on port 0.
//!
//! # Layout
//!
//! A call travels from the surface, through the facade, to the store, which runs one operation
//! in a transaction; its committed event travels back out through the fan-out. The arrows are
//! the real direction of calls (and imports): the broker never calls `operations/`, the store's
//! backends do, with their own transactions.
//!
//! ```text
//! grpc/ (inbox/)  ->  broker/  ->  store/ (sqlite/, postgres)  ->  operations/  ->  domain/
//!                                    |
//!     streams  <-  events.rs  <------+ (the durable event log, after each commit)
//! ```
//!
//! `docs/architecture.md` follows Decide through these files and holds the glossary and the
//! recipes for a change (a new read, admin write, event kind, setting or surface).
//!
//! - `grpc/`: the gRPC surface, one file per service (`agent`, `approver`, `admin`), plus `parse`
//!   (protobuf to validated domain values) and `render` (back). It reaches storage only through
//!   the broker (besides it, it uses `auth`, `events`, `receipts` and `stream_slots`).
//! - `inbox/`: the approval web page, served beside gRPC on the same port; the page's requests
//!   are gRPC-Web to the same services, through the same tokens and limits.
//! - `push/`: Web Push to approvers' browsers: the VAPID key, RFC 8291 encryption, and the
//!   sender that follows the event log and pushes each call to the subscriptions whose owner
//!   may decide it (`Call::visible_to`), off every decision's path.
//! - `slack/`: Slack app mode: pending calls posted from the event log with Approve / Deny /
//!   Open, and Slack's signed clicks (one HTTP path on the same port) decided through the broker
//!   like any decision.
//! - `hook/`, `acp/`, `mcp/`: adapters for the agents people run (the approval hooks of Claude
//!   Code, Codex, Gemini CLI, Copilot and Cursor on one shared core, `hook/host_call.rs`; an Agent
//!   Client Protocol proxy between an editor and its agent; any MCP client and server), gRPC
//!   clients of the broker like any agent.
//! - `broker/`: the one facade every surface calls; it judges large inputs ahead (`prejudge`),
//!   runs a write through the store, then hands what committed to the one after-commit step
//!   (`EventBus::committed`) and, after a submit, tells the deadline sweeper.
//! - `operations/`: what the broker does, one file per operation: `submit`, `decide`, `cancel`,
//!   `expire`, `escalate` (reminders and escalations), `prune` (retention), `policy_admin`
//!   (grants and rules), `explain`, `ruling` (what a rule or grant deciding a pending call
//!   brings along), and `routing` (who may decide a call, and the votes of two-person rules);
//!   `tx` holds the transaction primitives they are written over, and the lock order they keep.
//! - `domain/`: plain, validated types and rules with no I/O: ids, inputs in canonical JSON,
//!   calls, batches, outcomes, events, policy rules and grants, and the requests and reports the
//!   operations take and return.
//! - `store/`: storage behind small traits (`Calls`, `Deadlines`, `EventLog`, `Policies`,
//!   `Webhooks`, `Lifecycle`, `Receipts`, over the shared reads of `Backend`), one backend each: `sqlite/` (its one `writer` thread) and `postgres`, both group-committing
//!   submits, decisions and cancels (`group_commit`); the SQL
//!   both run is written once (`statements`), as is the keyset `listing`; `database` parses the
//!   URL once; `health` watches whether writes work.
//! - `receipts/`: signed receipts (DSSE over in-toto, Ed25519): the signing key and the offline
//!   verifier; the statement itself is `domain::receipt`, and the store signs it in the
//!   transaction that writes the outcome (`store::primitives`).
//! - `links.rs`: signed approval links (HMAC-SHA256, a key kept like the receipt key): made and
//!   opened through the broker (`broker::links`), carried by webhooks; a link never decides.
//! - `outbound.rs`: the one way out: every HTTP request the broker sends itself (webhooks, Web
//!   Push, Slack's Web API, an identity provider's keys) connects there (the URL read once, the
//!   address chosen by the egress policy, one TLS configuration).
//! - `commands/`: commands besides serving that drive several parts (`verify`, which checks
//!   receipts offline or against a database), kept above the parts they use.
//! - `events.rs`: the in-memory fan-out of committed events to every stream; `expiry.rs`: the
//!   deadline sweeper, which also fires escalation steps as they fall due; `retention.rs`:
//!   pruning decided calls past `--retain-decided`; `export.rs`: the audit of a time range as
//!   JSON Lines (`approval-broker export`).
//! - `startup.rs` wires the parts and serves them; `config.rs` parses the settings once;
//!   `connections/`, `auth.rs` and `stream_slots.rs` guard the door (connection caps, bearer
//!   tokens, stream caps); `error.rs` is the one error type and its gRPC status; `telemetry.rs`,
//!   `traces.rs` and `meters.rs` are logs, OTLP traces and metrics (`grpc/observed` counts and
//!   logs every RPC); `proto.rs` is generated code.
//!
//! The top-level modules import one another without cycles (the test in `layering.rs` fails
//! on one, naming its edges): settings a component owns live with it (`store::StoreSettings`,
//! `receipts::ReceiptsMode`), and `config` only gathers them.

// Every line of unsafe code is in the `sqlite-ffi` crate (SQLite's allocator and WAL VFS).
#![forbid(unsafe_code)]

pub mod acp;
pub mod auth;
pub mod broker;
pub mod commands;
pub mod config;
pub mod connections;
pub mod domain;
pub mod error;
pub mod events;
pub mod expiry;
pub mod export;
pub mod grpc;
pub mod hook;
pub mod inbox;
#[cfg(test)]
mod layering;
pub mod links;
pub mod mcp;
pub mod meters;
pub mod operations;
pub mod outbound;
pub mod private_files;
pub mod proto;
pub mod push;
pub mod receipts;
pub mod retention;
pub mod slack;
pub mod startup;
pub mod store;
pub mod stream_slots;
pub mod telemetry;
pub mod traces;
pub mod webhooks;

pub use error::{Error, Result};
