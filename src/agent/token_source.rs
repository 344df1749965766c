//! Where an agent-side adapter's bearer token comes from: a fixed token (`--token`), or the
//! organisation's identity provider, as a service client with the OAuth 2.0 client-credentials
//! grant (RFC 6749 section 4.4). One source for every adapter (the hooks, the MCP gateway, the
//! ACP proxy), used by their shared broker client (`hook::review`).
//!
//! A granted token is fetched at first use, kept, and fetched again once four fifths of its
//! `expires_in` have passed; a token the broker refused is dropped and fetched again once. While
//! the provider cannot be reached, the token held keeps working until it expires; after that
//! there is no token, the adapter says why and sends nothing: it never fails open. The request
//! goes through the broker's one way out (`door::outbound`): `https://` (with a private CA's
//! certificate when one is given) or plain `http://` to a loopback host only, since a client
//! secret sent in clear could be read by anyone on the path. The secret is read from a file only
//! its owner may read, never from the command line.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::Request;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, USER_AGENT};
use serde_json::Value;
use tokio::sync::{Mutex, OnceCell};
use tokio::time::Instant;

use crate::door::outbound::{Target, Tls, first_address};

/// How long one request to the provider may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read from the provider.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// The share of a token's lifetime after which the next one is fetched.
const RENEW_AT: f64 = 0.8;
/// The lifetime assumed for a token whose answer gives none.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// After a failed renewal, how long the token held is used before the provider is asked again.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The client-credentials settings every adapter takes (flattened into its broker address).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientCredentialsArgs {
    /// The identity provider's OAuth 2.0 token endpoint: the adapter authenticates to the broker
    /// with a token it gets there (client-credentials grant) and renews before it expires,
    /// instead of `--token`. `https://`, or `http://` to a loopback host only.
    #[arg(
        long,
        value_name = "URL",
        env = "APPROVALS_OAUTH_TOKEN_URL",
        conflicts_with = "oauth_issuer"
    )]
    pub oauth_token_url: Option<String>,

    /// The identity provider's issuer URL, whose discovery document
    /// (`/.well-known/openid-configuration`) names the token endpoint: instead of
    /// `--oauth-token-url`.
    #[arg(long, value_name = "URL", env = "APPROVALS_OAUTH_ISSUER")]
    pub oauth_issuer: Option<String>,

    /// The adapter's client id at the identity provider.
    #[arg(long, value_name = "ID", env = "APPROVALS_OAUTH_CLIENT_ID")]
    pub oauth_client_id: Option<String>,

    /// A file holding the client secret, readable by its owner only (mode 0600): the secret
    /// never appears on a command line.
    #[arg(long, value_name = "FILE", env = "APPROVALS_OAUTH_CLIENT_SECRET_FILE")]
    pub oauth_client_secret_file: Option<PathBuf>,

    /// The scopes to ask for, space-separated (e.g. `approval-agent`).
    #[arg(long, value_name = "SCOPES", env = "APPROVALS_OAUTH_SCOPE")]
    pub oauth_scope: Option<String>,

    /// The resource to ask a token for (RFC 8707 `resource`), when the provider wants one.
    #[arg(long, value_name = "URI", env = "APPROVALS_OAUTH_RESOURCE")]
    pub oauth_resource: Option<String>,

    /// The `audience` to ask a token for, for providers that take it instead of `resource`.
    #[arg(long, value_name = "AUDIENCE", env = "APPROVALS_OAUTH_AUDIENCE")]
    pub oauth_audience: Option<String>,

    /// How the client authenticates at the token endpoint: `basic` (HTTP Basic) or `post` (in
    /// the form).
    #[arg(long, value_name = "HOW", env = "APPROVALS_OAUTH_CLIENT_AUTH", value_enum, default_value_t = ClientAuth::Basic)]
    pub oauth_client_auth: ClientAuth,

    /// A PEM CA certificate the identity provider's HTTPS certificate is checked with (a
    /// private CA), besides the Mozilla roots built in.
    #[arg(long, value_name = "FILE", env = "APPROVALS_OAUTH_CA_FILE")]
    pub oauth_ca_file: Option<PathBuf>,
}

impl ClientCredentialsArgs {
    /// Whether any client-credentials setting is given.
    pub fn is_set(&self) -> bool {
        self.oauth_token_url.is_some()
            || self.oauth_issuer.is_some()
            || self.oauth_client_id.is_some()
    }
}

/// How the client's id and secret travel to the token endpoint (RFC 6749 section 2.3.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientAuth {
    /// `client_secret_basic`: an `Authorization: Basic` header.
    #[default]
    Basic,
    /// `client_secret_post`: `client_id` and `client_secret` in the form.
    Post,
}

/// What an adapter sends as its bearer token.
pub enum TokenSource {
    /// No token: the broker has authentication off.
    None,
    /// `--token`.
    Fixed(String),
    /// The identity provider's, renewed.
    Granted(Box<ClientCredentials>),
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::None => f.write_str("TokenSource::None"),
            TokenSource::Fixed(_) => f.write_str("TokenSource::Fixed(..)"),
            TokenSource::Granted(granted) => {
                write!(f, "TokenSource::Granted({})", granted.client_id)
            }
        }
    }
}

impl TokenSource {
    /// The source the settings name: `--token`, the client-credentials settings, or neither.
    pub fn from_settings(
        token: Option<&str>,
        granted: &ClientCredentialsArgs,
    ) -> Result<TokenSource, String> {
        match (token, granted.is_set()) {
            (Some(_), true) => Err(
                "give either --token or the --oauth-* settings (client credentials), not both"
                    .into(),
            ),
            (Some(token), false) => Ok(TokenSource::Fixed(token.to_owned())),
            (None, true) => {
                ClientCredentials::new(granted).map(|c| TokenSource::Granted(Box::new(c)))
            }
            (None, false) => Ok(TokenSource::None),
        }
    }

    /// The token to send now, if any; the error says why there is none.
    pub async fn bearer(&self) -> Result<Option<String>, String> {
        match self {
            TokenSource::None => Ok(None),
            TokenSource::Fixed(token) => Ok(Some(token.clone())),
            TokenSource::Granted(granted) => granted.token().await.map(Some),
        }
    }

    /// The broker refused `token`: true when another one is worth trying (a granted token,
    /// dropped so that the next [`bearer`](Self::bearer) fetches a new one).
    pub async fn refused(&self, token: Option<&str>) -> bool {
        match (self, token) {
            (TokenSource::Granted(granted), Some(token)) => {
                granted.invalidate(token).await;
                true
            }
            _ => false,
        }
    }
}

/// A token held, with when to renew it and when it expires.
struct Held {
    token: String,
    renew_after: Instant,
    expires: Instant,
}

/// A service client of the identity provider: its settings, and the token it holds.
pub struct ClientCredentials {
    /// The token endpoint, once known (given, or read from the discovery document).
    endpoint: OnceCell<Target>,
    issuer: Option<String>,
    client_id: String,
    secret: String,
    extra: Vec<(&'static str, String)>,
    auth: ClientAuth,
    tls: Tls,
    held: Mutex<Option<Held>>,
    requests: AtomicU64,
}

impl ClientCredentials {
    /// Checks the settings and reads the secret now (so a mistake shows at once); fetches
    /// nothing.
    pub fn new(args: &ClientCredentialsArgs) -> Result<ClientCredentials, String> {
        let client_id = (args.oauth_client_id.clone())
            .filter(|id| !id.is_empty())
            .ok_or("--oauth-client-id is required with --oauth-token-url or --oauth-issuer")?;
        let path = (args.oauth_client_secret_file.as_deref())
            .ok_or("--oauth-client-secret-file is required with --oauth-client-id")?;
        let secret = read_secret_file(path)?;
        let endpoint = OnceCell::new();
        let issuer = match (&args.oauth_token_url, &args.oauth_issuer) {
            (Some(url), None) => {
                let target = Target::parse_confidential(url)
                    .map_err(|e| format!("--oauth-token-url: {e}"))?;
                endpoint.set(target).expect("a fresh cell");
                None
            }
            (None, Some(issuer)) => {
                Target::parse_confidential(issuer).map_err(|e| format!("--oauth-issuer: {e}"))?;
                Some(issuer.trim_end_matches('/').to_owned())
            }
            _ => return Err("give --oauth-token-url or --oauth-issuer (one of them)".into()),
        };
        let tls = match &args.oauth_ca_file {
            Some(path) => Tls::with_ca_file(path).map_err(|e| format!("--oauth-ca-file: {e}"))?,
            None => Tls::public(),
        };
        let extra = [
            ("scope", &args.oauth_scope),
            ("resource", &args.oauth_resource),
            ("audience", &args.oauth_audience),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.clone().filter(|v| !v.is_empty()).map(|v| (name, v)))
        .collect();
        Ok(ClientCredentials {
            endpoint,
            issuer,
            client_id,
            secret,
            extra,
            auth: args.oauth_client_auth,
            tls,
            held: Mutex::new(None),
            requests: AtomicU64::new(0),
        })
    }

    /// How many token requests were sent (for tests and logs).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The token to send now: the one held while fresh, else a new one (one request at a time).
    pub async fn token(&self) -> Result<String, String> {
        let mut held = self.held.lock().await;
        if let Some(current) = held.as_ref()
            && Instant::now() < current.renew_after
        {
            return Ok(current.token.clone());
        }
        match self.fetch().await {
            Ok((token, lifetime)) => {
                let now = Instant::now();
                *held = Some(Held {
                    token: token.clone(),
                    renew_after: now + lifetime.mul_f64(RENEW_AT),
                    expires: now + lifetime,
                });
                Ok(token)
            }
            Err(why) => {
                if let Some(current) = held.as_mut()
                    && Instant::now() < current.expires
                {
                    current.renew_after = current.expires.min(Instant::now() + RETRY_AFTER);
                    tracing::warn!(
                        "could not renew the access token ({why}); using the one held until it \
                         expires"
                    );
                    return Ok(current.token.clone());
                }
                let expired = if held.take().is_some() {
                    " (and the last token it gave has expired)"
                } else {
                    ""
                };
                Err(format!(
                    "for the client `{}`, {why}{expired}",
                    self.client_id
                ))
            }
        }
    }

    /// The broker refused `token`: the next call fetches a new one.
    pub async fn invalidate(&self, token: &str) {
        let mut held = self.held.lock().await;
        if held.as_ref().is_some_and(|h| h.token == token) {
            *held = None;
        }
    }

    async fn fetch(&self) -> Result<(String, Duration), String> {
        let endpoint = self
            .endpoint
            .get_or_try_init(|| self.discover())
            .await?
            .clone();
        let mut form = vec![("grant_type", "client_credentials".to_owned())];
        form.extend(self.extra.iter().cloned());
        let mut basic = None;
        match self.auth {
            ClientAuth::Basic => {
                let pair = format!(
                    "{}:{}",
                    form_encode(&self.client_id),
                    form_encode(&self.secret)
                );
                basic = Some(format!("Basic {}", STANDARD.encode(pair)));
            }
            ClientAuth::Post => {
                form.push(("client_id", self.client_id.clone()));
                form.push(("client_secret", self.secret.clone()));
            }
        }
        let body: Vec<String> = (form.iter())
            .map(|(name, value)| format!("{name}={}", form_encode(value)))
            .collect();
        self.requests.fetch_add(1, Ordering::Relaxed);
        let answer = self
            .exchange(&endpoint, Some(body.join("&")), basic)
            .await?;
        let url = endpoint.url();
        let token = (answer.get("access_token").and_then(Value::as_str))
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                format!("the identity provider at {url} answered without an access_token")
            })?;
        let lifetime = (answer.get("expires_in").and_then(Value::as_f64))
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(DEFAULT_LIFETIME, Duration::from_secs_f64);
        Ok((token.to_owned(), lifetime))
    }

    /// The token endpoint the issuer's discovery document names.
    async fn discover(&self) -> Result<Target, String> {
        let issuer = self
            .issuer
            .as_deref()
            .expect("no token URL was given, so an issuer was");
        let url = format!("{issuer}/.well-known/openid-configuration");
        let target = Target::parse_confidential(&url)?;
        let document = self.exchange(&target, None, None).await?;
        let named = document.get("issuer").and_then(Value::as_str);
        if named.map(|n| n.trim_end_matches('/')) != Some(issuer) {
            return Err(format!(
                "the discovery document {url} names another issuer than {issuer}"
            ));
        }
        let endpoint = (document.get("token_endpoint").and_then(Value::as_str))
            .ok_or_else(|| format!("the discovery document {url} names no token_endpoint"))?;
        Target::parse_confidential(endpoint)
            .map_err(|e| format!("the token endpoint {endpoint} of {url}: {e}"))
    }

    /// Sends a POST of `form` (or a GET without one) and reads the JSON object answered.
    async fn exchange(
        &self,
        target: &Target,
        form: Option<String>,
        authorization: Option<String>,
    ) -> Result<serde_json::Map<String, Value>, String> {
        let url = target.url();
        tokio::time::timeout(
            TIMEOUT,
            self.exchange_unbounded(target, form, authorization),
        )
        .await
        .map_err(|_| {
            format!(
                "the identity provider at {url} could not be reached (no answer within {}s)",
                TIMEOUT.as_secs()
            )
        })?
    }

    async fn exchange_unbounded(
        &self,
        target: &Target,
        form: Option<String>,
        authorization: Option<String>,
    ) -> Result<serde_json::Map<String, Value>, String> {
        let url = target.url();
        let unreached =
            |why: String| format!("the identity provider at {url} could not be reached ({why})");
        // The URL was checked when it was configured (https, or http on loopback only).
        let mut sender = (target.connect_with(&self.tls, first_address).await)
            .map_err(|e| unreached(e.into_message()))?;
        let mut request = Request::builder()
            .uri(target.path())
            .header(HOST, target.authority())
            .header(ACCEPT, "application/json")
            .header(
                USER_AGENT,
                concat!("approval-broker/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(value) = authorization {
            request = request.header(AUTHORIZATION, value);
        }
        let request = match form {
            Some(form) => request
                .method("POST")
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Full::new(Bytes::from(form))),
            None => request.method("GET").body(Full::new(Bytes::new())),
        }
        .map_err(|e| format!("cannot build the request for {url}: {e}"))?;
        let response =
            (sender.send_request(request).await).map_err(|e| unreached(e.to_string()))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| unreached(format!("reading the answer failed: {e}")))?
            .to_bytes();
        let document = serde_json::from_slice::<Value>(&body).ok();
        let object = document.as_ref().and_then(Value::as_object);
        if !status.is_success() {
            // RFC 6749 section 5.2: `error` and `error_description` say why.
            let error = object.and_then(|o| o.get("error")).and_then(Value::as_str);
            let description = (object.and_then(|o| o.get("error_description")))
                .and_then(Value::as_str)
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            return Err(match error {
                Some(error) => {
                    format!("the identity provider at {url} refused: {error}{description}")
                }
                None => format!("the identity provider at {url} refused: HTTP {status}"),
            });
        }
        object.cloned().ok_or_else(|| {
            format!("the identity provider at {url} answered something that is not a JSON object")
        })
    }
}

/// The secret in `path` (surrounding white space removed), refused when others than its owner
/// may read it or when it is empty.
pub fn read_secret_file(path: &Path) -> Result<String, String> {
    let shown = path.display();
    if let Some(mode) = crate::private_files::shared_with_others(path) {
        return Err(format!(
            "the client secret file {shown} may be read by others (mode {mode:o}): run \
             `chmod 600 {shown}`"
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the client secret file {shown}: {e}"))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(format!("the client secret file {shown} is empty"));
    }
    Ok(secret.to_owned())
}

/// `application/x-www-form-urlencoded` (RFC 6749 appendix B): spaces as `+`, all but
/// `A-Z a-z 0-9 * - . _` percent-encoded.
fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(byte as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_is_encoded_as_rfc_6749_says() {
        assert_eq!(form_encode("ci bot"), "ci+bot");
        assert_eq!(form_encode("s3cret:&=/é"), "s3cret%3A%26%3D%2F%C3%A9");
        assert_eq!(form_encode("a-b.c_d*"), "a-b.c_d*");
    }

    #[test]
    fn a_fixed_token_and_client_credentials_exclude_each_other() {
        let granted = ClientCredentialsArgs {
            oauth_token_url: Some("https://idp.example.com/token".into()),
            ..Default::default()
        };
        let both = TokenSource::from_settings(Some("t"), &granted).unwrap_err();
        assert!(both.contains("not both"), "{both}");
        let no_id = TokenSource::from_settings(None, &granted).unwrap_err();
        assert!(no_id.contains("--oauth-client-id"), "{no_id}");
        assert!(matches!(
            TokenSource::from_settings(Some("t"), &ClientCredentialsArgs::default()),
            Ok(TokenSource::Fixed(_))
        ));
        assert!(matches!(
            TokenSource::from_settings(None, &ClientCredentialsArgs::default()),
            Ok(TokenSource::None)
        ));
    }
}
