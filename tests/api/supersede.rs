//! Supersede: a newer call replaces an older pending one; SUPERSEDED is an outcome whose text asks
//! the model to ask again, never an error.

use approval_broker::proto::v1 as pb;

use crate::helpers::*;

const SUPERSEDED_TEXT: &str = "This request was replaced by a newer one and was not answered. \
                               If it is still needed, ask again with the same request.";

fn keyed(call_id: &str, key: &str) -> pb::CallSpec {
    pb::CallSpec {
        supersede_key: key.into(),
        ..call(
            call_id,
            "ask_user",
            &format!(r#"{{"question":"{call_id}?"}}"#),
        )
    }
}

async fn a_newer_call_with_the_same_supersede_key_supersedes_the_pending_one(app: TestApp) {
    let mut agent = AgentStream::open(&app).await;
    agent
        .submit("r1", batch("s", vec![keyed("q1", "ask")]))
        .await;
    agent.next_submitted().await;
    agent
        .submit("r2", batch("s", vec![keyed("q2", "ask")]))
        .await;
    let acks = agent.next_submitted().await;
    assert!(matches!(
        acks.acks[0].result,
        Some(pb::call_ack::Result::Accepted(_))
    ));
    assert_eq!(acks.superseded.len(), 1);
    assert_eq!(acks.superseded[0].call_id, "q1");

    let superseded = agent.next_outcome().await;
    assert_eq!(superseded.call_id, "q1");
    assert_eq!(status_of(&superseded), CallStatus::Superseded);
    assert_eq!(superseded.tool_result, SUPERSEDED_TEXT);
    assert_eq!(superseded.decided_by, "broker");
    // q1's one-call batch is complete; q2 waits for a person.
    assert_eq!(agent.next_batch_complete().await.outcomes[0].call_id, "q1");
    assert!(matches!(
        states(&app, "s", &["q2"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

async fn supersede_keys_are_per_session_and_per_key(app: TestApp) {
    submit(&app, batch("s", vec![keyed("q1", "ask")])).await;
    submit(&app, batch("other", vec![keyed("q1", "ask")])).await;
    submit(&app, batch("s", vec![keyed("q2", "confirm")])).await;
    for (session, id) in [("s", "q1"), ("other", "q1"), ("s", "q2")] {
        assert!(matches!(
            states(&app, session, &[id]).await[0].state,
            Some(pb::call_state::State::Pending(_))
        ));
    }
}

async fn a_submit_can_supersede_everything_pending_in_its_session(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("old1", "t", "{}"), call("old2", "t", "{}")]),
    )
    .await;
    submit(&app, batch("s", vec![call("decided", "t", "{}")])).await;
    approve(&app, "s", "decided").await;
    submit(&app, batch("elsewhere", vec![call("keep", "t", "{}")])).await;

    let response = submit(
        &app,
        pb::BatchSpec {
            supersede_pending: true,
            ..batch("s", vec![call("new", "t", "{}")])
        },
    )
    .await;
    let superseded: Vec<_> = response
        .superseded
        .iter()
        .map(|o| o.call_id.as_str())
        .collect();
    assert_eq!(superseded, ["old1", "old2"]);
    for id in ["old1", "old2"] {
        assert_eq!(
            status_of(&outcome_of(&app, "s", id).await),
            CallStatus::Superseded
        );
    }
    assert_eq!(
        status_of(&outcome_of(&app, "s", "decided").await),
        CallStatus::Approved
    );
    assert!(matches!(
        states(&app, "elsewhere", &["keep"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
    assert!(matches!(
        states(&app, "s", &["new"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

async fn retrying_a_superseding_submit_does_not_supersede_itself(app: TestApp) {
    let spec = pb::BatchSpec {
        supersede_pending: true,
        ..batch("s", vec![call("c1", "t", "{}"), keyed("c2", "k")])
    };
    submit(&app, spec.clone()).await;
    let retry = submit(&app, spec).await;
    assert!(retry.superseded.is_empty());
    for ack in &retry.acks {
        assert!(
            matches!(ack.result, Some(pb::call_ack::Result::Duplicate(_))),
            "{ack:?}"
        );
    }
    let pending = states(&app, "s", &["c1", "c2"]).await;
    assert!(
        pending
            .iter()
            .all(|s| matches!(s.state, Some(pb::call_state::State::Pending(_))))
    );
}

async fn a_superseding_batch_whose_every_call_is_refused_supersedes_nothing(app: TestApp) {
    submit(&app, batch("s", vec![call("old", "t", "{}")])).await;
    let response = submit(
        &app,
        pb::BatchSpec {
            supersede_pending: true,
            ..batch("s", vec![call("new", "t", "not json")])
        },
    )
    .await;
    assert!(matches!(
        response.acks[0].result,
        Some(pb::call_ack::Result::Error(_))
    ));
    assert!(response.superseded.is_empty());
    assert!(matches!(
        states(&app, "s", &["old"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

async fn a_call_superseded_by_a_later_call_of_its_own_batch_is_acknowledged_as_superseded(
    app: TestApp,
) {
    let response = submit(
        &app,
        batch("s", vec![keyed("q1", "ask"), keyed("q2", "ask")]),
    )
    .await;
    // One reply, one story: the acknowledgement, the outcomes and the superseded list agree.
    assert_eq!(ack_status(&response, 0), CallStatus::Superseded);
    assert_eq!(ack_status(&response, 1), CallStatus::Pending);
    let outcomes: Vec<_> = response
        .outcomes
        .iter()
        .map(|o| (o.call_id.as_str(), status_of(o)))
        .collect();
    assert_eq!(outcomes, [("q1", CallStatus::Superseded)]);
    assert!(
        response.superseded.is_empty(),
        "`superseded` lists calls of earlier batches only: {:?}",
        response.superseded
    );
    let stored = outcome_of(&app, "s", "q1").await;
    assert_eq!(Some(&stored), response.outcomes.first());
    assert_eq!(stored.tool_result, SUPERSEDED_TEXT);

    // The same on the agent's stream.
    let mut agent = AgentStream::open(&app).await;
    agent
        .submit(
            "r1",
            batch("s2", vec![keyed("q1", "ask"), keyed("q2", "ask")]),
        )
        .await;
    let acks = agent.next_submitted().await;
    assert_eq!(ack_status(&acks, 0), CallStatus::Superseded);
    assert_eq!(ack_status(&acks, 1), CallStatus::Pending);
    assert!(acks.superseded.is_empty());

    // A call the request resubmits, superseded by a later call of the same request.
    submit(&app, batch("s3", vec![keyed("q1", "ask")])).await;
    let again = submit(
        &app,
        batch("s3", vec![keyed("q1", "ask"), keyed("q2", "ask")]),
    )
    .await;
    assert!(matches!(
        again.acks[0].result,
        Some(pb::call_ack::Result::Duplicate(_))
    ));
    assert_eq!(ack_status(&again, 0), CallStatus::Superseded);
    assert_eq!(again.outcomes.len(), 1);
    assert_eq!(status_of(&again.outcomes[0]), CallStatus::Superseded);
    assert!(again.superseded.is_empty(), "{:?}", again.superseded);
}

async fn a_superseding_batch_supersedes_a_pending_call_whose_id_it_reuses_for_another_request(
    app: TestApp,
) {
    submit(
        &app,
        batch(
            "s",
            vec![call("x", "t", r#"{"v":1}"#), call("y", "t", "{}")],
        ),
    )
    .await;
    // `x` again with another input is refused; it does not shield the pending `x`, which the
    // new turn replaces like every other pending call.
    let response = submit(
        &app,
        pb::BatchSpec {
            supersede_pending: true,
            ..batch(
                "s",
                vec![call("x", "t", r#"{"v":2}"#), call("z", "t", "{}")],
            )
        },
    )
    .await;
    assert!(
        matches!(&response.acks[0].result, Some(pb::call_ack::Result::Error(e))
            if e.code == tonic::Code::AlreadyExists as i32),
        "{:?}",
        response.acks[0]
    );
    assert_eq!(ack_status(&response, 1), CallStatus::Pending);
    let superseded: Vec<_> = response
        .superseded
        .iter()
        .map(|o| o.call_id.as_str())
        .collect();
    assert_eq!(superseded, ["x", "y"]);
    let x = outcome_of(&app, "s", "x").await;
    assert_eq!(status_of(&x), CallStatus::Superseded);
    assert_eq!(x.tool_result, SUPERSEDED_TEXT);
}

async fn a_superseding_batch_that_stores_no_new_call_supersedes_nothing(app: TestApp) {
    submit(
        &app,
        batch(
            "s",
            vec![call("x", "t", r#"{"v":1}"#), call("y", "t", "{}")],
        ),
    )
    .await;
    // Every entry refused (here: an id taken by another request) replaces nothing.
    let refused = submit(
        &app,
        pb::BatchSpec {
            supersede_pending: true,
            ..batch("s", vec![call("x", "t", r#"{"v":2}"#)])
        },
    )
    .await;
    assert!(matches!(
        refused.acks[0].result,
        Some(pb::call_ack::Result::Error(_))
    ));
    assert!(refused.superseded.is_empty());
    // A retry of an earlier superseding turn, after a newer turn: a retry changes nothing.
    let earlier = pb::BatchSpec {
        supersede_pending: true,
        ..batch("s", vec![call("a", "t", "{}")])
    };
    submit(&app, earlier.clone()).await;
    submit(&app, batch("s", vec![call("b", "t", "{}")])).await;
    let retry = submit(&app, earlier).await;
    assert!(matches!(
        retry.acks[0].result,
        Some(pb::call_ack::Result::Duplicate(_))
    ));
    assert!(retry.superseded.is_empty(), "{:?}", retry.superseded);
    assert!(matches!(
        states(&app, "s", &["b"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

backend_tests! {
    a_superseding_batch_whose_every_call_is_refused_supersedes_nothing,
    a_newer_call_with_the_same_supersede_key_supersedes_the_pending_one,
    supersede_keys_are_per_session_and_per_key,
    a_submit_can_supersede_everything_pending_in_its_session,
    retrying_a_superseding_submit_does_not_supersede_itself,
    a_call_superseded_by_a_later_call_of_its_own_batch_is_acknowledged_as_superseded,
    a_superseding_batch_supersedes_a_pending_call_whose_id_it_reuses_for_another_request,
    a_superseding_batch_that_stores_no_new_call_supersedes_nothing,
}
