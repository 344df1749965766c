//! Server reflection (v1 and v1alpha, so every grpcurl works), with a cap on open reflection
//! streams: reflection needs no token and its one RPC is a stream a client may keep open, so
//! without a cap any client could open them until memory ran out. Past `--max-reflection-streams`
//! a new one gets RESOURCE_EXHAUSTED.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::Body as HttpBody;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Bytes, Service, http};
use tonic::server::NamedService;

use crate::door::stream_slots::{StreamSlot, StreamSlots};

/// One count of open reflection streams, shared by the v1 and v1alpha services.
pub fn stream_slots(max: usize) -> Arc<StreamSlots> {
    StreamSlots::new(
        crate::observe::meters::StreamKind::Reflection,
        "reflection streams",
        "--max-reflection-streams",
        max,
    )
}

/// A reflection service whose every RPC (a stream) holds one of `slots` while it is open.
#[derive(Clone)]
pub struct Capped<S> {
    inner: S,
    slots: Arc<StreamSlots>,
}

impl<S> Capped<S> {
    pub fn new(inner: S, slots: Arc<StreamSlots>) -> Self {
        Self { inner, slots }
    }
}

impl<S: NamedService> NamedService for Capped<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Capped<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let slot = match self.slots.take() {
            Ok(slot) => slot,
            Err(e) => {
                let refused = Status::from(e).into_http();
                return Box::pin(async move { Ok(refused) });
            }
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Body::new(HeldBody { body, _slot: slot })))
        })
    }
}

/// A response body holding its stream's slot until the body is dropped (the stream ended).
struct HeldBody {
    body: Body,
    _slot: StreamSlot,
}

impl HttpBody for HeldBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
