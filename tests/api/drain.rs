//! Graceful drain: on SIGTERM, health turns NOT_SERVING, open streams end with UNAVAILABLE so
//! clients reconnect elsewhere, requests in flight finish, the process exits 0 within the drain
//! time, and nothing acknowledged is lost. Runs the real binary.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use approval_broker::proto::v1 as pb;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::helpers::*;

async fn on_sigterm_the_broker_drains_and_loses_nothing_acknowledged(mut app: TestApp) {
    app.shut_down().await;
    let mut broker = start_broker(&app.database_url, &["--drain-timeout", "5s"], &[]).await;

    let mut health = HealthClient::new(broker.channel())
        .watch(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("watch health")
        .into_inner();
    let first = health.next().await.expect("a status").expect("ok");
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let watch = |service: &str| {
        let mut client = HealthClient::new(broker.channel());
        let request = tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        };
        async move { client.watch(request).await.expect("watch").into_inner() }
    };
    let mut readiness = watch("readiness").await;
    let mut liveness = watch("liveness").await;
    for probe in [&mut readiness, &mut liveness] {
        let first = probe.next().await.expect("a status").expect("ok");
        assert_eq!(first.status, ServingStatus::Serving as i32);
    }

    let mut subscriber = ApproverServiceClient::new(broker.channel())
        .subscribe(pb::SubscribeRequest {
            filter: None,
            after_seq: None,
        })
        .await
        .expect("subscribe")
        .into_inner();
    let (requests, rx) = tokio::sync::mpsc::channel(8);
    let mut agent_stream = AgentServiceClient::new(broker.channel())
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("connect")
        .into_inner();
    requests
        .send(pb::AgentRequest {
            request_id: "r".into(),
            request: Some(pb::agent_request::Request::Submit(batch(
                "stream",
                vec![call("s1", "t", "{}")],
            ))),
        })
        .await
        .expect("send");
    let acked_on_stream = agent_stream
        .message()
        .await
        .expect("healthy")
        .expect("a response");
    assert!(matches!(
        acked_on_stream.response,
        Some(pb::agent_response::Response::Submitted(_))
    ));

    // A steady load of submits, recording every acknowledged call.
    let acknowledged = Arc::new(Mutex::new(vec!["s1".to_string()]));
    let load = {
        let channel = broker.channel();
        let acknowledged = Arc::clone(&acknowledged);
        tokio::spawn(async move {
            let mut client = AgentServiceClient::new(channel);
            for i in 0.. {
                let id = format!("load{i}");
                let request = pb::SubmitRequest {
                    batch: Some(batch("load", vec![call(&id, "t", "{}")])),
                };
                match client.submit(request).await {
                    Ok(_) => acknowledged.lock().unwrap().push(id),
                    Err(_) => return i,
                }
            }
            unreachable!()
        })
    };
    while acknowledged.lock().unwrap().len() < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let signalled = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &broker.pid().expect("running").to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());

    // Health says NOT_SERVING; open streams end with UNAVAILABLE.
    let mut saw_not_serving = false;
    while let Some(Ok(update)) = health.next().await {
        if update.status == ServingStatus::NotServing as i32 {
            saw_not_serving = true;
            break;
        }
    }
    assert!(saw_not_serving, "health turned NOT_SERVING");
    drop(health);
    let update = readiness.next().await.expect("a status").expect("ok");
    assert_eq!(update.status, ServingStatus::NotServing as i32, "not ready");
    drop(readiness);
    // Liveness does not turn NOT_SERVING: by now its watch would have said so.
    if let Ok(Some(Ok(update))) =
        tokio::time::timeout(Duration::from_millis(200), liveness.next()).await
    {
        assert_eq!(
            update.status,
            ServingStatus::Serving as i32,
            "alive while draining"
        );
    }
    drop(liveness);
    let ended = loop {
        match agent_stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the agent stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    let ended = loop {
        match subscriber.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the subscriber ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    assert!(ended.message().contains("after_seq"), "{}", ended.message());
    assert!(
        ended.metadata().get("approvals-last-seq").is_some(),
        "the resume position is in the trailer: {ended:?}"
    );
    drop(requests);

    // The process exits 0, within the drain time.
    let status = loop {
        if let Some(status) = broker.try_wait() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "the broker did not exit in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status:?}");
    let submitted = load.await.expect("load");
    assert!(submitted >= 20);

    // Nothing acknowledged was lost.
    drop(broker);
    let app = app.start_again().await;
    let acknowledged = acknowledged.lock().unwrap().clone();
    let (stream_ids, load_ids): (Vec<_>, Vec<_>) =
        acknowledged.iter().partition(|id| id.starts_with('s'));
    for (session, ids) in [("stream", stream_ids), ("load", load_ids)] {
        let ids: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
        for state in states(&app, session, &ids).await {
            assert!(
                matches!(state.state, Some(pb::call_state::State::Pending(_))),
                "{}: acknowledged before the drain, so stored: {state:?}",
                state.call_id
            );
        }
    }
}

/// A subscriber ended by a shutdown gets the position to resume from in the
/// `approvals-last-seq` trailer, as one that fell behind does: no client parses the message.
async fn on_shutdown_a_subscriber_is_told_where_to_resume_in_the_last_seq_trailer(
    mut app: TestApp,
) {
    let mut subscriber = Subscription::open(&app, pb::CallFilter::default(), None).await;
    subscriber.snapshot().await;
    submit(
        &app,
        batch("s", vec![call("a", "t", "{}"), call("b", "t", "{}")]),
    )
    .await;
    let mut last_seq = 0;
    for _ in 0..2 {
        last_seq = subscriber.next().await.seq;
    }
    let reader = tokio::spawn(async move {
        match subscriber.stream.message().await {
            Ok(Some(event)) => panic!("no event was expected: {event:?}"),
            Ok(None) => panic!("the subscriber ended without a status"),
            Err(status) => status,
        }
    });
    app.shut_down().await;
    let ended = tokio::time::timeout(PATIENCE, reader)
        .await
        .expect("the stream ended in time")
        .expect("reader");
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    let trailer = ended
        .metadata()
        .get("approvals-last-seq")
        .expect("the approvals-last-seq trailer")
        .to_str()
        .expect("ASCII");
    assert_eq!(trailer, last_seq.to_string());
    // The text still says it, for people reading logs.
    assert!(
        ended.message().contains(&format!("after_seq={last_seq}")),
        "{}",
        ended.message()
    );
}

backend_tests! {
    on_sigterm_the_broker_drains_and_loses_nothing_acknowledged,
    on_shutdown_a_subscriber_is_told_where_to_resume_in_the_last_seq_trailer,
}
