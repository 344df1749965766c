//! POSTs a signed body to an endpoint over HTTP/1.1 (hyper's client connection, TLS by rustls
//! against the Mozilla roots for `https://`). Connections are kept per endpoint and reused while
//! the server keeps them open. Every request ends within the timeout; nothing here retries
//! (delivery decides that) or follows redirects (a redirect is a failure the operator sees).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue, USER_AGENT};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

use crate::domain::webhook::WebhookUrl;

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

/// The HTTP client of one endpoint.
pub struct Client {
    url: Uri,
    tls: TlsConnector,
    timeout: Duration,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

/// One TLS configuration for the process: building it parses the root store.
fn tls() -> TlsConnector {
    static TLS: std::sync::OnceLock<TlsConnector> = std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        let roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        // One provider named here, whatever other crates enable: rustls refuses to guess.
        let config =
            ClientConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        TlsConnector::from(Arc::new(config))
    })
    .clone()
}

impl Client {
    pub fn new(url: &WebhookUrl, timeout: Duration) -> Result<Self, String> {
        let url: Uri = url
            .as_str()
            .parse()
            .map_err(|e| format!("invalid URL: {e}"))?;
        Ok(Self {
            url,
            tls: tls(),
            timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// POSTs `message`; `Ok` on a 2xx answer, else why not (for the operator: the status and
    /// the start of the answer, or the connection error).
    pub async fn post(&self, message: &Message) -> Result<(), String> {
        match tokio::time::timeout(self.timeout, self.send(message)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
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
        let authority = self.url.authority().map(|a| a.as_str()).unwrap_or_default();
        let path = self.url.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let request = Request::post(path)
            .header(HOST, authority)
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
        if status.is_success() {
            return Exchange::Answered(Ok(()));
        }
        let said = body
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned())
            .unwrap_or_default();
        Exchange::Answered(Err(format!("HTTP {status}: {}", said.trim())))
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

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let host = self.url.host().ok_or("the URL has no host")?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let https = self.url.scheme_str() == Some("https");
        let port = self.url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        if https {
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| format!("invalid server name {host}: {e}"))?;
            let stream = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {host}:{port} failed: {e}"))?;
            handshake(stream).await
        } else {
            handshake(tcp).await
        }
    }
}

async fn handshake<S>(stream: S) -> Result<SendRequest<Full<Bytes>>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    tokio::spawn(async move {
        // Ends when the server closes the connection or the sender is dropped.
        let _ = connection.await;
    });
    Ok(sender)
}
