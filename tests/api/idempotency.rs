//! Idempotent by (session_id, call_id): a resubmitted call is the stored call, never a second
//! row or event; the same id with a different tool or input is refused for that call alone.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

/// Every event in the log, read through a subscription from the start.
async fn event_log(app: &TestApp) -> Vec<pb::ApproverEvent> {
    let latest = {
        let mut sub = Subscription::open(app, pb::CallFilter::default(), None).await;
        sub.snapshot().await.1
    };
    let mut sub = Subscription::open(app, pb::CallFilter::default(), Some(0)).await;
    let mut events = Vec::new();
    while events
        .last()
        .is_none_or(|e: &pb::ApproverEvent| e.seq < latest)
    {
        events.push(sub.next().await);
    }
    events
}

async fn resubmitting_a_call_is_a_duplicate_with_no_new_row_and_no_new_event(app: TestApp) {
    let first = submit(
        &app,
        batch(
            "s",
            vec![call("c1", "read_file", r#"{"path": "a.txt", "limit": 10}"#)],
        ),
    )
    .await;
    let Some(pb::call_ack::Result::Accepted(accepted)) = &first.acks[0].result else {
        panic!("first submit accepted: {first:?}");
    };
    // Same input, other key order and white space.
    let again = submit(
        &app,
        batch(
            "s",
            vec![call(
                "c1",
                "read_file",
                "{\"limit\":10,\n \"path\":\"a.txt\"}",
            )],
        ),
    )
    .await;
    let Some(pb::call_ack::Result::Duplicate(duplicate)) = &again.acks[0].result else {
        panic!("resubmit is a duplicate: {again:?}");
    };
    assert_eq!(duplicate.batch_id, accepted.batch_id);
    assert_eq!(again.batch_id, "", "no new batch was stored");
    assert_eq!(all_calls(&app).await.len(), 1);
    let events = event_log(&app).await;
    assert_eq!(events.len(), 1, "one requested event only: {events:?}");
}

async fn a_resubmitted_decided_call_returns_its_outcome_at_once(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", r#"{"a":1}"#)])).await;
    deny(&app, "s", "c1", "not now").await;
    let again = submit(&app, batch("s", vec![call("c1", "t", r#"{"a":1}"#)])).await;
    let Some(pb::call_ack::Result::Duplicate(dup)) = &again.acks[0].result else {
        panic!("duplicate: {again:?}");
    };
    assert_eq!(dup.status, CallStatus::Denied as i32);
    assert_eq!(again.outcomes.len(), 1);
    assert_eq!(status_of(&again.outcomes[0]), CallStatus::Denied);
    assert_eq!(
        again.outcomes[0].tool_result,
        "The user denied this tool call. Reason: not now"
    );
}

async fn the_same_call_id_with_another_tool_or_input_is_refused_for_that_call_alone(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", r#"{"a":1}"#)])).await;
    let response = submit(
        &app,
        batch(
            "s",
            vec![
                call("c1", "t", r#"{"a":2}"#),
                call("c2", "t", "{}"),
                call("c1x", "t", "{}"),
            ],
        ),
    )
    .await;
    let Some(pb::call_ack::Result::Error(err)) = &response.acks[0].result else {
        panic!("conflict refused: {response:?}");
    };
    assert_eq!(err.code, Code::AlreadyExists as i32);
    assert!(err.message.contains("c1"), "{}", err.message);
    assert!(matches!(
        response.acks[1].result,
        Some(pb::call_ack::Result::Accepted(_))
    ));
    let other_tool = submit(&app, batch("s", vec![call("c1", "other", r#"{"a":1}"#)])).await;
    assert!(matches!(
        &other_tool.acks[0].result,
        Some(pb::call_ack::Result::Error(e)) if e.code == Code::AlreadyExists as i32
    ));
    // The stored call is untouched.
    let calls = all_calls(&app).await;
    let c1 = calls.iter().find(|c| c.call_id == "c1").expect("c1");
    assert_eq!(c1.input_json, r#"{"a":1}"#);
    assert_eq!(c1.tool, "t");
}

async fn the_same_call_id_in_two_sessions_is_two_calls(app: TestApp) {
    submit(&app, batch("s1", vec![call("c1", "t", "{}")])).await;
    let other = submit(&app, batch("s2", vec![call("c1", "t", "{}")])).await;
    assert!(matches!(
        other.acks[0].result,
        Some(pb::call_ack::Result::Accepted(_))
    ));
    assert_eq!(all_calls(&app).await.len(), 2);
}

async fn a_lookup_naming_a_call_twice_answers_both(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    deny(&app, "s", "c1", "").await;
    let answers = states(&app, "s", &["c1", "c1", "nope"]).await;
    assert!(matches!(
        answers[0].state,
        Some(pb::call_state::State::Outcome(_))
    ));
    assert_eq!(answers[0].state, answers[1].state);
    assert!(matches!(
        answers[2].state,
        Some(pb::call_state::State::Unknown(_))
    ));
}

/// Identical submits at once: on SQLite they may share a group commit (one transaction), on
/// Postgres their transactions queue on the session's lock; either way one stores the call and
/// the rest are duplicates.
async fn identical_submits_at_once_store_one_call_and_one_event(app: TestApp) {
    const SUBMITS: usize = 32;
    let mut submits = tokio::task::JoinSet::new();
    for _ in 0..SUBMITS {
        let mut agent = app.agent();
        submits.spawn(async move {
            let request = pb::SubmitRequest {
                batch: Some(batch("s", vec![call("c1", "t", r#"{"a":1}"#)])),
            };
            agent.submit(request).await.expect("submit").into_inner()
        });
    }
    let (mut accepted, mut duplicates) = (0, 0);
    while let Some(response) = submits.join_next().await {
        match response.expect("submit task").acks[0].result {
            Some(pb::call_ack::Result::Accepted(_)) => accepted += 1,
            Some(pb::call_ack::Result::Duplicate(_)) => duplicates += 1,
            ref other => panic!("accepted or duplicate: {other:?}"),
        }
    }
    assert_eq!((accepted, duplicates), (1, SUBMITS - 1));
    assert_eq!(all_calls(&app).await.len(), 1);
    let events = event_log(&app).await;
    assert_eq!(events.len(), 1, "one requested event only: {events:?}");
}

backend_tests! {
    identical_submits_at_once_store_one_call_and_one_event,
    a_lookup_naming_a_call_twice_answers_both,
    resubmitting_a_call_is_a_duplicate_with_no_new_row_and_no_new_event,
    a_resubmitted_decided_call_returns_its_outcome_at_once,
    the_same_call_id_with_another_tool_or_input_is_refused_for_that_call_alone,
    the_same_call_id_in_two_sessions_is_two_calls,
}
