//! The one way out: every HTTP request the broker itself sends (webhook deliveries, Web Push
//! messages, Slack's Web API, an identity provider's keys) is connected here, so each of them
//! gets the same care: the URL read once, the host resolved once and the address chosen by the
//! caller's policy (the webhooks' egress policy, which refuses private and link-local targets
//! unless allowed) and then used as it is (a second lookup could answer otherwise), TLS by
//! rustls with ring against the Mozilla roots (one configuration, to which a private CA's
//! certificates may be added for an identity provider: [`Tls`]), HTTP/1.1 by hyper's client
//! connection (no second HTTP stack). What to send and what an answer means stay with each
//! caller.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Uri;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

/// The process's one TLS client configuration: building it parses the root store.
pub fn tls() -> TlsConnector {
    static TLS: std::sync::OnceLock<TlsConnector> = std::sync::OnceLock::new();
    TLS.get_or_init(|| connector(mozilla_roots())).clone()
}

fn mozilla_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

fn connector(roots: RootCertStore) -> TlsConnector {
    // One provider named here, whatever other crates enable: rustls refuses to guess.
    let config = ClientConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// The certificates an `https://` server may present: signed by a Mozilla root, or (for an
/// identity provider behind a private CA, `--jwt-ca-file`) by one of a CA file's certificates.
#[derive(Clone)]
pub struct Tls {
    connector: TlsConnector,
    /// The CA file added, for messages.
    ca_file: Option<String>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl Tls {
    /// The process's one configuration: the Mozilla roots.
    pub fn public() -> Tls {
        Tls {
            connector: tls(),
            ca_file: None,
        }
    }

    /// The Mozilla roots and every certificate of the PEM file `path` (a private CA).
    pub fn with_ca_file(path: &Path) -> Result<Tls, String> {
        let shown = path.display();
        let certificates = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("cannot read the CA file {shown}: {e}"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the CA file {shown} is not PEM: {e}"))?;
        if certificates.is_empty() {
            return Err(format!("the CA file {shown} holds no PEM certificate"));
        }
        let mut roots = mozilla_roots();
        for certificate in certificates {
            roots.add(certificate).map_err(|e| {
                format!("the CA file {shown} holds a certificate that cannot be a root: {e}")
            })?;
        }
        Ok(Tls {
            connector: connector(roots),
            ca_file: Some(shown.to_string()),
        })
    }
}

/// Why no connection was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreached {
    /// The URL, its host name or the policy refuses it: trying again will not help.
    Refused(String),
    /// Resolving, connecting or TLS failed: it may work later.
    Failed(String),
}

impl Unreached {
    /// What happened, in words.
    pub fn into_message(self) -> String {
        match self {
            Unreached::Refused(why) | Unreached::Failed(why) => why,
        }
    }
}

/// Where a request goes: a URL, read once.
#[derive(Debug, Clone)]
pub struct Target {
    uri: Uri,
    /// The host without the brackets of an IPv6 literal.
    host: String,
    port: u16,
    https: bool,
}

impl Target {
    /// `https://`, or plain `http://` to a loopback host only: for a request whose content or
    /// answer must not be read or changed on the way (a client secret, an identity provider's
    /// keys).
    pub fn parse_confidential(url: &str) -> Result<Target, String> {
        let target = Target::parse(url).map_err(|e| format!("`{url}`: {e}"))?;
        let loopback = target.host.eq_ignore_ascii_case("localhost")
            || (target.host.parse::<IpAddr>()).is_ok_and(|ip| ip.is_loopback());
        if target.https || loopback {
            return Ok(target);
        }
        Err(format!(
            "`{url}`: only https:// (plain http:// to a loopback host alone), since what travels \
             in clear can be read or replaced by anyone on the path"
        ))
    }

    /// `http://` or `https://` with a host; the port defaults by scheme.
    pub fn parse(url: &str) -> Result<Target, String> {
        let uri: Uri = url.parse().map_err(|e| format!("invalid URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("the URL is neither http:// nor https://".into()),
        };
        let host = uri
            .host()
            .ok_or("the URL has no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        Ok(Target {
            uri,
            host,
            port,
            https,
        })
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// The URL, for messages.
    pub fn url(&self) -> String {
        self.uri.to_string()
    }

    /// The `Host` header: the URL's authority without any user information.
    pub fn authority(&self) -> &str {
        (self.uri.authority())
            .and_then(|a| a.as_str().rsplit('@').next())
            .unwrap_or(&self.host)
    }

    /// The request target: the URL's path and query.
    pub fn path(&self) -> &str {
        self.uri.path_and_query().map_or("/", |p| p.as_str())
    }

    /// Resolves the host once, lets `pick` choose among its addresses (an egress policy, say),
    /// connects there, adds TLS for `https://`, and opens an HTTP/1.1 connection, served by a
    /// task of its own until the server closes it or the sender is dropped.
    pub async fn connect(
        &self,
        pick: impl FnOnce(&str, &[SocketAddr]) -> Result<SocketAddr, String>,
    ) -> Result<SendRequest<Full<Bytes>>, Unreached> {
        self.connect_with(&Tls::public(), pick).await
    }

    /// [`connect`](Self::connect), checking an `https://` server's certificate with `tls`.
    pub async fn connect_with(
        &self,
        tls: &Tls,
        pick: impl FnOnce(&str, &[SocketAddr]) -> Result<SocketAddr, String>,
    ) -> Result<SendRequest<Full<Bytes>>, Unreached> {
        let (host, port) = (self.host.as_str(), self.port);
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| Unreached::Failed(format!("cannot resolve {host}: {e}")))?
            .collect();
        let address = pick(host, &resolved).map_err(Unreached::Refused)?;
        let tcp = TcpStream::connect(address).await.map_err(|e| {
            Unreached::Failed(format!("cannot connect to {host}:{port} ({address}): {e}"))
        })?;
        let _ = tcp.set_nodelay(true);
        if !self.https {
            return handshake(tcp).await;
        }
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| Unreached::Refused(format!("invalid server name {host}: {e}")))?;
        let stream = (tls.connector)
            .connect(name, tcp)
            .await
            .map_err(|e| Unreached::Failed(format!("TLS with {host}:{port} failed: {e}")))?;
        handshake(stream).await
    }
}

/// The first address resolved, for a caller whose URL was checked when it was configured.
pub fn first_address(host: &str, resolved: &[SocketAddr]) -> Result<SocketAddr, String> {
    resolved
        .first()
        .copied()
        .ok_or_else(|| format!("{host} resolves to no address"))
}

async fn handshake<S>(stream: S) -> Result<SendRequest<Full<Bytes>>, Unreached>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| Unreached::Failed(format!("HTTP handshake failed: {e}")))?;
    tokio::spawn(async move {
        // Ends when the server closes the connection or the sender is dropped.
        let _ = connection.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_read_once_with_its_port_authority_and_path() {
        let target = Target::parse("https://user:pw@[::1]:8443/a/b?c=1").unwrap();
        assert_eq!(
            (target.host(), target.port, target.https),
            ("::1", 8443, true)
        );
        assert_eq!(target.authority(), "[::1]:8443");
        assert_eq!(target.path(), "/a/b?c=1");
        let plain = Target::parse("http://example.com").unwrap();
        assert_eq!((plain.port, plain.path()), (80, "/"));
        assert!(Target::parse("ftp://example.com/").is_err());
        assert!(Target::parse("/relative").is_err());
    }

    #[tokio::test]
    async fn the_policy_chooses_the_address_and_its_refusal_is_final() {
        let target = Target::parse("http://127.0.0.1:9/").unwrap();
        let refused = target
            .connect(|host, _| Err(format!("{host} is not allowed")))
            .await
            .unwrap_err();
        assert_eq!(
            refused,
            Unreached::Refused("127.0.0.1 is not allowed".into())
        );
    }
}
