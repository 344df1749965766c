//! Limits: past the cap on subscribers or agent streams, a new stream gets RESOURCE_EXHAUSTED
//! while every stream already open, and every other RPC, goes on being served; a closed stream
//! frees its place.

use std::time::Duration;

use approval_broker::proto::v1 as pb;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::helpers::*;

async fn subscribe(app: &TestApp) -> Result<Subscription, tonic::Status> {
    let stream = app
        .approver()
        .subscribe(pb::SubscribeRequest {
            filter: None,
            after_seq: None,
        })
        .await?
        .into_inner();
    Ok(Subscription { stream })
}

async fn past_the_subscriber_cap_a_new_subscriber_is_refused_and_the_others_are_served(
    app: TestApp,
) {
    let mut first = subscribe(&app).await.expect("first");
    let mut second = subscribe(&app).await.expect("second");
    first.snapshot().await;
    second.snapshot().await;
    let refused = subscribe(&app)
        .await
        .err()
        .expect("a third subscriber is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("--max-subscribers"),
        "{}",
        refused.message()
    );

    // Everyone else is still served: a submit reaches both open subscribers.
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    for sub in [&mut first, &mut second] {
        assert!(matches!(
            sub.next().await.event,
            Some(pb::approver_event::Event::Requested(_))
        ));
    }

    // A closed subscription frees its place.
    drop(first);
    let mut attempts = 0;
    loop {
        match subscribe(&app).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::ResourceExhausted && attempts < 100 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("the freed place was not reused: {status:?}"),
        }
    }
}

async fn past_the_agent_stream_cap_a_new_stream_is_refused_and_the_others_are_served(app: TestApp) {
    let mut first = AgentStream::open(&app).await;
    let _second = AgentStream::open(&app).await;
    let (_requests, rx) = tokio::sync::mpsc::channel::<pb::AgentRequest>(1);
    let refused = app
        .agent()
        .connect(ReceiverStream::new(rx))
        .await
        .expect_err("a third stream is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("--max-agent-streams"),
        "{}",
        refused.message()
    );
    let watch = app
        .agent()
        .watch_outcomes(pb::WatchOutcomesRequest {
            session_id: "s".into(),
            call_ids: vec![],
        })
        .await
        .expect_err("so is a watch");
    assert_eq!(watch.code(), Code::ResourceExhausted);

    // The open stream still works end to end.
    first
        .submit("r1", batch("s", vec![call("c1", "t", "{}")]))
        .await;
    first.next_submitted().await;
    approve(&app, "s", "c1").await;
    assert_eq!(first.next_outcome().await.call_id, "c1");
}

backend_tests! {
    past_the_subscriber_cap_a_new_subscriber_is_refused_and_the_others_are_served => |c| c.max_subscribers = 2,
    past_the_agent_stream_cap_a_new_stream_is_refused_and_the_others_are_served => |c| c.max_agent_streams = 2,
}
