//! One call reviewed through a broker, as a hook needs it: submit the call, wait for its outcome
//! up to a time limit, and, when the limit passes first, cancel the call so no approver answers
//! a question nobody waits for any more. This is the broker's client side, over `AgentService`;
//! it never decides anything itself and never turns a failure into an approval. Its bearer token
//! comes from [`TokenSource`]: a fixed one, or the identity provider's, renewed (a token the
//! broker refuses is replaced once).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request};

use crate::agent::token_source::{ClientCredentialsArgs, TokenSource};
use crate::proto::v1 as pb;
use pb::agent_service_client::AgentServiceClient;

/// How long connecting to the broker may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the cancel sent after a timeout may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long reading the receipt keys or a receipt may take: a broker that accepts connections but
/// never answers must not hold a tool call (nor the hook) forever.
const RECEIPT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause before watching again after the outcome stream broke (a broker restart).
const REWATCH_PAUSE: Duration = Duration::from_millis(300);

/// Where the broker is and how to authenticate to it: the same settings for every command that
/// reviews calls through a broker (the hooks, the MCP gateway, the ACP proxy).
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerAddress {
    /// The broker's gRPC address: `http://host:port`, or `https://host:port` for a broker
    /// serving TLS.
    #[arg(
        id = "broker",
        long = "broker",
        env = "APPROVALS_BROKER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub url: String,

    /// A PEM CA certificate to check an `https://` broker's certificate with (a private CA);
    /// without it, the Mozilla root certificates built in are used.
    #[arg(long, env = "APPROVALS_BROKER_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,

    /// A bearer token with the `agent` role, when the broker has authentication on (prefer the
    /// environment variable: a flag is visible to other users of the machine). Or get one from
    /// the identity provider with the `--oauth-*` settings.
    #[arg(long, env = "APPROVALS_BROKER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// A token from the organisation's identity provider (client credentials), renewed.
    #[command(flatten)]
    pub oauth: ClientCredentialsArgs,

    /// The token source the settings make, made once and shared by every clone (so a renewed
    /// token serves every review of the process).
    #[arg(skip)]
    source: Arc<OnceLock<Result<Arc<TokenSource>, String>>>,
}

impl BrokerAddress {
    /// The broker at `url`, with no token.
    pub fn new(url: impl Into<String>) -> BrokerAddress {
        BrokerAddress {
            url: url.into(),
            ca_cert: None,
            token: None,
            oauth: ClientCredentialsArgs::default(),
            source: Arc::default(),
        }
    }

    /// Where the bearer token comes from (the settings are checked, and a client secret read,
    /// the first time).
    pub fn token_source(&self) -> Result<Arc<TokenSource>, String> {
        self.source
            .get_or_init(|| {
                TokenSource::from_settings(self.token.as_deref(), &self.oauth).map(Arc::new)
            })
            .clone()
    }
}

/// Control characters (a multi-line command's new lines) become spaces; text longer than
/// [`TITLE_CHARS`] is cut: what an approver reads as a title stays one short line.
pub fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let flat = flat.trim();
    if flat.chars().count() <= TITLE_CHARS {
        return flat.to_owned();
    }
    let mut cut: String = flat.chars().take(TITLE_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// The most characters of a title an adapter derives from a call.
pub const TITLE_CHARS: usize = 120;

/// What became of a reviewed call.
#[derive(Debug, Clone, PartialEq)]
pub enum Review {
    /// The call has an outcome (approved, or one of the ways of not running).
    Decided(Box<pb::Outcome>),
    /// No outcome before the time limit; the call was cancelled at the broker if it could be.
    TimedOut { cancelled: bool },
}

/// Why a call could not be reviewed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReviewError {
    /// The broker could not be reached, or did not accept the request as a whole (network, TLS,
    /// authentication, a broker that is shutting down).
    #[error("The approval broker at {url} could not be reached or refused the request ({detail}).")]
    Unreachable { url: String, detail: String },
    /// The broker refused this call (a bad field, the same id with another input).
    #[error("The approval broker refused this call ({0}).")]
    Refused(String),
    /// There is no token to send: the identity provider could not give one (down, or refusing
    /// the client's credentials) and the last one expired, or the settings are wrong.
    #[error("No access token for the approval broker, so nothing was sent to it ({0}).")]
    NoToken(String),
}

/// Submits `call` in `session_id` (idempotent by the call id), and waits until `limit` for its
/// outcome.
pub async fn review(
    broker: &BrokerAddress,
    session_id: &str,
    call: pb::CallSpec,
    limit: Duration,
) -> Result<Review, ReviewError> {
    let give_up_at = Instant::now() + limit;
    let client = BrokerClient::connect(broker).await?;
    let call_id = call.call_id.clone();
    let submitted = tokio::time::timeout_at(give_up_at, client.submit(session_id, call)).await;
    match submitted {
        Err(_) => return Ok(client.give_up(session_id, &call_id).await),
        Ok(Err(error)) => return Err(error),
        Ok(Ok(response)) => {
            if let Some(outcome) = decided_at_submit(&response, &call_id)? {
                return Ok(Review::Decided(Box::new(outcome)));
            }
        }
    }
    match tokio::time::timeout_at(give_up_at, client.wait_for(session_id, &call_id)).await {
        Ok(outcome) => Ok(Review::Decided(Box::new(outcome))),
        Err(_) => Ok(client.give_up(session_id, &call_id).await),
    }
}

/// Cancels `call_id` in `session_id` because the agent stopped waiting (its user cancelled the
/// request). A decision that won the race is returned as the review: it stands.
pub async fn cancel(
    broker: &BrokerAddress,
    session_id: &str,
    call_id: &str,
    reason: &str,
) -> Result<Review, ReviewError> {
    let client = BrokerClient::connect(broker).await?;
    Ok(client.cancel(session_id, call_id, reason).await)
}

/// The signed receipt of the caller's own call `call_id` in `session_id`
/// (`AgentService.GetReceipt`); the error says why there is none, for the model to read.
pub async fn receipt(
    broker: &BrokerAddress,
    session_id: &str,
    call_id: &str,
) -> Result<pb::GetReceiptResponse, String> {
    tokio::time::timeout(
        RECEIPT_READ_TIMEOUT,
        receipt_now(broker, session_id, call_id),
    )
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "its receipt could not be fetched: the broker did not answer within {}s",
            RECEIPT_READ_TIMEOUT.as_secs()
        ))
    })
}

async fn receipt_now(
    broker: &BrokerAddress,
    session_id: &str,
    call_id: &str,
) -> Result<pb::GetReceiptResponse, String> {
    let client = BrokerClient::connect(broker)
        .await
        .map_err(|e| format!("its receipt could not be fetched: {e}"))?;
    let message = pb::GetReceiptRequest {
        session_id: session_id.into(),
        call_id: call_id.into(),
        agent: String::new(),
    };
    let asked = client
        .call(message, |mut agent, request| async move {
            agent.get_receipt(request).await
        })
        .await;
    match asked {
        Ok(response) => Ok(response.into_inner()),
        Err(status) => Err(match status.code() {
            Code::NotFound | Code::FailedPrecondition => {
                format!("the broker has no receipt for it: {}", status.message())
            }
            Code::Unimplemented => {
                "the broker does not serve receipts to agents (AgentService.GetReceipt)".into()
            }
            code => format!(
                "its receipt could not be fetched ({code:?}: {})",
                status.message()
            ),
        }),
    }
}

/// The keys the broker says its receipts verify with (`AgentService.ListReceiptKeys`): what an
/// executor given no key of its own trusts, read once when it starts.
pub async fn receipt_keys(
    broker: &BrokerAddress,
) -> Result<pb::ListReceiptKeysResponse, ReviewError> {
    tokio::time::timeout(RECEIPT_READ_TIMEOUT, receipt_keys_now(broker))
        .await
        .unwrap_or_else(|_| {
            Err(ReviewError::Unreachable {
                url: broker.url.clone(),
                detail: format!("no answer within {}s", RECEIPT_READ_TIMEOUT.as_secs()),
            })
        })
}

async fn receipt_keys_now(
    broker: &BrokerAddress,
) -> Result<pb::ListReceiptKeysResponse, ReviewError> {
    let client = BrokerClient::connect(broker).await?;
    client
        .call(
            pb::ListReceiptKeysRequest {},
            |mut agent, request| async move { agent.list_receipt_keys(request).await },
        )
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| client.unreachable(&status))
}

/// The outcome a submit already carries (a duplicate of a decided call, or a call a rule or a
/// grant decided at once); `None` while the call is pending.
fn decided_at_submit(
    response: &pb::SubmitResponse,
    call_id: &str,
) -> Result<Option<pb::Outcome>, ReviewError> {
    let ack = response
        .acks
        .iter()
        .find(|ack| ack.call_id == call_id)
        .ok_or_else(|| ReviewError::Refused("the broker did not acknowledge the call".into()))?;
    match &ack.result {
        Some(pb::call_ack::Result::Accepted(_) | pb::call_ack::Result::Duplicate(_)) => {}
        Some(pb::call_ack::Result::Error(error)) => {
            let code = Code::from_i32(error.code);
            return Err(ReviewError::Refused(format!("{code:?}: {}", error.message)));
        }
        None => return Err(ReviewError::Refused("an empty acknowledgement".into())),
    }
    Ok(response
        .outcomes
        .iter()
        .chain(&response.superseded)
        .find(|outcome| outcome.call_id == call_id)
        .cloned())
}

struct BrokerClient {
    agent: AgentServiceClient<Channel>,
    url: String,
    tokens: Arc<TokenSource>,
}

impl BrokerClient {
    /// Connects to the broker, with a token in hand first: without one, nothing is sent.
    async fn connect(broker: &BrokerAddress) -> Result<BrokerClient, ReviewError> {
        let unreachable = |detail: String| ReviewError::Unreachable {
            url: broker.url.clone(),
            detail,
        };
        let tokens = broker.token_source().map_err(ReviewError::NoToken)?;
        tokens.bearer().await.map_err(ReviewError::NoToken)?;
        let mut endpoint = Endpoint::from_shared(broker.url.clone())
            .map_err(|e| unreachable(format!("not a URL: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT);
        if broker.url.starts_with("https://") {
            let tls = match &broker.ca_cert {
                None => ClientTlsConfig::new().with_webpki_roots(),
                Some(path) => {
                    let pem = std::fs::read(path).map_err(|e| {
                        unreachable(format!(
                            "cannot read the CA certificate {}: {e}",
                            path.display()
                        ))
                    })?;
                    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))
                }
            };
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| unreachable(error_chain(&e)))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        Ok(BrokerClient {
            agent: AgentServiceClient::new(channel),
            url: broker.url.clone(),
            tokens,
        })
    }

    /// `message` with the bearer token to send now, and that token; no token is an
    /// UNAUTHENTICATED status saying why (nothing is sent).
    async fn request<T>(&self, message: T) -> Result<(Request<T>, Option<String>), tonic::Status> {
        let token = (self.tokens.bearer().await)
            .map_err(|why| tonic::Status::unauthenticated(format!("no access token: {why}")))?;
        let mut request = Request::new(message);
        if let Some(token) = &token {
            let value: MetadataValue<tonic::metadata::Ascii> =
                format!("Bearer {token}").parse().map_err(|_| {
                    tonic::Status::unauthenticated("the token is not a valid header value")
                })?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok((request, token))
    }

    /// One unary call with the bearer token; a token the broker refuses (UNAUTHENTICATED) is
    /// replaced with a fresh one, and the call made once more.
    async fn call<T: Clone, R, F, Fut>(&self, message: T, rpc: F) -> Result<R, tonic::Status>
    where
        F: Fn(AgentServiceClient<Channel>, Request<T>) -> Fut,
        Fut: Future<Output = Result<R, tonic::Status>>,
    {
        let (request, token) = self.request(message.clone()).await?;
        match rpc(self.agent.clone(), request).await {
            Err(status)
                if status.code() == Code::Unauthenticated
                    && self.tokens.refused(token.as_deref()).await =>
            {
                let (request, _) = self.request(message).await?;
                rpc(self.agent.clone(), request).await
            }
            answered => answered,
        }
    }

    fn unreachable(&self, status: &tonic::Status) -> ReviewError {
        ReviewError::Unreachable {
            url: self.url.clone(),
            detail: format!("{:?}: {}", status.code(), status.message()),
        }
    }

    async fn submit(
        &self,
        session_id: &str,
        call: pb::CallSpec,
    ) -> Result<pb::SubmitResponse, ReviewError> {
        let batch = pb::BatchSpec {
            session_id: session_id.into(),
            calls: vec![call],
            // One call per batch: there are no siblings to skip, whatever the policy.
            on_deny: pb::OnDeny::Independent as i32,
            supersede_pending: false,
        };
        let message = pb::SubmitRequest { batch: Some(batch) };
        self.call(message, |mut agent, request| async move {
            agent.submit(request).await
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| self.unreachable(&status))
    }

    /// Watches the call until it is decided; a broken stream (a broker restart) is watched
    /// again, since the call is durable and its outcome will come.
    async fn wait_for(&self, session_id: &str, call_id: &str) -> pb::Outcome {
        loop {
            if let Some(outcome) = self.watch_once(session_id, call_id).await {
                return outcome;
            }
            tokio::time::sleep(REWATCH_PAUSE).await;
        }
    }

    async fn watch_once(&self, session_id: &str, call_id: &str) -> Option<pb::Outcome> {
        let message = pb::WatchOutcomesRequest {
            session_id: session_id.into(),
            call_ids: vec![call_id.into()],
        };
        let mut stream = self
            .call(message, |mut agent, request| async move {
                agent.watch_outcomes(request).await
            })
            .await
            .ok()?
            .into_inner();
        while let Ok(Some(message)) = stream.message().await {
            if let Some(pb::watch_outcomes_response::Event::Outcome(outcome)) = message.event
                && outcome.call_id == call_id
            {
                return Some(outcome);
            }
        }
        None
    }

    /// Cancels the call after the time limit. A decision that won the race is returned as the
    /// review: it stands, and is what the agent must follow.
    async fn give_up(&self, session_id: &str, call_id: &str) -> Review {
        self.cancel(
            session_id,
            call_id,
            "the agent stopped waiting for a decision (its time limit passed)",
        )
        .await
    }

    async fn cancel(&self, session_id: &str, call_id: &str, reason: &str) -> Review {
        let message = pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: session_id.into(),
                target: Some(pb::cancel_target::Target::Calls(pb::CallIds {
                    call_ids: vec![call_id.into()],
                })),
                reason: reason.into(),
            }),
        };
        let cancelled = self.call(message, |mut agent, request| async move {
            agent.cancel(request).await
        });
        match tokio::time::timeout(CANCEL_TIMEOUT, cancelled).await {
            Ok(Ok(response)) => {
                let result = response.into_inner().result.unwrap_or_default();
                if let Some(outcome) = result
                    .already_decided
                    .iter()
                    .find(|o| o.call_id == call_id && o.status != pb::CallStatus::Cancelled as i32)
                {
                    return Review::Decided(Box::new(outcome.clone()));
                }
                // Cancelled now, or already (an earlier cancel of the same call).
                Review::TimedOut {
                    cancelled: (result.cancelled.iter())
                        .chain(&result.already_decided)
                        .any(|o| o.call_id == call_id),
                }
            }
            _ => Review::TimedOut { cancelled: false },
        }
    }
}

/// An error with its causes, which name what actually failed (refused, DNS, TLS).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // hyper and tonic repeat a cause in their own message; say it once.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
