//! POSTs one encrypted push message to a push service (RFC 8030 §5) over HTTP/1.1, TLS by
//! rustls against the Mozilla roots, connecting only to an address the webhooks' egress policy
//! admits (resolved once, checked, then used). Nothing here retries: the sender decides that
//! from the [`Answer`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::client::conn::http1;
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

use crate::webhooks::egress::EgressPolicy;

/// The most of an answer's body read (then dropped).
const MAX_RESPONSE_BYTES: usize = 16 * 1024;

/// What the push service said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: accepted for delivery.
    Accepted,
    /// 404 or 410: the subscription expired or was withdrawn; drop it.
    Gone,
    /// 429, 5xx, or no answer: try again later.
    Retry(String),
    /// Any other status: the request itself is wrong; retrying will not help.
    Refused(String),
}

/// One request to send.
pub struct PushRequest<'a> {
    pub endpoint: &'a str,
    pub authorization: &'a str,
    pub ttl_secs: u32,
    pub urgency: &'static str,
    /// Replaces a message still queued at the push service with the same topic.
    pub topic: Option<&'a str>,
    pub body: Bytes,
}

fn tls() -> TlsConnector {
    static TLS: std::sync::OnceLock<TlsConnector> = std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        let roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
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

/// Sends `request`, ending within `timeout` whatever the push service does.
pub async fn post(request: &PushRequest<'_>, egress: &EgressPolicy, timeout: Duration) -> Answer {
    match tokio::time::timeout(timeout, exchange(request, egress)).await {
        Ok(answer) => answer,
        Err(_) => Answer::Retry(format!(
            "the push service did not answer within {}s",
            timeout.as_secs_f64()
        )),
    }
}

async fn exchange(request: &PushRequest<'_>, egress: &EgressPolicy) -> Answer {
    let url: Uri = match request.endpoint.parse() {
        Ok(url) => url,
        Err(e) => return Answer::Refused(format!("invalid endpoint URL: {e}")),
    };
    let Some(host) = url.host() else {
        return Answer::Refused("the endpoint URL has no host".into());
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let https = url.scheme_str() == Some("https");
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    let resolved: Vec<std::net::SocketAddr> =
        match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(addresses) => addresses.collect(),
            Err(e) => return Answer::Retry(format!("cannot resolve {host}: {e}")),
        };
    let address = match egress.pick(&host, &resolved) {
        Ok(address) => address,
        Err(e) => return Answer::Refused(e),
    };
    let tcp = match TcpStream::connect(address).await {
        Ok(tcp) => tcp,
        Err(e) => return Answer::Retry(format!("cannot connect to {host}:{port}: {e}")),
    };
    let _ = tcp.set_nodelay(true);
    let authority = url
        .authority()
        .and_then(|a| a.as_str().rsplit('@').next())
        .unwrap_or_default()
        .to_owned();
    let path = url.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut builder = Request::post(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
        .header(hyper::header::CONTENT_ENCODING, "aes128gcm")
        .header(hyper::header::AUTHORIZATION, request.authorization)
        .header("TTL", request.ttl_secs.to_string())
        .header("Urgency", request.urgency)
        .header(
            hyper::header::USER_AGENT,
            concat!("approval-broker/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(topic) = request.topic {
        builder = builder.header("Topic", topic);
    }
    let built = match builder.body(Full::new(request.body.clone())) {
        Ok(built) => built,
        Err(e) => return Answer::Refused(format!("cannot build the request: {e}")),
    };
    let sent = if https {
        let name = match ServerName::try_from(host.clone()) {
            Ok(name) => name,
            Err(e) => return Answer::Refused(format!("invalid server name {host}: {e}")),
        };
        match tls().connect(name, tcp).await {
            Ok(stream) => send(TokioIo::new(stream), built).await,
            Err(e) => return Answer::Retry(format!("TLS with {host}:{port} failed: {e}")),
        }
    } else {
        send(TokioIo::new(tcp), built).await
    };
    match sent {
        Ok(status) => classify(status),
        Err(e) => Answer::Retry(e),
    }
}

async fn send<I>(io: I, request: Request<Full<Bytes>>) -> Result<u16, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status().as_u16();
    let _ = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await;
    Ok(status)
}

/// What a status means for the subscription (RFC 8030 §5, §7.3; RFC 8292 §4.2 for 403).
pub fn classify(status: u16) -> Answer {
    match status {
        200..=299 => Answer::Accepted,
        404 | 410 => Answer::Gone,
        429 | 500..=599 => Answer::Retry(format!("the push service answered {status}")),
        _ => Answer::Refused(format!("the push service answered {status}")),
    }
}
