//! Acknowledged means durable: whatever was acknowledged survives the broker stopping or being
//! killed mid-flight, and streams pick up where they were.

use approval_broker::proto::v1 as pb;

use crate::helpers::*;

async fn acknowledged_calls_and_decisions_survive_a_crash(app: TestApp) {
    for b in 0..10 {
        let calls = (0..5)
            .map(|i| call(&format!("b{b}c{i}"), "t", &format!(r#"{{"n":{i}}}"#)))
            .collect();
        submit(
            &app,
            pb::BatchSpec {
                on_deny: pb::OnDeny::Independent as i32,
                ..batch("s", calls)
            },
        )
        .await;
    }
    for b in 0..10 {
        approve(&app, "s", &format!("b{b}c0")).await;
        deny(&app, "s", &format!("b{b}c1"), "no").await;
    }
    let app = app.crash_and_restart().await;
    let calls = all_calls(&app).await;
    assert_eq!(calls.len(), 50);
    for c in &calls {
        let expected = if c.call_id.ends_with("c0") {
            CallStatus::Approved
        } else if c.call_id.ends_with("c1") {
            CallStatus::Denied
        } else {
            CallStatus::Pending
        };
        assert_eq!(c.status, expected as i32, "{}", c.call_id);
    }
    // The restarted broker goes on: new calls, decisions, events after the old ones.
    submit(&app, batch("s", vec![call("after", "t", "{}")])).await;
    approve(&app, "s", "after").await;
}

async fn a_subscriber_resumes_across_a_restart_with_no_gap_and_no_duplicate(app: TestApp) {
    submit(&app, batch("s", vec![call("a", "t", "{}")])).await;
    let mut sub = Subscription::open(&app, pb::CallFilter::default(), None).await;
    let (_, seen) = sub.snapshot().await;
    drop(sub);
    let app = app.restart().await;
    approve(&app, "s", "a").await;
    submit(&app, batch("s", vec![call("b", "t", "{}")])).await;

    let mut resumed = Subscription::open(&app, pb::CallFilter::default(), Some(seen)).await;
    let resolved = resumed.next().await;
    assert!(resolved.seq > seen);
    assert!(
        matches!(resolved.event, Some(pb::approver_event::Event::Resolved(ref o)) if o.call_id == "a")
    );
    let requested = resumed.next().await;
    assert!(requested.seq > resolved.seq);
    assert!(
        matches!(requested.event, Some(pb::approver_event::Event::Requested(ref c)) if c.call_id == "b")
    );
}

async fn an_agent_gets_outcomes_decided_while_the_broker_restarted(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("a", "t", "{}"), call("b", "t", "{}")]),
    )
    .await;
    approve(&app, "s", "a").await;
    let app = app.crash_and_restart().await;
    approve(&app, "s", "b").await;
    let mut agent = AgentStream::open(&app).await;
    agent
        .send(
            "resume",
            pb::agent_request::Request::Resume(pb::ResumeRequest {
                session_id: "s".into(),
                call_ids: vec![],
            }),
        )
        .await;
    let first = agent.next_outcome().await;
    let second = agent.next_outcome().await;
    assert_eq!(
        (first.call_id.as_str(), second.call_id.as_str()),
        ("a", "b")
    );
    let complete = agent.next_batch_complete().await;
    assert_eq!(complete.outcomes.len(), 2);
    match agent.next().await {
        pb::agent_response::Response::Resumed(done) => assert!(done.pending_call_ids.is_empty()),
        other => panic!("expected resumed, got {other:?}"),
    }
}

async fn grants_and_rules_survive_a_crash(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("c1", "shell", r#"{"command":"ls"}"#)]),
    )
    .await;
    let grant = grant_by_deciding(
        &app,
        "s",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Always,
        Some(any_input()),
    )
    .await;
    create_rule(&app, rule("no-rm", "rm", pb::Effect::Deny, 0, None)).await;
    let app = app.crash_and_restart().await;
    let listed = list_grants(&app, Default::default()).await;
    assert_eq!(listed, vec![grant.clone()], "the grant, as it was");
    let response = submit(
        &app,
        batch(
            "s2",
            vec![
                call("c2", "shell", r#"{"command":"pwd"}"#),
                call("c3", "rm", "{}"),
            ],
        ),
    )
    .await;
    let decided: Vec<_> = response
        .outcomes
        .iter()
        .map(|o| (o.call_id.as_str(), o.decided_by.clone()))
        .collect();
    assert_eq!(
        decided,
        [
            ("c2", format!("grant:{}", grant.id)),
            ("c3", "policy:no-rm".to_owned()),
        ]
    );
}

backend_tests! {
    grants_and_rules_survive_a_crash,
    acknowledged_calls_and_decisions_survive_a_crash,
    a_subscriber_resumes_across_a_restart_with_no_gap_and_no_duplicate,
    an_agent_gets_outcomes_decided_while_the_broker_restarted,
}
