//! Black-box tests: each starts the real broker on port 0 with a fresh SQLite file and talks to
//! it through the generated gRPC clients, one module per area. One test binary, so the suite
//! links once. Set `TEST_LOG=1` to see the broker's logs.

mod helpers;

mod admin;
mod agent_stream;
mod approver_stream;
mod audit;
mod auth;
mod backup;
mod bad_input;
mod batches;
mod cancel;
mod claude_code_hook;
mod cli;
mod connections;
mod database_tls;
mod deadlines;
mod decisions;
mod drain;
mod escalation;
mod executor_receipts;
mod explain;
mod export;
mod governance;
mod grants;
mod host_actions;
mod host_hooks;
mod group_commit;
mod idempotency;
mod inbox;
mod jwt;
mod limits;
mod lookalikes;
mod numbers;
mod policy_cache;
mod receipts;
mod recovery;
mod replay;
mod replicas;
mod replies;
mod retention;
mod routing;
mod rules;
mod shadow;
mod storage;
mod supersede;
mod surface;
mod telemetry;
mod test_total;
mod tls;
mod traces;
mod undecodable;
mod validation;
mod visibility;
mod webhooks;
