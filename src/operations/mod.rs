//! The broker's operations, written once for every backend: one file per operation, each a
//! function over one open transaction of a backend ([`tx`]'s primitives), holding the rules of
//! that operation and nothing about SQL or gRPC.
//!
//! Submits, decisions and cancels reach them through the [`Writes`] port the broker holds: on
//! SQLite (and Postgres under `--postgres-group-commit`) the group commit in [`tx`], which runs
//! the writes queued meanwhile in one transaction; otherwise Postgres runs each in its own. The
//! rest a backend runs in transactions of its own. Either way a report is acknowledged only after
//! its commit. The lock-order rules that keep concurrent transactions and replicas correct are
//! stated once, in [`tx`].
//!
//! - [`submit`]: store a batch, recognise retries, supersede, let rules and grants decide.
//! - [`decide`]: an approver's verdict, first decision wins; a remembered one creates a grant.
//! - [`cancel`]: the agent withdraws calls.
//! - [`expire`]: deadlines passed.
//! - [`escalate`]: escalation ladders: started at submit, a step fired when it falls due.
//! - [`policy_admin`]: revoke grants; create, delete and load rules.
//! - [`explain`]: what would decide a call now, read as a submit reads it.
//! - [`prune`]: retention deletes batches decided long ago, with their events.
//! - [`routing`]: who may decide a call (fixed at submit) and the votes of two-person rules,
//!   which `decide` counts.

pub mod cancel;
pub mod decide;
pub mod escalate;
pub mod expire;
pub mod explain;
pub mod passkeys;
pub mod policy_admin;
pub mod prune;
pub mod routing;
mod ruling;
pub mod submit;
pub mod tx;

#[cfg(test)]
pub(crate) mod testing;

pub use passkeys::PasskeyTx;
pub use tx::{Placement, PolicyTx, Resolved, Stored, SubmitLocks, Transactions, WriteTx, Writes};
