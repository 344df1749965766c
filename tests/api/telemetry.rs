//! What operators watch: the Prometheus endpoint counts one approval cycle exactly, and JSON
//! logs carry each request's span with its session and call ids. Runs the real binary (the
//! metrics recorder is global to a process, so in-process brokers could not be told apart).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use approval_broker::proto::v1 as pb;
use pb::agent_service_client::AgentServiceClient;
use pb::approver_event::Event as E;
use pb::approver_service_client::ApproverServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::ReceiverStream;

use crate::helpers::*;

/// One sample of the exposition: its metric name and labels, sorted.
type Sample = (String, BTreeMap<String, String>);

/// Scrapes `/metrics` over plain HTTP/1.0 and parses every sample line.
async fn scrape(port: u16) -> BTreeMap<Sample, f64> {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the metrics port");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    conn.read_to_string(&mut response).await.expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    let mut samples = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').expect("label");
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        samples.insert((name.to_owned(), labels), value.parse().expect("a number"));
    }
    samples
}

fn value(samples: &BTreeMap<Sample, f64>, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    samples.get(&(name.to_owned(), labels)).copied()
}

/// Scrapes until `check` holds (gauges read from the store refresh every few seconds).
async fn eventually(port: u16, what: &str, check: impl Fn(&BTreeMap<Sample, f64>) -> bool) {
    let started = Instant::now();
    loop {
        let samples = scrape(port).await;
        if check(&samples) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: {samples:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads `subscription` until `n` of its events were `wanted`.
async fn read_until(
    subscription: &mut tonic::Streaming<pb::ApproverEvent>,
    n: usize,
    wanted: fn(&E) -> bool,
) {
    let mut seen = 0;
    while seen < n {
        let event = subscription
            .message()
            .await
            .expect("healthy")
            .expect("open");
        if event.event.as_ref().is_some_and(wanted) {
            seen += 1;
        }
    }
}

async fn metrics_count_one_approval_cycle_and_logs_name_its_ids(mut app: TestApp) {
    app.shut_down().await;
    let port = free_port().expect("a free port");
    let metrics_listen = format!("127.0.0.1:{port}");
    let broker = start_broker(
        &app.database_url,
        &["--metrics-listen", &metrics_listen, "--log-format", "json"],
        &[("RUST_LOG", "info,approval_broker=debug")],
    )
    .await;

    // An approver UI and an agent stream are open.
    let mut subscription = ApproverServiceClient::new(broker.channel())
        .subscribe(pb::SubscribeRequest {
            filter: None,
            after_seq: None,
        })
        .await
        .expect("subscribe")
        .into_inner();
    let (requests, rx) = tokio::sync::mpsc::channel(8);
    let mut agent = AgentServiceClient::new(broker.channel())
        .connect(ReceiverStream::new(rx))
        .await
        .expect("connect")
        .into_inner();
    let mut spec = batch(
        "metrics-session",
        vec![
            call("call-a", "read_file", r#"{"path":"a"}"#),
            call("call-b", "run_shell", r#"{"command":"rm -rf build"}"#),
            call("call-c", "write_file", r#"{"path":"c"}"#),
        ],
    );
    spec.on_deny = pb::OnDeny::SkipRest as i32;
    requests
        .send(pb::AgentRequest {
            request_id: "turn-1".into(),
            request: Some(pb::agent_request::Request::Submit(spec)),
        })
        .await
        .expect("send");
    let submitted = agent.message().await.expect("healthy").expect("open");
    assert!(matches!(
        submitted.response,
        Some(pb::agent_response::Response::Submitted(_))
    ));
    // The subscriber sees the three calls (so it has been sent events).
    read_until(&mut subscription, 3, |e| matches!(e, E::Requested(_))).await;
    eventually(port, "three calls pending", |s| {
        value(s, "approvals_pending_calls", &[]) == Some(3.0)
    })
    .await;

    let mut approver = ApproverServiceClient::new(broker.channel());
    approver
        .decide(decide_request(
            "metrics-session",
            "call-a",
            pb::Decision::Approve,
            "",
        ))
        .await
        .expect("approve");
    approver
        .decide(decide_request(
            "metrics-session",
            "call-b",
            pb::Decision::Deny,
            "no",
        ))
        .await
        .expect("deny");
    // The agent hears all three outcomes.
    let mut outcomes = 0;
    while outcomes < 3 {
        let message = agent.message().await.expect("healthy").expect("open");
        if matches!(
            message.response,
            Some(pb::agent_response::Response::Outcome(_))
        ) {
            outcomes += 1;
        }
    }
    // And the subscriber was sent the three outcomes (its lag is metered as they are sent).
    read_until(&mut subscription, 3, |e| matches!(e, E::Resolved(_))).await;

    eventually(port, "nothing pending", |s| {
        value(s, "approvals_pending_calls", &[]) == Some(0.0)
    })
    .await;
    let s = scrape(port).await;
    let outcome = |kind: &str, by: &str| {
        value(
            &s,
            "approvals_outcomes_total",
            &[("decided_by", by), ("kind", kind)],
        )
    };
    assert_eq!(value(&s, "approvals_calls_submitted_total", &[]), Some(3.0));
    assert_eq!(outcome("approved", "approver"), Some(1.0));
    assert_eq!(outcome("denied", "approver"), Some(1.0));
    assert_eq!(outcome("skipped", "broker"), Some(1.0));
    assert_eq!(
        outcome("cancelled", "agent"),
        None,
        "nothing else was decided"
    );
    assert_eq!(
        value(
            &s,
            "approvals_decision_seconds_count",
            &[("decided_by", "approver")]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            "approvals_decision_seconds_count",
            &[("decided_by", "broker")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&s, "approvals_agent_streams", &[]), Some(1.0));
    assert_eq!(value(&s, "approvals_subscribers", &[]), Some(1.0));
    // One submit and two decisions were committed, in one or more transactions.
    let transactions = value(&s, "approvals_store_commit_seconds_count", &[]).unwrap_or(0.0);
    assert!(transactions >= 1.0, "{s:#?}");
    assert_eq!(
        value(&s, "approvals_store_commit_writes_count", &[]),
        Some(transactions)
    );
    assert!(value(&s, "approvals_store_commit_writes_sum", &[]).unwrap_or(0.0) >= 3.0);
    // The subscriber was sent its (empty) snapshot's end, 3 requested and 3 resolved events.
    assert_eq!(
        value(&s, "approvals_subscriber_lag_events_count", &[]),
        Some(7.0)
    );

    // Closing the streams shows in the gauges.
    drop(subscription);
    drop(requests);
    drop(agent);
    eventually(port, "streams closed", |s| {
        value(s, "approvals_agent_streams", &[]) == Some(0.0)
            && value(s, "approvals_subscribers", &[]) == Some(0.0)
    })
    .await;

    // Every log line is a JSON object; the submit's and the decision's carry their ids.
    let log = broker.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let with_message = |message: &str| {
        lines
            .iter()
            .filter(|l| l["message"] == message)
            .cloned()
            .collect::<Vec<_>>()
    };
    let submitted = with_message("submitted");
    assert_eq!(submitted.len(), 1, "{log}");
    let span = &submitted[0]["span"];
    assert_eq!(span["session"], "metrics-session", "{log}");
    assert_eq!(span["calls"], "call-a,call-b,call-c", "{log}");
    let rpc = &submitted[0]["spans"][0];
    assert_eq!(rpc["method"], "/approvals.v1.AgentService/Connect", "{log}");
    let decided = with_message("decided");
    assert_eq!(decided.len(), 2, "{log}");
    assert_eq!(decided[0]["span"]["call"], "call-a", "{log}");
    assert_eq!(decided[1]["span"]["call"], "call-b", "{log}");
    assert_eq!(decided[1]["span"]["session"], "metrics-session", "{log}");
    // Traces are off: the spans hold what the lines use, not the OTel attributes (which would
    // be formatted for every request and never read).
    let fields = |span: &serde_json::Value| {
        let mut names: Vec<String> = span.as_object().unwrap().keys().cloned().collect();
        names.sort();
        names
    };
    assert_eq!(fields(rpc), ["method", "name"], "{log}");
    assert_eq!(
        fields(&decided[0]["span"]),
        ["agent", "approver", "call", "name", "session"],
        "{log}"
    );
}

async fn each_superseded_call_is_counted_once(mut app: TestApp) {
    let (broker, port) = broker_serving_metrics(&mut app).await;
    let mut agent = AgentServiceClient::new(broker.channel());
    let keyed = |call_id: &str| pb::CallSpec {
        supersede_key: "ask".into(),
        ..call(call_id, "ask_user", "{}")
    };
    // `q1` superseded by a later call of its own batch, `q2` by a later call of the request
    // that resubmits it, `q3` by a superseding batch: three SUPERSEDED outcomes.
    let submits = [
        batch("s", vec![keyed("q1"), keyed("q2")]),
        batch("s", vec![keyed("q2"), keyed("q3")]),
        pb::BatchSpec {
            supersede_pending: true,
            ..batch("s", vec![call("x", "t", "{}")])
        },
    ];
    for spec in submits {
        agent
            .submit(pb::SubmitRequest { batch: Some(spec) })
            .await
            .expect("submit");
    }
    let s = scrape(port).await;
    assert_eq!(
        value(
            &s,
            "approvals_outcomes_total",
            &[("decided_by", "broker"), ("kind", "superseded")]
        ),
        Some(3.0),
        "{s:#?}"
    );
}

/// A call that falls due is counted once as EXPIRED by the deadline, and logged, whether it fell
/// due while no broker ran (the sweep at start) or while this one runs (the sweeper): the
/// sweeper writes through the broker, so its outcomes take the same after-commit step as a
/// decision's.
async fn a_call_past_its_deadline_is_counted_and_logged_as_expired(mut app: TestApp) {
    let due = |call_id: &str, d: Duration| pb::CallSpec {
        deadline: Some(in_future(d)),
        ..call(call_id, "t", "{}")
    };
    // Falls due while the broker is down: expired by the sweep at start.
    submit_one(&app, "s", due("early", Duration::from_millis(300))).await;
    app.shut_down().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let port = free_port().expect("a free port");
    let metrics_listen = format!("127.0.0.1:{port}");
    let broker = start_broker(
        &app.database_url,
        &["--metrics-listen", &metrics_listen, "--log-format", "json"],
        &[],
    )
    .await;
    // Falls due while it runs: expired by the sweeper.
    AgentServiceClient::new(broker.channel())
        .submit(pb::SubmitRequest {
            batch: Some(batch("s", vec![due("late", Duration::from_millis(500))])),
        })
        .await
        .expect("submit");
    let expired = |s: &BTreeMap<Sample, f64>| {
        value(
            s,
            "approvals_outcomes_total",
            &[("decided_by", "deadline"), ("kind", "expired")],
        )
    };
    eventually(port, "both calls counted as expired", |s| {
        expired(s) == Some(2.0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = scrape(port).await;
    assert_eq!(expired(&s), Some(2.0), "each counted once: {s:#?}");
    assert_eq!(
        samples_of(&s, "approvals_outcomes_total").count(),
        1,
        "nothing else was decided: {s:#?}"
    );
    // Logged once each, as the deadline's (the line is written with the count).
    let deadline = Instant::now() + PATIENCE;
    loop {
        let log = broker.log_text();
        let logged: Vec<(String, String)> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["message"] == "outcome")
            .map(|l| {
                let field = |name: &str| l[name].as_str().unwrap_or_default().to_owned();
                (field("call"), field("decided_by"))
            })
            .collect();
        if logged.len() >= 2 {
            let mut logged = logged;
            logged.sort();
            assert_eq!(
                logged,
                [
                    ("early".to_owned(), "deadline".to_owned()),
                    ("late".to_owned(), "deadline".to_owned())
                ],
                "{log}"
            );
            return;
        }
        assert!(Instant::now() < deadline, "not both outcomes logged: {log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every sample of `name`, with its labels.
fn samples_of<'a>(
    samples: &'a BTreeMap<Sample, f64>,
    name: &'a str,
) -> impl Iterator<Item = (&'a BTreeMap<String, String>, f64)> + 'a {
    samples
        .iter()
        .filter(move |((n, _), _)| n == name)
        .map(|((_, labels), v)| (labels, *v))
}

/// The broker binary on `app`'s database (the in-process broker stopped first), serving its
/// metrics on a free port of its own: the broker and that port.
async fn broker_serving_metrics(app: &mut TestApp) -> (BrokerProcess, u16) {
    app.shut_down().await;
    let port = free_port().expect("a free port");
    let metrics_listen = format!("127.0.0.1:{port}");
    let broker = start_broker(
        &app.database_url,
        &["--metrics-listen", &metrics_listen],
        &[],
    )
    .await;
    (broker, port)
}

const AGENT_TOKEN: &str = "token-of-build-bot-never-logged";
const APPROVER_TOKEN: &str = "token-of-alice-never-logged";

fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

async fn every_rpc_is_counted_by_method_and_code_and_each_refusal_and_outcome_is_logged(
    mut app: TestApp,
) {
    app.shut_down().await;
    let port = free_port().expect("a free port");
    let metrics_listen = format!("127.0.0.1:{port}");
    let tokens = format!(
        "agent build-bot {}\napprover alice {}",
        approval_broker::door::auth::hash_token(AGENT_TOKEN),
        approval_broker::door::auth::hash_token(APPROVER_TOKEN)
    );
    // The default level: what an operator sees without asking for more.
    let broker = start_broker(
        &app.database_url,
        &["--metrics-listen", &metrics_listen, "--log-format", "json"],
        &[("APPROVALS_TOKENS", &tokens)],
    )
    .await;
    let mut agent = AgentServiceClient::new(broker.channel());
    let mut approver = ApproverServiceClient::new(broker.channel());
    let secret = r#"{"password":"hunter2-never-logged"}"#;
    agent
        .submit(bearer(
            pb::SubmitRequest {
                batch: Some(batch("logged", vec![call("call-1", "login", secret)])),
            },
            AGENT_TOKEN,
        ))
        .await
        .expect("submit");
    // Refused: a submit without a batch, a decision on no call, the wrong role, no token.
    let refused = agent
        .submit(bearer(pb::SubmitRequest { batch: None }, AGENT_TOKEN))
        .await
        .expect_err("no batch");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    let refused = approver
        .decide(bearer(
            decide_request("logged", "no-such-call", pb::Decision::Approve, ""),
            APPROVER_TOKEN,
        ))
        .await
        .expect_err("no such call");
    assert_eq!(refused.code(), tonic::Code::NotFound);
    let refused = approver
        .decide(bearer(
            decide_request("logged", "call-1", pb::Decision::Approve, ""),
            AGENT_TOKEN,
        ))
        .await
        .expect_err("an agent may not decide");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let refused = approver
        .decide(decide_request(
            "logged",
            "call-1",
            pb::Decision::Approve,
            "",
        ))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    approver
        .decide(bearer(
            pb::DecideRequest {
                agent: "build-bot".into(),
                ..decide_request(
                    "logged",
                    "call-1",
                    pb::Decision::Deny,
                    "reason-never-logged",
                )
            },
            APPROVER_TOKEN,
        ))
        .await
        .expect("deny");
    // A stream its client abandons ends as cancelled.
    let subscription = approver
        .subscribe(bearer(
            pb::SubscribeRequest {
                filter: None,
                after_seq: None,
            },
            APPROVER_TOKEN,
        ))
        .await
        .expect("subscribe")
        .into_inner();
    drop(subscription);

    const SUBMIT: &str = "/approvals.v1.AgentService/Submit";
    const DECIDE: &str = "/approvals.v1.ApproverService/Decide";
    const SUBSCRIBE: &str = "/approvals.v1.ApproverService/Subscribe";
    let rpcs = |s: &BTreeMap<Sample, f64>, method: &str, code: &str| {
        value(
            s,
            "approvals_rpc_requests_total",
            &[("code", code), ("method", method)],
        )
    };
    eventually(port, "the abandoned stream counted", |s| {
        rpcs(s, SUBSCRIBE, "Canceled") == Some(1.0)
    })
    .await;
    eventually(port, "process and pool metrics sampled", |s| {
        value(s, "process_resident_memory_bytes", &[]).is_some_and(|v| v > 0.0)
            && value(s, "process_open_fds", &[]).is_some_and(|v| v > 0.0)
            && value(s, "approvals_store_pool_connections", &[("state", "open")])
                .is_some_and(|v| v >= 1.0)
    })
    .await;
    let s = scrape(port).await;
    assert_eq!(rpcs(&s, SUBMIT, "OK"), Some(1.0), "{s:#?}");
    assert_eq!(rpcs(&s, SUBMIT, "InvalidArgument"), Some(1.0), "{s:#?}");
    assert_eq!(rpcs(&s, DECIDE, "OK"), Some(1.0), "{s:#?}");
    assert_eq!(rpcs(&s, DECIDE, "NotFound"), Some(1.0), "{s:#?}");
    assert_eq!(rpcs(&s, DECIDE, "PermissionDenied"), Some(1.0), "{s:#?}");
    assert_eq!(rpcs(&s, DECIDE, "Unauthenticated"), Some(1.0), "{s:#?}");
    assert_eq!(
        value(
            &s,
            "approvals_rpc_seconds_count",
            &[("code", "OK"), ("method", SUBMIT)]
        ),
        Some(1.0)
    );
    assert!(
        samples_of(&s, "approvals_rpc_requests_total")
            .all(|(labels, _)| labels["method"] != "unknown"),
        "every RPC here is one the broker serves: {s:#?}"
    );
    let builds: Vec<_> = samples_of(&s, "approvals_build_info").collect();
    assert_eq!(builds.len(), 1, "{s:#?}");
    let (labels, one) = builds[0];
    assert_eq!(one, 1.0);
    assert_eq!(labels["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        labels["git_commit"],
        option_env!("APPROVALS_GIT_COMMIT").unwrap_or("unknown")
    );
    assert!(
        value(&s, "process_cpu_seconds_total", &[]).is_some(),
        "{s:#?}"
    );

    // The log at the default level: one line per refusal and per outcome, with what happened
    // and who asked, never an input, a reason or a token.
    let log = broker.log_text();
    for secret in [
        "hunter2-never-logged",
        "reason-never-logged",
        AGENT_TOKEN,
        APPROVER_TOKEN,
    ] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let refusals: Vec<_> = lines
        .iter()
        .filter(|l| l["message"] == "refused")
        .map(|l| {
            (
                l["level"].as_str().unwrap_or_default().to_owned(),
                l["method"].as_str().unwrap_or_default().to_owned(),
                l["code"].as_str().unwrap_or_default().to_owned(),
                l["caller"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let refusal = |method: &str, code: &str, caller: &str| {
        (
            "INFO".to_owned(),
            method.to_owned(),
            code.to_owned(),
            caller.to_owned(),
        )
    };
    assert_eq!(
        refusals,
        vec![
            refusal(SUBMIT, "InvalidArgument", "build-bot"),
            refusal(DECIDE, "NotFound", "alice"),
            refusal(DECIDE, "PermissionDenied", "build-bot"),
            refusal(DECIDE, "Unauthenticated", "unauthenticated"),
        ],
        "{log}"
    );
    let outcomes: Vec<_> = lines.iter().filter(|l| l["message"] == "outcome").collect();
    assert_eq!(outcomes.len(), 1, "{log}");
    let outcome = outcomes[0];
    assert_eq!(outcome["level"], "INFO", "{log}");
    assert_eq!(outcome["call"], "call-1", "{log}");
    assert_eq!(outcome["session"], "logged", "{log}");
    assert_eq!(outcome["agent"], "build-bot", "{log}");
    assert_eq!(outcome["outcome"], "denied", "{log}");
    assert_eq!(outcome["decided_by"], "approver:alice", "{log}");
}

/// A write into a deleted SQLite file fails in the storage itself: counted as `unavailable`.
/// (SQLite only: deleting its files is how a test breaks storage at will.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_errors_are_counted_by_fault_and_client_mistakes_are_not() {
    let mut app = spawn_app().await;
    let (broker, port) = broker_serving_metrics(&mut app).await;
    let mut approver = ApproverServiceClient::new(broker.channel());
    approver
        .decide(decide_request(
            "s",
            "no-such-call",
            pb::Decision::Approve,
            "",
        ))
        .await
        .expect_err("no such call");
    let s = scrape(port).await;
    assert!(
        samples_of(&s, "approvals_store_errors_total")
            .next()
            .is_none(),
        "a decision on no call is the client's mistake: {s:#?}"
    );

    let path = app.dir.path().join("approvals.db");
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        std::fs::remove_file(&file).expect("delete");
    }
    let refused = AgentServiceClient::new(broker.channel())
        .submit(pb::SubmitRequest {
            batch: Some(batch("s", vec![call("after", "t", "{}")])),
        })
        .await
        .expect_err("a write into a deleted database");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    eventually(port, "the failed write counted", |s| {
        value(
            s,
            "approvals_store_errors_total",
            &[("fault", "unavailable")],
        )
        .is_some_and(|n| n >= 1.0)
    })
    .await;
}

/// A storage error on a receipt read (a read the store's traits provide, that storage health's
/// decorator does not re-declare) is counted like any other. (SQLite only: a table dropped
/// under the broker is how a test breaks one read at will.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_error_reading_receipts_is_counted() {
    let mut app = spawn_app().await;
    let (broker, port) = broker_serving_metrics(&mut app).await;
    AgentServiceClient::new(broker.channel())
        .submit(pb::SubmitRequest {
            batch: Some(batch("s", vec![call("c", "t", "{}")])),
        })
        .await
        .expect("submit");
    ApproverServiceClient::new(broker.channel())
        .decide(decide_request("s", "c", pb::Decision::Approve, ""))
        .await
        .expect("approve");
    let database = app.dir.path().join("approvals.db");
    let dropped = tokio::task::spawn_blocking(move || {
        let conn = rusqlite::Connection::open(&database).expect("open");
        conn.busy_timeout(Duration::from_secs(10))
            .expect("busy timeout");
        conn.execute_batch("PRAGMA foreign_keys = OFF; DROP TABLE receipts;")
    })
    .await
    .expect("the drop");
    dropped.expect("drop the receipts table");
    let failed = ApproverServiceClient::new(broker.channel())
        .get_receipt(pb::GetReceiptRequest {
            session_id: "s".into(),
            call_id: "c".into(),
            agent: String::new(),
        })
        .await
        .expect_err("no receipts table to read");
    assert_ne!(failed.code(), tonic::Code::NotFound, "{failed:?}");
    eventually(port, "the failed receipt read counted", |s| {
        samples_of(s, "approvals_store_errors_total").any(|(_, n)| n >= 1.0)
    })
    .await;
}

/// The log says who decided exactly as the API does: `policy:<rule>` for a rule (it once said
/// `rule:<rule>`), `approver:<who>` for a person.
async fn the_log_names_who_decided_as_the_api_does(mut app: TestApp) {
    app.shut_down().await;
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"rules": [{"id": "reads", "tool": "read_file", "effect": "allow"}]}"#,
    )
    .expect("write the policy");
    let policy = policy.display().to_string();
    let broker = start_broker(
        &app.database_url,
        &["--log-format", "json", "--policy-file", &policy],
        &[],
    )
    .await;
    let reply = AgentServiceClient::new(broker.channel())
        .submit(pb::SubmitRequest {
            batch: Some(batch("s", vec![call("r1", "read_file", "{}")])),
        })
        .await
        .expect("submit")
        .into_inner();
    let said_by_api = reply.outcomes[0].decided_by.clone();
    assert_eq!(said_by_api, "policy:reads");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let log = broker.log_text();
        let logged: Vec<String> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["message"] == "outcome" && l["call"] == "r1")
            .map(|l| l["decided_by"].as_str().unwrap_or_default().to_owned())
            .collect();
        if !logged.is_empty() {
            assert_eq!(logged, [said_by_api], "{log}");
            return;
        }
        assert!(Instant::now() < deadline, "no outcome logged for r1: {log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

backend_tests! {
    the_log_names_who_decided_as_the_api_does,
    metrics_count_one_approval_cycle_and_logs_name_its_ids,
    each_superseded_call_is_counted_once,
    a_call_past_its_deadline_is_counted_and_logged_as_expired,
    every_rpc_is_counted_by_method_and_code_and_each_refusal_and_outcome_is_logged,
}
