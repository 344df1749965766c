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

/// A TCP relay between a client and the broker that can freeze: it keeps both connections open
/// but passes no more bytes either way, like a client whose host vanished.
struct Relay {
    address: std::net::SocketAddr,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    async fn to(broker: std::net::SocketAddr) -> Relay {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let frozen = std::sync::Arc::new(AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&frozen);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(broker)
                    .await
                    .expect("connect");
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                for (mut from, mut to) in [(client_read, server_write), (server_read, client_write)]
                {
                    let frozen = std::sync::Arc::clone(&flag);
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if frozen.load(Ordering::SeqCst) {
                                // Hold both sockets open and answer nothing, ever.
                                std::future::pending::<()>().await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Relay { address, frozen }
    }

    fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn a_client_that_stops_answering_is_noticed_and_its_stream_released(app: TestApp) {
    let relay = Relay::to(app.address).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", relay.address))
        .expect("endpoint")
        .connect_lazy();
    let mut through_relay = ApproverServiceClient::new(channel)
        .subscribe(pb::SubscribeRequest {
            filter: None,
            after_seq: None,
        })
        .await
        .expect("subscribe")
        .into_inner();
    through_relay
        .message()
        .await
        .expect("healthy")
        .expect("the snapshot marker");
    let refused = subscribe(&app)
        .await
        .err()
        .expect("the only place is taken");
    assert_eq!(refused.code(), Code::ResourceExhausted);

    // The client's host vanishes: keepalive pings go unanswered, the broker closes the
    // connection, and the subscriber's place is free again.
    relay.freeze();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match subscribe(&app).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the dead client's stream was never released"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
}

async fn one_agent_stream_follows_a_bounded_number_of_sessions(app: TestApp) {
    let mut stream = AgentStream::open(&app).await;
    let max = approval_broker::surface::grpc::agent::MAX_FOLLOWED_SESSIONS;
    for i in 0..=max {
        let resume = pb::agent_request::Request::Resume(pb::ResumeRequest {
            session_id: format!("s{i}"),
            call_ids: vec![],
        });
        stream.send(&format!("r{i}"), resume).await;
        match stream.next().await {
            pb::agent_response::Response::Resumed(_) if i < max => {}
            pb::agent_response::Response::Error(e) if i == max => {
                assert_eq!(e.code, Code::ResourceExhausted as i32, "{}", e.message);
            }
            other => panic!("resume {i}: {other:?}"),
        }
    }
    // The stream goes on for the sessions it follows.
    stream
        .submit("last", batch("s0", vec![call("c", "t", "{}")]))
        .await;
    stream.next_submitted().await;
}

/// The per-call result of an acknowledgement: `accepted`, `duplicate`, or the error's code.
fn ack_result(ack: &pb::CallAck) -> String {
    match &ack.result {
        Some(pb::call_ack::Result::Accepted(_)) => "accepted".into(),
        Some(pb::call_ack::Result::Duplicate(_)) => "duplicate".into(),
        Some(pb::call_ack::Result::Error(e)) => format!("{:?}", Code::from_i32(e.code)),
        None => "none".into(),
    }
}

async fn past_the_per_agent_pending_cap_new_calls_are_refused_each_naming_the_setting(
    app: TestApp,
) {
    // The cap is 3 (configured below).
    let first = submit(
        &app,
        batch("s1", vec![call("a", "t", "{}"), call("b", "t", "{}")]),
    )
    .await;
    assert_eq!(
        first.acks.iter().map(ack_result).collect::<Vec<_>>(),
        ["accepted", "accepted"]
    );

    // One more fits, in another session too; the rest of the batch is refused, call by call,
    // and a resubmitted call is still answered as stored.
    let second = submit(
        &app,
        batch(
            "s2",
            vec![
                call("c", "t", "{}"),
                call("d", "t", "{}"),
                call("e", "t", "{}"),
            ],
        ),
    )
    .await;
    assert_eq!(
        second.acks.iter().map(ack_result).collect::<Vec<_>>(),
        ["accepted", "ResourceExhausted", "ResourceExhausted"]
    );
    for ack in &second.acks[1..] {
        let Some(pb::call_ack::Result::Error(error)) = &ack.result else {
            unreachable!()
        };
        assert!(
            error.message.contains("--max-pending-per-agent"),
            "`{}` should name the setting",
            error.message
        );
    }
    let again = submit(
        &app,
        batch("s1", vec![call("a", "t", "{}"), call("f", "t", "{}")]),
    )
    .await;
    assert_eq!(
        again.acks.iter().map(ack_result).collect::<Vec<_>>(),
        ["duplicate", "ResourceExhausted"]
    );
    let stored = all_calls(&app).await;
    assert_eq!(stored.len(), 3, "nothing refused was stored");

    // A decision makes room for one call.
    approve(&app, "s1", "a").await;
    let after = submit(
        &app,
        batch("s2", vec![call("d", "t", "{}"), call("e", "t", "{}")]),
    )
    .await;
    assert_eq!(
        after.acks.iter().map(ack_result).collect::<Vec<_>>(),
        ["accepted", "ResourceExhausted"]
    );
    // The refused call was not stored: once there is room it is accepted as new.
    approve(&app, "s2", "c").await;
    let last = submit(&app, batch("s2", vec![call("e", "t", "{}")])).await;
    assert_eq!(
        last.acks.iter().map(ack_result).collect::<Vec<_>>(),
        ["accepted"]
    );
}

/// The cap counts what is pending once the submit has superseded what it replaces: a submit at
/// the cap that supersedes its session's pending calls (`supersede_pending`) makes room for
/// itself (on Postgres the count taken with the submit's locks must not serve then).
async fn a_submit_at_the_pending_cap_that_supersedes_makes_room_for_itself(app: TestApp) {
    // The cap is 2 (configured below).
    submit(
        &app,
        batch("s", vec![call("old1", "t", "{}"), call("old2", "t", "{}")]),
    )
    .await;
    let full = submit(&app, batch("s", vec![call("refused", "t", "{}")])).await;
    assert_eq!(
        full.acks.iter().map(ack_result).collect::<Vec<_>>(),
        ["ResourceExhausted"]
    );

    let replacing = submit(
        &app,
        pb::BatchSpec {
            supersede_pending: true,
            ..batch("s", vec![call("new1", "t", "{}"), call("new2", "t", "{}")])
        },
    )
    .await;
    assert_eq!(
        replacing.acks.iter().map(ack_result).collect::<Vec<_>>(),
        ["accepted", "accepted"]
    );
    assert_eq!(replacing.superseded.len(), 2);
}

backend_tests! {
    a_submit_at_the_pending_cap_that_supersedes_makes_room_for_itself => |c| c.requests.max_pending_per_agent = 2,
    one_agent_stream_follows_a_bounded_number_of_sessions,
    a_client_that_stops_answering_is_noticed_and_its_stream_released => |c| {
        c.streams.max_subscribers = 1;
        // Applies to every connection, the test's own too: a stall of a loaded machine must
        // not read as a dead client.
        c.connections.keepalive_interval = std::time::Duration::from_millis(500);
        c.connections.keepalive_timeout = std::time::Duration::from_secs(2);
    },
    past_the_subscriber_cap_a_new_subscriber_is_refused_and_the_others_are_served => |c| c.streams.max_subscribers = 2,
    past_the_agent_stream_cap_a_new_stream_is_refused_and_the_others_are_served => |c| c.streams.max_agent_streams = 2,
    past_the_per_agent_pending_cap_new_calls_are_refused_each_naming_the_setting => |c| c.requests.max_pending_per_agent = 3,
}
