//! In-process brokers: `spawn_app_on(backend, configure)` serves a real broker on port 0 with a
//! fresh database (a SQLite file, or a new schema of the Postgres database named by
//! `APPROVALS_TEST_POSTGRES_URL`), restarts it on the same database, and starts replicas beside
//! it. Each is built from an explicit configuration ([`Config::for_tests`]), never from the
//! developer's environment.

use std::time::Duration;

use approval_broker::config::Config;
use approval_broker::{observe::telemetry, startup};
use testkit::Schema;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

use super::PATIENCE;
use super::clients::{AdminServiceClient, AgentServiceClient, ApproverServiceClient};

/// Where a test's broker keeps its state.
#[derive(Debug, Clone)]
pub enum Backend {
    Sqlite,
    /// The URL of a Postgres database; the test creates a schema of its own in it.
    Postgres(String),
}

impl Backend {
    /// Postgres, at the database `APPROVALS_TEST_POSTGRES_URL` names. Only Postgres tests call
    /// it, and they are compiled as ignored when the variable was unset at build time (see
    /// `build.rs`), so an unset variable here means it was unset after the build: say so.
    pub fn postgres() -> Backend {
        Backend::Postgres(testkit::postgres_url())
    }
}

pub struct TestApp {
    pub address: std::net::SocketAddr,
    pub channel: Channel,
    pub database_url: String,
    pub backend: Backend,
    /// Holds the SQLite file; dropped with the app.
    pub dir: tempfile::TempDir,
    schema: Option<std::sync::Arc<Schema>>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<approval_broker::Result<()>>>,
}

/// Starts a broker on SQLite with the default configuration.
pub async fn spawn_app() -> TestApp {
    spawn_app_on(Backend::Sqlite, |_| {}).await
}

/// Starts a broker with a fresh database of `backend`, after `configure` adjusts the defaults.
pub async fn spawn_app_on(backend: Backend, configure: impl FnOnce(&mut Config)) -> TestApp {
    let dir = tempfile::tempdir().expect("temp dir");
    let schema = match &backend {
        Backend::Sqlite => None,
        Backend::Postgres(base) => Some(std::sync::Arc::new(fresh_schema(base).await)),
    };
    let url = match &schema {
        None => format!("sqlite://{}", dir.path().join("approvals.db").display()),
        Some(schema) => schema.url(),
    };
    let mut config = Config::for_tests(url);
    configure(&mut config);
    start(config, dir, backend, schema).await
}

async fn start(
    config: Config,
    dir: tempfile::TempDir,
    backend: Backend,
    schema: Option<std::sync::Arc<Schema>>,
) -> TestApp {
    if std::env::var_os("TEST_LOG").is_some() {
        telemetry::init("info,approval_broker=debug", false);
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let database_url = config.store.database_url.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(startup::run(listener, config, async {
        let _ = stopped.await;
    }));
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect_lazy();
    let app = TestApp {
        address,
        channel,
        database_url,
        backend,
        dir,
        schema,
        stop: Some(stop),
        server: Some(server),
    };
    app.wait_until_serving().await;
    app
}

impl TestApp {
    /// Runs `sql` (one or more statements) on the app's database over a connection of its own,
    /// behind the broker's back: for a test that plants a fault or a row the broker must cope
    /// with.
    pub async fn run_sql(&self, sql: &str) {
        use sqlx::Connection as _;
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self.backend {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.database_url)
                    .await
                    .expect("open the database");
                sqlx::raw_sql(sql).execute(&mut conn).await.expect("sql");
            }
            Backend::Postgres(_) => {
                let mut conn = sqlx::PgConnection::connect(&self.database_url)
                    .await
                    .expect("open the database");
                sqlx::raw_sql(sql).execute(&mut conn).await.expect("sql");
            }
        }
    }

    /// The count `sql` (a `SELECT count(*) ...`) reads from the app's database, over a
    /// connection of its own: for a test about how rows are stored, not what the API answers.
    pub async fn count(&self, sql: &str) -> i64 {
        use sqlx::Connection as _;
        let sql = || sqlx::AssertSqlSafe(sql.to_owned());
        match self.backend {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.database_url)
                    .await
                    .expect("open the database");
                sqlx::query_scalar(sql())
                    .fetch_one(&mut conn)
                    .await
                    .expect("sql")
            }
            Backend::Postgres(_) => {
                let mut conn = sqlx::PgConnection::connect(&self.database_url)
                    .await
                    .expect("open the database");
                sqlx::query_scalar(sql())
                    .fetch_one(&mut conn)
                    .await
                    .expect("sql")
            }
        }
    }

    pub fn agent(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel.clone())
    }

    pub fn approver(&self) -> ApproverServiceClient<Channel> {
        ApproverServiceClient::new(self.channel.clone())
    }

    pub fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel.clone())
    }

    async fn wait_until_serving(&self) {
        let mut health = tonic_health::pb::health_client::HealthClient::new(self.channel.clone());
        for _ in 0..200 {
            let request = tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            };
            if health.check(request).await.is_ok() {
                return;
            }
            if self.server.as_ref().is_some_and(|s| s.is_finished()) {
                panic!("the broker stopped during start");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the broker did not start serving");
    }

    /// Stops the broker gracefully and starts a new one on the same database file.
    pub async fn restart(self) -> TestApp {
        self.start_again().await
    }

    /// Kills the broker without a graceful stop (its task is aborted mid-flight) and starts a new
    /// one on the same database file, as after a crash.
    pub async fn crash_and_restart(mut self) -> TestApp {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
        self.start_again().await
    }

    /// Stops the broker gracefully; the database stays for [`TestApp::start_again`].
    pub async fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            match tokio::time::timeout(PATIENCE, server).await {
                Ok(result) => result
                    .expect("server task")
                    .expect("server stopped cleanly"),
                Err(_) => panic!("the broker did not stop"),
            }
        }
    }

    pub async fn start_again(mut self) -> TestApp {
        self.shut_down().await;
        let database_url = std::mem::take(&mut self.database_url);
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        let schema = self.schema.take();
        start(
            Config::for_tests(database_url),
            dir,
            self.backend.clone(),
            schema,
        )
        .await
    }

    /// Stops the broker gracefully and starts a new one on the same database, configured by
    /// `configure` (for settings read at start, such as the policy file).
    pub async fn restart_with(mut self, configure: impl FnOnce(&mut Config)) -> TestApp {
        self.shut_down().await;
        let mut config = Config::for_tests(std::mem::take(&mut self.database_url));
        configure(&mut config);
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        let schema = self.schema.take();
        start(config, dir, self.backend.clone(), schema).await
    }

    /// Another broker process on the same database (Postgres replicas), configured by
    /// `configure`.
    pub async fn replica(&self, configure: impl FnOnce(&mut Config)) -> TestApp {
        let mut config = Config::for_tests(self.database_url.clone());
        configure(&mut config);
        let dir = tempfile::tempdir().expect("temp dir");
        start(config, dir, self.backend.clone(), self.schema.clone()).await
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A new Postgres schema in the database `base_url` names, dropped with the value.
pub async fn fresh_schema(base_url: &str) -> Schema {
    Schema::create(base_url, "test")
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", testkit::POSTGRES_URL_VAR))
}
