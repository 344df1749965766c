//! `spawn_app()`: a real broker on port 0 with a fresh SQLite file, and small builders for the
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

pub struct TestApp {
    pub channel: Channel,
    pub database_url: String,
    /// Holds the database file; dropped with the app.
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<approval_broker::Result<()>>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Starts a broker with a fresh database, after `configure` adjusts the defaults.
pub async fn spawn_app_with(configure: impl FnOnce(&mut Config)) -> TestApp {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("approvals.db").display());
    let mut config = Config::with_database(url);
    configure(&mut config);
    start(config, dir).await
}

async fn start(config: Config, dir: tempfile::TempDir) -> TestApp {
    if std::env::var_os("TEST_LOG").is_some() {
        telemetry::init("info,approval_broker=debug");
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
        channel,
        database_url,
        dir,
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
        start(Config::with_database(database_url), dir).await
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

/// Every call in the store, through the admin audit view.
pub async fn all_calls(app: &TestApp) -> Vec<pb::Call> {
    let mut calls = Vec::new();
    let mut token = String::new();
    loop {
        let page = app
            .admin()
            .list_calls(pb::ListCallsRequest {
                page_size: 1000,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list calls")
            .into_inner();
        calls.extend(page.calls);
        if page.next_page_token.is_empty() {
            return calls;
        }
        token = page.next_page_token;
    }
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
