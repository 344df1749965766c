//! The work that follows the committed event log, off every request's path: the fan-out of
//! committed events to every stream (`events`), the deadline and escalation sweeper (`expiry`),
//! pruning decided calls past `--retain-decided` (`retention`), webhook delivery (`webhooks/`),
//! Web Push to approvers' browsers (`push/`), and what Web Push and Slack's poster share: where
//! they stopped in the log (`cursor`) and their rounds of retries (`rounds`).

pub mod cursor;
pub mod events;
pub mod expiry;
pub mod push;
pub mod retention;
pub mod rounds;
pub mod webhooks;
