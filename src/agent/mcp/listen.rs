//! Where the gateway meets its clients: one client on standard I/O (the way MCP clients start a
//! local server), or any number over Streamable HTTP at `/mcp` (`--listen`), each MCP session
//! with its own [`Gateway`], so its own broker session and its own connection to the server.
//! In stdio mode standard output carries MCP messages only; everything else goes to standard
//! error.
//!
//! On both, every message is screened before the MCP library sees it ([`super::screen`]): on
//! standard I/O by the transport of [`super::stdio`], over HTTP by [`screen_post`] in front of
//! the library's service, which answers a refused request with a JSON-RPC error instead of the
//! library's bare HTTP 415.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{Method, Request, Response, StatusCode, header};
use axum::middleware::Next;
use rmcp::ServiceExt as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::gateway::{Gateway, Settings};
use super::screen::{self, Screened};

/// Serves one client on standard I/O until it disconnects.
pub async fn serve_stdio(settings: Settings) -> Result<(), String> {
    let gateway = Gateway::new(Arc::new(settings));
    let running = gateway
        .serve(super::stdio::stdio())
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
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(screen_post));
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

/// The longest request body read, as the library's own limit for a message: 16 MiB.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Screens the body of each POST (the messages a client sends); a passed message goes on to the
/// library as it was screened (re-encoded, so it reads exactly what the screen read, even where
/// the body held a key twice). GET (the server's stream) and DELETE (the end of a session) carry
/// no client message and go on as they are.
async fn screen_post(request: Request<Body>, next: Next) -> Response<Body> {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(bytes) => bytes,
        Err(error) => {
            let text = format!(
                "The approval gateway could not read the request body ({error}; at most                  {MAX_BODY} bytes); nothing was sent to the MCP server."
            );
            let reply =
                screen::error_reply(&serde_json::Value::Null, screen::INVALID_REQUEST, text);
            return json_reply(StatusCode::BAD_REQUEST, &reply);
        }
    };
    match screen::screen_bytes(&bytes) {
        Screened::Pass(message) => {
            let body = match serde_json::to_vec(&message) {
                Ok(body) => Bytes::from(body),
                Err(error) => {
                    tracing::error!(%error, "cannot re-encode a screened MCP message");
                    let reply = screen::error_reply(
                        &serde_json::Value::Null,
                        screen::INVALID_REQUEST,
                        "The approval gateway could not pass this message on; nothing was sent                          to the MCP server."
                            .to_owned(),
                    );
                    return json_reply(StatusCode::BAD_REQUEST, &reply);
                }
            };
            parts
                .headers
                .insert(header::CONTENT_LENGTH, body.len().into());
            next.run(Request::from_parts(parts, Body::from(body))).await
        }
        Screened::Refuse(reply) => {
            tracing::warn!(%reply, "refused a message from the MCP client");
            // A request with an id is answered as the protocol answers it (200, the JSON-RPC
            // response); one the reply cannot name is an HTTP error with the reply as its body.
            let status = if reply.is_array() || !reply["id"].is_null() {
                StatusCode::OK
            } else {
                StatusCode::BAD_REQUEST
            };
            json_reply(status, &reply)
        }
        Screened::Drop(what) => {
            tracing::warn!("dropped {what} from the MCP client; it was not passed on");
            Response::builder()
                .status(StatusCode::ACCEPTED)
                .body(Body::empty())
                .unwrap_or_default()
        }
    }
}

fn json_reply(status: StatusCode, reply: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(reply.to_string()))
        .unwrap_or_default()
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
