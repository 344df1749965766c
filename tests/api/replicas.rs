//! Several broker processes on one Postgres database are one broker: outcomes decided through one
//! replica reach agents on another, every subscriber on every replica sees every event once and
//! in order, the first decision wins across replicas, a transaction that commits late never
//! makes a reader skip its event, and grants and rules made through one replica apply on all. Postgres only: without
//! `APPROVALS_TEST_POSTGRES_URL` they are compiled as ignored, and the summary counts them so.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use approval_broker::proto::v1 as pb;
use sqlx::Connection as _;
use tokio::sync::Mutex;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::*;

/// Three brokers on one fresh schema.
async fn three_replicas() -> [TestApp; 3] {
    let a = spawn_app_on(Backend::postgres(), |_| {}).await;
    let b = a.replica(|_| {}).await;
    let c = a.replica(|_| {}).await;
    [a, b, c]
}

fn agent(channel: &Channel) -> AgentServiceClient<Channel> {
    AgentServiceClient::new(channel.clone())
}

fn approver(channel: &Channel) -> ApproverServiceClient<Channel> {
    ApproverServiceClient::new(channel.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn an_outcome_decided_through_one_replica_reaches_the_agent_and_subscribers_on_others() {
    let [a, b, c] = three_replicas().await;
    let mut agent_stream = AgentStream::open(&a).await;
    let mut subscriber = Subscription::open(&b, pb::CallFilter::default(), None).await;
    let (snapshot, _) = subscriber.snapshot().await;
    assert!(snapshot.is_empty());

    agent_stream
        .submit(
            "r1",
            batch("s", vec![call("c1", "deploy", r#"{"env":"prod"}"#)]),
        )
        .await;
    agent_stream.next_submitted().await;
    let requested = subscriber.next().await;
    assert!(
        matches!(requested.event, Some(pb::approver_event::Event::Requested(ref call)) if call.call_id == "c1"),
        "{requested:?}"
    );

    approve(&c, "s", "c1").await;
    let outcome = agent_stream.next_outcome().await;
    assert_eq!(
        (outcome.call_id.as_str(), status_of(&outcome)),
        ("c1", CallStatus::Approved)
    );
    assert_eq!(agent_stream.next_batch_complete().await.outcomes.len(), 1);
    let resolved = subscriber.next().await;
    assert!(resolved.seq > requested.seq);
    assert!(
        matches!(resolved.event, Some(pb::approver_event::Event::Resolved(ref o)) if o.call_id == "c1"),
        "{resolved:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn the_same_call_decided_through_two_replicas_at_once_has_exactly_one_winner() {
    let [a, b, _c] = three_replicas().await;
    const CALLS: usize = 200;
    for chunk in 0..CALLS / 100 {
        let calls = (0..100)
            .map(|i| call(&format!("c{}", chunk * 100 + i), "t", "{}"))
            .collect();
        submit(
            &a,
            pb::BatchSpec {
                on_deny: pb::OnDeny::Independent as i32,
                ..batch("s", calls)
            },
        )
        .await;
    }
    for i in 0..CALLS {
        let call_id = format!("c{i}");
        let mut through_a = approver(&a.channel);
        let mut through_b = approver(&b.channel);
        let approve = decide_request("s", &call_id, pb::Decision::Approve, "");
        let deny = decide_request("s", &call_id, pb::Decision::Deny, "");
        let (ra, rb) = tokio::join!(through_a.decide(approve), through_b.decide(deny));
        let (winner, loser) = match (ra, rb) {
            (Ok(w), Err(l)) => (w.into_inner(), l),
            (Err(l), Ok(w)) => (w.into_inner(), l),
            other => panic!("{call_id}: exactly one decision must win, got {other:?}"),
        };
        assert!(!winner.replayed);
        let standing = winner.outcome.expect("outcome");
        assert_eq!(
            loser.code(),
            Code::FailedPrecondition,
            "{}",
            loser.message()
        );
        let name = if status_of(&standing) == CallStatus::Approved {
            "APPROVED"
        } else {
            "DENIED"
        };
        assert!(loser.message().contains(name), "{}", loser.message());
        assert_eq!(outcome_of(&a, "s", &call_id).await, standing);
    }
}

/// What one agent saw on its stream.
#[derive(Default)]
struct AgentLog {
    accepted: Vec<String>,
    outcomes: HashMap<String, usize>,
}

/// Collects every event a subscriber receives, from the start of the log.
fn collect_events(channel: Channel, into: Arc<Mutex<Vec<pb::ApproverEvent>>>) {
    tokio::spawn(async move {
        let mut stream = approver(&channel)
            .subscribe(pb::SubscribeRequest {
                filter: None,
                after_seq: Some(0),
            })
            .await
            .expect("subscribe")
            .into_inner();
        while let Some(Ok(event)) = stream.next().await {
            into.lock().await.push(event);
        }
    });
}

/// Decides every call requested, through the replica after the one it watches: approve most,
/// deny some. Calls already superseded, skipped or cancelled are refused; that is expected.
fn decide_everything(watch: Channel, decide_through: Channel, decided: Arc<AtomicUsize>) {
    tokio::spawn(async move {
        let mut stream = approver(&watch)
            .subscribe(pb::SubscribeRequest {
                filter: None,
                after_seq: None,
            })
            .await
            .expect("subscribe")
            .into_inner();
        let mut client = approver(&decide_through);
        while let Some(Ok(event)) = stream.next().await {
            let call = match event.event {
                Some(pb::approver_event::Event::Requested(call))
                | Some(pb::approver_event::Event::Snapshot(call)) => call,
                _ => continue,
            };
            let verdict = if call.call_id.ends_with("-3") && call.batch_id.as_bytes()[0] % 3 == 0 {
                pb::Decision::Deny
            } else {
                pb::Decision::Approve
            };
            let mut request = decide_request(&call.session_id, &call.call_id, verdict, "load");
            request.approver = "load-approver".into();
            if client.decide(request).await.is_ok() {
                decided.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
}

/// 2,000 calls submitted across three replicas by six agents, decided through other replicas,
/// with supersedes and cancels; optionally with the LISTEN connections killed throughout.
async fn load_across_replicas(kill_listeners: bool) {
    let replicas = three_replicas().await;
    let channels: Vec<Channel> = replicas.iter().map(|r| r.channel.clone()).collect();
    let logs: Vec<Arc<Mutex<Vec<pb::ApproverEvent>>>> =
        (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    for (channel, log) in channels.iter().zip(&logs) {
        collect_events(channel.clone(), Arc::clone(log));
    }
    let decided = Arc::new(AtomicUsize::new(0));
    for i in 0..3 {
        decide_everything(
            channels[i].clone(),
            channels[(i + 1) % 3].clone(),
            Arc::clone(&decided),
        );
    }

    let kills = Arc::new(AtomicUsize::new(0));
    let killer = kill_listeners.then(|| {
        let url = replicas[0].database_url.clone();
        let kills = Arc::clone(&kills);
        tokio::spawn(async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
            loop {
                let killed: Vec<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE query LIKE 'LISTEN%' \
                     AND query LIKE '%' || current_schema() || '%'",
                )
                .fetch_all(&mut conn)
                .await
                .expect("terminate listeners");
                kills.fetch_add(killed.len(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    });

    const AGENTS: usize = 6;
    const BATCHES: usize = 400;
    const CALLS_PER_BATCH: usize = 5;
    let mut agents = Vec::new();
    for agent_no in 0..AGENTS {
        let channel = channels[agent_no % 3].clone();
        agents.push(tokio::spawn(async move {
            let session = format!("agent{agent_no}");
            let (requests, rx) = tokio::sync::mpsc::channel(16);
            let mut responses = agent(&channel)
                .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .expect("connect")
                .into_inner();
            let mut log = AgentLog::default();
            let mut awaiting_acks = 0usize;
            for b in (agent_no..BATCHES).step_by(AGENTS) {
                let calls = (0..CALLS_PER_BATCH)
                    .map(|k| pb::CallSpec {
                        // One call in each batch asks the user; a newer question supersedes it.
                        supersede_key: if k == 4 { "ask".into() } else { String::new() },
                        ..call(
                            &format!("b{b}-{k}"),
                            "tool",
                            &format!(r#"{{"b":{b},"k":{k}}}"#),
                        )
                    })
                    .collect();
                let on_deny = if b % 2 == 0 {
                    pb::OnDeny::SkipRest
                } else {
                    pb::OnDeny::Independent
                };
                let spec = pb::BatchSpec {
                    on_deny: on_deny as i32,
                    ..batch(&session, calls)
                };
                let submit = pb::agent_request::Request::Submit(spec);
                requests
                    .send(pb::AgentRequest {
                        request_id: format!("b{b}"),
                        request: Some(submit),
                    })
                    .await
                    .expect("send");
                awaiting_acks += 1;
                // Every tenth batch is cancelled as soon as it is acknowledged.
                while awaiting_acks > 0 {
                    let message =
                        tokio::time::timeout(Duration::from_secs(60), responses.message())
                            .await
                            .expect("a response in time")
                            .expect("healthy")
                            .expect("open");
                    match message.response.expect("response") {
                        pb::agent_response::Response::Submitted(acks) => {
                            awaiting_acks -= 1;
                            for ack in acks.acks {
                                assert!(
                                    matches!(ack.result, Some(pb::call_ack::Result::Accepted(_))),
                                    "{ack:?}"
                                );
                                log.accepted.push(ack.call_id);
                            }
                            if b % 10 == 0 {
                                let cancel = pb::agent_request::Request::Cancel(pb::CancelTarget {
                                    session_id: session.clone(),
                                    target: Some(pb::cancel_target::Target::BatchId(acks.batch_id)),
                                    reason: "changed plans".into(),
                                });
                                requests
                                    .send(pb::AgentRequest {
                                        request_id: format!("cancel{b}"),
                                        request: Some(cancel),
                                    })
                                    .await
                                    .expect("send");
                            }
                        }
                        pb::agent_response::Response::Outcome(outcome) => {
                            *log.outcomes.entry(outcome.call_id).or_default() += 1;
                        }
                        _ => {}
                    }
                }
            }
            // Every accepted call gets its outcome on this stream.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            while log.accepted.iter().any(|id| !log.outcomes.contains_key(id)) {
                let message = tokio::time::timeout_at(deadline, responses.message())
                    .await
                    .unwrap_or_else(|_| {
                        let missing = log
                            .accepted
                            .iter()
                            .filter(|id| !log.outcomes.contains_key(*id))
                            .count();
                        panic!("{session}: {missing} outcomes never arrived")
                    })
                    .expect("healthy")
                    .expect("open");
                if let Some(pb::agent_response::Response::Outcome(outcome)) = message.response {
                    *log.outcomes.entry(outcome.call_id).or_default() += 1;
                }
            }
            // Anything further would be a duplicate: give it a moment to show.
            while let Ok(Ok(Some(message))) =
                tokio::time::timeout(Duration::from_millis(500), responses.message()).await
            {
                if let Some(pb::agent_response::Response::Outcome(outcome)) = message.response {
                    *log.outcomes.entry(outcome.call_id).or_default() += 1;
                }
            }
            log
        }));
    }
    let mut accepted = 0;
    for agent in agents {
        let log = agent.await.expect("agent");
        accepted += log.accepted.len();
        for (call_id, count) in &log.outcomes {
            assert_eq!(
                *count, 1,
                "{call_id}: each outcome reaches its agent exactly once"
            );
        }
        assert_eq!(log.outcomes.len(), log.accepted.len());
    }
    assert_eq!(accepted, BATCHES * CALLS_PER_BATCH);
    if let Some(killer) = killer {
        killer.abort();
        assert!(
            kills.load(Ordering::Relaxed) > 0,
            "the listeners were really killed"
        );
    }

    // Every subscriber, on every replica, saw the whole log: each event once, in order.
    let last_seq = {
        let mut sub = Subscription::open(&replicas[0], pb::CallFilter::default(), None).await;
        sub.snapshot().await.1
    };
    let expected_events = 2 * BATCHES * CALLS_PER_BATCH;
    assert_eq!(
        last_seq as usize, expected_events,
        "one requested and one resolved event per call"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for (i, log) in logs.iter().enumerate() {
        loop {
            let seen = log.lock().await.len();
            if seen >= expected_events {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "replica {i}'s subscriber has {seen} events"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log = log.lock().await;
        let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
        assert_eq!(
            seqs,
            (1..=last_seq).collect::<Vec<_>>(),
            "replica {i}: every event once, in order"
        );
        let mut resolved_per_call: BTreeMap<(String, String), usize> = BTreeMap::new();
        for event in log.iter() {
            if let Some(pb::approver_event::Event::Resolved(o)) = &event.event {
                *resolved_per_call
                    .entry((o.session_id.clone(), o.call_id.clone()))
                    .or_default() += 1;
            }
        }
        assert_eq!(resolved_per_call.len(), BATCHES * CALLS_PER_BATCH);
        assert!(resolved_per_call.values().all(|n| *n == 1));
    }
    // The outcomes themselves: a mix of every kind the load produces.
    let calls = all_calls(&replicas[1]).await;
    let mut kinds: BTreeMap<i32, usize> = BTreeMap::new();
    for c in &calls {
        *kinds.entry(c.status).or_default() += 1;
    }
    for kind in [
        CallStatus::Approved,
        CallStatus::Superseded,
        CallStatus::Cancelled,
    ] {
        assert!(
            kinds.get(&(kind as i32)).copied().unwrap_or(0) > 0,
            "{kind:?} in {kinds:?}"
        );
    }
    assert!(
        !kinds.contains_key(&(CallStatus::Pending as i32)),
        "{kinds:?}"
    );
    assert!(decided.load(Ordering::Relaxed) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn under_load_across_replicas_every_outcome_and_every_event_arrives_exactly_once() {
    load_across_replicas(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn killing_the_listen_connections_under_load_loses_nothing() {
    load_across_replicas(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn an_event_whose_transaction_commits_late_is_not_skipped() {
    let [a, b, c] = three_replicas().await;
    submit(&a, batch("s", vec![call("fast", "t", "{}")])).await;
    let mut subscriber = Subscription::open(&c, pb::CallFilter::default(), None).await;
    let (pending, _) = subscriber.snapshot().await;
    assert_eq!(pending.len(), 1);

    // A slow writer: a transaction that stores a call and its Requested event, as a broker's
    // submit does, taking an event id now, and commits only at the end of the test.
    let mut slow_conn = sqlx::PgConnection::connect(&a.database_url)
        .await
        .expect("connect");
    let mut slow = slow_conn.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO batches (batch_id, agent, session_id, on_deny, size, created_at) \
         VALUES ('slow-batch', 'default', 's', 1, 1, 0)",
    )
    .execute(&mut *slow)
    .await
    .expect("batch");
    let slow_call: i64 = sqlx::query_scalar(
        "INSERT INTO calls (agent, session_id, call_id, batch_id, position, tool, input, title, \
         message, workspace, created_at) \
         VALUES ('default', 's', 'slow', 'slow-batch', 0, 't', '{}', '', '', '', 0) RETURNING id",
    )
    .fetch_one(&mut *slow)
    .await
    .expect("call");
    let slow_event: i64 = sqlx::query_scalar(
        "INSERT INTO events (kind, call_rowid, created_at) VALUES (1, $1, 0) RETURNING id",
    )
    .bind(slow_call)
    .fetch_one(&mut *slow)
    .await
    .expect("event");

    // A later transaction, with a higher event id, commits first: subscribers see its event.
    approve(&b, "s", "fast").await;
    let fast_event = subscriber.next().await;
    assert!(
        matches!(fast_event.event, Some(pb::approver_event::Event::Resolved(ref o)) if o.call_id == "fast"),
        "{fast_event:?}"
    );

    // The slow transaction commits now. Its event was written first but must come after.
    slow.commit().await.expect("commit");
    let slow_seen = subscriber.next().await;
    assert!(
        matches!(slow_seen.event, Some(pb::approver_event::Event::Requested(ref c)) if c.call_id == "slow"),
        "the late commit's event is delivered, not skipped: {slow_seen:?}"
    );
    assert!(slow_seen.seq > fast_event.seq);

    // The interleaving really happened: the slow event holds the lower id, the higher seq.
    let mut probe = sqlx::PgConnection::connect(&a.database_url)
        .await
        .expect("connect");
    let fast_row: (i64, i64) = sqlx::query_as(
        "SELECT e.id, e.seq FROM events e JOIN calls c ON c.id = e.call_rowid \
         WHERE e.kind = 2 AND c.call_id = 'fast'",
    )
    .fetch_one(&mut probe)
    .await
    .expect("fast event");
    let slow_seq: i64 = sqlx::query_scalar("SELECT seq FROM events WHERE id = $1")
        .bind(slow_event)
        .fetch_one(&mut probe)
        .await
        .expect("slow event");
    assert!(
        slow_event < fast_row.0,
        "the slow transaction took its event id first"
    );
    assert!(slow_seq > fast_row.1, "but its event is numbered after");

    // A subscriber resuming from before both sees both, in the same order; the broker treats
    // the slow call as any other.
    let mut resumed =
        Subscription::open(&a, pb::CallFilter::default(), Some(fast_event.seq - 1)).await;
    assert_eq!(resumed.next().await.seq, fast_event.seq);
    assert_eq!(resumed.next().await.seq, slow_seen.seq);
    approve(&a, "s", "slow").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn every_replica_sweeps_deadlines_and_each_call_expires_exactly_once() {
    let [a, b, c] = three_replicas().await;
    let deadline = {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            + Duration::from_secs(2);
        prost_types::Timestamp {
            seconds: t.as_secs() as i64,
            nanos: t.subsec_nanos() as i32,
        }
    };
    let calls = (0..100)
        .map(|i| pb::CallSpec {
            deadline: Some(deadline),
            ..call(&format!("c{i}"), "t", "{}")
        })
        .collect();
    submit(
        &b,
        pb::BatchSpec {
            on_deny: pb::OnDeny::Independent as i32,
            ..batch("s", calls)
        },
    )
    .await;
    let mut log = Subscription::open(&c, pb::CallFilter::default(), Some(0)).await;
    let mut resolved: BTreeMap<String, usize> = BTreeMap::new();
    let mut batch_completions = 0;
    let mut watch = agent(&a.channel)
        .watch_outcomes(pb::WatchOutcomesRequest {
            session_id: "s".into(),
            call_ids: vec![],
        })
        .await
        .expect("watch")
        .into_inner();
    while resolved.len() < 100 {
        if let Some(pb::approver_event::Event::Resolved(o)) = log.next().await.event {
            assert_eq!(status_of(&o), CallStatus::Expired);
            assert_eq!(o.decided_by, "deadline");
            *resolved.entry(o.call_id).or_default() += 1;
        }
    }
    // Nothing more comes: no call expired twice.
    let more = tokio::time::timeout(Duration::from_millis(1500), log.stream.message()).await;
    assert!(more.is_err(), "an extra event: {more:?}");
    assert!(resolved.values().all(|n| *n == 1));
    while let Ok(Some(Ok(message))) =
        tokio::time::timeout(Duration::from_millis(500), watch.next()).await
    {
        if let Some(pb::watch_outcomes_response::Event::BatchComplete(_)) = message.event {
            batch_completions += 1;
        }
    }
    assert_eq!(batch_completions, 1, "the batch completes exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_denial_skips_the_rest_of_its_batch_atomically_across_replicas() {
    let [a, b, c] = three_replicas().await;
    let mut watch = agent(&c.channel)
        .watch_outcomes(pb::WatchOutcomesRequest {
            session_id: "s".into(),
            call_ids: vec![],
        })
        .await
        .expect("watch")
        .into_inner();
    const ROUNDS: usize = 50;
    for round in 0..ROUNDS {
        let (x, y) = (format!("x{round}"), format!("y{round}"));
        submit(
            &a,
            batch("s", vec![call(&x, "t", "{}"), call(&y, "t", "{}")]),
        )
        .await;
        // Deny x through A while y is approved through B.
        let mut through_a = approver(&a.channel);
        let mut through_b = approver(&b.channel);
        let (denied, approved) = tokio::join!(
            through_a.decide(decide_request("s", &x, pb::Decision::Deny, "")),
            through_b.decide(decide_request("s", &y, pb::Decision::Approve, "")),
        );
        assert!(
            denied.is_ok(),
            "the denial of a pending call stands: {denied:?}"
        );
        let x_outcome = outcome_of(&c, "s", &x).await;
        let y_outcome = outcome_of(&c, "s", &y).await;
        assert_eq!(status_of(&x_outcome), CallStatus::Denied);
        match approved {
            // The approval came first: it stands, nothing was skipped.
            Ok(_) => assert_eq!(status_of(&y_outcome), CallStatus::Approved),
            // The denial came first and skipped y: the approval was refused, naming SKIPPED.
            Err(status) => {
                assert_eq!(status.code(), Code::FailedPrecondition);
                assert!(status.message().contains("SKIPPED"), "{}", status.message());
                assert_eq!(status_of(&y_outcome), CallStatus::Skipped);
            }
        }
    }
    // Every batch completed exactly once, with both outcomes.
    let mut completions = 0;
    while completions < ROUNDS {
        let message = tokio::time::timeout(PATIENCE, watch.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("healthy");
        if let Some(pb::watch_outcomes_response::Event::BatchComplete(done)) = message.event {
            assert_eq!(done.outcomes.len(), 2);
            completions += 1;
        }
    }
    let extra = tokio::time::timeout(Duration::from_millis(1500), async {
        loop {
            match watch.next().await {
                Some(Ok(m))
                    if matches!(
                        m.event,
                        Some(pb::watch_outcomes_response::Event::BatchComplete(_))
                    ) =>
                {
                    return m;
                }
                Some(Ok(_)) => continue,
                _ => std::future::pending().await,
            }
        }
    })
    .await;
    assert!(extra.is_err(), "a batch completed twice: {extra:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn concurrent_supersedes_through_two_replicas_leave_one_pending_question() {
    let [a, b, c] = three_replicas().await;
    let ask = |id: String| pb::CallSpec {
        supersede_key: "ask".into(),
        ..call(&id, "ask_user", "{}")
    };
    for round in 0..50 {
        let mut through_a = agent(&a.channel);
        let mut through_b = agent(&b.channel);
        let first = pb::SubmitRequest {
            batch: Some(batch("s", vec![ask(format!("a{round}"))])),
        };
        let second = pb::SubmitRequest {
            batch: Some(batch("s", vec![ask(format!("b{round}"))])),
        };
        let (r1, r2) = tokio::join!(through_a.submit(first), through_b.submit(second));
        r1.expect("submit through A");
        r2.expect("submit through B");
        let pending = c
            .approver()
            .list_pending(pb::ListPendingRequest {
                filter: Some(pb::CallFilter {
                    session_id: "s".into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner()
            .calls;
        assert_eq!(
            pending.len(),
            1,
            "round {round}: one question stands: {pending:?}"
        );
    }
    let calls = all_calls(&c).await;
    let superseded = calls
        .iter()
        .filter(|c| c.status == CallStatus::Superseded as i32)
        .count();
    assert_eq!(superseded, 99, "every question but the last was superseded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_batch_decided_through_two_replicas_at_once_completes_exactly_once() {
    decided_through_two_replicas_at_once(pb::Decision::Deny).await;
}

/// Two approvals of a batch's two calls at once, through two replicas: each is written by one
/// statement (`approve_call`), which flags the batch complete only if no other call of it is
/// pending, seen after the batch's lock; exactly one of them does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_batch_approved_through_two_replicas_at_once_completes_exactly_once() {
    decided_through_two_replicas_at_once(pb::Decision::Approve).await;
}

/// Rounds of a two-call batch whose first call is approved through one replica while the
/// second is decided `second` through another, watched from a third: every batch completes
/// exactly once, with both outcomes.
async fn decided_through_two_replicas_at_once(second: pb::Decision) {
    let [a, b, c] = three_replicas().await;
    let mut watch = agent(&c.channel)
        .watch_outcomes(pb::WatchOutcomesRequest {
            session_id: "s".into(),
            call_ids: vec![],
        })
        .await
        .expect("watch")
        .into_inner();
    const ROUNDS: usize = 50;
    for round in 0..ROUNDS {
        let (x, y) = (format!("x{round}"), format!("y{round}"));
        let spec = pb::BatchSpec {
            on_deny: pb::OnDeny::Independent as i32,
            ..batch("s", vec![call(&x, "t", "{}"), call(&y, "t", "{}")])
        };
        submit(&a, spec).await;
        // Each replica decides one call of the batch; neither touches the other's call.
        let mut through_a = approver(&a.channel);
        let mut through_b = approver(&b.channel);
        let (rx, ry) = tokio::join!(
            through_a.decide(decide_request("s", &x, pb::Decision::Approve, "")),
            through_b.decide(decide_request("s", &y, second, "")),
        );
        rx.expect("approve x");
        ry.expect("decide y");
    }
    let mut completed = std::collections::BTreeSet::new();
    while completed.len() < ROUNDS {
        let message = tokio::time::timeout(PATIENCE, watch.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {ROUNDS} batches completed", completed.len()))
            .expect("open")
            .expect("healthy");
        if let Some(pb::watch_outcomes_response::Event::BatchComplete(done)) = message.event {
            assert_eq!(done.outcomes.len(), 2);
            assert!(completed.insert(done.batch_id), "a batch completed twice");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn writers_racing_on_one_batch_never_deadlock() {
    let [a, b, _c] = three_replicas().await;
    const ROUNDS: usize = 60;
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let session = format!("s{round}");
        let calls = (0..3).map(|i| call(&format!("c{i}"), "t", "{}")).collect();
        let submitted = submit(&a, batch(&session, calls)).await;
        // Deny the last call (skipping its siblings) through A while B cancels the batch, or
        // supersedes everything pending in the session.
        let mut approver_a = approver(&a.channel);
        let mut agent_b = agent(&b.channel);
        let deny = decide_request(&session, "c2", pb::Decision::Deny, "");
        let (decided, other) = if round % 2 == 0 {
            let cancel = pb::CancelRequest {
                target: Some(pb::CancelTarget {
                    session_id: session.clone(),
                    target: Some(pb::cancel_target::Target::BatchId(submitted.batch_id)),
                    reason: String::new(),
                }),
            };
            let (d, c) = tokio::join!(approver_a.decide(deny), agent_b.cancel(cancel));
            (d.map(|_| ()), c.map(|_| ()))
        } else {
            let newer = pb::SubmitRequest {
                batch: Some(pb::BatchSpec {
                    supersede_pending: true,
                    ..batch(&session, vec![call("newer", "t", "{}")])
                }),
            };
            let (d, s) = tokio::join!(approver_a.decide(deny), agent_b.submit(newer));
            (d.map(|_| ()), s.map(|_| ()))
        };
        for result in [decided, other] {
            if let Err(status) = result
                && status.code() != Code::FailedPrecondition
            {
                failures.push(format!("round {round}: {status:?}"));
            }
        }
        // Whatever the order, the batch ended whole: every call decided, once.
        for id in ["c0", "c1", "c2"] {
            assert!(
                matches!(
                    states(&a, &session, &[id]).await[0].state,
                    Some(pb::call_state::State::Outcome(_))
                ),
                "round {round}: {id} decided"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} refusals:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_resume_of_named_calls_never_hides_another_outcome_of_a_followed_session() {
    let [a, b, _c] = three_replicas().await;
    for round in 0..20 {
        let session = format!("s{round}");
        let mut stream = AgentStream::open(&a).await;
        let spec = pb::BatchSpec {
            on_deny: pb::OnDeny::Independent as i32,
            ..batch(&session, vec![call("a", "t", "{}"), call("b", "t", "{}")])
        };
        stream.submit("r", spec).await;
        stream.next_submitted().await;
        // b is decided on another replica while the agent asks again for a alone.
        approve(&b, &session, "b").await;
        let resume = pb::agent_request::Request::Resume(pb::ResumeRequest {
            session_id: session.clone(),
            call_ids: vec!["a".into()],
        });
        stream.send("resume", resume).await;
        let mut b_pushed = false;
        let mut resumed = false;
        while !(b_pushed && resumed) {
            match stream.next().await {
                pb::agent_response::Response::Outcome(o) if o.call_id == "b" => b_pushed = true,
                pb::agent_response::Response::Resumed(_) => resumed = true,
                _ => {}
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_grant_created_through_one_replica_applies_to_a_submit_on_another() {
    let [a, b, c] = three_replicas().await;
    submit(
        &a,
        batch(
            "s",
            vec![call("c1", "shell", r#"{"command":"git status"}"#)],
        ),
    )
    .await;
    let grant = grant_by_deciding(
        &a,
        "s",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Session,
        Some(fields(vec![prefix("command", "git status")])),
    )
    .await;
    let by_grant = format!("grant:{}", grant.id);
    let input = r#"{"command":"git status --short"}"#;
    let response = submit(&b, batch("s", vec![call("c2", "shell", input)])).await;
    assert_eq!(ack_status(&response, 0), CallStatus::Approved);
    assert_eq!(response.outcomes[0].decided_by, by_grant);
    let explained = explain_inline(&c, "s", "", "shell", input).await;
    assert_eq!(
        explained.decided_by, by_grant,
        "every replica reads the same grants"
    );

    // A revocation through one replica applies on the others too.
    AdminServiceClient::new(c.channel.clone())
        .revoke_grant(pb::RevokeGrantRequest {
            target: Some(pb::revoke_grant_request::Target::Id(grant.id)),
            agent: String::new(),
        })
        .await
        .expect("revoke");
    let response = submit(&a, batch("s", vec![call("c3", "shell", input)])).await;
    assert_eq!(ack_status(&response, 0), CallStatus::Pending);
    // And a rule made through one replica applies on another.
    create_rule(&b, rule("no-shell", "shell", pb::Effect::Deny, 0, None)).await;
    let response = submit(&c, batch("s", vec![call("c4", "shell", input)])).await;
    assert_eq!(response.outcomes[0].decided_by, "policy:no-shell");
}

/// Submits of calls a grant will match, through two replicas, racing the grant's creation
/// through a third: each call is decided by the grant, at its submit or at the grant's creation;
/// none is left pending (the grant saw it, or it saw the grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_grant_racing_matching_submits_across_replicas_leaves_none_of_them_pending() {
    let [a, b, c] = three_replicas().await;
    const PER_SUBMITTER: usize = 60;
    for round in 0..3 {
        let session = format!("race{round}");
        let tool = format!("tool{round}");
        submit(&a, batch(&session, vec![call("seed", &tool, "{}")])).await;
        let mut submitters = Vec::new();
        for (n, replica) in [&b, &c, &b, &c].into_iter().enumerate() {
            let mut client = AgentServiceClient::new(replica.channel.clone());
            let (session, tool) = (session.clone(), tool.clone());
            submitters.push(tokio::spawn(async move {
                for i in 0..PER_SUBMITTER {
                    let spec = batch(
                        &session,
                        vec![call(&format!("c{n}-{i}"), &tool, r#"{"i":1}"#)],
                    );
                    client
                        .submit(pb::SubmitRequest { batch: Some(spec) })
                        .await
                        .expect("submit");
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(20 * round as u64 + 10)).await;
        let grant = grant_by_deciding(
            &a,
            &session,
            "seed",
            pb::Decision::Approve,
            pb::Scope::Session,
            Some(any_input()),
        )
        .await;
        for submitter in submitters {
            submitter.await.expect("submitter");
        }
        let by_grant = format!("grant:{}", grant.id);
        let calls: Vec<pb::Call> = all_calls(&a)
            .await
            .into_iter()
            .filter(|c| c.session_id == session && c.call_id != "seed")
            .collect();
        assert_eq!(calls.len(), 4 * PER_SUBMITTER);
        let pending: Vec<&str> = calls
            .iter()
            .filter(|c| c.status == CallStatus::Pending as i32)
            .map(|c| c.call_id.as_str())
            .collect();
        let decided_later = calls
            .iter()
            .filter(|c| c.outcome.as_ref().is_some_and(|o| o.decided_by == by_grant))
            .count();
        assert!(
            pending.is_empty(),
            "round {round}: left pending although the grant matches: {pending:?}"
        );
        assert_eq!(
            decided_later,
            calls.len(),
            "round {round}: every one by the grant"
        );
    }
}

/// Numbering events sends a notification that wakes the other replicas, telling them how far it
/// numbered, and names its sender, so it does not wake the replica that sent it (whose pump
/// reads right after numbering); a reader other than the pump that numbers events wakes its own
/// replica's pump itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn numbering_wakes_the_other_replicas_but_not_its_own() {
    use approval_broker::domain::ToolResultTexts;
    use approval_broker::store::{EventLog, PostgresStore};

    let url = postgres_url();
    // Two stores and no broker: nothing else numbers events on this schema.
    let schema = fresh_schema(&url).await;
    let url = schema.url();
    let open = || PostgresStore::open(&url, 2, false, ToolResultTexts::default(), None);
    let (one, two) = (
        open().await.expect("store one"),
        open().await.expect("store two"),
    );
    let (woken_one, woken_two) = (
        one.remote_commits().expect("one is woken"),
        two.remote_commits().expect("two is woken"),
    );
    // Each listener wakes its replica once when it starts listening; after that, both listen.
    let wait = Duration::from_secs(10);
    for woken in [&woken_one, &woken_two] {
        let through = tokio::time::timeout(wait, woken.announced())
            .await
            .expect("woken once listening");
        assert_eq!(
            through,
            u64::MAX,
            "a listener starting knows nothing of how far"
        );
    }

    // Events committed without a number (as every broker commits them, to be numbered after
    // commit), numbered by replica one.
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    let mut commit_unnumbered = async |id: &str| {
        sqlx::query(
            "WITH b AS (INSERT INTO batches (batch_id, agent, session_id, on_deny, size, \
             created_at) VALUES ($1, 'default', 's', 1, 1, 0)), \
             c AS (INSERT INTO calls (agent, session_id, call_id, batch_id, position, tool, \
             input, title, message, workspace, created_at) VALUES ('default', 's', $1, $1, 0, \
             't', '{}', '', '', '', 0) RETURNING id) \
             INSERT INTO events (kind, call_rowid, created_at) SELECT 1, id, 0 FROM c",
        )
        .bind(id)
        .execute(&mut conn)
        .await
        .expect("an unnumbered event");
    };
    commit_unnumbered("by-hand").await;
    assert_eq!(one.sequence_events().await.expect("numbering"), 1);

    let through = tokio::time::timeout(wait, woken_two.announced())
        .await
        .expect("the other replica is woken");
    assert_eq!(through, 1, "told how far the log is numbered");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), woken_one.announced())
            .await
            .is_err(),
        "a replica is not woken by its own notification"
    );

    // Numbered by a reader of replica one (here `latest_seq`), not its pump: it wakes one's
    // pump itself.
    commit_unnumbered("by-hand-2").await;
    assert_eq!(one.latest_seq().await.expect("latest"), 2);
    let through = tokio::time::timeout(wait, woken_one.announced())
        .await
        .expect("the reader wakes its own replica's pump");
    assert_eq!(through, u64::MAX, "the pump reads what its reader numbered");
}
