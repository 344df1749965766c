//! Webhook receivers inside the bench (`--webhooks N`): each answers every request 204 and
//! counts it, cheap enough not to be what is measured. They verify nothing: what the broker's
//! requests carry is proved by the tests and by `.ci/webhooks`; here only their cost matters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// One receiver on a free loopback port.
pub struct Sink {
    pub url: String,
    received: Arc<AtomicU64>,
}

impl Sink {
    pub async fn start() -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("webhook sink: {e}"))?;
        let address = listener
            .local_addr()
            .map_err(|e| format!("webhook sink: {e}"))?;
        let received = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let counter = Arc::clone(&counter);
                        async move {
                            request.into_body().collect().await?;
                            counter.fetch_add(1, Ordering::Relaxed);
                            let mut response = Response::new(Full::new(Bytes::new()));
                            *response.status_mut() = StatusCode::NO_CONTENT;
                            Ok::<_, hyper::Error>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            url: format!("http://{address}/hook"),
            received,
        })
    }

    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}
