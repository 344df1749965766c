//! The approval inbox: the web page a person approves from, served by the broker itself on its
//! gRPC port so that nothing else has to be installed or run. The page (built from `web/` and
//! committed in `web/dist/`) is embedded in the binary; it talks to the same `ApproverService`
//! and `AdminService` through gRPC-Web, with the same bearer tokens, so there is one API.
//!
//! This layer answers only `GET`/`HEAD` of the page's own few files; every other request goes
//! on, untouched, to gRPC. It must never serve anything from the file system, never answer for
//! another path, and never relax what gRPC requires (the page holds no secret: the token is
//! typed by the person and sent on each call, as any client's).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use tonic::body::Body;
use tonic::codegen::http::{HeaderValue, Method, Request, Response, StatusCode, header};

/// One file of the page.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

/// The page's files, as `npm run build` wrote them (file names without hashes, so the build is
/// reproducible and the paths fixed).
const ASSETS: [Asset; 3] = [
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("../../web/dist/index.html"),
    },
    Asset {
        path: "/inbox.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../web/dist/inbox.js"),
    },
    Asset {
        path: "/inbox.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../web/dist/inbox.css"),
    },
];

/// The page may load only its own files and talk only to its own origin; no other site may
/// frame it (an approve button under someone else's page is a click away from a forged
/// approval).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

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

/// Serves the page's files in front of the gRPC services (see the module docs), or, when the
/// inbox is off (`--inbox false`), nothing.
#[derive(Debug, Clone, Copy)]
pub struct InboxPage {
    serve: bool,
}

impl InboxPage {
    pub fn new(serve: bool) -> Self {
        Self { serve }
    }
}

impl<S> tower_layer::Layer<S> for InboxPage {
    type Service = InboxPageService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InboxPageService {
            inner,
            serve: self.serve,
        }
    }
}

#[derive(Debug, Clone)]
pub struct InboxPageService<S> {
    inner: S,
    serve: bool,
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
        let method = request.method();
        if self.serve
            && (method == Method::GET || method == Method::HEAD)
            && let Some(asset) = asset(request.uri().path())
        {
            let response = serve(asset, method);
            return Box::pin(std::future::ready(Ok(response)));
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
}
