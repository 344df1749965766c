//! The approval broker: a gRPC service between LLM agents and the humans who approve their tool
//! calls. `main.rs` only wires configuration to [`startup::run`]; everything else lives here so
//! the black-box tests in `tests/` can start the real server on port 0.

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
pub mod limits;
pub mod mcp;
pub mod meters;
pub mod proto;
pub mod startup;
pub mod store;
pub mod telemetry;

pub use error::{Error, Result};
