//! `approval-broker mcp-gateway`: an MCP server that stands in front of a real MCP server and
//! puts every `tools/call` through the broker, so any MCP client and any MCP server get
//! approvals with no change to either. The client speaks MCP to the gateway (standard I/O, or
//! Streamable HTTP with `--listen`); the gateway speaks MCP to the real server (a child process it
//! spawns, or a Streamable HTTP URL with `--upstream`).
//!
//! # Layout
//! - [`screen`]: what may reach the MCP library at all; deny-by-default, every refused request
//!   answered with a JSON-RPC error.
//! - [`stdio`]: the client's standard I/O as a transport that screens each line.
//! - [`gateway`]: the MCP server the client sees; relays the requests known to be free of side
//!   effects, gates `tools/call`, refuses the rest.
//! - [`upstream`]: the connection to the real server, and what it sends back to the client.
//! - [`approval`]: a tool call as a broker call (title, message, hints) and an outcome as a tool
//!   result.
//! - [`session`]: which broker session and call id a tool call gets.
//! - [`listen`]: serving the client, on standard I/O or over Streamable HTTP.
//!
//! Like the hook, the gateway fails closed: no failure, timeout or refusal ever runs a tool;
//! each is a tool result with `isError: true`, or a JSON-RPC error for a request it cannot read,
//! that names the problem. Standard output is the MCP
//! channel in stdio mode, so nothing else may ever be written to it.

pub mod approval;
pub mod gateway;
pub mod listen;
pub mod screen;
pub mod session;
pub mod stdio;
pub mod upstream;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// The settings of `mcp-gateway`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Example: approval-broker mcp-gateway --broker http://127.0.0.1:50051 -- npx -y @modelcontextprotocol/server-filesystem /srv/data"
)]
pub struct McpGatewayArgs {
    #[command(flatten)]
    pub broker: crate::agent::hook::review::BrokerAddress,

    /// The broker session every tool call goes into. Call ids are then prefixed with a fresh id
    /// per client connection, since MCP request ids start again at 0 on each connection.
    #[arg(long, env = "APPROVALS_MCP_SESSION", conflicts_with = "session_from")]
    pub session: Option<String>,

    /// Where the session comes from when --session is not given: `connection` (a fresh session
    /// per client connection, the default) or `env:NAME` (the value of the environment
    /// variable NAME, read at start).
    #[arg(long, env = "APPROVALS_MCP_SESSION_FROM", default_value = "connection", value_parser = session::SessionSource::parse)]
    pub session_from: session::SessionSource,

    /// The workspace recorded with each call (approvers filter on it; workspace grants match it).
    #[arg(long, env = "APPROVALS_MCP_WORKSPACE")]
    pub workspace: Option<String>,

    /// How long a tool call waits for a decision, e.g. `90s`, `10m`. When it passes, the call is
    /// cancelled at the broker and the client gets an error result; the tool is not run.
    #[arg(long, env = "APPROVALS_MCP_TIMEOUT", default_value = "10m", value_parser = crate::domain::time::parse_duration)]
    pub timeout: Duration,

    /// Serve the client over Streamable HTTP at this address (the endpoint is `/mcp`) instead of
    /// standard I/O. Each MCP session gets its own broker session and its own upstream.
    #[arg(long, env = "APPROVALS_MCP_LISTEN")]
    pub listen: Option<SocketAddr>,

    /// The real server's Streamable HTTP URL, e.g. `http://127.0.0.1:3001/mcp`, instead of a
    /// command to spawn.
    #[arg(long, env = "APPROVALS_MCP_UPSTREAM", conflicts_with = "server")]
    pub upstream: Option<String>,

    /// The real server's command and arguments, after `--`: spawned per client connection, and
    /// spoken to over its standard I/O. Its standard error is the gateway's.
    #[arg(last = true, value_name = "SERVER COMMAND")]
    pub server: Vec<String>,

    #[command(flatten)]
    pub receipts: crate::agent::hook::receipt_check::ReceiptCheckArgs,
}

/// Runs the gateway until the client disconnects (stdio) or SIGINT/SIGTERM (HTTP).
pub async fn run(args: &McpGatewayArgs) -> ExitCode {
    log_to_stderr();
    // The TLS of an `https://` upstream; tonic and the broker already use ring. Installing it
    // fails only when a provider is already installed, which is as good.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let settings = match gateway::Settings::from_args(args) {
        Ok(settings) => settings,
        Err(problem) => {
            eprintln!("approval-broker mcp-gateway: {problem}");
            return ExitCode::from(2);
        }
    };
    // The broker's keys, when none is given, are read now (and, if the broker cannot be
    // reached yet, before the first call is submitted), never from an outcome.
    if let Err(unverified) = settings.receipts.keys().await {
        tracing::warn!(%unverified, "the broker's receipt keys could not be read at start");
    }
    let result = match args.listen {
        None => listen::serve_stdio(settings).await,
        Some(address) => listen::serve_http(settings, address).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("approval-broker mcp-gateway: {problem}");
            ExitCode::FAILURE
        }
    }
}

/// Warnings and errors (or `RUST_LOG`) on standard error: standard output may be the MCP channel.
fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
}
