//! The MCP server the client sees, deny-by-default. Only what [`super::screen`] passed reaches
//! it; of that, the requests known to be free of side effects (listing, reading, completion,
//! logging level, subscriptions, `ping`) are relayed to the real server unchanged, `initialize`
//! opens the connection to it with the client's parameters and answers with the server's, and
//! `tools/call` is submitted to the broker first: only an APPROVED outcome is forwarded (the name
//! and the approved, possibly edited, arguments, nothing else of the client's request), and every
//! other outcome, a timeout, a broker that cannot be reached, a server that has exited or a
//! refusal, is answered with a tool result with `isError: true` whose text the model reads. Every
//! other request is refused with a JSON-RPC error, never relayed; every other notification is
//! dropped. A client's `notifications/cancelled` cancels the call at the broker (CANCELLED) or,
//! once it runs, at the server.
//!
//! It must never forward a `tools/call` the broker did not approve.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, ClientNotification, ClientRequest,
    CompleteRequest, CompleteRequestParams, CompleteResult, CustomNotification, CustomRequest,
    CustomResult, DiscoverResult, GetMeta as _, GetPromptRequest, GetPromptRequestParams,
    GetPromptResponse, InitializeRequestParams, InitializeResult, ListPromptsRequest,
    ListPromptsResult, ListResourceTemplatesRequest, ListResourceTemplatesResult,
    ListResourcesRequest, ListResourcesResult, ListToolsRequest, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion, ReadResourceRequest,
    ReadResourceRequestParams, ReadResourceResponse, RootsListChangedNotification, ServerConfig,
    ServerResult, SubscribeRequestParams, UnsubscribeRequestParams,
};
// Logging levels and resource subscriptions are deprecated by the newest revision, which the
// gateway does not speak; for the revisions it speaks they are ordinary requests to relay.
#[allow(deprecated)]
use rmcp::model::{SetLevelRequest, SetLevelRequestParams, SubscribeRequest, UnsubscribeRequest};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, ServiceError};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use tokio::sync::{OnceCell, watch};

use super::approval::{self, Disposition, NotSubmitted, ToolFacts};
use super::screen::{self, RequestRoute};
use super::session::{ConnectionNames, SessionPolicy};
use super::upstream::{ProgressRoutes, Relay, Upstream, UpstreamTarget, cancelled, relay_error};
use crate::agent::hook::receipt_check::{NoKeys, ReceiptCheck};
use crate::agent::hook::review::{self, BrokerAddress, Review, ReviewError};

/// The most `tools/list` pages read to learn a tool's annotations the client never listed.
const MAX_TOOL_PAGES: usize = 20;
/// How long the server has to answer the `ping` that shows it is still there before a call is
/// submitted for approval.
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection of one gateway shares.
#[derive(Debug, Clone)]
pub struct Settings {
    pub broker: BrokerAddress,
    pub sessions: SessionPolicy,
    pub workspace: Option<String>,
    pub timeout: Duration,
    pub upstream: UpstreamTarget,
    /// What every APPROVED outcome is checked against before its tool runs.
    pub receipts: Arc<ReceiptCheck>,
}

impl Settings {
    pub fn from_args(args: &super::McpGatewayArgs) -> Result<Settings, String> {
        let upstream = match (&args.upstream, args.server.is_empty()) {
            (Some(url), true) => UpstreamTarget::Url(url.clone()),
            (None, false) => UpstreamTarget::Command(args.server.clone()),
            (None, true) => {
                return Err(
                    "name the MCP server: its command after `--`, or --upstream URL".to_owned(),
                );
            }
            (Some(_), false) => {
                return Err("give either --upstream or a server command, not both".to_owned());
            }
        };
        // The token settings are checked (and a client secret read) now, not at the first call.
        args.broker.token_source()?;
        Ok(Settings {
            broker: args.broker.clone(),
            sessions: SessionPolicy::from_flags(args.session.as_deref(), &args.session_from)?,
            workspace: args.workspace.clone(),
            timeout: args.timeout,
            upstream,
            receipts: Arc::new(ReceiptCheck::new(&args.receipts, &args.broker)?),
        })
    }
}

/// One client connection (one MCP session over HTTP) and its own connection to the server.
pub struct Gateway {
    settings: Arc<Settings>,
    names: ConnectionNames,
    upstream: OnceCell<Upstream>,
    tools: Mutex<HashMap<String, ToolFacts>>,
    progress: ProgressRoutes,
    /// How many tool calls are under review, so a gateway whose client went away can let their
    /// cancellations reach the broker before it exits.
    reviews: Arc<watch::Sender<usize>>,
}

/// Counts one review while it lives.
struct UnderReview(Arc<watch::Sender<usize>>);

impl UnderReview {
    fn start(reviews: &Arc<watch::Sender<usize>>) -> UnderReview {
        reviews.send_modify(|n| *n += 1);
        UnderReview(reviews.clone())
    }
}

impl Drop for UnderReview {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Gateway {
    pub fn new(settings: Arc<Settings>) -> Gateway {
        let names = settings.sessions.connection();
        Gateway {
            settings,
            names,
            upstream: OnceCell::new(),
            tools: Mutex::new(HashMap::new()),
            progress: ProgressRoutes::default(),
            reviews: Arc::new(watch::channel(0).0),
        }
    }

    /// The number of tool calls under review, as it changes.
    pub fn reviews(&self) -> watch::Receiver<usize> {
        self.reviews.subscribe()
    }

    fn upstream(&self) -> Result<&Upstream, McpError> {
        self.upstream
            .get()
            .ok_or_else(|| McpError::invalid_request("initialize first", None))
    }

    /// Sends `request` to the server and returns its answer; a client cancellation is passed on.
    /// The client's `_meta` goes along with relayed reads; never with a tool call, whose approver
    /// saw only its name and arguments (the SDK adds a progress token of its own either way).
    async fn forward(
        &self,
        request: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, McpError> {
        let upstream = self.upstream()?;
        let options = match &request {
            ClientRequest::CallToolRequest(_) => PeerRequestOptions::no_options(),
            _ => PeerRequestOptions::no_options().with_meta(context.meta.clone()),
        };
        let handle = upstream
            .peer()
            .send_cancellable_request(request, options)
            .await
            .map_err(relay_error)?;
        let _route = context
            .meta
            .get_progress_token()
            .map(|client| self.progress.route(handle.progress_token.clone(), client));
        let id = handle.id.clone();
        tokio::select! {
            response = handle.await_response() => response.map_err(relay_error),
            () = context.ct.cancelled() => {
                let _ = upstream.notify(cancelled(id, "the client cancelled the request").into()).await;
                Err(client_cancelled())
            }
        }
    }

    /// Relays a client notification with the `_meta` the SDK took out of it.
    async fn notify_upstream(
        &self,
        mut notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) {
        let Ok(upstream) = self.upstream() else {
            return;
        };
        notification.get_meta_mut().extend(context.meta);
        if let Err(error) = upstream.notify(notification).await {
            tracing::warn!(%error, "cannot relay a notification to the MCP server");
        }
    }

    fn remember_tools(&self, result: &ListToolsResult) {
        let mut tools = self.tools.lock().unwrap_or_else(|p| p.into_inner());
        for tool in &result.tools {
            tools.insert(tool.name.to_string(), ToolFacts::from(tool));
        }
    }

    fn known_tool(&self, name: &str) -> Option<ToolFacts> {
        let tools = self.tools.lock().unwrap_or_else(|p| p.into_inner());
        tools.get(name).cloned()
    }

    /// What the server declared about `name`: from the client's own `tools/list`, or, for a
    /// client that called without listing, from a listing the gateway asks for itself.
    async fn tool_facts(&self, name: &str) -> Option<ToolFacts> {
        if let Some(facts) = self.known_tool(name) {
            return Some(facts);
        }
        let peer = self.upstream().ok()?.peer();
        let mut cursor = None;
        for _ in 0..MAX_TOOL_PAGES {
            let mut request = ListToolsRequest::with_param(PaginatedRequestParams::default());
            request.params = cursor.map(|cursor| {
                let mut page = PaginatedRequestParams::default();
                page.cursor = Some(cursor);
                page
            });
            let Ok(ServerResult::ListToolsResult(page)) = peer
                .send_request(ClientRequest::ListToolsRequest(request))
                .await
            else {
                break;
            };
            self.remember_tools(&page);
            if let Some(facts) = self.known_tool(name) {
                return Some(facts);
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        None
    }

    /// Why the server cannot run a tool now, if it cannot: it has exited (its connection is
    /// closed), or it does not answer a `ping`. Asked before a call is submitted, so approvers
    /// are never asked about a call that could not run. Any answer to the ping, an error
    /// included, shows the server is there.
    async fn server_gone(&self) -> Option<String> {
        let upstream = self.upstream().ok()?;
        let server = self.server_name();
        let gone = |what: String| {
            Some(format!(
                "The MCP server `{server}` behind the approval gateway {what}, so the tool cannot                  run; the call was not submitted for approval and the tool was not run.                  Reconnect to the gateway (restart the MCP server in the client) and try again."
            ))
        };
        let peer = upstream.peer();
        if peer.is_transport_closed() {
            return gone("has exited".to_owned());
        }
        let ping = ClientRequest::PingRequest(Default::default());
        match tokio::time::timeout(PING_TIMEOUT, peer.send_request(ping)).await {
            Ok(Ok(_) | Err(ServiceError::McpError(_))) => None,
            Ok(Err(ServiceError::TransportClosed)) => gone("has exited".to_owned()),
            Ok(Err(error)) => gone(format!("cannot be reached ({error})")),
            Err(_) => gone(format!(
                "did not answer a ping within {}",
                humantime::format_duration(PING_TIMEOUT)
            )),
        }
    }

    fn server_name(&self) -> String {
        self.upstream
            .get()
            .and_then(Upstream::server_info)
            .map(|info| info.server_info.name)
            .unwrap_or_else(|| self.settings.upstream.to_string())
    }

    /// Has the broker review the call, and says what its answer calls for. Every path but an
    /// APPROVED outcome refuses.
    async fn review(
        &self,
        params: &CallToolRequestParams,
        call_id: String,
        context: &RequestContext<RoleServer>,
    ) -> Disposition {
        let facts = self.tool_facts(&params.name).await;
        let spec = match approval::call_spec(
            call_id.clone(),
            &self.server_name(),
            &params.name,
            params.arguments.as_ref(),
            facts.as_ref(),
            self.settings.workspace.as_deref(),
        ) {
            Ok(spec) => spec,
            Err(NotSubmitted(text)) => return Disposition::Refuse(approval::refusal(&text)),
        };
        let settings = &self.settings;
        // No call is submitted before the keys its approval will be checked with are known.
        // Within the call's own time limit: a broker that never answers refuses it in time.
        let keys = tokio::time::timeout(settings.timeout, settings.receipts.keys()).await;
        let Ok(keys) = keys else {
            tracing::warn!(call_id, "the broker did not answer in time; not submitted");
            return Disposition::Refuse(approval::refusal(&format!(
                "No approver decided within {}: the approval broker did not answer, so the call \
                 was never submitted. The tool was not run.",
                humantime::format_duration(settings.timeout)
            )));
        };
        match keys {
            Ok(_) => {}
            // An unreachable broker is said as such (as when the call itself cannot be sent).
            Err(NoKeys::Unreachable(error)) => {
                tracing::warn!(call_id, %error, "a tool call could not be reviewed; not run");
                return Disposition::Refuse(approval::refusal(&format!(
                    "{error} The tool was not run."
                )));
            }
            Err(NoKeys::Unverified(unverified)) => {
                tracing::warn!(call_id, %unverified, "no trusted receipt key; not submitted");
                return Disposition::Refuse(approval::refusal(&unverified.to_string()));
            }
        }
        let session_id = &self.names.session_id;
        let _counted = UnderReview::start(&self.reviews);
        let reviewed = tokio::select! {
            reviewed = review::review(&settings.broker, session_id, spec, settings.timeout) => reviewed,
            // The client cancelled the request, or went away (the SDK then cancels every
            // request still open): either way nobody waits for the answer any more.
            () = context.ct.cancelled() => {
                let reason = "the MCP client cancelled the request or disconnected";
                review::cancel(&settings.broker, session_id, &call_id, reason).await
            }
        };
        match reviewed {
            Ok(Review::Decided(outcome)) => match approval::disposition(&outcome) {
                Disposition::Run(arguments) => {
                    // The approved input as the outcome gives it (the hints included, as the
                    // receipt records it); the arguments are that input less the hints.
                    let runs = serde_json::from_str(&outcome.input_json).unwrap_or_default();
                    match settings
                        .receipts
                        .approve(session_id, &call_id, &outcome, &runs)
                        .await
                    {
                        Ok(()) => Disposition::Run(arguments),
                        Err(unverified) => {
                            tracing::warn!(call_id, %unverified, "an APPROVED outcome did not check");
                            Disposition::Refuse(approval::refusal(&unverified.to_string()))
                        }
                    }
                }
                refused => refused,
            },
            Ok(Review::TimedOut { cancelled }) => {
                let what = if cancelled {
                    "it was cancelled at the approval broker"
                } else {
                    "cancelling it at the approval broker failed too"
                };
                Disposition::Refuse(approval::refusal(&format!(
                    "No approver decided within {}, so {what}. The tool was not run.",
                    humantime::format_duration(settings.timeout)
                )))
            }
            Err(
                error @ (ReviewError::Unreachable { .. }
                | ReviewError::Refused(_)
                | ReviewError::NoToken(_)),
            ) => {
                tracing::warn!(call_id, %error, "a tool call could not be reviewed; not run");
                Disposition::Refuse(approval::refusal(&format!("{error} The tool was not run.")))
            }
        }
    }
}

/// The error for a request of `method` the SDK could not type: unreadable params for a method
/// the gateway serves, else a method it does not relay.
fn refuse_untyped(method: &str) -> McpError {
    match screen::request_route(method) {
        Some(RequestRoute::Review) => McpError::invalid_params(
            "The approval gateway refused this tools/call: its params do not have the types the \
             MCP specification gives them. Nothing was sent to the MCP server or to approvers, \
             and the tool was not run. Call it again with `name` (a string) and `arguments` (an \
             object) only.",
            None,
        ),
        Some(RequestRoute::Relay) => McpError::invalid_params(
            format!(
                "The approval gateway could not read this `{method}` request: its params do not \
                 have the types the MCP specification gives them. Nothing was sent to the MCP \
                 server."
            ),
            None,
        ),
        None => McpError::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!(
                "The approval gateway does not relay `{method}`: it passes on only requests known \
                 to have no side effects and `tools/call` after approval. Nothing was sent to the \
                 MCP server."
            ),
            None,
        ),
    }
}

fn client_cancelled() -> McpError {
    McpError::internal_error("the client cancelled the request", None)
}

fn unexpected(result: ServerResult) -> McpError {
    tracing::warn!(
        ?result,
        "the MCP server answered with another kind of result"
    );
    McpError::internal_error("the MCP server answered with another kind of result", None)
}

impl ServerHandler for Gateway {
    /// The client's `initialize` opens the connection to the server with the client's own
    /// parameters; the server's answer is the gateway's.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let relay = Relay::new(context.peer.clone(), request, self.progress.clone());
        let upstream = self
            .upstream
            .get_or_try_init(|| Upstream::connect(&self.settings.upstream, relay))
            .await
            .map_err(|problem| {
                tracing::error!(%problem, "cannot reach the MCP server");
                McpError::internal_error(problem, None)
            })?;
        upstream
            .server_info()
            .ok_or_else(|| McpError::internal_error("the MCP server sent no server info", None))
    }

    fn get_info(&self) -> ServerConfig {
        self.upstream
            .get()
            .and_then(Upstream::server_info)
            .unwrap_or_default()
    }

    /// The handshake era only (up to 2025-11-25): every request is relayed within the one
    /// session `initialize` opened with the server.
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        Err(McpError::method_not_found::<
            rmcp::model::DiscoverRequestMethod,
        >())
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.upstream()?;
        // The screen refuses these before the SDK types them; they are checked again here so
        // that this path stands on its own: the approver would not see them.
        if params.input_responses.is_some() || params.request_state.is_some() {
            return Err(McpError::invalid_params(
                "The approval gateway refused this tools/call: `inputResponses` and \
                 `requestState` belong to a protocol revision it does not speak. Nothing was sent \
                 to the MCP server or to approvers, and the tool was not run.",
                None,
            ));
        }
        if let Some(text) = self.server_gone().await {
            tracing::warn!(tool = %params.name, "{text}");
            return Ok(CallToolResponse::Complete(approval::refusal(&text)));
        }
        let call_id = self.names.next_call_id(&context.id.to_string());
        match self.review(&params, call_id, &context).await {
            Disposition::Refuse(result) => Ok(CallToolResponse::Complete(result)),
            Disposition::Run(arguments) => {
                // Only what the approver saw goes to the server: the name and the arguments.
                let mut params = CallToolRequestParams::new(params.name);
                params.arguments = Some(arguments);
                let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
                match self.forward(request, &context).await? {
                    ServerResult::CallToolResult(result) => Ok(CallToolResponse::Complete(result)),
                    ServerResult::InputRequiredResult(input) => {
                        Ok(CallToolResponse::InputRequired(input))
                    }
                    ServerResult::CreateTaskResult(task) => Ok(CallToolResponse::Task(task)),
                    other => Err(unexpected(other)),
                }
            }
        }
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut list = ListToolsRequest::with_param(PaginatedRequestParams::default());
        list.params = request;
        match self
            .forward(ClientRequest::ListToolsRequest(list), &context)
            .await?
        {
            ServerResult::ListToolsResult(result) => {
                self.remember_tools(&result);
                Ok(result)
            }
            other => Err(unexpected(other)),
        }
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let request = ClientRequest::CompleteRequest(CompleteRequest::new(request));
        match self.forward(request, &context).await? {
            ServerResult::CompleteResult(result) => Ok(result),
            other => Err(unexpected(other)),
        }
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::SetLevelRequest(SetLevelRequest::new(request));
        self.forward(request, &context).await.map(drop)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(request));
        match self.forward(request, &context).await? {
            ServerResult::GetPromptResult(result) => Ok(GetPromptResponse::Complete(result)),
            ServerResult::InputRequiredResult(input) => Ok(GetPromptResponse::InputRequired(input)),
            other => Err(unexpected(other)),
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let mut list = ListPromptsRequest::with_param(PaginatedRequestParams::default());
        list.params = request;
        match self
            .forward(ClientRequest::ListPromptsRequest(list), &context)
            .await?
        {
            ServerResult::ListPromptsResult(result) => Ok(result),
            other => Err(unexpected(other)),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut list = ListResourcesRequest::with_param(PaginatedRequestParams::default());
        list.params = request;
        match self
            .forward(ClientRequest::ListResourcesRequest(list), &context)
            .await?
        {
            ServerResult::ListResourcesResult(result) => Ok(result),
            other => Err(unexpected(other)),
        }
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let mut list = ListResourceTemplatesRequest::with_param(PaginatedRequestParams::default());
        list.params = request;
        match self
            .forward(ClientRequest::ListResourceTemplatesRequest(list), &context)
            .await?
        {
            ServerResult::ListResourceTemplatesResult(result) => Ok(result),
            other => Err(unexpected(other)),
        }
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(request));
        match self.forward(request, &context).await? {
            ServerResult::ReadResourceResult(result) => Ok(ReadResourceResponse::Complete(result)),
            ServerResult::InputRequiredResult(input) => {
                Ok(ReadResourceResponse::InputRequired(input))
            }
            other => Err(unexpected(other)),
        }
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::SubscribeRequest(SubscribeRequest::new(request));
        self.forward(request, &context).await.map(drop)
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(request));
        self.forward(request, &context).await.map(drop)
    }

    /// A request the SDK could not type as any method it knows. The screen refuses these before
    /// they get here; this path refuses them too, and relays nothing: a `tools/call` the SDK
    /// could not type would otherwise reach the server unreviewed.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        tracing::warn!(method = %request.method, "refused a request the MCP library could not type");
        Err(refuse_untyped(&request.method))
    }

    async fn on_progress(
        &self,
        notification: ProgressNotificationParam,
        context: NotificationContext<RoleServer>,
    ) {
        let notification = rmcp::model::ProgressNotification::new(notification);
        self.notify_upstream(notification.into(), context).await;
    }

    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        let notification = RootsListChangedNotification::default();
        self.notify_upstream(notification.into(), context).await;
    }

    /// A notification the SDK could not type. A notification can do anything a server makes it
    /// do and cannot be answered, so it is dropped, never relayed.
    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleServer>,
    ) {
        tracing::warn!(
            method = %notification.method,
            "dropped a notification the MCP library could not type; it was not passed on"
        );
    }

    /// The SDK sends the server its own `notifications/initialized` when it connects.
    async fn on_initialized(&self, _context: NotificationContext<RoleServer>) {}
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::config::{Command, Config};

    fn settings(args: &[&str]) -> Result<Settings, String> {
        let config = Config::try_parse_from(args).map_err(|e| e.to_string())?;
        let Some(Command::McpGateway(gateway)) = config.command else {
            panic!("not the gateway: {args:?}");
        };
        Settings::from_args(&gateway)
    }

    #[test]
    fn the_server_is_a_command_after_the_separator_or_an_upstream_url() {
        let spawned = settings(&[
            "approval-broker",
            "mcp-gateway",
            "--",
            "npx",
            "-y",
            "server",
        ]);
        assert_eq!(
            spawned.unwrap().upstream,
            UpstreamTarget::Command(vec!["npx".into(), "-y".into(), "server".into()])
        );
        let remote = settings(&[
            "approval-broker",
            "mcp-gateway",
            "--upstream",
            "http://127.0.0.1:3001/mcp",
        ]);
        assert_eq!(
            remote.unwrap().upstream,
            UpstreamTarget::Url("http://127.0.0.1:3001/mcp".into())
        );
    }

    #[test]
    fn a_request_the_sdk_could_not_type_is_refused_never_relayed() {
        use rmcp::model::ErrorCode;
        let call = refuse_untyped("tools/call");
        assert_eq!(call.code, ErrorCode::INVALID_PARAMS);
        assert!(
            call.message.contains("the tool was not run"),
            "{}",
            call.message
        );
        assert_eq!(
            refuse_untyped("resources/read").code,
            ErrorCode::INVALID_PARAMS
        );
        let unknown = refuse_untyped("x/y");
        assert_eq!(unknown.code, ErrorCode::METHOD_NOT_FOUND);
        assert!(unknown.message.contains("`x/y`"), "{}", unknown.message);
    }

    #[test]
    fn a_gateway_with_no_server_or_two_is_refused_naming_the_flags() {
        let none = settings(&["approval-broker", "mcp-gateway"]).unwrap_err();
        assert!(none.contains("--upstream"), "{none}");
        let both = settings(&[
            "approval-broker",
            "mcp-gateway",
            "--upstream",
            "http://127.0.0.1:3001/mcp",
            "--",
            "server",
        ])
        .unwrap_err();
        assert!(both.contains("--upstream"), "{both}");
        let sessions = settings(&[
            "approval-broker",
            "mcp-gateway",
            "--session",
            "a",
            "--session-from",
            "env:X",
            "--",
            "server",
        ])
        .unwrap_err();
        assert!(sessions.contains("--session"), "{sessions}");
    }
}
