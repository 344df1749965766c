//! Where the gateway meets its clients: one client on standard I/O (the way MCP clients start a
//! local server), or any number over Streamable HTTP at `/mcp` (`--listen`), each MCP session
//! with its own [`Gateway`], so its own broker session and its own connection to the server.
//! In stdio mode standard output carries MCP messages only; everything else goes to standard
//! error.

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::ServiceExt as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::gateway::{Gateway, Settings};

/// Serves one client on standard I/O until it disconnects.
pub async fn serve_stdio(settings: Settings) -> Result<(), String> {
    let gateway = Gateway::new(Arc::new(settings));
    let running = gateway
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("the MCP client on standard I/O: {e}"))?;
    let mut reviews = running.service().reviews();
    running
        .waiting()
        .await
        .map_err(|e| format!("the gateway stopped: {e}"))?;
    // The client is gone; the calls it left waiting are being cancelled at the broker, so
    // approvers are not asked about them. Let that finish before the process exits.
    let _ = tokio::time::timeout(CLOSE_GRACE, reviews.wait_for(|n| *n == 0)).await;
    Ok(())
}

/// How long a gateway whose client went away waits for its calls' cancellations.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves Streamable HTTP at `http://ADDRESS/mcp` until SIGINT or SIGTERM.
pub async fn serve_http(settings: Settings, address: SocketAddr) -> Result<(), String> {
    let settings = Arc::new(settings);
    let mut config = StreamableHttpServerConfig::default();
    // The default admits only loopback host names (against DNS rebinding); a gateway bound to
    // another address is meant to be reached by it.
    if !address.ip().is_loopback() {
        let mut hosts = config.allowed_hosts.clone();
        hosts.push(address.ip().to_string());
        config = config.with_allowed_hosts(hosts);
    }
    let service = StreamableHttpService::new(
        move || Ok(Gateway::new(settings.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| format!("cannot bind --listen {address}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    eprintln!("approval-broker mcp-gateway: serving MCP at http://{bound}/mcp");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| format!("serving HTTP: {e}"))
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
