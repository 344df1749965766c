//! The approval broker: a gRPC service between LLM agents and the humans who approve their tool
//! calls. `main.rs` only wires configuration to [`startup::run`]; everything else lives here so
//! the black-box tests in `tests/` can start the real server on port 0.
//!
//! # Layout
//!
//! The top level is grouped by role. A call travels from a surface, through the facade, to the
//! store, which runs one operation in a transaction; its committed event travels back out
//! through the background work that follows the event log. The arrows are the real direction of
//! calls (and imports): the broker never calls `operations/`, the store's backends do, with
//! their own transactions.
//!
//! ```text
//! surface/ (grpc, inbox, slack)  ->  broker/  ->  store/ (sqlite/, postgres)  ->  operations/  ->  domain/
//!        ^                              |            |
//!        |                              v            v (the durable event log, after each commit)
//!        +---- streams <---- background/ (events fan-out, sweeper, retention, webhooks, push)
//!
//! agent/ (hook, mcp, acp): gRPC clients of the broker, run beside the agent hosts
//! door/ (auth, connections, stream_slots, links, outbound), observe/ (meters, telemetry, traces): used by the above
//! ```
//!
//! `docs/architecture.md` follows Decide through these files and holds the glossary and the
//! recipes for a change (a new read, admin write, event kind, setting or surface).
//!
//! - `surface/`: where people and programs reach the broker. `grpc/` is one file per service
//!   (`agent`, `approver`, `admin`) plus `parse` (protobuf to validated domain values) and
//!   `render` (back); `inbox/` the approval web page served beside gRPC on the same port (its
//!   requests are gRPC-Web to the same services); `slack/` Slack's signed clicks, decided through
//!   the broker like any decision, and the Block Kit posts. Surfaces reach storage only through
//!   the broker.
//! - `broker/`: the one facade every surface calls; it judges large inputs ahead (`prejudge`),
//!   writes calls through the `Writes` port (`operations::tx`), then runs the one after-commit step
//!   (`Broker::committed`: the event pump woken, each outcome counted and logged) and, after a
//!   submit, tells the deadline sweeper, whose own writes come back through the broker
//!   (`background::expiry::Sweeps`).
//! - `store/`: storage behind small traits (`Calls`, `Deadlines`, `EventLog`, `Policies`,
//!   `Webhooks`, `Lifecycle`, `Receipts`, over the shared reads of `Backend`), one backend each:
//!   `sqlite/` (its one `writer` thread) and `postgres`, each giving the broker its `Writes`
//!   (the group commit of `operations::tx` over the backend's transactions, or Postgres's own
//!   transactions without `--postgres-group-commit`); the SQL both run is
//!   written once (`statements`), as is the keyset `listing`; the feature tables (`webhooks`, `push`, `slack`, `passkeys`) and rule and
//!   grant administration (`policies`) are each written once over the `Transact` port;
//!   `database` parses the URL once; `health` is told inside every transaction and shared read
//!   whether storage works; `fault` is the one place that reads the drivers' errors.
//! - `operations/`: what the broker does, one file per operation: `submit`, `decide`, `cancel`,
//!   `expire`, `escalate` (reminders and escalations), `prune` (retention), `policy_admin`
//!   (grants and rules), `explain`, `ruling` (what a rule or grant deciding a pending call
//!   brings along), `routing` (the requirement a call gets at submit: who may decide it, how
//!   many must agree; `decide` counts the votes), and
//!   `passkeys` (registering passkeys, and the check of a passkey-signed vote in its decision);
//!   `tx` holds the transaction primitives they are written over, the lock order they keep, and
//!   the `Writes` port with the group commit that runs submits, decisions and cancels.
//! - `domain/`: plain, validated types and rules with no I/O: ids, inputs in canonical JSON,
//!   calls, batches, outcomes, events, policy rules, grants and the one gate
//!   (`domain/policy/gate.rs`), passkeys (`domain/passkey/`: WebAuthn checked from its bytes,
//!   and the statement a passkey signs), and the requests and reports the operations take and
//!   return.
//! - `background/`: the work that follows the committed event log, off every request's path:
//!   `events` (the in-memory fan-out to every stream), `expiry` (the deadline sweeper, which
//!   also fires escalation steps; it decides when, the broker writes), `retention` (pruning past
//!   `--retain-decided`), `webhooks/` (delivery) and `push/` (Web Push to approvers' browsers, to
//!   those who may decide the call); `cursor` (where Web Push and Slack's poster stopped in the
//!   log, stored) and `rounds` (their rounds of retries) are written once for both.
//! - `agent/`: the agent side: `hook/` (the approval hooks of Claude Code, Codex, Gemini CLI,
//!   Copilot and Cursor on one core, `hook/host_call.rs`, and the shared broker client
//!   `hook/review.rs`), `acp/` (an Agent Client Protocol proxy) and `mcp/` (the MCP gateway),
//!   with one `token_source` (a fixed bearer token, or the identity provider's, renewed).
//!   They check each outcome's signed receipt before a tool runs.
//! - `door/`: who comes in and what goes out: `auth` (bearer tokens, JWTs, roles),
//!   `connections/` and `stream_slots` (caps), `links` (signed approval links: they open a
//!   call, never decide it), `outbound` (the one way out: every HTTP request the broker sends
//!   itself, under the egress policy and one TLS configuration), `passkeys` (who the broker is
//!   to WebAuthn authenticators: `--passkey-*`).
//! - `observe/`: `meters` (metrics), `telemetry` (one log line per outcome), `traces` (OTLP).
//! - `receipts/`: signed receipts (DSSE over in-toto, Ed25519): the signing key and the offline
//!   verifier; the statement itself is `domain::receipt`, and the store signs it in the
//!   transaction that writes the outcome (`store::primitives`).
//! - `commands/`: commands besides serving that drive several parts (`verify`, `export`), kept
//!   above the parts they use.
//! - `startup.rs` wires the parts and serves them; `config.rs` parses the settings once;
//!   `error.rs` is the one error type and its gRPC status; `proto.rs` is generated code;
//!   `private_files.rs` writes the 0600 key files.
//!
//! The top-level modules import one another without cycles (the test in `layering.rs` fails
//! on one, naming its edges): settings a component owns live with it (`store::StoreSettings`,
//! `receipts::ReceiptsMode`), and `config` only gathers them.

// Every line of unsafe code is in the `sqlite-ffi` crate (SQLite's allocator and WAL VFS).
#![forbid(unsafe_code)]

pub mod agent;
pub mod background;
pub mod broker;
pub mod commands;
pub mod config;
pub mod domain;
pub mod door;
pub mod error;
#[cfg(test)]
mod layering;
pub mod observe;
pub mod operations;
pub mod private_files;
pub mod proto;
pub mod receipts;
pub mod startup;
pub mod store;
pub mod surface;

pub use error::{Error, Result};
