//! Wires the broker together and serves it: store, event fan-out, deadline sweeper, the three
//! services, health and reflection. `run` takes a bound listener and a shutdown future, so tests
//! bind port 0 and stop the server when they are done.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::broker::Broker;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::events::EventBus;
use crate::expiry::DeadlineSweeper;
use crate::grpc::{admin::AdminApi, agent::AgentApi, approver::ApproverApi};
use crate::proto::{self, v1 as pb};
use crate::store;

use pb::admin_service_server::AdminServiceServer;
use pb::agent_service_server::AgentServiceServer;
use pb::approver_service_server::ApproverServiceServer;

/// Serves the broker on `listener` until `shutdown` resolves. Open streams are then ended with
/// UNAVAILABLE (clients reconnect and resume) and the server stops.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let store = store::open(&config.store_options()).await?;
    let bus = EventBus::new(Arc::clone(&store), config.event_buffer as usize).await?;
    let sweeper = DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&bus));
    // Calls that fell due while the broker was down expire before anything is served.
    sweeper.expire_due().await?;
    let background = [
        tokio::spawn(Arc::clone(&bus).pump()),
        tokio::spawn(Arc::clone(&sweeper).run()),
    ];

    let (stop, stopping) = watch::channel(false);
    let broker = Arc::new(Broker::new(store, bus, sweeper, config.limits(), stopping));

    let max = config.max_message_bytes;
    let agent = AgentServiceServer::new(AgentApi::new(Arc::clone(&broker)))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let approver = ApproverServiceServer::new(ApproverApi::new(Arc::clone(&broker)))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let admin = AdminServiceServer::new(AdminApi::new(Arc::clone(&broker)))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<AgentServiceServer<AgentApi>>().await;
    health
        .set_serving::<ApproverServiceServer<ApproverApi>>()
        .await;
    health.set_serving::<AdminServiceServer<AdminApi>>().await;

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| Error::Internal(format!("reflection: {e}")))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| Error::Internal(format!("reflection: {e}")))?;

    let local = listener.local_addr().ok();
    tracing::info!(address = ?local, backend = backend_name(&config), "approval broker serving");

    let drain = async move {
        shutdown.await;
        tracing::info!("shutting down: ending open streams");
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let _ = stop.send(true);
    };
    let served = Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(agent)
        .add_service(approver)
        .add_service(admin)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), drain)
        .await;
    for task in background {
        task.abort();
    }
    served.map_err(|e| Error::Internal(format!("server: {e}")))
}

fn backend_name(config: &Config) -> &'static str {
    if store::is_postgres(&config.database_url) {
        "postgres"
    } else {
        "sqlite"
    }
}

/// Applies the migrations of the configured database and returns (`approval-broker migrate`).
pub async fn migrate(config: &Config) -> Result<()> {
    store::open(&config.store_options()).await?;
    tracing::info!(backend = backend_name(config), "migrations applied");
    Ok(())
}
