//! The gateway's connection to the real MCP server: a child process spoken to over its standard
//! I/O, or a Streamable HTTP URL. The connection is opened when the client initializes, with the
//! client's own `initialize` parameters, so the server sees the client's name and capabilities.
//! What the server sends back on its own (sampling, elicitation and roots requests,
//! notifications, progress) is relayed to the client by [`Relay`]. This side never decides
//! anything about tool calls: the gateway only sends it calls that were approved.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientConfig, ClientNotification,
    ClientResult, GetMeta as _, InitializeResult, ProgressToken, RequestId, ServerNotification,
    ServerRequest,
};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RequestContext, RunningService, ServiceError,
    ServiceExt,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ErrorData as McpError, RoleClient, RoleServer, Service};

/// Where the real server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTarget {
    /// A command and its arguments, spawned per client connection.
    Command(Vec<String>),
    /// A Streamable HTTP endpoint.
    Url(String),
}

impl std::fmt::Display for UpstreamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamTarget::Command(command) => write!(f, "`{}`", command.join(" ")),
            UpstreamTarget::Url(url) => f.write_str(url),
        }
    }
}

/// Which client progress token each upstream progress token stands for. The SDK gives every
/// request it sends a progress token of its own, so the server's progress notifications name
/// the gateway's token and must be renamed before the client can match them.
#[derive(Debug, Clone, Default)]
pub struct ProgressRoutes(Arc<Mutex<HashMap<ProgressToken, ProgressToken>>>);

impl ProgressRoutes {
    /// Routes `upstream` to `client` until the returned guard is dropped.
    pub fn route(&self, upstream: ProgressToken, client: ProgressToken) -> ProgressRoute {
        self.lock().insert(upstream.clone(), client);
        ProgressRoute {
            routes: self.clone(),
            upstream,
        }
    }

    fn client_token(&self, upstream: &ProgressToken) -> Option<ProgressToken> {
        self.lock().get(upstream).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ProgressToken, ProgressToken>> {
        // A panic elsewhere while holding the map leaves it usable: entries are independent.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A live progress route; dropping it forgets the route after [`ROUTE_GRACE`].
pub struct ProgressRoute {
    routes: ProgressRoutes,
    upstream: ProgressToken,
}

/// How long a route outlives its request. The SDK relays each notification on a task of its
/// own, so the server's last progress notifications, sent before its result, may be relayed
/// just after the result: they must still find their route.
const ROUTE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        let (routes, upstream) = (self.routes.clone(), self.upstream.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(ROUTE_GRACE).await;
                    routes.lock().remove(&upstream);
                });
            }
            Err(_) => {
                routes.lock().remove(&upstream);
            }
        }
    }
}

/// The client side of the gateway's connection to the server: relays what the server sends on
/// its own to the client.
pub struct Relay {
    client: Peer<RoleServer>,
    client_info: ClientConfig,
    progress: ProgressRoutes,
}

impl Relay {
    pub fn new(
        client: Peer<RoleServer>,
        client_info: ClientConfig,
        progress: ProgressRoutes,
    ) -> Self {
        Relay {
            client,
            client_info,
            progress,
        }
    }
}

impl Service<RoleClient> for Relay {
    async fn handle_request(
        &self,
        request: ServerRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, McpError> {
        let options = PeerRequestOptions::no_options().with_meta(context.meta.clone());
        let handle = self
            .client
            .send_cancellable_request(request, options)
            .await
            .map_err(relay_error)?;
        let (id, client) = (handle.id.clone(), handle.peer.clone());
        tokio::select! {
            response = handle.await_response() => response.map_err(relay_error),
            () = context.ct.cancelled() => {
                let _ = client.send_notification(cancelled(id, "the server cancelled it").into()).await;
                Err(McpError::internal_error("cancelled by the server", None))
            }
        }
    }

    async fn handle_notification(
        &self,
        mut notification: ServerNotification,
        context: NotificationContext<RoleClient>,
    ) -> Result<(), McpError> {
        // The SDK takes `_meta` out of a notification it receives; it goes back in as it came.
        notification.get_meta_mut().extend(context.meta);
        let notification = match notification {
            ServerNotification::ProgressNotification(mut progress) => {
                // The SDK gives every request a token; progress for a request whose client
                // asked for none has no one to go to.
                let Some(token) = self.progress.client_token(&progress.params.progress_token)
                else {
                    return Ok(());
                };
                progress.params.progress_token = token;
                ServerNotification::ProgressNotification(progress)
            }
            // The SDK turned it into the cancellation of the request the server had sent, which
            // `handle_request` relays with the client's own request id.
            ServerNotification::CancelledNotification(_) => return Ok(()),
            other => other,
        };
        self.client
            .send_notification(notification)
            .await
            .map_err(relay_error)
    }

    fn get_info(&self) -> ClientConfig {
        self.client_info.clone()
    }
}

/// A `notifications/cancelled` for the request `id`.
pub fn cancelled(id: RequestId, reason: &str) -> CancelledNotification {
    CancelledNotification::new(CancelledNotificationParam::new(
        Some(id),
        Some(reason.to_owned()),
    ))
}

/// An error from the other side, passed on as it came; a broken connection as an internal error.
pub fn relay_error(error: ServiceError) -> McpError {
    match error {
        ServiceError::McpError(error) => error,
        other => McpError::internal_error(format!("the MCP server: {other}"), None),
    }
}

/// A connection to the server, initialized.
pub struct Upstream {
    running: RunningService<RoleClient, Relay>,
}

impl Upstream {
    /// Starts (or reaches) the server and initializes it with the client's parameters.
    pub async fn connect(target: &UpstreamTarget, relay: Relay) -> Result<Upstream, String> {
        let running = match target {
            UpstreamTarget::Command(command) => {
                let (program, args) = command
                    .split_first()
                    .ok_or_else(|| "no server command".to_owned())?;
                let mut process = tokio::process::Command::new(program);
                process.args(args);
                let transport = TokioChildProcess::new(process)
                    .map_err(|e| format!("cannot start the MCP server {target}: {e}"))?;
                relay.serve(transport).await
            }
            UpstreamTarget::Url(url) => {
                let transport = StreamableHttpClientTransport::from_uri(url.as_str());
                relay.serve(transport).await
            }
        }
        .map_err(|e| format!("cannot initialize the MCP server {target}: {e}"))?;
        Ok(Upstream { running })
    }

    pub fn peer(&self) -> &Peer<RoleClient> {
        self.running.peer()
    }

    /// The server's answer to `initialize`, to give the client as the gateway's own.
    pub fn server_info(&self) -> Option<InitializeResult> {
        let info = self.running.peer().peer_info()?;
        let mut result = InitializeResult::new(info.capabilities.clone())
            .with_protocol_version(info.protocol_version.clone());
        if let Some(server) = &info.server_info {
            result = result.with_server_info(server.clone());
        }
        if let Some(instructions) = &info.instructions {
            result = result.with_instructions(instructions.clone());
        }
        result.meta = info.meta.clone();
        Some(result)
    }

    /// Sends `notification` to the server.
    pub async fn notify(&self, notification: ClientNotification) -> Result<(), McpError> {
        self.peer()
            .send_notification(notification)
            .await
            .map_err(relay_error)
    }
}
