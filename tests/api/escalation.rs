//! Reminders and escalation: a call nobody answers climbs its ladder (the ask rule's, or the
//! default `--escalation-file`): each step is an event in the log that subscribers see, that
//! GetCall's audit counts, and that webhooks deliver only to the endpoints the step names (and
//! to endpoints whose filter asks for its kind); then the deadline makes it EXPIRED, not DENIED.
//! A decided call fires no more steps; a step that came due while the broker was down fires on
//! start, once; two Postgres replicas fire each step once.

use std::time::Duration;

use approval_broker::proto::v1 as pb;
use pb::approver_event::Event as E;
use tonic::Code;

use crate::helpers::{
    self, PATIENCE, Subscription, TestApp, backend_tests, batch, call, create_rule, deny, get_call,
    in_future, start_broker, submit,
};
use crate::webhooks::Receiver;

// --- helpers -----------------------------------------------------------------------------------

fn after(d: Duration) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

fn step(d: Duration, kind: pb::EscalationStepKind, endpoints: &[&str]) -> pb::EscalationStep {
    pb::EscalationStep {
        after: after(d),
        kind: kind as i32,
        endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
    }
}

/// An ask rule for `tool` with `ladder`.
fn ask_with(id: &str, tool: &str, ladder: Vec<pb::EscalationStep>) -> pb::Rule {
    pb::Rule {
        escalation: ladder,
        ..helpers::rule(id, tool, pb::Effect::Ask, 0, None)
    }
}

/// A webhook endpoint `id` at `url`, receiving `kinds` (empty: every kind).
async fn endpoint(app: &TestApp, id: &str, url: &str, kinds: &[pb::WebhookEventKind]) {
    app.admin()
        .create_webhook(pb::CreateWebhookRequest {
            id: id.into(),
            url: url.into(),
            filter: Some(pb::WebhookFilter {
                event_kinds: kinds.iter().map(|k| *k as i32).collect(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("CreateWebhook");
}

/// A default ladder file: `steps` as `--escalation-file` reads it.
fn ladder_file(dir: &std::path::Path, steps: &str) -> std::path::PathBuf {
    let path = dir.join(format!("escalation-{}.json", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, format!(r#"{{"steps": {steps}}}"#)).expect("write the ladder");
    path
}

/// Every event in the log after `after_seq` (no snapshot), read until `done` holds.
async fn log_until(
    app_channel: tonic::transport::Channel,
    what: &str,
    done: impl Fn(&[pb::ApproverEvent]) -> bool,
) -> Vec<pb::ApproverEvent> {
    let mut stream = pb::approver_service_client::ApproverServiceClient::new(app_channel)
        .subscribe(pb::SubscribeRequest {
            filter: Some(pb::CallFilter::default()),
            after_seq: Some(0),
        })
        .await
        .expect("subscribe")
        .into_inner();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done(&events) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, stream.message()).await {
            Ok(Ok(Some(event))) => events.push(event),
            _ => panic!("the log did not show {what}; it showed {events:#?}"),
        }
    }
    events
}

/// The whole log as it stands: every event from the start, read until none comes for a while.
/// The first may take a store read (seconds on a loaded machine); then half a second of quiet.
async fn whole_log(channel: tonic::transport::Channel) -> Vec<pb::ApproverEvent> {
    let mut stream = pb::approver_service_client::ApproverServiceClient::new(channel)
        .subscribe(pb::SubscribeRequest {
            filter: Some(pb::CallFilter::default()),
            after_seq: Some(0),
        })
        .await
        .expect("subscribe")
        .into_inner();
    let mut events = Vec::new();
    let mut patience = Duration::from_secs(5);
    while let Ok(message) = tokio::time::timeout(patience, stream.message()).await {
        events.push(message.expect("stream healthy").expect("stream open"));
        patience = Duration::from_millis(500);
    }
    events
}

/// The fired steps among `events`: (call id, step, kind).
fn fired(events: &[pb::ApproverEvent]) -> Vec<(String, u32, pb::EscalationStepKind)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(E::Escalation(f)) => Some((
                f.call.as_ref().expect("the call").call_id.clone(),
                f.step,
                f.kind(),
            )),
            _ => None,
        })
        .collect()
}

/// The CloudEvents types an endpoint received, in order of arrival.
fn types(receiver: &Receiver) -> Vec<String> {
    receiver
        .received()
        .iter()
        .map(|r| r.json()["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

// --- the tests ---------------------------------------------------------------------------------

backend_tests!(
    a_pending_call_is_reminded_then_escalated_then_expired_each_step_an_event_for_its_endpoints => crate::webhooks::allow_loopback,
    a_decided_call_fires_no_more_steps,
    a_ladder_is_refused_where_it_cannot_work_naming_the_field,
    a_step_due_while_the_broker_was_down_fires_once_after_a_crash,
);

async fn a_pending_call_is_reminded_then_escalated_then_expired_each_step_an_event_for_its_endpoints(
    app: TestApp,
) {
    let (team, oncall, audit) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    endpoint(&app, "team", &team.url(), &[]).await;
    endpoint(&app, "oncall", &oncall.url(), &[]).await;
    // Names no step, but its filter asks for both step kinds (and nothing else).
    use pb::WebhookEventKind as K;
    endpoint(&app, "audit", &audit.url(), &[K::Reminded, K::Escalated]).await;
    use pb::EscalationStepKind as S;
    let rule = create_rule(
        &app,
        ask_with(
            "ask-shell",
            "shell",
            vec![
                step(Duration::from_millis(300), S::Reminder, &["team"]),
                step(Duration::from_millis(900), S::Escalation, &["oncall"]),
            ],
        ),
    )
    .await;
    assert_eq!(rule.escalation.len(), 2, "the rule keeps its ladder");

    let mut live = Subscription::open(&app, pb::CallFilter::default(), None).await;
    live.snapshot().await;
    submit(
        &app,
        batch(
            "s",
            vec![pb::CallSpec {
                deadline: Some(in_future(Duration::from_secs(4))),
                ..call("c1", "shell", r#"{"command":"make deploy"}"#)
            }],
        ),
    )
    .await;

    // The subscriber sees: requested, the reminder, the escalation, then EXPIRED.
    let mut seen = Vec::new();
    loop {
        let event = live.next().await;
        let done = matches!(event.event, Some(E::Resolved(_)));
        seen.push(event);
        if done {
            break;
        }
    }
    assert!(matches!(seen[0].event, Some(E::Requested(_))), "{seen:#?}");
    assert_eq!(
        fired(&seen),
        vec![
            ("c1".to_owned(), 0, S::Reminder),
            ("c1".to_owned(), 1, S::Escalation)
        ]
    );
    let Some(E::Resolved(outcome)) = &seen.last().unwrap().event else {
        unreachable!()
    };
    assert_eq!(
        outcome.status(),
        pb::CallStatus::Expired,
        "EXPIRED, never DENIED"
    );
    assert_eq!(outcome.decided_by, "deadline");
    assert_eq!(seen.len(), 4, "{seen:#?}");
    // Strictly increasing sequence numbers: each step is its own event in the log.
    assert!(seen.windows(2).all(|w| w[0].seq < w[1].seq));

    // The audit of the call: its ladder, both steps fired, none left.
    let audited = get_call(&app, "s", "c1").await;
    let escalation = audited.escalation.clone().expect("the call's escalation");
    assert_eq!(escalation.steps.len(), 2);
    assert_eq!(escalation.fired, 2);
    assert_eq!(escalation.next_step_at, None);
    assert_eq!(audited.status(), pb::CallStatus::Expired);

    // Each endpoint got the requested and resolved events (filters of every kind) and only the
    // step that names it; `audit` got both steps and nothing else.
    let requested = "approvals.v1.call.requested";
    let resolved = "approvals.v1.call.resolved";
    let reminded = "approvals.v1.call.reminded";
    let escalated = "approvals.v1.call.escalated";
    team.wait_for(PATIENCE, "3 events", |got| got.len() >= 3)
        .await;
    oncall
        .wait_for(PATIENCE, "3 events", |got| got.len() >= 3)
        .await;
    audit
        .wait_for(PATIENCE, "2 events", |got| got.len() >= 2)
        .await;
    assert_eq!(types(&team), [requested, reminded, resolved]);
    assert_eq!(types(&oncall), [requested, escalated, resolved]);
    assert_eq!(types(&audit), [reminded, escalated]);
    let body = oncall.received()[1].json();
    assert_eq!(body["data"]["status"], "PENDING");
    assert_eq!(body["data"]["escalation"]["step"], 1);
    assert_eq!(body["data"]["escalation"]["kind"], "escalation");
    assert_eq!(body["data"]["escalation"]["endpoints"][0], "oncall");
}

async fn a_decided_call_fires_no_more_steps(app: TestApp) {
    use pb::EscalationStepKind as S;
    let ladder = vec![
        step(Duration::from_millis(300), S::Reminder, &[]),
        step(Duration::from_secs(3), S::Escalation, &[]),
    ];
    create_rule(&app, ask_with("ask-edit", "edit", ladder)).await;
    submit(&app, batch("s", vec![call("c1", "edit", "{}")])).await;
    log_until(app.channel.clone(), "the reminder", |events| {
        !fired(events).is_empty()
    })
    .await;
    deny(&app, "s", "c1", "not now").await;
    // Past the escalation's due time: nothing more fires for the decided call.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let events = whole_log(app.channel.clone()).await;
    assert_eq!(fired(&events), vec![("c1".to_owned(), 0, S::Reminder)]);
    assert!(matches!(events.last().unwrap().event, Some(E::Resolved(_))));
    let audited = get_call(&app, "s", "c1").await;
    assert_eq!(audited.status(), pb::CallStatus::Denied);
    assert_eq!(audited.escalation.expect("a ladder").fired, 1);
}

async fn a_ladder_is_refused_where_it_cannot_work_naming_the_field(app: TestApp) {
    use pb::EscalationStepKind as S;
    let refused = |rule: pb::Rule| {
        let app = &app;
        async move {
            app.admin()
                .create_rule(pb::CreateRuleRequest { rule: Some(rule) })
                .await
                .expect_err("refused")
        }
    };
    let ladder = vec![step(Duration::from_secs(60), S::Reminder, &["team"])];
    let status = refused(pb::Rule {
        escalation: ladder.clone(),
        ..helpers::rule("allow-with-ladder", "shell", pb::Effect::Allow, 0, None)
    })
    .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("rule.escalation") && status.message().contains("ask rule"),
        "{}",
        status.message()
    );
    let status = refused(ask_with(
        "out-of-order",
        "shell",
        vec![
            step(Duration::from_secs(60), S::Reminder, &[]),
            step(Duration::from_secs(30), S::Escalation, &[]),
        ],
    ))
    .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("rule.escalation[1].after"),
        "{}",
        status.message()
    );
    let status = refused(ask_with(
        "bad-endpoint",
        "shell",
        vec![step(Duration::from_secs(60), S::Reminder, &["not an id"])],
    ))
    .await;
    assert!(
        status.message().contains("rule.escalation[0].endpoints[0]"),
        "{}",
        status.message()
    );
    let status = refused(ask_with(
        "no-after",
        "shell",
        vec![pb::EscalationStep {
            after: None,
            ..step(Duration::ZERO, S::Reminder, &[])
        }],
    ))
    .await;
    assert!(
        status.message().contains("rule.escalation[0].after"),
        "{}",
        status.message()
    );
    // A good one is listed with its ladder as given.
    create_rule(&app, ask_with("good", "shell", ladder.clone())).await;
    let listed = app
        .admin()
        .list_rules(pb::ListRulesRequest::default())
        .await
        .expect("ListRules")
        .into_inner()
        .rules;
    let good = listed.iter().find(|r| r.id == "good").expect("listed");
    assert_eq!(good.escalation, ladder);
}

async fn a_step_due_while_the_broker_was_down_fires_once_after_a_crash(app: TestApp) {
    use pb::EscalationStepKind as S;
    create_rule(
        &app,
        ask_with(
            "ask-shell",
            "shell",
            vec![step(Duration::from_millis(500), S::Reminder, &[])],
        ),
    )
    .await;
    submit(&app, batch("s", vec![call("c1", "shell", "{}")])).await;
    let mut app = app;
    app.shut_down().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The restarted broker has no ladder configured: the step is stored with the call.
    let app = app.start_again().await;
    let events = log_until(app.channel.clone(), "the reminder", |events| {
        !fired(events).is_empty()
    })
    .await;
    assert_eq!(fired(&events), vec![("c1".to_owned(), 0, S::Reminder)]);
    // Killed (its task aborted) and started again: the fired step stays fired.
    let app = app.crash_and_restart().await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let all = whole_log(app.channel.clone()).await;
    assert_eq!(fired(&all), vec![("c1".to_owned(), 0, S::Reminder)]);
    assert_eq!(get_call(&app, "s", "c1").await.escalation.unwrap().fired, 1);
}

/// The real binary, SIGKILLed with a call pending, kept down past the call's step, started
/// again: the step fires once on start (on SQLite, and on Postgres when it is configured).
async fn a_killed_broker_fires_a_step_that_came_due_while_it_was_down_once(database: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = ladder_file(dir.path(), r#"[{"after": "1s", "kind": "escalation"}]"#);
    let args = ["--escalation-file", file.to_str().unwrap()];
    let mut broker = start_broker(database, &args, &[]).await;
    let mut agent = pb::agent_service_client::AgentServiceClient::new(broker.channel());
    agent
        .submit(pb::SubmitRequest {
            batch: Some(batch("kill", vec![call("c1", "shell", "{}")])),
        })
        .await
        .expect("submit");
    broker.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    broker.restart().await.expect("the broker starts again");
    let events = log_until(broker.channel(), "the escalation", |events| {
        !fired(events).is_empty()
    })
    .await;
    assert_eq!(
        events.len(),
        2,
        "requested, then the escalation: {events:#?}"
    );
    // Leave every chance for a second firing to show.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        fired(&whole_log(broker.channel()).await),
        vec![("c1".to_owned(), 0, pb::EscalationStepKind::Escalation)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sqlite_broker_fires_a_step_that_came_due_while_it_was_down_once() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("approvals.db").display());
    a_killed_broker_fires_a_step_that_came_due_while_it_was_down_once(&database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_killed_postgres_broker_fires_a_step_that_came_due_while_it_was_down_once() {
    let schema = helpers::fresh_schema(&helpers::postgres_url()).await;
    a_killed_broker_fires_a_step_that_came_due_while_it_was_down_once(&schema.url()).await;
}

/// Two replicas on one Postgres database, both sweeping: each call's step fires once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn two_postgres_replicas_fire_each_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = ladder_file(dir.path(), r#"[{"after": "500ms"}, {"after": "1s"}]"#);
    let configure =
        |c: &mut approval_broker::config::Config| c.escalation.escalation_file = Some(file.clone());
    let first = helpers::spawn_app_on(helpers::Backend::postgres(), configure).await;
    let second = first.replica(configure).await;
    for i in 0..10 {
        let app = if i % 2 == 0 { &first } else { &second };
        submit(app, batch("r", vec![call(&format!("c{i}"), "shell", "{}")])).await;
    }
    let events = log_until(first.channel.clone(), "20 fired steps", |events| {
        fired(events).len() >= 20
    })
    .await;
    assert_eq!(fired(&events).len(), 20);
    // Both keep sweeping; give a second firing every chance to show.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let all = whole_log(second.channel.clone()).await;
    let mut steps = fired(&all);
    steps.sort();
    let mut expected: Vec<(String, u32, pb::EscalationStepKind)> = (0..10)
        .flat_map(|i| [0, 1].map(|s| (format!("c{i}"), s, pb::EscalationStepKind::Reminder)))
        .collect();
    expected.sort();
    assert_eq!(steps, expected, "each step of each call exactly once");
}
