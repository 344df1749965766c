//! POSTs a signed body to an endpoint over HTTP/1.1 (hyper's client connection, TLS by rustls
//! against the Mozilla roots for `https://`). Connections are kept per endpoint and reused while
//! the server keeps them open. Every request ends within the timeout; nothing here retries
//! (delivery decides that) or follows redirects (a redirect is a failure the operator sees).
//!
//! Each new connection resolves the host, checks the answers against the egress policy and
//! connects to the address it checked, never to a name again. What an endpoint answers is read
//! (to keep the connection reusable) and dropped: a failure says the status and a fixed reason,
//! never the body, which the receiver chose and an operator's screen would show.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::Request;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue, USER_AGENT};

use super::egress::EgressPolicy;
use crate::domain::webhook::WebhookUrl;
use crate::door::outbound::{Target, Unreached};

/// The most of a response body read (then discarded): enough to keep a connection reusable.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Idle connections kept per endpoint.
const MAX_IDLE: usize = 16;

/// A message to POST: the body and the Standard Webhooks headers.
pub struct Message {
    pub id: String,
    pub timestamp: i64,
    pub signature: String,
    pub content_type: &'static str,
    pub body: Bytes,
}

/// How one request went.
enum Exchange {
    /// The endpoint answered (2xx: `Ok`), or the request could not be built.
    Answered(Result<(), String>),
    /// The connection failed before an answer.
    NotSent(String),
}

/// Where delivery sends an endpoint's messages: its HTTP [`Client`] (in unit tests, a fake
/// receiver, so a paused clock can run an hour of retries).
#[async_trait]
pub trait Transport: Send + Sync {
    /// POSTs `message`; `Ok` on a 2xx answer, else why not, for the operator.
    async fn post(&self, message: &Message) -> Result<(), String>;
}

/// Makes the transport for an endpoint's URL.
pub type Connect = Arc<dyn Fn(&WebhookUrl) -> Result<Arc<dyn Transport>, String> + Send + Sync>;

/// The HTTP client of one endpoint.
pub struct Client {
    target: Target,
    timeout: Duration,
    egress: Arc<EgressPolicy>,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Client {
    pub fn new(
        url: &WebhookUrl,
        timeout: Duration,
        egress: Arc<EgressPolicy>,
    ) -> Result<Self, String> {
        Ok(Self {
            target: Target::parse(url.as_str())?,
            timeout,
            egress,
            idle: Mutex::new(Vec::new()),
        })
    }

    async fn send(&self, message: &Message) -> Result<(), String> {
        // A kept connection the server closed meanwhile fails before any answer: the request
        // goes again on a new one (the same message, so a receiver sees at most a duplicate).
        if let Some(sender) = self.reuse() {
            match self.exchange(sender, message).await {
                Exchange::Answered(result) => return result,
                Exchange::NotSent(_) => {}
            }
        }
        let sender = self.connect().await?;
        match self.exchange(sender, message).await {
            Exchange::Answered(result) => result,
            Exchange::NotSent(error) => Err(error),
        }
    }

    async fn exchange(&self, mut sender: SendRequest<Full<Bytes>>, message: &Message) -> Exchange {
        // Host and port only: user-info is refused when a URL is set, and never sent if an older
        // stored one holds it.
        let request = Request::post(self.target.path())
            .header(HOST, self.target.authority())
            .header(CONTENT_TYPE, message.content_type)
            .header(
                USER_AGENT,
                HeaderValue::from_static(concat!("approval-broker/", env!("CARGO_PKG_VERSION"))),
            )
            .header("webhook-id", &message.id)
            .header("webhook-timestamp", message.timestamp.to_string())
            .header("webhook-signature", &message.signature)
            .body(Full::new(message.body.clone()));
        let request = match request {
            Ok(request) => request,
            Err(e) => return Exchange::Answered(Err(format!("cannot build the request: {e}"))),
        };
        if let Err(e) = sender.ready().await {
            return Exchange::NotSent(format!("connection closed: {e}"));
        }
        let response = match sender.send_request(request).await {
            Ok(response) => response,
            Err(e) => return Exchange::NotSent(format!("request failed: {e}")),
        };
        let status = response.status();
        let keep_alive = response.version() == hyper::Version::HTTP_11
            && !response
                .headers()
                .get(hyper::header::CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map(|b| b.to_bytes());
        if body.is_ok() && keep_alive {
            self.keep(sender);
        }
        Exchange::Answered(answered(status))
    }

    fn reuse(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(sender) = idle.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn keep(&self, sender: SendRequest<Full<Bytes>>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE && !sender.is_closed() {
            idle.push(sender);
        }
    }

    /// A new connection, to the one address the egress policy admits of the host's answers.
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        (self.target)
            .connect(|host, resolved| self.egress.pick(host, resolved))
            .await
            .map_err(Unreached::into_message)
    }
}

#[async_trait]
impl Transport for Client {
    async fn post(&self, message: &Message) -> Result<(), String> {
        match tokio::time::timeout(self.timeout, self.send(message)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }
}

/// What an answer's status means for delivery: 2xx delivered; anything else a failure saying
/// the status and a fixed reason. The body and the reason phrase are the receiver's words and
/// are never repeated (`last_error` and `SendTestEvent.error` are shown to operators).
fn answered(status: hyper::StatusCode) -> Result<(), String> {
    if status.is_success() {
        return Ok(());
    }
    let why = if status.is_redirection() {
        "redirects are not followed"
    } else {
        "the endpoint did not accept the event (its answer is not shown)"
    };
    let shown = match status.canonical_reason() {
        Some(name) => format!("{} {name}", status.as_u16()),
        None => status.as_u16().to_string(),
    };
    Err(format!("HTTP {shown}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::background::webhooks::egress::AllowedHost;

    fn client(url: &str, allowed: &[&str]) -> Client {
        let policy = EgressPolicy::new(
            allowed
                .iter()
                .map(|a| a.parse::<AllowedHost>().unwrap())
                .collect(),
        );
        let url = WebhookUrl::parse("url", url).unwrap();
        Client::new(&url, Duration::from_secs(2), Arc::new(policy)).unwrap()
    }

    fn message() -> Message {
        Message {
            id: "evt_1".into(),
            timestamp: 0,
            signature: "v1,x".into(),
            content_type: "application/json",
            body: Bytes::from_static(b"{}"),
        }
    }

    /// `localhost` passes no check made on the URL's text; the resolved address is what the
    /// policy judges, and a refused one is never connected to.
    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_after_resolution_and_never_connected() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let name = format!("http://localhost:{port}/hook");

        let error = client(&name, &[]).post(&message()).await.unwrap_err();
        assert!(
            error.contains("egress policy") && error.contains("loopback"),
            "{error}"
        );
        let connected = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(connected.is_err(), "a refused address was connected to");

        // Allowed by network: the loopback address it resolved to is the one connected to.
        let allowed = client(&name, &["127.0.0.0/8"]);
        let posting = tokio::spawn(async move { allowed.post(&message()).await });
        let (_, peer) = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .expect("the allowed address is connected to")
            .unwrap();
        assert!(peer.ip().is_loopback(), "{peer}");
        posting.abort();
    }

    #[test]
    fn a_failure_says_the_status_and_a_fixed_reason() {
        assert_eq!(answered(hyper::StatusCode::NO_CONTENT), Ok(()));
        assert_eq!(
            answered(hyper::StatusCode::INTERNAL_SERVER_ERROR),
            Err(
                "HTTP 500 Internal Server Error: the endpoint did not accept the event \
                 (its answer is not shown)"
                    .into()
            )
        );
        let redirect = answered(hyper::StatusCode::FOUND).unwrap_err();
        assert!(redirect.contains("302") && redirect.contains("not followed"));
        let odd = answered(hyper::StatusCode::from_u16(599).unwrap()).unwrap_err();
        assert!(odd.starts_with("HTTP 599: "), "{odd}");
    }
}
