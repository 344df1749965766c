//! A webhook receiver that answers every request 204 and prints how many it got each second:
//! the endpoint for measuring the broker's cycle rate with webhooks configured
//! (`approval-bench --broker-arg=--webhooks-file=...`), cheap enough not to be what is measured.
//! Verifies nothing; run by hand.
//!
//! `cargo run --release --example webhook_sink [ADDRESS]` (ADDRESS defaults to 127.0.0.1:8088).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8088".into());
    let listener = TcpListener::bind(&address).await.expect("bind");
    let count = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&count);
    tokio::spawn(async move {
        let mut last = 0;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = counted.load(Ordering::Relaxed);
            if now != last {
                println!("{now} requests ({}/s)", now - last);
                last = now;
            }
        }
    });
    println!("listening on {address}");
    loop {
        let (stream, _) = listener.accept().await.expect("accept");
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let count = Arc::clone(&count);
                async move {
                    request.into_body().collect().await?;
                    count.fetch_add(1, Ordering::Relaxed);
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
}
