//! Every RPC observed once, around all the services (one tower layer, not code per method):
//! counted by method and gRPC status code, timed, and, when it is refused, logged at info with
//! its method, code and caller (never its message, inputs or token).
//!
//! An RPC is finished, and counted, when its status is known:
//! - a trailers-only response (any error before the first reply message, unary or streaming)
//!   carries `grpc-status` in its headers: counted at once;
//! - otherwise the status comes in the trailers after the last message: counted when they are
//!   sent, so a unary call is timed to its reply, and a stream to its end;
//! - a response body dropped before its trailers (the client went away, or the server stopped
//!   mid-stream) is counted as CANCELLED.
//!
//! Method labels are the methods the broker serves (read from the services' descriptors); any
//! other path is `unknown`, so clients cannot grow the metrics with made-up paths.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use prost::Message as _;
use tonic::Code;
use tonic::codegen::http;

use crate::door::auth::CallerNote;
use crate::observe::meters;

/// The label of paths the broker does not serve.
const UNKNOWN: &str = "unknown";

/// The layer; built once, with the methods of the descriptor sets the broker serves.
#[derive(Clone)]
pub struct Observed {
    methods: Arc<HashMap<String, &'static str>>,
}

impl Observed {
    /// Observes the RPCs whose paths `descriptor_sets` (encoded `FileDescriptorSet`s) define.
    pub fn new(descriptor_sets: &[&[u8]]) -> Self {
        let mut methods = HashMap::new();
        for encoded in descriptor_sets {
            let Ok(set) = prost_types::FileDescriptorSet::decode(*encoded) else {
                continue;
            };
            for file in set.file {
                let package = file.package.unwrap_or_default();
                for service in file.service {
                    let service_name = service.name.unwrap_or_default();
                    for method in service.method {
                        let path = format!(
                            "/{package}{}{service_name}/{}",
                            if package.is_empty() { "" } else { "." },
                            method.name.unwrap_or_default()
                        );
                        // Leaked once per served method (a few dozen), so each RPC's labels
                        // cost no allocation.
                        let label: &'static str = Box::leak(path.clone().into_boxed_str());
                        methods.insert(path, label);
                    }
                }
            }
        }
        Self {
            methods: Arc::new(methods),
        }
    }

    fn label(&self, path: &str) -> &'static str {
        self.methods.get(path).copied().unwrap_or(UNKNOWN)
    }
}

impl<S> tower_layer::Layer<S> for Observed {
    type Service = ObservedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ObservedService {
            inner,
            observed: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ObservedService<S> {
    inner: S,
    observed: Observed,
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for ObservedService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let caller = CallerNote::default();
        request.extensions_mut().insert(caller.clone());
        let rpc = Rpc {
            method: self.observed.label(request.uri().path()),
            started: Instant::now(),
            caller,
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            let status = status_of(response.headers());
            Ok(response.map(|body| {
                let pending = match status {
                    Some(code) => {
                        rpc.finish(code);
                        None
                    }
                    None => Some(rpc),
                };
                tonic::body::Body::new(ObservedBody {
                    inner: body,
                    pending,
                })
            }))
        })
    }
}

/// An RPC whose status is not known yet.
struct Rpc {
    method: &'static str,
    started: Instant,
    caller: CallerNote,
}

impl Rpc {
    fn finish(self, code: Code) {
        meters::rpc_finished(self.method, code_label(code), self.started.elapsed());
        if !matches!(code, Code::Ok | Code::Cancelled) {
            tracing::info!(
                method = self.method,
                code = code_label(code),
                caller = self.caller.get().unwrap_or("unauthenticated"),
                "refused"
            );
        }
    }
}

/// The response body, which finishes its RPC when the trailers pass (or when it is dropped).
struct ObservedBody<B> {
    inner: B,
    pending: Option<Rpc>,
}

impl<B: Body + Unpin> Body for ObservedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref()
                    && let Some(rpc) = self.pending.take()
                {
                    rpc.finish(status_of(trailers).unwrap_or(Code::Unknown));
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(rpc) = self.pending.take() {
                    rpc.finish(Code::Internal);
                }
            }
            Poll::Ready(None) => {
                // Ended without trailers: no status was sent, which gRPC clients read as such.
                if let Some(rpc) = self.pending.take() {
                    rpc.finish(Code::Unknown);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for ObservedBody<B> {
    fn drop(&mut self) {
        if let Some(rpc) = self.pending.take() {
            rpc.finish(Code::Cancelled);
        }
    }
}

fn status_of(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    Some(Code::from_i32(value.parse().ok()?))
}

/// The status code as gRPC's own clients name it (`OK`, `InvalidArgument`...).
pub fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}
