//! Fetches an issuer's signing keys (its JWKS) over HTTPS: from an explicit URL, or from the
//! `jwks_uri` its OpenID discovery document (`<issuer>/.well-known/openid-configuration`)
//! names. Through the broker's one way out (`crate::door::outbound`), as the webhooks send.
//!
//! Plain `http://` is accepted only for a loopback host (a provider on the same machine, as in
//! the tests): keys fetched in clear from elsewhere could be swapped for an attacker's, who
//! could then sign any token. Every request ends within a timeout; redirects are not followed;
//! an answer larger than [`MAX_DOCUMENT_BYTES`] is refused.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, HOST, HeaderValue, USER_AGENT};
use hyper::{Request, Uri};

use super::jwt::KeySource;
use crate::door::outbound::{Target, Tls, first_address};

/// The largest discovery or JWKS document read.
const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
/// How long one document may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The keys of `issuer`, at `jwks_url` or where its discovery document says.
pub struct HttpKeys {
    issuer: String,
    jwks_url: Option<String>,
    /// The certificates its HTTPS may present (the Mozilla roots, or also a private CA's).
    tls: Tls,
}

impl HttpKeys {
    /// Checks the URLs now (so a typo stops the broker at start); fetches nothing.
    pub fn new(issuer: &str, jwks_url: Option<&str>) -> Result<HttpKeys, String> {
        checked_url(&discovery_url(issuer))?;
        if let Some(url) = jwks_url {
            checked_url(url)?;
        }
        Ok(HttpKeys {
            issuer: issuer.to_owned(),
            jwks_url: jwks_url.map(str::to_owned),
            tls: Tls::public(),
        })
    }

    /// Checks the provider's HTTPS certificate with `tls` (`--jwt-ca-file`: a private CA).
    pub fn with_tls(mut self, tls: Tls) -> HttpKeys {
        self.tls = tls;
        self
    }

    async fn jwks_url(&self) -> Result<String, String> {
        if let Some(url) = &self.jwks_url {
            return Ok(url.clone());
        }
        let url = discovery_url(&self.issuer);
        let text = self.get(&url).await?;
        let doc: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("the discovery document {url} is not JSON: {e}"))?;
        if doc.get("issuer").and_then(|v| v.as_str()) != Some(self.issuer.as_str()) {
            return Err(format!(
                "the discovery document {url} names another issuer than `{}`",
                self.issuer
            ));
        }
        let jwks = doc
            .get("jwks_uri")
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("the discovery document {url} has no `jwks_uri`"))?;
        checked_url(jwks)?;
        Ok(jwks.to_owned())
    }

    async fn get(&self, url: &str) -> Result<String, String> {
        tokio::time::timeout(TIMEOUT, self.get_unbounded(url))
            .await
            .map_err(|_| format!("{url} did not answer within {}s", TIMEOUT.as_secs()))?
    }

    async fn get_unbounded(&self, url: &str) -> Result<String, String> {
        checked_url(url)?;
        let target = Target::parse(url).map_err(|e| format!("{url}: {e}"))?;
        // The URL was checked when it was configured (https, or http on loopback only).
        let sender = target
            .connect_with(&self.tls, first_address)
            .await
            .map_err(|e| format!("{url}: {}", e.into_message()))?;
        exchange(sender, &target, url).await
    }
}

impl KeySource for HttpKeys {
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + '_>> {
        Box::pin(async move {
            let url = self.jwks_url().await?;
            self.get(&url).await
        })
    }

    fn describe(&self) -> String {
        match &self.jwks_url {
            Some(url) => url.clone(),
            None => discovery_url(&self.issuer),
        }
    }
}

async fn exchange(
    mut sender: SendRequest<Full<Bytes>>,
    target: &Target,
    url: &str,
) -> Result<String, String> {
    let request = Request::get(target.path())
        .header(HOST, target.authority())
        .header(ACCEPT, "application/json")
        .header(
            USER_AGENT,
            HeaderValue::from_static(concat!("approval-broker/", env!("CARGO_PKG_VERSION"))),
        )
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("cannot build the request for {url}: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("{url} did not answer: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    let body = Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading {url} failed: {e}"))?
        .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| format!("{url} answered text that is not UTF-8"))
}

fn discovery_url(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    )
}

/// `https://` anywhere, `http://` on loopback only.
fn checked_url(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    let host = uri.host().ok_or_else(|| format!("`{url}` names no host"))?;
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if is_loopback(host) => Ok(uri),
        Some("http") => Err(format!(
            "`{url}`: keys are fetched over https:// (plain http:// only from a loopback host), \
             since keys read in clear could be replaced by anyone on the path"
        )),
        _ => Err(format!("`{url}` is not an https:// URL")),
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fetched_over_https_or_from_loopback_only() {
        assert!(checked_url("https://idp.example.com/jwks").is_ok());
        assert!(checked_url("http://127.0.0.1:8080/jwks").is_ok());
        assert!(checked_url("http://[::1]:8080/jwks").is_ok());
        assert!(checked_url("http://localhost/jwks").is_ok());
        let err = checked_url("http://idp.example.com/jwks").unwrap_err();
        assert!(err.contains("https://"), "{err}");
        assert!(checked_url("ftp://127.0.0.1/jwks").is_err());
        assert!(HttpKeys::new("http://idp.example.com", None).is_err());
    }
}
