//! Batches: every call of a batch gets an outcome, delivered as it happens, then batch-complete
//! in the batch's order; by default a denial skips the still-pending siblings.

use approval_broker::proto::v1 as pb;

use crate::helpers::*;

fn statuses(outcomes: &[pb::Outcome]) -> Vec<CallStatus> {
    outcomes.iter().map(status_of).collect()
}

async fn a_denial_skips_the_still_pending_rest_of_the_batch_by_default(app: TestApp) {
    let mut agent = AgentStream::open(&app).await;
    let calls = (1..=4)
        .map(|i| call(&format!("c{i}"), "write", "{}"))
        .collect();
    agent.submit("r1", batch("s", calls)).await;
    agent.next_submitted().await;

    approve(&app, "s", "c1").await;
    assert_eq!(status_of(&agent.next_outcome().await), CallStatus::Approved);
    let denied = deny(&app, "s", "c3", "no").await;
    let skipped: Vec<_> = denied.skipped.iter().map(|o| o.call_id.as_str()).collect();
    assert_eq!(skipped, ["c2", "c4"]);
    for o in &denied.skipped {
        assert_eq!(status_of(o), CallStatus::Skipped);
        assert_eq!(o.decided_by, "broker");
        assert_eq!(
            o.tool_result,
            "Not run: another tool call in the same batch was denied."
        );
    }

    let mut delivered = Vec::new();
    for _ in 0..3 {
        let o = agent.next_outcome().await;
        delivered.push((o.call_id.clone(), status_of(&o)));
    }
    assert_eq!(
        delivered,
        [
            ("c3".to_string(), CallStatus::Denied),
            ("c2".to_string(), CallStatus::Skipped),
            ("c4".to_string(), CallStatus::Skipped),
        ]
    );
    let complete = agent.next_batch_complete().await;
    let ids: Vec<_> = complete
        .outcomes
        .iter()
        .map(|o| o.call_id.as_str())
        .collect();
    assert_eq!(ids, ["c1", "c2", "c3", "c4"], "in the batch's order");
    assert_eq!(
        statuses(&complete.outcomes),
        [
            CallStatus::Approved,
            CallStatus::Skipped,
            CallStatus::Denied,
            CallStatus::Skipped
        ]
    );
}

async fn an_independent_batch_decides_each_call_on_its_own(app: TestApp) {
    let mut agent = AgentStream::open(&app).await;
    let spec = pb::BatchSpec {
        on_deny: pb::OnDeny::Independent as i32,
        ..batch(
            "s",
            vec![
                call("a", "t", "{}"),
                call("b", "t", "{}"),
                call("c", "t", "{}"),
            ],
        )
    };
    agent.submit("r1", spec).await;
    agent.next_submitted().await;
    let denied = deny(&app, "s", "b", "").await;
    assert!(denied.skipped.is_empty());
    assert_eq!(agent.next_outcome().await.call_id, "b");
    approve(&app, "s", "c").await;
    assert_eq!(agent.next_outcome().await.call_id, "c");
    approve(&app, "s", "a").await;
    assert_eq!(agent.next_outcome().await.call_id, "a");
    let complete = agent.next_batch_complete().await;
    assert_eq!(
        statuses(&complete.outcomes),
        [
            CallStatus::Approved,
            CallStatus::Denied,
            CallStatus::Approved
        ]
    );
}

async fn batch_complete_comes_once_after_the_last_outcome_even_when_decided_out_of_order(
    app: TestApp,
) {
    let mut agent = AgentStream::open(&app).await;
    agent
        .submit(
            "r1",
            batch("s", vec![call("x", "t", "{}"), call("y", "t", "{}")]),
        )
        .await;
    let acks = agent.next_submitted().await;
    approve(&app, "s", "y").await;
    assert_eq!(agent.next_outcome().await.call_id, "y");
    approve(&app, "s", "x").await;
    assert_eq!(agent.next_outcome().await.call_id, "x");
    let complete = agent.next_batch_complete().await;
    assert_eq!(complete.batch_id, acks.batch_id);
    assert_eq!(complete.session_id, "s");
    let ids: Vec<_> = complete
        .outcomes
        .iter()
        .map(|o| o.call_id.as_str())
        .collect();
    assert_eq!(ids, ["x", "y"]);
    assert!(
        agent
            .is_quiet_for(std::time::Duration::from_millis(300))
            .await
    );
}

async fn a_skip_never_reaches_into_another_batch(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("a1", "t", "{}"), call("a2", "t", "{}")]),
    )
    .await;
    submit(&app, batch("s", vec![call("b1", "t", "{}")])).await;
    deny(&app, "s", "a1", "").await;
    assert_eq!(
        status_of(&outcome_of(&app, "s", "a2").await),
        CallStatus::Skipped
    );
    assert!(matches!(
        states(&app, "s", &["b1"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

async fn calls_carry_their_batch_and_position(app: TestApp) {
    let response = submit(
        &app,
        batch("s", vec![call("a", "t", "{}"), call("b", "t", "{}")]),
    )
    .await;
    let calls = all_calls(&app).await;
    assert_eq!(calls.len(), 2);
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(c.batch_id, response.batch_id);
        assert_eq!(c.position, i as u32);
        assert_eq!(c.batch_size, 2);
    }
}

backend_tests! {
    a_denial_skips_the_still_pending_rest_of_the_batch_by_default,
    an_independent_batch_decides_each_call_on_its_own,
    batch_complete_comes_once_after_the_last_outcome_even_when_decided_out_of_order,
    a_skip_never_reaches_into_another_batch,
    calls_carry_their_batch_and_position,
}
