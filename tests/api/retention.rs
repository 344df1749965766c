//! Retention (`--retain-decided`): batches decided longer ago than the setting are pruned with
//! their events, while pending calls, grants and rules stay; a subscriber resuming below what was
//! pruned is refused with OUT_OF_RANGE naming the oldest resume point still served, and one at or
//! above it is served without a gap; events a webhook endpoint has not delivered are kept; and a
//! quiet broker prunes on time, the log's last event included (numbering continues after it).

use std::time::Duration;

use approval_broker::config::Config;
use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

/// Keeps decided calls for a second, and prunes often.
fn retain_a_second(config: &mut Config) {
    config.lifecycle.retain_decided = Some(Duration::from_secs(1));
    config.lifecycle.prune_every = Duration::from_millis(100);
}

async fn decided_calls_past_retention_are_pruned_and_pending_calls_grants_and_rules_are_kept(
    app: TestApp,
) {
    submit(
        &app,
        batch("s", vec![call("old", "shell", r#"{"cmd":"ls"}"#)]),
    )
    .await;
    let grant = grant_by_deciding(
        &app,
        "s",
        "old",
        pb::Decision::Approve,
        pb::Scope::Always,
        Some(exact_input(r#"{"cmd":"ls"}"#)),
    )
    .await;
    create_rule(&app, rule("no-rm", "rm", pb::Effect::Deny, 10, None)).await;
    // A call nobody decides: pending however old it gets (it also holds the log's last event).
    submit(&app, batch("s", vec![call("waiting", "edit", "{}")])).await;

    until_pruned(&app, "s", "old").await;

    let waiting = app
        .admin()
        .get_call(pb::GetCallRequest {
            session_id: "s".into(),
            call_id: "waiting".into(),
            ..Default::default()
        })
        .await
        .expect("the pending call is kept")
        .into_inner();
    assert_eq!(waiting.status, CallStatus::Pending as i32);
    let grants = list_grants(&app, pb::ListGrantsRequest::default()).await;
    assert_eq!(
        grants.iter().map(|g| g.id).collect::<Vec<_>>(),
        [grant.id],
        "the grant made by deciding the pruned call is kept"
    );
    let rules = app
        .admin()
        .list_rules(pb::ListRulesRequest::default())
        .await
        .expect("list rules")
        .into_inner()
        .rules;
    assert_eq!(
        rules.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["no-rm"]
    );
    // The grant still decides: a new call it matches is approved by it.
    let again = submit(
        &app,
        batch("s2", vec![call("again", "shell", r#"{"cmd":"ls"}"#)]),
    )
    .await;
    assert_eq!(ack_status(&again, 0), CallStatus::Approved);
}

async fn a_subscriber_resuming_below_the_pruned_horizon_is_refused_and_one_above_it_is_served(
    app: TestApp,
) {
    // Events 1 and 2: `gone` requested and decided; event 3: `kept` requested.
    submit(&app, batch("s", vec![call("gone", "t", "{}")])).await;
    deny(&app, "s", "gone", "no").await;
    submit(&app, batch("s", vec![call("kept", "t", "{}")])).await;
    until_pruned(&app, "s", "gone").await;

    for after_seq in [0, 1] {
        let refused = app
            .approver()
            .subscribe(pb::SubscribeRequest {
                filter: Some(pb::CallFilter::default()),
                after_seq: Some(after_seq),
            })
            .await
            .map(|_| ());
        let status = refused.expect_err("a resume point below the horizon is refused");
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        assert!(
            status.message().contains("resume with after_seq=2"),
            "names the oldest resume point served: {}",
            status.message()
        );
    }

    let mut resumed = Subscription::open(&app, pb::CallFilter::default(), Some(2)).await;
    let event = resumed.next().await;
    assert_eq!(event.seq, 3);
    match event.event {
        Some(pb::approver_event::Event::Requested(call)) => assert_eq!(call.call_id, "kept"),
        other => panic!("expected kept's request, got {other:?}"),
    }
    // And live events follow, without a gap.
    approve(&app, "s", "kept").await;
    assert_eq!(resumed.next().await.seq, 4);
}

async fn events_a_webhook_endpoint_has_not_delivered_are_kept_until_it_is_deleted(app: TestApp) {
    submit(&app, batch("s", vec![call("before", "t", "{}")])).await;
    approve(&app, "s", "before").await;
    // Nothing listens on port 1: every delivery fails, so the endpoint's cursor stays where it
    // started, after `before`'s events.
    app.admin()
        .create_webhook(pb::CreateWebhookRequest {
            id: "down".into(),
            url: "http://127.0.0.1:1/hook".into(),
            ..Default::default()
        })
        .await
        .expect("CreateWebhook");
    submit(&app, batch("s", vec![call("after", "t", "{}")])).await;
    approve(&app, "s", "after").await;
    submit(&app, batch("s", vec![call("last", "t", "{}")])).await;

    // `before` was delivered (passed over before the endpoint existed): pruned.
    until_pruned(&app, "s", "before").await;
    // `after` is older than retention keeps too, but undelivered: kept, prune after prune.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(is_stored(&app, "s", "after").await, "undelivered, kept");

    app.admin()
        .delete_webhook(pb::DeleteWebhookRequest { id: "down".into() })
        .await
        .expect("DeleteWebhook");
    until_pruned(&app, "s", "after").await;
}

/// A quiet broker prunes on time: the batch that holds the log's last event goes too, with
/// nothing submitted after it, and numbering continues after it (also across a restart).
async fn a_quiet_broker_prunes_the_last_decided_batch_on_time_and_numbering_continues(
    app: TestApp,
) {
    // Events 1 and 2: `last` requested and decided, and then nothing else happens.
    submit(&app, batch("s", vec![call("last", "t", "{}")])).await;
    deny(&app, "s", "last", "no").await;
    until_pruned(&app, "s", "last").await;

    let app = app.restart().await;
    let mut resumed = Subscription::open(&app, pb::CallFilter::default(), Some(2)).await;
    submit(&app, batch("s", vec![call("next", "t", "{}")])).await;
    let event = resumed.next().await;
    assert_eq!(
        event.seq, 3,
        "numbering continues after the pruned last event"
    );
    match event.event {
        Some(pb::approver_event::Event::Requested(call)) => assert_eq!(call.call_id, "next"),
        other => panic!("expected next's request, got {other:?}"),
    }
}

backend_tests!(
    a_quiet_broker_prunes_the_last_decided_batch_on_time_and_numbering_continues => super::retain_a_second,
    decided_calls_past_retention_are_pruned_and_pending_calls_grants_and_rules_are_kept => super::retain_a_second,
    a_subscriber_resuming_below_the_pruned_horizon_is_refused_and_one_above_it_is_served => super::retain_a_second,
    events_a_webhook_endpoint_has_not_delivered_are_kept_until_it_is_deleted => |c: &mut approval_broker::config::Config| {
        super::retain_a_second(c);
        crate::webhooks::allow_loopback(c);
    },
);
