//! The audit: every outcome records precisely who or what decided it (an approver identity,
//! `grant:<id>`, `policy:<id>`, `deadline`, `agent` or `broker`), and ListCalls filters by it,
//! exactly or by kind.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

/// Every call (ids) ListCalls returns for a `decided_by` filter.
async fn decided_by(app: &TestApp, filter: &str) -> Vec<String> {
    let mut ids: Vec<String> = app
        .admin()
        .list_calls(pb::ListCallsRequest {
            decided_by: filter.into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("list calls")
        .into_inner()
        .calls
        .into_iter()
        .map(|c| c.call_id)
        .collect();
    ids.sort();
    ids
}

async fn every_outcome_records_who_decided_it_and_list_calls_filters_by_it(app: TestApp) {
    // deadline: a call that expires.
    let soon =
        SystemTime::now().duration_since(UNIX_EPOCH).expect("clock") + Duration::from_millis(1500);
    let expiring = pb::CallSpec {
        deadline: Some(prost_types::Timestamp {
            seconds: soon.as_secs() as i64,
            nanos: soon.subsec_nanos() as i32,
        }),
        ..call("expires", "t", "{}")
    };
    submit(&app, batch("s", vec![expiring])).await;

    // approver: a person; grant: a remembered decision deciding a later call.
    submit(
        &app,
        batch("s", vec![call("by-alice", "shell", r#"{"command":"ls"}"#)]),
    )
    .await;
    let grant = grant_by_deciding(
        &app,
        "s",
        "by-alice",
        pb::Decision::Approve,
        pb::Scope::Session,
        None,
    )
    .await;
    submit(
        &app,
        batch("s", vec![call("by-grant", "shell", r#"{"command":"ls"}"#)]),
    )
    .await;
    submit(&app, batch("s", vec![call("by-bob", "t", "{}")])).await;
    let mut bob = decide_request("s", "by-bob", pb::Decision::Approve, "");
    bob.approver = "bob@example.com".into();
    app.approver().decide(bob).await.expect("bob approves");

    // policy: a rule.
    create_rule(&app, rule("no-rm", "rm", pb::Effect::Deny, 0, None)).await;
    submit(&app, batch("s", vec![call("by-policy", "rm", "{}")])).await;

    // agent: a cancel; broker: a supersede and a skip.
    submit(&app, batch("s", vec![call("cancelled", "t", "{}")])).await;
    app.agent()
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: "s".into(),
                target: Some(pb::cancel_target::Target::Calls(pb::CallIds {
                    call_ids: vec!["cancelled".into()],
                })),
                reason: String::new(),
            }),
        })
        .await
        .expect("cancel");
    let keyed = |id: &str| pb::CallSpec {
        supersede_key: "question".into(),
        ..call(id, "ask_user", "{}")
    };
    submit(&app, batch("s2", vec![keyed("superseded")])).await;
    submit(&app, batch("s2", vec![keyed("newer")])).await;
    submit(
        &app,
        batch(
            "s2",
            vec![call("denied", "t", "{}"), call("skipped", "t", "{}")],
        ),
    )
    .await;
    deny(&app, "s2", "denied", "no").await;

    // Wait for the deadline to pass and the call to expire.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while decided_by(&app, "deadline").await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let by_grant = format!("grant:{}", grant.id);
    for (filter, expected) in [
        ("approver:alice@example.com", vec!["by-alice", "denied"]),
        ("approver:bob@example.com", vec!["by-bob"]),
        ("approver:", vec!["by-alice", "by-bob", "denied"]),
        (by_grant.as_str(), vec!["by-grant"]),
        ("grant:", vec!["by-grant"]),
        ("policy:no-rm", vec!["by-policy"]),
        ("policy:", vec!["by-policy"]),
        ("deadline", vec!["expires"]),
        ("agent", vec!["cancelled"]),
        ("broker", vec!["skipped", "superseded"]),
        ("grant:999999", vec![]),
        ("approver", vec![]),
    ] {
        assert_eq!(decided_by(&app, filter).await, expected, "{filter}");
    }
    // Each outcome carries the same string.
    assert_eq!(outcome_of(&app, "s", "by-grant").await.decided_by, by_grant);
    assert_eq!(
        outcome_of(&app, "s", "by-policy").await.decided_by,
        "policy:no-rm"
    );
    assert_eq!(
        outcome_of(&app, "s", "expires").await.decided_by,
        "deadline"
    );
    assert_eq!(outcome_of(&app, "s", "cancelled").await.decided_by, "agent");
    assert_eq!(outcome_of(&app, "s2", "skipped").await.decided_by, "broker");
    // And the filter combines with the others.
    let in_s2 = app
        .admin()
        .list_calls(pb::ListCallsRequest {
            decided_by: "approver:".into(),
            session_id: "s2".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .calls;
    assert_eq!(in_s2.len(), 1);
    assert_status(
        app.admin()
            .list_calls(pb::ListCallsRequest {
                decided_by: "grant:\n".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "decided_by",
    );
}

backend_tests! {
    every_outcome_records_who_decided_it_and_list_calls_filters_by_it,
}
