//! Deadlines: a due call becomes EXPIRED (its own outcome, never a denial) within a second of its
//! deadline, also when the deadline passed while the broker was down.

use std::time::Duration;

use approval_broker::proto::v1 as pb;

use crate::helpers::*;

fn micros(t: &prost_types::Timestamp) -> i64 {
    t.seconds * 1_000_000 + i64::from(t.nanos / 1000)
}

fn with_deadline(call_id: &str, d: Duration) -> pb::CallSpec {
    pb::CallSpec {
        deadline: Some(in_future(d)),
        ..call(call_id, "t", "{}")
    }
}

/// Waits on WatchOutcomes for the call's outcome.
async fn wait_for_outcome(app: &TestApp, session: &str, call_id: &str) -> pb::Outcome {
    let mut watch = app
        .agent()
        .watch_outcomes(pb::WatchOutcomesRequest {
            session_id: session.into(),
            call_ids: vec![call_id.into()],
        })
        .await
        .expect("watch")
        .into_inner();
    loop {
        let message = tokio::time::timeout(PATIENCE, watch.message())
            .await
            .expect("in time")
            .expect("healthy")
            .expect("an outcome before the stream ends");
        if let Some(pb::watch_outcomes_response::Event::Outcome(o)) = message.event {
            return o;
        }
    }
}

async fn a_call_expires_within_a_second_of_its_deadline(app: TestApp) {
    submit(
        &app,
        batch(
            "s",
            vec![
                with_deadline("c1", Duration::from_millis(600)),
                call("c2", "t", "{}"),
            ],
        ),
    )
    .await;
    let outcome = wait_for_outcome(&app, "s", "c1").await;
    assert_eq!(status_of(&outcome), CallStatus::Expired);
    assert_eq!(outcome.decided_by, "deadline");
    assert_eq!(
        outcome.tool_result,
        "No approver answered before the deadline; the tool was not run."
    );
    let call = &all_calls(&app).await[0];
    let late =
        micros(outcome.decided_at.as_ref().unwrap()) - micros(call.deadline.as_ref().unwrap());
    assert!(
        (0..=1_000_000).contains(&late),
        "expired {late} µs after the deadline"
    );
    // Expiry is not a denial: the sibling is not skipped.
    assert!(matches!(
        states(&app, "s", &["c2"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

async fn a_decision_before_the_deadline_stands_and_the_call_never_expires(app: TestApp) {
    submit(
        &app,
        batch("s", vec![with_deadline("c1", Duration::from_secs(2))]),
    )
    .await;
    approve(&app, "s", "c1").await;
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert_eq!(
        status_of(&outcome_of(&app, "s", "c1").await),
        CallStatus::Approved
    );
}

async fn the_configured_default_deadline_applies_to_calls_without_one(app: TestApp) {
    let now = || {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock");
        since.as_micros() as i64
    };
    let before = now();
    submit(
        &app,
        batch(
            "s",
            vec![
                call("c1", "t", "{}"),
                with_deadline("c2", Duration::from_secs(3600)),
            ],
        ),
    )
    .await;
    let after = now();
    let calls = all_calls(&app).await;
    let deadline = micros(calls[0].deadline.as_ref().expect("default deadline set"));
    // The default (400 ms) counts from the submit, however long its commit took.
    assert!(
        (before + 400_000..=after + 400_000).contains(&deadline),
        "deadline {deadline} not 400 ms after the submit ({before}..{after})"
    );
    assert_eq!(
        status_of(&wait_for_outcome(&app, "s", "c1").await),
        CallStatus::Expired
    );
    assert!(
        matches!(
            states(&app, "s", &["c2"]).await[0].state,
            Some(pb::call_state::State::Pending(_))
        ),
        "an explicit deadline wins over the default"
    );
}

async fn calls_that_fell_due_while_the_broker_was_down_expire_at_start(mut app: TestApp) {
    submit(
        &app,
        batch("s", vec![with_deadline("c1", Duration::from_secs(2))]),
    )
    .await;
    app.shut_down().await;
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let app = app.start_again().await;
    // The sweep at start ran before the broker served this request.
    let outcome = outcome_of(&app, "s", "c1").await;
    assert_eq!(status_of(&outcome), CallStatus::Expired);
    assert_eq!(outcome.decided_by, "deadline");
}

async fn a_decision_after_the_deadline_loses_to_it(app: TestApp) {
    submit(
        &app,
        batch("s", vec![with_deadline("c1", Duration::from_secs(1))]),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Whether or not the sweeper got there first, the deadline wins.
    let late = app
        .approver()
        .decide(decide_request("s", "c1", pb::Decision::Approve, ""))
        .await;
    assert_status(late, tonic::Code::FailedPrecondition, "EXPIRED");
    assert_eq!(
        status_of(&wait_for_outcome(&app, "s", "c1").await),
        CallStatus::Expired
    );
}

fn ack_error(response: &pb::SubmitResponse, index: usize) -> &pb::ItemError {
    match &response.acks[index].result {
        Some(pb::call_ack::Result::Error(e)) => e,
        other => panic!("call {index} was not refused: {other:?}"),
    }
}

async fn retrying_a_submit_after_its_deadline_returns_the_stored_calls_and_their_outcomes(
    app: TestApp,
) {
    let spec = pb::BatchSpec {
        on_deny: pb::OnDeny::Independent as i32,
        ..batch(
            "s",
            vec![
                with_deadline("c1", Duration::from_secs(1)),
                with_deadline("c2", Duration::from_secs(1)),
            ],
        )
    };
    // A second is room for the submit and the approval on a loaded machine.
    submit(&app, spec.clone()).await;
    approve(&app, "s", "c2").await;
    tokio::time::sleep(Duration::from_millis(1050)).await;
    // Past the deadline, whether or not the sweeper has expired `c1` yet: the stored calls.
    let early = submit(&app, spec.clone()).await;
    for ack in &early.acks {
        assert!(
            matches!(ack.result, Some(pb::call_ack::Result::Duplicate(_))),
            "{ack:?}"
        );
    }
    assert!(matches!(
        ack_status(&early, 0),
        CallStatus::Pending | CallStatus::Expired
    ));
    assert_eq!(ack_status(&early, 1), CallStatus::Approved);

    let expired = wait_for_outcome(&app, "s", "c1").await;
    assert_eq!(status_of(&expired), CallStatus::Expired);
    let retry = submit(&app, spec).await;
    assert_eq!(ack_status(&retry, 0), CallStatus::Expired);
    assert_eq!(ack_status(&retry, 1), CallStatus::Approved);
    let outcomes: Vec<_> = retry.outcomes.iter().map(|o| o.call_id.as_str()).collect();
    assert_eq!(outcomes, ["c1", "c2"]);
    assert_eq!(retry.outcomes[0], expired);
    assert_eq!(all_calls(&app).await.len(), 2, "no second row");
}

async fn a_past_deadline_refuses_new_calls_only(app: TestApp) {
    let late = pb::CallSpec {
        deadline: Some(prost_types::Timestamp {
            seconds: 1,
            nanos: 0,
        }),
        ..call("new", "t", "{}")
    };
    submit(
        &app,
        batch("s", vec![with_deadline("c1", Duration::from_secs(3600))]),
    )
    .await;
    // A retry of `c1` with a deadline now past, another input under `c1`, and a new call whose
    // deadline has passed: the stored call, ALREADY_EXISTS, and INVALID_ARGUMENT.
    let stale = |input: &str| pb::CallSpec {
        deadline: late.deadline,
        ..call("c1", "t", input)
    };
    let response = submit(&app, batch("s", vec![stale("{}"), late.clone()])).await;
    assert_eq!(ack_status(&response, 0), CallStatus::Pending);
    let refused = ack_error(&response, 1);
    assert_eq!(refused.code, tonic::Code::InvalidArgument as i32);
    assert!(
        refused
            .message
            .contains("batch.calls[1].deadline: is in the past"),
        "{}",
        refused.message
    );
    let other = submit(&app, batch("s", vec![stale(r#"{"v":2}"#)])).await;
    assert_eq!(ack_error(&other, 0).code, tonic::Code::AlreadyExists as i32);
    // On the agent's stream, the field is named by its path there.
    let mut agent = AgentStream::open(&app).await;
    agent
        .submit("r1", batch("s", vec![stale("{}"), late]))
        .await;
    let acks = agent.next_submitted().await;
    assert_eq!(ack_status(&acks, 0), CallStatus::Pending);
    assert!(
        ack_error(&acks, 1)
            .message
            .contains("submit.calls[1].deadline"),
        "{:?}",
        acks.acks[1]
    );
    assert_eq!(all_calls(&app).await.len(), 1, "nothing new was stored");
}

backend_tests! {
    a_decision_after_the_deadline_loses_to_it,
    a_call_expires_within_a_second_of_its_deadline,
    a_decision_before_the_deadline_stands_and_the_call_never_expires,
    the_configured_default_deadline_applies_to_calls_without_one => |c| c.policy.default_deadline = Some(std::time::Duration::from_millis(400)),
    calls_that_fell_due_while_the_broker_was_down_expire_at_start,
    retrying_a_submit_after_its_deadline_returns_the_stored_calls_and_their_outcomes,
    a_past_deadline_refuses_new_calls_only,
}
