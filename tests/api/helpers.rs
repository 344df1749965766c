//! `spawn_app_on(backend, ...)`: a real broker on port 0 with a fresh database (a SQLite file, or
//! a new schema of the Postgres database named by `APPROVALS_TEST_POSTGRES_URL`), the
//! `backend_tests!` macro that runs one test body on each backend, and small builders for the
//! requests the tests send.

use std::time::Duration;

use approval_broker::config::Config;
use approval_broker::proto::v1 as pb;
use approval_broker::{startup, telemetry};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Streaming};

pub use pb::CallStatus;
pub use pb::admin_service_client::AdminServiceClient;
pub use pb::agent_service_client::AgentServiceClient;
pub use pb::approver_service_client::ApproverServiceClient;

/// How long a test waits for something the broker should send before it fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The environment variable naming the Postgres database the Postgres variants run on, e.g.
/// `postgres://postgres@127.0.0.1:5432/test`. Each test gets a schema of its own.
pub const POSTGRES_URL_VAR: &str = "APPROVALS_TEST_POSTGRES_URL";

/// Defines, for each named `async fn name(app: TestApp)` of the module, the tests
/// `name::sqlite` and `name::postgres`: the same body against each backend. `name => |config|
/// ...` adjusts the broker's configuration first.
macro_rules! backend_tests {
    ($($name:ident $(=> $configure:expr)?),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    let app = crate::helpers::spawn_app_on(
                        crate::helpers::Backend::Sqlite,
                        crate::helpers::backend_tests!(@configure $($configure)?),
                    )
                    .await;
                    super::$name(app).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(
                    not(approvals_test_postgres),
                    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres variants"
                )]
                async fn postgres() {
                    let app = crate::helpers::spawn_app_on(
                        crate::helpers::Backend::postgres(),
                        crate::helpers::backend_tests!(@configure $($configure)?),
                    )
                    .await;
                    super::$name(app).await;
                }
            }
        )*
    };
    (@configure $configure:expr) => { $configure };
    (@configure) => { |_: &mut approval_broker::config::Config| {} };
}

pub(crate) use backend_tests;

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
        match std::env::var(POSTGRES_URL_VAR) {
            Ok(url) if !url.is_empty() => Backend::Postgres(url),
            _ => panic!(
                "{POSTGRES_URL_VAR} was set when the tests were built but is not set now: set it \
                 again (or unset it and rebuild, which marks the Postgres tests ignored)"
            ),
        }
    }
}

/// The URL of the Postgres database the tests use (see [`Backend::postgres`]).
pub fn postgres_url() -> String {
    match Backend::postgres() {
        Backend::Postgres(url) => url,
        Backend::Sqlite => unreachable!("Backend::postgres is Postgres"),
    }
}

/// A Postgres schema a test owns; dropped with it.
pub struct Schema {
    base_url: String,
    name: String,
}

impl Schema {
    pub async fn create(base_url: &str) -> Schema {
        use sqlx::Connection as _;
        let name = format!("test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(base_url)
            .await
            .unwrap_or_else(|e| panic!("{POSTGRES_URL_VAR}={base_url} is unreachable: {e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut conn)
            .await
            .expect("create schema");
        Schema {
            base_url: base_url.to_owned(),
            name,
        }
    }

    /// The database URL with this schema first on the search path.
    pub fn url(&self) -> String {
        let sep = if self.base_url.contains('?') {
            '&'
        } else {
            '?'
        };
        format!(
            "{}{sep}options=-c%20search_path%3D{}",
            self.base_url, self.name
        )
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let base_url = self.base_url.clone();
        let sql = format!(
            "SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS {} CASCADE",
            self.name
        );
        // Drop may run inside the test's runtime: do the async work on a thread of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                use sqlx::Connection as _;
                if let Ok(mut conn) = sqlx::PgConnection::connect(&base_url).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
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
        Backend::Postgres(base) => Some(std::sync::Arc::new(Schema::create(base).await)),
    };
    let url = match &schema {
        None => format!("sqlite://{}", dir.path().join("approvals.db").display()),
        Some(schema) => schema.url(),
    };
    let mut config = Config::with_database(url);
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
    let database_url = config.database_url.clone();
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
            Config::with_database(database_url),
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
        let mut config = Config::with_database(std::mem::take(&mut self.database_url));
        configure(&mut config);
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        let schema = self.schema.take();
        start(config, dir, self.backend.clone(), schema).await
    }

    /// Another broker process on the same database (Postgres replicas), configured by
    /// `configure`.
    pub async fn replica(&self, configure: impl FnOnce(&mut Config)) -> TestApp {
        let mut config = Config::with_database(self.database_url.clone());
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

/// A call with a small JSON input.
pub fn call(call_id: &str, tool: &str, input_json: &str) -> pb::CallSpec {
    pb::CallSpec {
        call_id: call_id.into(),
        tool: tool.into(),
        input_json: input_json.into(),
        ..Default::default()
    }
}

/// A batch of `calls` in `session` with the default options.
pub fn batch(session: &str, calls: Vec<pb::CallSpec>) -> pb::BatchSpec {
    pb::BatchSpec {
        session_id: session.into(),
        calls,
        ..Default::default()
    }
}

/// Submits through the unary RPC and returns the response.
pub async fn submit(app: &TestApp, batch: pb::BatchSpec) -> pb::SubmitResponse {
    app.agent()
        .submit(pb::SubmitRequest { batch: Some(batch) })
        .await
        .expect("submit")
        .into_inner()
}

pub fn decide_request(
    session: &str,
    call_id: &str,
    decision: pb::Decision,
    reason: &str,
) -> pb::DecideRequest {
    pb::DecideRequest {
        session_id: session.into(),
        call_id: call_id.into(),
        decision: decision as i32,
        reason: reason.into(),
        approver: "alice@example.com".into(),
        ..Default::default()
    }
}

pub async fn approve(app: &TestApp, session: &str, call_id: &str) -> pb::DecideResponse {
    app.approver()
        .decide(decide_request(session, call_id, pb::Decision::Approve, ""))
        .await
        .expect("approve")
        .into_inner()
}

pub async fn deny(app: &TestApp, session: &str, call_id: &str, reason: &str) -> pb::DecideResponse {
    app.approver()
        .decide(decide_request(session, call_id, pb::Decision::Deny, reason))
        .await
        .expect("deny")
        .into_inner()
}

/// The state of each named call, through GetOutcomes.
pub async fn states(app: &TestApp, session: &str, call_ids: &[&str]) -> Vec<pb::CallState> {
    app.agent()
        .get_outcomes(pb::GetOutcomesRequest {
            session_id: session.into(),
            call_ids: call_ids.iter().map(|s| s.to_string()).collect(),
        })
        .await
        .expect("get outcomes")
        .into_inner()
        .calls
}

/// The outcome of a decided call (panics if it is pending or unknown).
pub async fn outcome_of(app: &TestApp, session: &str, call_id: &str) -> pb::Outcome {
    match states(app, session, &[call_id]).await.remove(0).state {
        Some(pb::call_state::State::Outcome(outcome)) => outcome,
        other => panic!("{call_id} has no outcome: {other:?}"),
    }
}

pub fn status_of(outcome: &pb::Outcome) -> CallStatus {
    CallStatus::try_from(outcome.status).expect("known status")
}

/// A `WatchOutcomes` stream of `session` (all its calls, or the named ones).
pub async fn watch(
    app: &TestApp,
    session: &str,
    call_ids: &[&str],
) -> tonic::Streaming<pb::WatchOutcomesResponse> {
    app.agent()
        .watch_outcomes(pb::WatchOutcomesRequest {
            session_id: session.into(),
            call_ids: call_ids.iter().map(|s| s.to_string()).collect(),
        })
        .await
        .expect("watch outcomes")
        .into_inner()
}

/// Every page ListCalls answers for `request`, following `next_page_token` to the end.
pub async fn list_calls_pages(
    app: &TestApp,
    request: pb::ListCallsRequest,
) -> Vec<pb::ListCallsResponse> {
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = app
            .admin()
            .list_calls(pb::ListCallsRequest {
                page_size: 1000,
                page_token: token,
                ..request.clone()
            })
            .await
            .expect("list calls")
            .into_inner();
        token = page.next_page_token.clone();
        pages.push(page);
        if token.is_empty() {
            return pages;
        }
    }
}

/// Every call in the store, through the admin audit view.
pub async fn all_calls(app: &TestApp) -> Vec<pb::Call> {
    list_calls_pages(app, pb::ListCallsRequest::default())
        .await
        .into_iter()
        .flat_map(|page| page.calls)
        .collect()
}

/// Times a one-call submit of an unrelated session sent while `behind` is being judged, and
/// asserts it was answered (pending) within a second: "not stalled", as opposed to the seconds
/// a quadratic matcher on the writer took.
pub async fn assert_an_unrelated_submit_is_not_stalled(app: &TestApp, behind: &str) {
    let started = std::time::Instant::now();
    let unrelated = submit(
        app,
        batch("unrelated", vec![call("c1", "t", r#"{"x":"a"}"#)]),
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(ack_status(&unrelated, 0), CallStatus::Pending);
    assert!(
        waited < std::time::Duration::from_secs(1),
        "an unrelated submit waited {waited:?} behind the adversarial {behind}"
    );
}

/// An open `Connect` stream.
pub struct AgentStream {
    requests: mpsc::Sender<pb::AgentRequest>,
    responses: Streaming<pb::AgentResponse>,
}

impl AgentStream {
    pub async fn open(app: &TestApp) -> AgentStream {
        let (requests, rx) = mpsc::channel(64);
        let responses = app
            .agent()
            .connect(ReceiverStream::new(rx))
            .await
            .expect("connect")
            .into_inner();
        AgentStream {
            requests,
            responses,
        }
    }

    pub async fn send(&self, request_id: &str, request: pb::agent_request::Request) {
        self.requests
            .send(pb::AgentRequest {
                request_id: request_id.into(),
                request: Some(request),
            })
            .await
            .expect("stream open");
    }

    pub async fn send_raw(&self, request: pb::AgentRequest) {
        self.requests.send(request).await.expect("stream open");
    }

    pub async fn submit(&self, request_id: &str, batch: pb::BatchSpec) {
        self.send(request_id, pb::agent_request::Request::Submit(batch))
            .await;
    }

    /// The next response; fails the test after [`PATIENCE`].
    pub async fn next(&mut self) -> pb::agent_response::Response {
        let message = tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("a response in time")
            .expect("stream healthy")
            .expect("stream open");
        message.response.expect("a response")
    }

    /// The next response with its request id.
    pub async fn next_with_id(&mut self) -> (String, pb::agent_response::Response) {
        let message = tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("a response in time")
            .expect("stream healthy")
            .expect("stream open");
        (message.request_id, message.response.expect("a response"))
    }

    /// Whether nothing arrives within `wait`.
    pub async fn is_quiet_for(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.responses.message())
            .await
            .is_err()
    }

    /// The acknowledgements of the next `submitted` response.
    pub async fn next_submitted(&mut self) -> pb::SubmitResponse {
        match self.next().await {
            pb::agent_response::Response::Submitted(s) => s,
            other => panic!("expected acknowledgements, got {other:?}"),
        }
    }

    pub async fn next_outcome(&mut self) -> pb::Outcome {
        match self.next().await {
            pb::agent_response::Response::Outcome(o) => o,
            other => panic!("expected an outcome, got {other:?}"),
        }
    }

    pub async fn next_batch_complete(&mut self) -> pb::BatchComplete {
        match self.next().await {
            pb::agent_response::Response::BatchComplete(b) => b,
            other => panic!("expected batch-complete, got {other:?}"),
        }
    }
}

/// An open `Subscribe` stream.
pub struct Subscription {
    pub stream: Streaming<pb::ApproverEvent>,
}

impl Subscription {
    pub async fn open(
        app: &TestApp,
        filter: pb::CallFilter,
        after_seq: Option<u64>,
    ) -> Subscription {
        let stream = app
            .approver()
            .subscribe(pb::SubscribeRequest {
                filter: Some(filter),
                after_seq,
            })
            .await
            .expect("subscribe")
            .into_inner();
        Subscription { stream }
    }

    pub async fn next(&mut self) -> pb::ApproverEvent {
        tokio::time::timeout(PATIENCE, self.stream.message())
            .await
            .expect("an event in time")
            .expect("stream healthy")
            .expect("stream open")
    }

    /// Reads until the snapshot marker; returns the snapshot's calls and its sequence number.
    pub async fn snapshot(&mut self) -> (Vec<pb::Call>, u64) {
        let mut calls = Vec::new();
        loop {
            let event = self.next().await;
            match event.event {
                Some(pb::approver_event::Event::Snapshot(call)) => calls.push(call),
                Some(pb::approver_event::Event::SnapshotComplete(done)) => {
                    assert_eq!(done.pending as usize, calls.len());
                    return (calls, event.seq);
                }
                other => panic!("expected the snapshot, got {other:?}"),
            }
        }
    }
}

/// Asserts a gRPC error's code and that its message names `field`.
pub fn assert_status(result: Result<impl std::fmt::Debug, tonic::Status>, code: Code, field: &str) {
    match result {
        Ok(value) => panic!("expected {code:?} naming `{field}`, got {value:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "{}", status.message());
            assert!(
                status.message().contains(field),
                "`{}` should name `{field}`",
                status.message()
            );
        }
    }
}

/// The real `approval-broker` binary as a child process on a free port, for what only a process
/// shows: signals, exit codes, metrics, log output. Killed and reaped on drop.
pub struct BrokerProcess {
    pub child: std::process::Child,
    pub channel: Channel,
    /// The process's standard output and error.
    pub log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl BrokerProcess {
    /// Starts the binary on `database_url` with `args` (and `env` on top of a clean
    /// environment), and waits until it answers health checks.
    pub async fn start(database_url: &str, args: &[&str], env: &[(&str, &str)]) -> BrokerProcess {
        use std::process::{Command, Stdio};
        let port = free_port();
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("broker.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_approval-broker"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--database-url", database_url])
            .args(args)
            .env_clear()
            // Tests run side by side: none may take the default metrics port unless it asks.
            .env("APPROVALS_METRICS_LISTEN", "off")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().expect("log file")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("start the broker");
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("endpoint")
            .connect_lazy();
        // Owned from here on, so the process is killed and reaped even if the test fails.
        let mut broker = BrokerProcess {
            child,
            channel,
            log,
            _dir: dir,
        };
        let mut health = tonic_health::pb::health_client::HealthClient::new(broker.channel.clone());
        for _ in 0..500 {
            if health
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .is_ok()
            {
                return broker;
            }
            if let Ok(Some(status)) = broker.child.try_wait() {
                panic!("the broker exited with {status}: {}", broker.log_text());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the broker did not start: {}", broker.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Decides a call and remembers the decision with `scope` (and `matcher`, if given).
pub async fn decide_remembering(
    app: &TestApp,
    session: &str,
    call_id: &str,
    decision: pb::Decision,
    scope: pb::Scope,
    matcher: Option<pb::InputMatcher>,
) -> pb::DecideResponse {
    let mut request = decide_request(session, call_id, decision, "remembered");
    request.scope = scope as i32;
    request.matcher = matcher;
    app.approver()
        .decide(request)
        .await
        .expect("decide")
        .into_inner()
}

/// Decides a call remembering the decision (see [`decide_remembering`]); returns the grant
/// that made.
pub async fn grant_by_deciding(
    app: &TestApp,
    session: &str,
    call_id: &str,
    decision: pb::Decision,
    scope: pb::Scope,
    matcher: Option<pb::InputMatcher>,
) -> pb::Grant {
    decide_remembering(app, session, call_id, decision, scope, matcher)
        .await
        .grant
        .expect("a grant")
}

/// A matcher of every input.
pub fn any_input() -> pb::InputMatcher {
    pb::InputMatcher {
        kind: Some(pb::input_matcher::Kind::Any(pb::AnyInput {})),
    }
}

/// A matcher of exactly this input.
pub fn exact_input(input_json: &str) -> pb::InputMatcher {
    pb::InputMatcher {
        kind: Some(pb::input_matcher::Kind::ExactJson(input_json.into())),
    }
}

/// A matcher of inputs where every condition holds.
pub fn fields(conditions: Vec<pb::FieldCondition>) -> pb::InputMatcher {
    pb::InputMatcher {
        kind: Some(pb::input_matcher::Kind::Fields(pb::FieldConditions {
            conditions,
        })),
    }
}

fn condition(field: &str, test: pb::field_condition::Test) -> pb::FieldCondition {
    pb::FieldCondition {
        field: field.into(),
        test: Some(test),
    }
}

pub fn prefix(field: &str, prefix: &str) -> pb::FieldCondition {
    condition(field, pb::field_condition::Test::Prefix(prefix.into()))
}

pub fn glob(field: &str, glob: &str) -> pb::FieldCondition {
    condition(field, pb::field_condition::Test::Glob(glob.into()))
}

pub fn equals(field: &str, value: &str) -> pb::FieldCondition {
    condition(field, pb::field_condition::Test::Equals(value.into()))
}

pub fn equals_json(field: &str, json: &str) -> pb::FieldCondition {
    condition(field, pb::field_condition::Test::EqualsJson(json.into()))
}

/// A rule for CreateRule.
pub fn rule(
    id: &str,
    tool: &str,
    effect: pb::Effect,
    priority: i32,
    matcher: Option<pb::InputMatcher>,
) -> pb::Rule {
    pb::Rule {
        id: id.into(),
        tool: tool.into(),
        matcher,
        effect: effect as i32,
        priority,
        ..Default::default()
    }
}

pub async fn create_rule(app: &TestApp, rule: pb::Rule) -> pb::Rule {
    app.admin()
        .create_rule(pb::CreateRuleRequest { rule: Some(rule) })
        .await
        .expect("create rule")
        .into_inner()
}

/// The grants ListGrants shows (active ones, or all with `include_inactive`), every page.
pub async fn list_grants(app: &TestApp, mut request: pb::ListGrantsRequest) -> Vec<pb::Grant> {
    let mut grants = Vec::new();
    loop {
        let page = app
            .admin()
            .list_grants(request.clone())
            .await
            .expect("list grants")
            .into_inner();
        grants.extend(page.grants);
        if page.next_page_token.is_empty() {
            return grants;
        }
        request.page_token = page.next_page_token;
    }
}

/// Explains a call described inline (agent `default`).
pub async fn explain_inline(
    app: &TestApp,
    session: &str,
    workspace: &str,
    tool: &str,
    input_json: &str,
) -> pb::ExplainResponse {
    let inline = pb::ExplainCall {
        agent: String::new(),
        session_id: session.into(),
        workspace: workspace.into(),
        tool: tool.into(),
        input_json: input_json.into(),
    };
    app.admin()
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Inline(inline)),
        })
        .await
        .expect("explain")
        .into_inner()
}

/// Explains a stored call of agent `default`.
pub async fn explain_stored(app: &TestApp, session: &str, call_id: &str) -> pb::ExplainResponse {
    let stored = pb::GetCallRequest {
        session_id: session.into(),
        call_id: call_id.into(),
        agent: String::new(),
    };
    app.admin()
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Stored(stored)),
        })
        .await
        .expect("explain")
        .into_inner()
}

/// The status of the one call a submit acknowledged (its `accepted` status).
pub fn ack_status(response: &pb::SubmitResponse, index: usize) -> CallStatus {
    match &response.acks[index].result {
        Some(pb::call_ack::Result::Accepted(a) | pb::call_ack::Result::Duplicate(a)) => {
            CallStatus::try_from(a.status).expect("known status")
        }
        other => panic!("call {index} was not accepted: {other:?}"),
    }
}

/// A call with a workspace.
pub fn call_in(workspace: &str, call_id: &str, tool: &str, input_json: &str) -> pb::CallSpec {
    pb::CallSpec {
        workspace: workspace.into(),
        ..call(call_id, tool, input_json)
    }
}
