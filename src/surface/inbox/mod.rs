//! The approval inbox: the web page a person approves from, served by the broker itself on its
//! gRPC port so that nothing else has to be installed or run. The page (built from `web/` and
//! committed in `web/dist/`) is embedded in the binary; it talks to the same `ApproverService`
//! and `AdminService` through gRPC-Web, with the same bearer tokens, so there is one API.
//!
//! This layer answers only `GET`/`HEAD` of the page's own few files (and `/favicon.ico`, which
//! browsers ask for on every load, with an empty 204 rather than gRPC's 400); every other
//! request goes on, untouched, to gRPC. It must never serve anything from the file system,
//! never answer for another path, and never relax what gRPC requires (the page holds no secret:
//! the token is typed by the person and sent on each call, as any client's).
//!
//! While authentication is off (no tokens: the laptop default), anyone who reaches the port may
//! decide calls, and a web site could reach it from the person's own browser by DNS rebinding
//! (its name made to resolve to 127.0.0.1, its page then "same-origin" with the broker). So,
//! without tokens, HTTP/1.1 requests (how a browser reaches a plain `http://` broker) are
//! answered only when their `Host` is `localhost` or an IP address; gRPC clients, on HTTP/2,
//! are not affected, nor is anything once tokens are configured.
//!
//! With sign-in configured (`--inbox-oidc-client-id`, docs/identity.md), the page signs people
//! in at the OpenID provider itself, a public client: this layer answers [`SIGN_IN_PATH`] with
//! what the page needs (issuer, client id, scopes, the identity claim; nothing secret), and the
//! page's Content-Security-Policy lets it connect to the issuer's origin too (its discovery
//! document and token endpoint), nowhere else. Without it, that path says sign-in is off.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use tonic::body::Body;
use tonic::codegen::http::{
    HeaderValue, Method, Request, Response, StatusCode, Uri, Version, header,
};

/// One file of the page.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

/// An [`Asset`] of `web/dist/$file`, served at `$path` (at `/$file` when no path is given): the
/// file is named once, so the path served and the file embedded cannot drift apart.
macro_rules! asset {
    ($path:expr, $file:literal, $content_type:expr) => {
        Asset {
            path: $path,
            content_type: $content_type,
            bytes: include_bytes!(concat!("../../../web/dist/", $file)),
        }
    };
    ($file:literal, $content_type:expr) => {
        asset!(concat!("/", $file), $file, $content_type)
    };
}

/// The page's files, as `npm run build` wrote them (file names without hashes, so the build is
/// reproducible and the paths fixed).
const ASSETS: [Asset; 6] = [
    asset!("/", "index.html", "text/html; charset=utf-8"),
    asset!("inbox.js", "text/javascript; charset=utf-8"),
    asset!("inbox.css", "text/css; charset=utf-8"),
    // Web Push (docs/notifications.md): the service worker, at the root so that its scope is the
    // whole page; the manifest that makes the inbox installable; its icon.
    asset!("sw.js", "text/javascript; charset=utf-8"),
    asset!("manifest.webmanifest", "application/manifest+json"),
    asset!("icon.svg", "image/svg+xml"),
];

/// The page may load only its own files and talk only to its own origin (and, with sign-in,
/// to the identity provider's: `{connect}`); no other site may frame it (an approve button under
/// someone else's page is a click away from a forged approval).
fn content_security_policy(connect: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src {connect}; manifest-src 'self'; worker-src 'self'; base-uri 'none'; \
         form-action 'none'; frame-ancestors 'none'"
    )
}

/// Where the page reads how to sign people in (`{"openid": null}` when it cannot).
pub const SIGN_IN_PATH: &str = "/inbox-sign-in.json";

/// Signing people in to the inbox at the OpenID provider: what the page is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignIn {
    issuer: String,
    client_id: String,
    scopes: String,
    identity_claim: String,
    /// The issuer's origin, which the page may connect to.
    origin: String,
}

impl SignIn {
    /// `scopes` must include `openid` (no ID token otherwise); the issuer must be an http(s)
    /// URL (the JWT settings already require https, or http on loopback).
    pub fn new(
        issuer: &str,
        client_id: &str,
        scopes: &str,
        identity_claim: &str,
    ) -> Result<SignIn, String> {
        if client_id.trim().is_empty() {
            return Err("the inbox's client id is empty".to_owned());
        }
        if !scopes.split_whitespace().any(|s| s == "openid") {
            return Err(format!(
                "the scopes `{scopes}` lack `openid`, without which the provider issues no ID \
                 token"
            ));
        }
        let uri: Uri = issuer
            .parse()
            .map_err(|e| format!("the issuer `{issuer}` is not a URL: {e}"))?;
        let origin = match (uri.scheme_str(), uri.authority()) {
            (Some(scheme @ ("https" | "http")), Some(authority))
                if !authority.as_str().contains('@') =>
            {
                format!("{scheme}://{authority}")
            }
            _ => return Err(format!("the issuer `{issuer}` is not an http(s) URL")),
        };
        Ok(SignIn {
            issuer: issuer.to_owned(),
            client_id: client_id.trim().to_owned(),
            scopes: scopes.split_whitespace().collect::<Vec<_>>().join(" "),
            identity_claim: identity_claim.to_owned(),
            origin,
        })
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "issuer": self.issuer,
            "clientId": self.client_id,
            "scopes": self.scopes,
            "identityClaim": self.identity_claim,
        })
    }
}

/// What browsers ask for by themselves on every page load; the page has no icon.
const FAVICON: &str = "/favicon.ico";

/// `204 No Content` for [`FAVICON`]: nothing to show, and nothing wrong.
fn no_icon() -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=86400"),
    );
    response
}

fn asset(path: &str) -> Option<&'static Asset> {
    let path = if path == "/index.html" { "/" } else { path };
    ASSETS.iter().find(|asset| asset.path == path)
}

/// The sign-in settings (see [`SIGN_IN_PATH`]), never cached.
fn sign_in_settings(body: &Bytes, method: &Method) -> Response<Body> {
    let mut response = Response::new(if method == Method::HEAD {
        Body::empty()
    } else {
        Body::new(Full::new(body.clone()))
    });
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// The response for one of the page's files.
fn serve(asset: &Asset, method: &Method, csp: &HeaderValue) -> Response<Body> {
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::new(Full::new(Bytes::from_static(asset.bytes)))
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(asset.bytes.len()));
    // The page changes with the broker's version, and is small: always revalidate.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::CONTENT_SECURITY_POLICY, csp.clone());
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// Whether a `Host` header names this machine by `localhost` or by an address, not by a DNS
/// name that someone else's DNS could point here.
fn is_local_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // `[::1]:50051`
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Refuses a browser's request to a broker without tokens made under a DNS name (see the
/// module docs).
fn rebinding_refusal<B>(request: &Request<B>) -> Option<Response<Body>> {
    if request.version() >= Version::HTTP_2 {
        return None;
    }
    let host = request.headers().get(header::HOST)?.to_str().unwrap_or("");
    if is_local_host(host) {
        return None;
    }
    let mut response = Response::new(Body::new(Full::new(Bytes::from_static(
        b"This broker runs without tokens, so browsers may reach it only at localhost or an IP \
          address (a DNS name could be pointed here by another site). Configure tokens \
          (--tokens-file) to serve the inbox under a name.\n",
    ))));
    *response.status_mut() = StatusCode::FORBIDDEN;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Some(response)
}

/// Serves the page's files in front of the gRPC services (see the module docs), or, when the
/// inbox is off (`--inbox false`), nothing.
#[derive(Debug, Clone)]
pub struct InboxPage {
    serve: bool,
    local_browsers_only: bool,
    /// The page's Content-Security-Policy.
    csp: HeaderValue,
    /// The body served at [`SIGN_IN_PATH`].
    sign_in: Bytes,
}

impl InboxPage {
    /// `serve`: `--inbox`. `authentication_off`: no tokens are configured, so browsers are
    /// answered only at local names (see the module docs).
    pub fn new(serve: bool, authentication_off: bool) -> Self {
        Self {
            serve,
            local_browsers_only: authentication_off,
            csp: HeaderValue::from_str(&content_security_policy("'self'"))
                .expect("the policy is ASCII"),
            sign_in: Bytes::from_static(br#"{"openid":null}"#),
        }
    }

    /// Offers sign-in with the OpenID provider (`None`: only tokens, as without it).
    pub fn with_sign_in(mut self, sign_in: Option<&SignIn>) -> Self {
        let Some(sign_in) = sign_in else {
            return self;
        };
        let connect = format!("'self' {}", sign_in.origin);
        // The origin is a parsed URI's scheme and authority: visible ASCII, no `;`.
        if let Ok(csp) = HeaderValue::from_str(&content_security_policy(&connect)) {
            self.csp = csp;
        }
        self.sign_in = Bytes::from(serde_json::json!({ "openid": sign_in.json() }).to_string());
        self
    }
}

impl<S> tower_layer::Layer<S> for InboxPage {
    type Service = InboxPageService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InboxPageService {
            inner,
            page: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct InboxPageService<S> {
    inner: S,
    page: InboxPage,
}

impl<S, ReqBody> tower_service::Service<Request<ReqBody>> for InboxPageService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        if self.page.local_browsers_only
            && let Some(refusal) = rebinding_refusal(&request)
        {
            return Box::pin(std::future::ready(Ok(refusal)));
        }
        let method = request.method();
        if self.page.serve
            && (method == Method::GET || method == Method::HEAD)
            && let Some(asset) = asset(request.uri().path())
        {
            let response = serve(asset, method, &self.page.csp);
            return Box::pin(std::future::ready(Ok(response)));
        }
        if self.page.serve
            && (method == Method::GET || method == Method::HEAD)
            && request.uri().path() == SIGN_IN_PATH
        {
            let response = sign_in_settings(&self.page.sign_in, method);
            return Box::pin(std::future::ready(Ok(response)));
        }
        if self.page.serve
            && (method == Method::GET || method == Method::HEAD)
            && request.uri().path() == FAVICON
        {
            return Box::pin(std::future::ready(Ok(no_icon())));
        }
        Box::pin(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_files_are_served_with_their_content_types() {
        for (path, content_type) in [
            ("/", "text/html; charset=utf-8"),
            ("/index.html", "text/html; charset=utf-8"),
            ("/inbox.js", "text/javascript; charset=utf-8"),
            ("/inbox.css", "text/css; charset=utf-8"),
            ("/sw.js", "text/javascript; charset=utf-8"),
            ("/manifest.webmanifest", "application/manifest+json"),
            ("/icon.svg", "image/svg+xml"),
        ] {
            let asset = asset(path).unwrap_or_else(|| panic!("{path} is served"));
            let response = serve(asset, &Method::GET, &InboxPage::new(true, false).csp);
            assert_eq!(response.headers()[header::CONTENT_TYPE], content_type);
        }
        for other in [
            "/approvals.v1.ApproverService/Subscribe",
            "/../Cargo.toml",
            "/x",
        ] {
            assert!(asset(other).is_none(), "{other}");
        }
    }

    #[test]
    fn sign_in_settings_name_the_provider_and_let_the_page_reach_its_origin_only() {
        let off = InboxPage::new(true, false);
        assert_eq!(&off.sign_in[..], br#"{"openid":null}"#);
        let csp = off.csp.to_str().unwrap();
        assert!(csp.contains("connect-src 'self';"), "{csp}");

        let sign_in = SignIn::new(
            "https://idp.example.com/realms/acme",
            "approvals-inbox",
            " openid  email ",
            "email",
        )
        .unwrap();
        let on = InboxPage::new(true, false).with_sign_in(Some(&sign_in));
        let csp = on.csp.to_str().unwrap();
        assert!(
            csp.contains("connect-src 'self' https://idp.example.com;"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        let body: serde_json::Value = serde_json::from_slice(&on.sign_in).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"openid": {
                "issuer": "https://idp.example.com/realms/acme",
                "clientId": "approvals-inbox",
                "scopes": "openid email",
                "identityClaim": "email",
            }})
        );
        let response = sign_in_settings(&on.sign_in, &Method::GET);
        assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
        assert!(asset(SIGN_IN_PATH).is_none(), "not a file of the page");
    }

    #[test]
    fn sign_in_needs_the_openid_scope_and_an_http_issuer() {
        let why =
            SignIn::new("https://idp.example.com", "inbox", "email profile", "email").unwrap_err();
        assert!(why.contains("openid"), "{why}");
        for issuer in [
            "idp.example.com",
            "ftp://idp.example.com",
            "https://u:p@idp.example.com",
        ] {
            assert!(
                SignIn::new(issuer, "inbox", "openid", "email").is_err(),
                "{issuer}"
            );
        }
        assert!(SignIn::new("https://idp.example.com", " ", "openid", "email").is_err());
    }

    #[test]
    fn the_favicon_browsers_ask_for_is_an_empty_204_not_a_grpc_400() {
        let response = no_icon();
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
        assert!(asset(FAVICON).is_none(), "no file is served for it");
    }

    #[test]
    fn local_hosts_are_localhost_and_addresses_never_dns_names() {
        for local in [
            "localhost",
            "localhost:50051",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:50051",
            "10.1.2.3:8080",
            "[::1]:50051",
            "[::1]",
        ] {
            assert!(is_local_host(local), "{local}");
        }
        for name in [
            "evil.example",
            "evil.example:50051",
            "localhost.evil.example",
            "127.0.0.1.nip.io:50051",
            "",
        ] {
            assert!(!is_local_host(name), "{name}");
        }
    }
}
