//! The work that follows the committed event log, off every request's path: the fan-out of
//! committed events to every stream (`events`), the deadline and escalation sweeper (`expiry`),
//! pruning decided calls past `--retain-decided` (`retention`), webhook delivery (`webhooks/`) and
//! Web Push to approvers' browsers (`push/`).

pub mod events;
pub mod expiry;
pub mod push;
pub mod retention;
pub mod webhooks;
