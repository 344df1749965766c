//! `grpc.health.v1.Health`, as tonic-health serves it, with a cap on open `Watch` streams:
//! health needs no token, so without one any client could open streams until memory ran out.
//! Past `--max-health-watches` a new watch gets RESOURCE_EXHAUSTED; `Check` is never capped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

use crate::door::stream_slots::{StreamSlot, StreamSlots};
use crate::observe::meters::StreamKind;

/// The health service reporting what `reporter` is told, with at most `max_watches` watches.
pub fn capped(reporter: HealthReporter, max_watches: usize) -> HealthServer<CappedHealth> {
    HealthServer::new(CappedHealth {
        inner: HealthService::from_health_reporter(reporter),
        watches: StreamSlots::new(
            StreamKind::HealthWatch,
            "health watches",
            "--max-health-watches",
            max_watches,
        ),
    })
}

pub struct CappedHealth {
    inner: HealthService,
    watches: Arc<StreamSlots>,
}

#[tonic::async_trait]
impl Health for CappedHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = Watch;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let slot = self.watches.take()?;
        let inner = self.inner.watch(request).await?.into_inner();
        Ok(Response::new(Watch { inner, _slot: slot }))
    }
}

/// One open watch; its slot is freed when the client goes away and the stream is dropped.
pub struct Watch {
    inner: tonic_health::server::WatchStream,
    _slot: StreamSlot,
}

impl Stream for Watch {
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}
