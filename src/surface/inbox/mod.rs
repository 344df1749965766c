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

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use tonic::body::Body;
use tonic::codegen::http::{HeaderValue, Method, Request, Response, StatusCode, Version, header};

/// One file of the page.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

/// The page's files, as `npm run build` wrote them (file names without hashes, so the build is
/// reproducible and the paths fixed).
const ASSETS: [Asset; 6] = [
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("../../../web/dist/index.html"),
    },
    Asset {
        path: "/inbox.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../web/dist/inbox.js"),
    },
    Asset {
        path: "/inbox.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../../web/dist/inbox.css"),
    },
    // Web Push (docs/notifications.md): the service worker, at the root so that its scope is the
    // whole page; the manifest that makes the inbox installable; its icon.
    Asset {
        path: "/sw.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../web/dist/sw.js"),
    },
    Asset {
        path: "/manifest.webmanifest",
        content_type: "application/manifest+json",
        bytes: include_bytes!("../../../web/dist/manifest.webmanifest"),
    },
    Asset {
        path: "/icon.svg",
        content_type: "image/svg+xml",
        bytes: include_bytes!("../../../web/dist/icon.svg"),
    },
];

/// The page may load only its own files and talk only to its own origin; no other site may
/// frame it (an approve button under someone else's page is a click away from a forged
/// approval).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; manifest-src 'self'; \
     worker-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

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

/// The response for one of the page's files.
fn serve(asset: &Asset, method: &Method) -> Response<Body> {
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
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
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
#[derive(Debug, Clone, Copy)]
pub struct InboxPage {
    serve: bool,
    local_browsers_only: bool,
}

impl InboxPage {
    /// `serve`: `--inbox`. `authentication_off`: no tokens are configured, so browsers are
    /// answered only at local names (see the module docs).
    pub fn new(serve: bool, authentication_off: bool) -> Self {
        Self {
            serve,
            local_browsers_only: authentication_off,
        }
    }
}

impl<S> tower_layer::Layer<S> for InboxPage {
    type Service = InboxPageService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InboxPageService { inner, page: *self }
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
            let response = serve(asset, method);
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
            let response = serve(asset, &Method::GET);
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
