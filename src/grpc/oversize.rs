//! Oversized messages are a limit, and limits answer RESOURCE_EXHAUSTED (PRODUCT.md, guarantee 7).
//! tonic refuses a message over `--max-message-bytes` with OUT_OF_RANGE while decoding it: before
//! a unary or server-streaming handler runs (the status travels in the response headers, which
//! [`MessageLimitStatus`] rewrites), or inside a client stream (which the handler maps with
//! [`map_status`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::{Code, Status};

/// Whether `message` is tonic's "message too large" text, percent-encoded or not.
fn is_too_large(message: &str) -> bool {
    message.contains("message length too large")
        || message.contains("message%20length%20too%20large")
}

/// The status to send for a client-stream error: RESOURCE_EXHAUSTED for an oversized message,
/// anything else unchanged.
pub fn map_status(status: Status) -> Status {
    if status.code() == Code::OutOfRange && is_too_large(status.message()) {
        Status::resource_exhausted(format!(
            "{} (raise --max-message-bytes to accept larger messages)",
            status.message()
        ))
    } else {
        status
    }
}

/// A server layer turning tonic's OUT_OF_RANGE for oversized requests into RESOURCE_EXHAUSTED.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageLimitStatus;

impl<S> tower_layer::Layer<S> for MessageLimitStatus {
    type Service = MessageLimitStatusService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MessageLimitStatusService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct MessageLimitStatusService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>>
    for MessageLimitStatusService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            let headers = response.headers_mut();
            let out_of_range = headers
                .get("grpc-status")
                .is_some_and(|code| code.as_bytes() == b"11");
            let too_large = headers
                .get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .is_some_and(is_too_large);
            if out_of_range && too_large {
                headers.insert("grpc-status", http::HeaderValue::from_static("8"));
            }
            Ok(response)
        })
    }
}
