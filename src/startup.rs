//! Wires the broker together and serves it: store, event fan-out, deadline sweeper, the three
//! services, health and reflection. `run` takes a bound listener and a shutdown future, so tests
//! bind port 0 and stop the server when they are done.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tonic_web::GrpcWebLayer;

use crate::background::events::EventBus;
use crate::background::expiry::DeadlineSweeper;
use crate::background::retention::Retention;
use crate::background::webhooks::Dispatcher;
use crate::broker::Broker;
use crate::config::{Config, MetricsListen, ServeSettings};
use crate::door::auth::{Gate, Role};
use crate::door::connections;
use crate::error::{Error, Result, StorageFault};
use crate::proto::{self, v1 as pb};
use crate::receipts;
use crate::store;
use crate::store::health::{self, StorageHealth};
use crate::surface::grpc::observed::Observed;
use crate::surface::grpc::oversize::MessageLimitStatus;
use crate::surface::grpc::{admin::AdminApi, agent::AgentApi, approver::ApproverApi, reflection};
use crate::surface::inbox::InboxPage;

use pb::admin_service_server::AdminServiceServer;
use pb::agent_service_server::AgentServiceServer;
use pb::approver_service_server::ApproverServiceServer;

/// Serves the broker on `listener` until `shutdown` resolves. Then it drains: health turns
/// NOT_SERVING, new streams are refused, open streams end with UNAVAILABLE (clients reconnect
/// elsewhere and resume), requests in flight finish (their commits included), and the server
/// stops, at the latest `--drain-timeout` after the signal.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // An invalid policy file stops the broker before anything else happens.
    let policy_rules = config.policy_rules()?;
    let file_webhooks = config.webhooks_file()?;
    let slack_settings = config.slack()?;
    let default_escalation = config.escalation_ladder()?;
    let reply_limit = config.reply_limit()?;
    // Who the broker is to passkeys (docs/identity.md, "Passkeys"): an origin no browser would
    // accept for its relying party stops the broker here.
    let relying_party = Arc::new(config.passkeys.relying_party(
        config.webhooks.webhooks_inbox_url.as_deref(),
        listener.local_addr().map_or(0, |address| address.port()),
        config.serve.tls_cert.is_some(),
    )?);
    let database = config.store.database()?;
    // Held until the server stops (or its task is dropped): one broker per SQLite file.
    let _only_broker = store::claim(&database)?;
    let notary = receipts::notary(
        config.receipts.mode,
        config.receipts.receipt_key.as_deref(),
        database.key_home(),
    )?
    .map(Arc::new);
    let public_key = notary.as_ref().map(|n| *n.public_key());
    let retired_keys = match &config.receipts.receipt_retired_keys {
        Some(path) => receipts::trust::KeySet::from_file("--receipt-retired-keys", path)?,
        None => receipts::trust::KeySet::default(),
    };
    let storage = StorageHealth::new();
    let store = store::open_watched(&database, config.texts.resolve(), notary, &storage).await?;
    if let Some(rules) = &policy_rules {
        store.load_file_rules(rules).await?;
        tracing::info!(rules = rules.len(), "policy file loaded");
    }
    if let Some(hooks) = &file_webhooks {
        // Endpoints new to the file receive the events committed from now on.
        store
            .load_file_webhooks(hooks, store.latest_seq().await?)
            .await?;
        tracing::info!(webhooks = hooks.len(), "webhooks file loaded");
    }
    let bus = EventBus::new(store.clone(), config.streams.event_buffer as usize).await?;
    // Signed approval links (docs/answers.md): a key beside a SQLite database, or given; the
    // broker makes and opens them, and webhooks carry one to each call.
    let sqlite_file = match &database {
        store::Database::Sqlite { path, .. } => Some(path.as_path()),
        _ => None,
    };
    let link_key = config.links.key(sqlite_file)?.map(Arc::new);
    let delivery = crate::background::webhooks::DeliverySettings {
        links: link_key
            .as_ref()
            .map(|key| (Arc::clone(key), config.links.link_lifetime)),
        ..config.webhook_delivery()
    };
    let dispatcher = Dispatcher::new(store.clone(), Arc::clone(&bus), delivery);
    // Web Push (docs/notifications.md): sent from the events committed from now on.
    let push = crate::background::push::start(
        &config.push,
        database.key_home(),
        store.clone(),
        &bus,
        &config.webhook_delivery(),
    )
    .await?;
    let sweeper = DeadlineSweeper::new(store.clone());
    let retention = config
        .lifecycle
        .retention()
        .map(|policy| tokio::spawn(Retention::new(store.clone(), policy).run()));
    let background = [
        tokio::spawn(Arc::clone(&bus).pump()),
        tokio::spawn(count_pending(store.clone())),
        tokio::spawn(health::probe_while_open(Arc::clone(&store))),
        tokio::spawn(Arc::clone(&dispatcher).run()),
    ];
    // Slack app mode: follows the event log from where it stopped (docs/notifications.md).
    let slack = match slack_settings {
        Some(settings) => {
            let slack = crate::surface::slack::Slack::new(settings, store.clone());
            let after = slack.resume_point().await?;
            tracing::info!(
                path = crate::surface::slack::interactivity::PATH,
                "Slack app mode on: clicks are taken at {}",
                crate::surface::slack::interactivity::PATH
            );
            let poster = tokio::spawn(Arc::clone(&slack).post_from(Arc::downgrade(&bus), after));
            Some((slack, poster))
        }
        None => None,
    };

    let (stop, stopping) = watch::channel(false);
    let mut broker = Broker::new(store, bus, Arc::clone(&sweeper), config.limits(), stopping)
        .with_webhooks(Arc::clone(&dispatcher))
        .with_default_escalation(default_escalation)
        .with_receipt_key(public_key)
        .with_retired_receipt_keys(&retired_keys)
        .with_passkeys(relying_party);
    if let Some(dir) = backup_dir(&config, &database) {
        broker = broker.with_backup_dir(dir);
    }
    if let Some(key) = &link_key {
        broker = broker.with_links(
            Arc::clone(key),
            config.links.link_lifetime,
            config.webhooks.webhooks_inbox_url.clone(),
        );
    }
    let broker = Arc::new(broker);
    // Steps and calls that fell due while the broker was down fire and expire before anything
    // is served; then the sweeper follows the deadlines, writing through the broker.
    sweeper.sweep(&*broker).await?;
    let sweeping = tokio::spawn(Arc::clone(&sweeper).run(broker.clone()));

    let tokens = config.tokens()?.map(Arc::new);
    match &tokens {
        None if config.auth.jwt_issuer.is_some() => {}
        None => tracing::warn!(
            "authentication is OFF: no tokens are configured (--tokens-file, APPROVALS_TOKENS), \
             so anyone who reaches this port may act as any agent, approver or admin"
        ),
        Some(tokens) => tracing::info!(tokens = tokens.len(), "bearer-token authentication on"),
    }
    let jwt = match config.jwt()? {
        None => None,
        Some((settings, keys)) => {
            tracing::info!(
                issuer = %settings.issuer,
                "JWT bearer tokens of {} accepted; its keys are fetched in the background",
                settings.issuer
            );
            let verifier = Arc::new(crate::door::auth::jwt::Verifier::new(
                settings,
                Arc::new(keys),
            ));
            verifier.fetch_keys_in_background();
            Some(verifier)
        }
    };
    let authenticated = tokens.is_some() || jwt.is_some();
    let gate = |role| Gate::new(tokens.clone(), role).with_jwt(jwt.clone());
    let max = config.requests.max_message_bytes;
    let agent = InterceptedService::new(
        AgentServiceServer::new(AgentApi::new(Arc::clone(&broker)))
            .max_decoding_message_size(max)
            .max_encoding_message_size(reply_limit),
        gate(Role::Agent),
    );
    let approver = InterceptedService::new(
        ApproverServiceServer::new(ApproverApi::new(Arc::clone(&broker)).with_push(push))
            .max_decoding_message_size(max)
            .max_encoding_message_size(reply_limit),
        gate(Role::Approver),
    );
    let admin = InterceptedService::new(
        AdminServiceServer::new(AdminApi::new(Arc::clone(&broker)))
            .max_decoding_message_size(max)
            .max_encoding_message_size(reply_limit),
        gate(Role::Admin),
    );

    let health = tonic_health::server::HealthReporter::new();
    let health_service = crate::surface::grpc::health::capped(
        health.clone(),
        config.streams.max_health_watches as usize,
    );
    for service in SERVICES.into_iter().chain([READINESS, LIVENESS]) {
        health
            .set_service_status(service, ServingStatus::Serving)
            .await;
    }
    // Set once draining starts, under its lock, so storage never turns health SERVING again.
    let health_drained = Arc::new(tokio::sync::Mutex::new(false));
    let storage_health = tokio::spawn(report_storage(
        health.clone(),
        storage.subscribe(),
        Arc::clone(&health_drained),
    ));

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
    let reflection_streams =
        reflection::stream_slots(config.streams.max_reflection_streams as usize);
    let reflection_v1 = reflection::Capped::new(reflection_v1, Arc::clone(&reflection_streams));
    let reflection_v1alpha = reflection::Capped::new(reflection_v1alpha, reflection_streams);

    let mut server = Server::builder()
        // Every request's log lines carry its RPC; the broker's own spans add the session and
        // call ids. With traces on, it continues the caller's `traceparent`.
        .trace_fn(crate::observe::traces::rpc_span)
        // HTTP/1.1 only for browsers on `http://` (the page and gRPC-Web, see `inbox`) and for
        // Slack's clicks.
        .accept_http1(config.serve.inbox || slack.is_some())
        // Outermost first: Slack's signed clicks (one path), the page's files, then gRPC-Web
        // turned into gRPC, so the limits below see every call in one form.
        .layer(
            crate::surface::slack::interactivity::SlackInteractivity::new(
                slack.as_ref().map(|(slack, _)| Arc::clone(slack)),
                Arc::clone(&broker),
            ),
        )
        .layer(
            InboxPage::new(config.serve.inbox, !authenticated)
                .with_sign_in(config.inbox_sign_in()?.as_ref()),
        )
        .layer(GrpcWebLayer::new())
        // Counted after gRPC-Web is turned into gRPC, and outside the limits' rewriting, so
        // every RPC is counted once, with the status its client reads.
        .layer(Observed::new(&[
            proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ]))
        .layer(MessageLimitStatus)
        // A JWT naming a key not cached yet has the keys fetched before its gate verifies it.
        .layer(crate::door::auth::KeyPrefetch::new(jwt.clone()))
        .max_concurrent_streams(config.connections.max_concurrent_streams)
        .http2_keepalive_interval(Some(config.connections.keepalive_interval))
        .http2_keepalive_timeout(Some(config.connections.keepalive_timeout));
    let tls = tls_acceptor(&config.serve)?;

    let grpc = listener.local_addr().map_or_else(
        |_| config.serve.listen.to_string(),
        |a| openable(a).to_string(),
    );
    let scheme = if config.serve.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    let inbox = if config.serve.inbox {
        format!("{scheme}://{grpc}/")
    } else {
        "off".to_owned()
    };
    let metrics = match config.telemetry.metrics_listen {
        MetricsListen::On(address) => format!("http://{}/metrics", openable(address)),
        MetricsListen::Off => "off".to_owned(),
    };
    let state = database.describe();
    tracing::info!(
        grpc = %grpc,
        inbox = %inbox,
        metrics = %metrics,
        database = %state,
        backend = database.backend(),
        tls = config.serve.tls_cert.is_some(),
        mutual_tls = config.serve.tls_client_ca.is_some(),
        "approval broker serving: inbox {inbox}, gRPC {grpc}, metrics {metrics}, state in {state}"
    );

    let (draining, drain_started) = tokio::sync::oneshot::channel::<()>();
    let drain = async move {
        shutdown.await;
        tracing::info!("shutting down: no new streams, ending open ones, finishing requests");
        // Liveness stays SERVING: a draining broker is healthy, only no longer ready.
        let mut drained = health_drained.lock().await;
        *drained = true;
        for service in SERVICES.into_iter().chain([READINESS]) {
            health
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
        drop(drained);
        let _ = stop.send(true);
        let _ = draining.send(());
    };
    let serve = server
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(agent)
        .add_service(approver)
        .add_service(admin)
        .serve_with_incoming_shutdown(
            connections::admit(
                listener,
                config.connections.limits(config.serve.inbox, authenticated),
                tls,
            ),
            drain,
        );
    let drain_timeout = config.serve.drain_timeout;
    let served = tokio::select! {
        served = serve => served.map_err(|e| Error::Internal(format!("server: {e}"))),
        _ = async {
            if drain_started.await.is_ok() {
                tokio::time::sleep(drain_timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(?drain_timeout, "requests still open after the drain timeout; stopping anyway");
            Ok(())
        }
    };
    if let Some((_, poster)) = &slack {
        poster.abort();
    }
    for task in background.into_iter().chain([sweeping]).chain(retention) {
        task.abort();
    }
    dispatcher.stop().await;
    storage_health.abort();
    if served.is_ok() {
        tracing::info!("stopped");
    }
    served
}

/// Where the Backup RPC writes: `--backup-dir`, else the SQLite file's own directory; `None` on
/// Postgres, which the broker does not copy.
fn backup_dir(config: &Config, database: &store::Database) -> Option<std::path::PathBuf> {
    let store::Database::Sqlite { path, .. } = database else {
        return None;
    };
    let dir = config
        .lifecycle
        .backup_dir
        .clone()
        .unwrap_or_else(|| match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => std::path::PathBuf::from("."),
        });
    Some(dir)
}

/// Keeps the pending-calls gauge current. Read from the store (an indexed count), so it is the
/// whole fleet's figure on every replica, whoever wrote the calls. The pool gauges too.
async fn count_pending(store: Arc<dyn store::Deadlines>) {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(2);
    loop {
        match store.pending_count().await {
            Ok(n) => crate::observe::meters::pending_calls(n),
            Err(e) => tracing::warn!(error = %e, "cannot count pending calls for the metrics"),
        }
        let pool = store.reads().pool_stats();
        crate::observe::meters::store_pool(pool.open, pool.idle);
        tokio::time::sleep(EVERY).await;
    }
}

/// Reports the storage's state on the health service: readiness and every service NOT_SERVING
/// while writes fail, SERVING again once one succeeds; never SERVING once the broker drains.
/// Liveness stays SERVING: restarting the broker does not mend a disk, and a broker whose
/// database file was deleted would start on a new, empty one.
async fn report_storage(
    health: tonic_health::server::HealthReporter,
    mut storage: watch::Receiver<Option<StorageFault>>,
    draining: Arc<tokio::sync::Mutex<bool>>,
) {
    loop {
        let status = match *storage.borrow_and_update() {
            None => ServingStatus::Serving,
            Some(_) => ServingStatus::NotServing,
        };
        {
            let draining = draining.lock().await;
            if !*draining {
                for service in SERVICES.into_iter().chain([READINESS]) {
                    health.set_service_status(service, status).await;
                }
            }
        }
        if storage.changed().await.is_err() {
            return;
        }
    }
}

/// The health service name for readiness probes: SERVING until the broker starts draining.
pub const READINESS: &str = "readiness";
/// The health service name for liveness probes: SERVING for as long as the broker serves at all,
/// draining included, so an orchestrator never restarts a broker that is finishing its work.
pub const LIVENESS: &str = "liveness";

/// The health service names the broker reports: the server as a whole and each service. Each
/// turns NOT_SERVING when the broker starts draining, as readiness does.
const SERVICES: [&str; 4] = [
    "",
    <AgentServiceServer<AgentApi> as tonic::server::NamedService>::NAME,
    <ApproverServiceServer<ApproverApi> as tonic::server::NamedService>::NAME,
    <AdminServiceServer<AdminApi> as tonic::server::NamedService>::NAME,
];

/// TLS from --tls-cert and --tls-key, with client certificates required when --tls-client-ca
/// is set.
fn tls_acceptor(config: &ServeSettings) -> Result<Option<TlsAcceptor>> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let read = |setting: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| Error::invalid(setting, format!("cannot read {}: {e}", path.display())))
    };
    let client_ca = match &config.tls_client_ca {
        Some(ca) => Some(read("--tls-client-ca", ca)?),
        None => None,
    };
    connections::tls_acceptor(
        &read("--tls-cert", cert)?,
        &read("--tls-key", key)?,
        client_ca.as_deref(),
    )
    .map(Some)
}

/// Applies the migrations of the configured database and returns (`approval-broker migrate`).
pub async fn migrate(config: &Config) -> Result<()> {
    let database = config.store.database()?;
    let _only_broker = store::claim(&database)?;
    store::open(&database, config.texts.resolve(), None).await?;
    tracing::info!(backend = database.backend(), "migrations applied");
    Ok(())
}

/// `address` as a person opens it: an unspecified listen address (`0.0.0.0`, `::`) is reached
/// on this machine as localhost.
fn openable(address: std::net::SocketAddr) -> std::net::SocketAddr {
    if address.ip().is_unspecified() {
        let localhost = match address {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        std::net::SocketAddr::new(localhost, address.port())
    } else {
        address
    }
}
