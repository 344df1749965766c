//! `approval-broker acp-proxy -- <agent command>`: puts an Agent Client Protocol agent's
//! permission requests through the broker, with no change to the editor or the agent. The editor
//! starts the proxy instead of the agent; the proxy starts the agent and relays every JSON-RPC
//! line both ways unchanged, except the agent's `session/request_permission`, which the editor
//! never sees: the proxy submits the tool call (host `acp`) and answers the agent from the
//! outcome.
//!
//! # Layout
//! - [`proxy`]: the relay, the agent process, pending reviews and `session/cancel`.
//! - [`permission`]: a permission request as a broker call (the input shape is documented
//!   there), and the broker's review (`Reviewed`) as the option the agent gets.
//! - [`tool_calls`]: what the agent announced of each tool call before asking.
//!
//! Like the hooks, it fails closed: only an APPROVED outcome checked against its signed receipt
//! selects an allow option; a denial, a timeout, an unreachable broker, an approver's edit (ACP
//! cannot hand an agent another input) or a request it cannot read never does. Standard output
//! is the editor's channel: the proxy's own messages go to standard error.

pub mod permission;
pub mod proxy;
pub mod tool_calls;

use std::process::ExitCode;
use std::time::Duration;

use crate::agent::hook::receipt_check::ReceiptCheckArgs;
use crate::agent::hook::review::BrokerAddress;

/// The settings of `acp-proxy`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Example (an editor's agent command): approval-broker acp-proxy --broker http://127.0.0.1:50051 -- npx @zed-industries/claude-code-acp"
)]
pub struct AcpProxyArgs {
    #[command(flatten)]
    pub broker: BrokerAddress,

    /// How long a permission request waits for a decision, e.g. `90s`, `5m`. When it passes,
    /// the call is cancelled at the broker and the agent's reject option is selected.
    #[arg(long, env = "APPROVALS_ACP_TIMEOUT", default_value = "5m", value_parser = crate::domain::time::parse_duration)]
    pub timeout: Duration,

    /// The workspace recorded with each call (approvers filter on it; workspace grants match
    /// it). Default: the `cwd` of the session's `session/new` (or `session/load`).
    #[arg(long, env = "APPROVALS_ACP_WORKSPACE")]
    pub workspace: Option<String>,

    /// Select the agent's `allow_always` option when a remembered decision (a broker grant)
    /// approved the call. Off by default: an agent told "always" stops asking (claude-code-acp
    /// then allows the tool for the rest of the session, whatever its input), so its later calls
    /// would run without an approval from the broker.
    #[arg(long, env = "APPROVALS_ACP_SELECT_ALLOW_ALWAYS")]
    pub select_allow_always: bool,

    #[command(flatten)]
    pub receipts: ReceiptCheckArgs,

    /// The agent's command and arguments, after `--`; its standard error is the proxy's.
    #[arg(last = true, required = true, value_name = "AGENT COMMAND")]
    pub agent: Vec<String>,
}

/// Runs the agent behind the proxy until it exits; exits with the agent's code.
pub async fn run(args: &AcpProxyArgs) -> ExitCode {
    proxy::run(args).await
}
