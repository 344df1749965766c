//! The approvers' stream, `ApproverService.Subscribe`: a snapshot of the matching pending calls,
//! its marker, then live `requested` and `resolved` events in sequence order for matching calls
//! only, the same for every subscriber; resuming after a sequence number without gap or
//! duplicate; and a subscriber that falls too far behind is told where to resume from.

use std::time::{SystemTime, UNIX_EPOCH};

use approval_broker::proto::v1 as pb;
use pb::approver_event::Event as E;
use tonic::Code;

use crate::helpers::*;

fn filter(session: &str, workspace: &str, tool: &str) -> pb::CallFilter {
    pb::CallFilter {
        session_id: session.into(),
        workspace: workspace.into(),
        tool: tool.into(),
        ..Default::default()
    }
}

fn everything() -> pb::CallFilter {
    pb::CallFilter::default()
}

/// A batch whose calls are decided each on its own (a denial skips nothing).
fn independent_batch(session: &str, calls: Vec<pb::CallSpec>) -> pb::BatchSpec {
    pb::BatchSpec {
        on_deny: pb::OnDeny::Independent as i32,
        ..batch(session, calls)
    }
}

/// A call with a workspace.
fn call_in(call_id: &str, tool: &str, workspace: &str) -> pb::CallSpec {
    pb::CallSpec {
        workspace: workspace.into(),
        ..call(call_id, tool, "{}")
    }
}

/// What an event is about, e.g. `requested a`, `resolved b`, `snapshot c`, `snapshot_complete`.
fn label(event: &pb::ApproverEvent) -> String {
    match event.event.as_ref().expect("an event") {
        E::Snapshot(c) => format!("snapshot {}", c.call_id),
        E::SnapshotComplete(_) => "snapshot_complete".into(),
        E::Requested(c) => format!("requested {}", c.call_id),
        E::Resolved(o) => format!("resolved {}", o.call_id),
        E::Escalation(f) => format!(
            "escalation {} step {}",
            f.call.as_ref().map_or("", |c| c.call_id.as_str()),
            f.step
        ),
        E::ApprovalRecorded(c) => format!("approval_recorded {}", c.call_id),
    }
}

fn labels(events: &[pb::ApproverEvent]) -> Vec<String> {
    events.iter().map(label).collect()
}

fn requested(event: &pb::ApproverEvent) -> &pb::Call {
    match &event.event {
        Some(E::Requested(call)) => call,
        other => panic!("expected a requested event, got {other:?}"),
    }
}

fn resolved(event: &pb::ApproverEvent) -> &pb::Outcome {
    match &event.event {
        Some(E::Resolved(outcome)) => outcome,
        other => panic!("expected a resolved event, got {other:?}"),
    }
}

fn assert_strictly_increasing(events: &[pb::ApproverEvent], after: u64) {
    let mut last = after;
    for event in events {
        assert!(
            event.seq > last,
            "seq {} after {last}: {:?}",
            event.seq,
            labels(events)
        );
        last = event.seq;
    }
}

/// Reads the snapshot: every item must carry the marker's sequence number, and the marker the
/// number of items. Returns the calls and that sequence number.
async fn read_snapshot(sub: &mut Subscription) -> (Vec<pb::Call>, u64) {
    let mut items = Vec::new();
    loop {
        let event = sub.next().await;
        match event.event {
            Some(E::Snapshot(call)) => items.push((event.seq, call)),
            Some(E::SnapshotComplete(done)) => {
                assert_eq!(
                    done.pending as usize,
                    items.len(),
                    "the marker counts the items"
                );
                for (seq, call) in &items {
                    assert_eq!(
                        *seq, event.seq,
                        "{} carries the snapshot's seq",
                        call.call_id
                    );
                    assert_eq!(call.status, CallStatus::Pending as i32);
                    assert!(call.outcome.is_none());
                }
                return (items.into_iter().map(|(_, c)| c).collect(), event.seq);
            }
            other => panic!("expected the snapshot, got {other:?}"),
        }
    }
}

/// Reads events up to and including the one labelled `last`.
async fn read_until(sub: &mut Subscription, last: &str) -> Vec<pb::ApproverEvent> {
    let mut events = Vec::new();
    loop {
        let event = sub.next().await;
        let done = label(&event) == last;
        events.push(event);
        if done {
            return events;
        }
    }
}

/// Reads exactly `n` events.
async fn read_n(sub: &mut Subscription, n: usize) -> Vec<pb::ApproverEvent> {
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        events.push(sub.next().await);
    }
    events
}

fn in_an_hour() -> prost_types::Timestamp {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    prost_types::Timestamp {
        seconds: now as i64 + 3600,
        nanos: 0,
    }
}

async fn subscribing_without_a_cursor_sends_a_snapshot_of_exactly_the_matching_pending_calls(
    app: TestApp,
) {
    let mut watcher = Subscription::open(&app, everything(), None).await;
    let (calls, _) = read_snapshot(&mut watcher).await;
    assert!(calls.is_empty());

    let mut first = independent_batch(
        "s1",
        vec![
            call_in("p1", "read", "alpha"),
            call_in("d1", "read", "alpha"),
        ],
    );
    first.calls[0].title = "Read a file".into();
    submit(&app, first).await;
    approve(&app, "s1", "d1").await; // decided: in no snapshot
    submit(&app, batch("s1", vec![call_in("p2", "write", "beta")])).await;
    submit(&app, batch("s2", vec![call_in("p3", "read", "beta")])).await;
    // The log's last event so far: the snapshots are taken at it.
    let log = read_until(&mut watcher, "requested p3").await;
    let latest = log.last().expect("events").seq;

    let cases = [
        (everything(), vec!["p1", "p2", "p3"]),
        (filter("s1", "", ""), vec!["p1", "p2"]),
        (filter("", "beta", ""), vec!["p2", "p3"]),
        (filter("", "", "read"), vec!["p1", "p3"]),
        (filter("s1", "alpha", "read"), vec!["p1"]),
        (filter("s3", "", ""), vec![]),
    ];
    for (filter, expected) in cases {
        let mut sub = Subscription::open(&app, filter.clone(), None).await;
        let (calls, seq) = read_snapshot(&mut sub).await;
        assert_eq!(seq, latest, "the snapshot's seq for {filter:?}");
        let mut ids: Vec<&str> = calls.iter().map(|c| c.call_id.as_str()).collect();
        ids.sort();
        assert_eq!(ids, expected, "the snapshot for {filter:?}");
        for call in &calls {
            assert!(filter.session_id.is_empty() || call.session_id == filter.session_id);
            assert!(filter.workspace.is_empty() || call.workspace == filter.workspace);
            assert!(filter.tool.is_empty() || call.tool == filter.tool);
        }
    }

    // Snapshot items are whole calls.
    let mut sub = Subscription::open(&app, filter("s1", "", "read"), None).await;
    let (calls, _) = read_snapshot(&mut sub).await;
    let p1 = &calls[0];
    assert_eq!(p1.session_id, "s1");
    assert_eq!(p1.agent, "default");
    assert_eq!(p1.title, "Read a file");
    assert_eq!(p1.workspace, "alpha");
    assert_eq!(p1.position, 0);
    assert_eq!(p1.batch_size, 2);
    assert!(p1.created_at.is_some());
}

async fn live_requested_and_resolved_events_reach_subscribers_for_matching_calls_only_in_seq_order(
    app: TestApp,
) {
    let mut by_session = Subscription::open(&app, filter("s1", "", ""), None).await;
    let mut by_workspace = Subscription::open(&app, filter("", "alpha", ""), None).await;
    let mut by_tool = Subscription::open(&app, filter("", "", "deploy"), None).await;
    let mut snapshot_seqs = Vec::new();
    for sub in [&mut by_session, &mut by_workspace, &mut by_tool] {
        let (calls, seq) = read_snapshot(sub).await;
        assert!(calls.is_empty());
        snapshot_seqs.push(seq);
    }

    let deadline = in_an_hour();
    // Matches no filter.
    submit(&app, batch("s2", vec![call_in("x", "read", "beta")])).await;
    // `a` matches every filter, `b` only the session.
    let a_spec = pb::CallSpec {
        call_id: "a".into(),
        tool: "deploy".into(),
        input_json: r#"{"b": 1, "a": 2}"#.into(),
        title: "Deploy to production".into(),
        message: "The model wants to **deploy**.".into(),
        workspace: "alpha".into(),
        deadline: Some(deadline),
        ..Default::default()
    };
    let ab = submit(
        &app,
        batch("s1", vec![a_spec, call_in("b", "read", "beta")]),
    )
    .await;
    // `y` matches the workspace and tool filters, not the session.
    submit(&app, batch("s3", vec![call_in("y", "deploy", "alpha")])).await;
    approve(&app, "s2", "x").await;
    // The default SKIP_REST: denying `a` skips `b`.
    let denial = deny(&app, "s1", "a", "not on a Friday").await;
    assert_eq!(denial.skipped.len(), 1);
    approve(&app, "s3", "y").await;
    // A last call that matches every filter: what comes before it is all each one gets.
    submit(&app, batch("s1", vec![call_in("z", "deploy", "alpha")])).await;

    let session_events = read_until(&mut by_session, "requested z").await;
    let workspace_events = read_until(&mut by_workspace, "requested z").await;
    let tool_events = read_until(&mut by_tool, "requested z").await;
    assert_eq!(
        labels(&session_events),
        [
            "requested a",
            "requested b",
            "resolved a",
            "resolved b",
            "requested z"
        ]
    );
    let deploys_in_alpha = [
        "requested a",
        "requested y",
        "resolved a",
        "resolved y",
        "requested z",
    ];
    assert_eq!(labels(&workspace_events), deploys_in_alpha);
    assert_eq!(labels(&tool_events), deploys_in_alpha);
    assert_strictly_increasing(&session_events, snapshot_seqs[0]);
    assert_strictly_increasing(&workspace_events, snapshot_seqs[1]);
    assert_strictly_increasing(&tool_events, snapshot_seqs[2]);
    // One log: the same event has the same seq for everyone.
    assert_eq!(session_events[0], workspace_events[0]);
    assert_eq!(session_events[2], tool_events[2]);

    let a = requested(&session_events[0]);
    assert_eq!(a.agent, "default");
    assert_eq!(a.session_id, "s1");
    assert_eq!(a.call_id, "a");
    assert_eq!(a.workspace, "alpha");
    assert_eq!(a.tool, "deploy");
    assert_eq!(a.input_json, r#"{"a":2,"b":1}"#, "canonical JSON");
    assert_eq!(a.title, "Deploy to production");
    assert_eq!(a.message, "The model wants to **deploy**.");
    assert_eq!(a.batch_id, ab.batch_id);
    assert_eq!(a.position, 0);
    assert_eq!(a.batch_size, 2);
    assert_eq!(a.deadline, Some(deadline));
    assert!(a.created_at.is_some());
    assert_eq!(a.status, CallStatus::Pending as i32);
    assert!(a.outcome.is_none());
    let b = requested(&session_events[1]);
    assert_eq!(b.call_id, "b");
    assert_eq!(b.batch_id, ab.batch_id);
    assert_eq!(b.position, 1);
    assert_eq!(b.batch_size, 2);
    assert_eq!(b.workspace, "beta");
    assert_eq!(b.tool, "read");
    assert!(b.deadline.is_none());

    let a_outcome = resolved(&session_events[2]);
    assert_eq!(a_outcome.call_id, "a");
    assert_eq!(a_outcome.session_id, "s1");
    assert_eq!(status_of(a_outcome), CallStatus::Denied);
    assert_eq!(a_outcome.reason, "not on a Friday");
    assert_eq!(a_outcome.decided_by, "approver:alice@example.com");
    assert_eq!(Some(a_outcome), denial.outcome.as_ref());
    let b_outcome = resolved(&session_events[3]);
    assert_eq!(b_outcome.call_id, "b");
    assert_eq!(status_of(b_outcome), CallStatus::Skipped);
    assert_eq!(b_outcome.decided_by, "broker");
    let y_outcome = resolved(&workspace_events[3]);
    assert_eq!(status_of(y_outcome), CallStatus::Approved);
}

async fn several_subscribers_see_the_same_requested_and_resolved_events(app: TestApp) {
    let mut ide = Subscription::open(&app, everything(), None).await;
    let mut phone = Subscription::open(&app, everything(), None).await;
    let (_, ide_seq) = read_snapshot(&mut ide).await;
    let (_, phone_seq) = read_snapshot(&mut phone).await;
    assert_eq!(ide_seq, phone_seq);

    submit(
        &app,
        independent_batch(
            "s1",
            vec![call("a", "read", "{}"), call("b", "write", "{}")],
        ),
    )
    .await;
    approve(&app, "s1", "a").await;
    deny(&app, "s1", "b", "no").await;

    let seen_by_ide = read_n(&mut ide, 4).await;
    let seen_by_phone = read_n(&mut phone, 4).await;
    assert_eq!(
        labels(&seen_by_ide),
        ["requested a", "requested b", "resolved a", "resolved b"]
    );
    assert_strictly_increasing(&seen_by_ide, ide_seq);
    assert_eq!(seen_by_ide, seen_by_phone);
}

async fn resuming_with_after_seq_yields_every_later_event_without_snapshot_gap_or_duplicate(
    app: TestApp,
) {
    let mut first = Subscription::open(&app, everything(), None).await;
    read_snapshot(&mut first).await;
    submit(
        &app,
        independent_batch(
            "s1",
            vec![
                call("a", "read", "{}"),
                call("b", "read", "{}"),
                call("c", "read", "{}"),
            ],
        ),
    )
    .await;
    // The UI saw two events, then went away.
    let seen = read_n(&mut first, 2).await;
    assert_eq!(labels(&seen), ["requested a", "requested b"]);
    let last_seen = seen[1].seq;
    drop(first);

    approve(&app, "s1", "a").await;
    deny(&app, "s1", "b", "no").await;
    submit(&app, batch("s2", vec![call("d", "read", "{}")])).await;
    approve(&app, "s1", "c").await;

    // The reference: the whole log.
    let mut reference = Subscription::open(&app, everything(), Some(0)).await;
    let log = read_until(&mut reference, "resolved c").await;
    assert_eq!(
        labels(&log),
        [
            "requested a",
            "requested b",
            "requested c",
            "resolved a",
            "resolved b",
            "requested d",
            "resolved c"
        ]
    );
    assert_strictly_increasing(&log, 0);
    assert_eq!(&log[..2], &seen[..]);

    let mut resumed = Subscription::open(&app, everything(), Some(last_seen)).await;
    let rest = read_until(&mut resumed, "resolved c").await;
    let expected: Vec<pb::ApproverEvent> =
        log.iter().filter(|e| e.seq > last_seen).cloned().collect();
    assert_eq!(rest, expected, "no snapshot, no gap, no duplicate");

    // And it goes on live.
    submit(&app, batch("s1", vec![call("e", "read", "{}")])).await;
    let live = resumed.next().await;
    assert_eq!(label(&live), "requested e");
    assert!(live.seq > rest.last().expect("events").seq);
}

async fn after_seq_beyond_the_last_event_is_refused_naming_after_seq(app: TestApp) {
    let mut watcher = Subscription::open(&app, everything(), None).await;
    read_snapshot(&mut watcher).await;
    submit(&app, batch("s1", vec![call("a", "read", "{}")])).await;
    let last = watcher.next().await.seq;

    let beyond = app
        .approver()
        .subscribe(pb::SubscribeRequest {
            filter: Some(everything()),
            after_seq: Some(last + 1),
        })
        .await;
    assert_status(beyond, Code::InvalidArgument, "after_seq");

    // The last event itself is a valid cursor: nothing to catch up, then live events.
    let mut at_the_end = Subscription::open(&app, everything(), Some(last)).await;
    submit(&app, batch("s1", vec![call("b", "read", "{}")])).await;
    let next = at_the_end.next().await;
    assert_eq!(label(&next), "requested b");
    assert!(next.seq > last);
}

/// Reads until the stream ends with an error; returns the events before it and the error.
async fn read_until_error(sub: &mut Subscription) -> (Vec<pb::ApproverEvent>, tonic::Status) {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, sub.stream.message())
            .await
            .expect("an event or the error in time")
        {
            Ok(Some(event)) => events.push(event),
            Ok(None) => panic!(
                "the stream ended without an error after {} events",
                events.len()
            ),
            Err(status) => return (events, status),
        }
    }
}

/// The number in `after_seq=<N>` within an error message.
fn named_after_seq(message: &str) -> Option<u64> {
    let (_, rest) = message.split_once("after_seq=")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

async fn a_subscriber_that_falls_too_far_behind_is_told_where_to_resume_and_resumes_without_gap(
    app: TestApp,
) {
    const BATCHES: usize = 8;
    const CALLS: usize = 10;

    let mut slow = Subscription::open(&app, everything(), None).await;
    read_snapshot(&mut slow).await;
    // One event read makes sure the subscriber follows the live feed (not a catch-up read,
    // which waits for the reader) before the flood.
    submit(&app, batch("warm-up", vec![call("w", "read", "{}")])).await;
    let warm_up = slow.next().await;
    assert_eq!(label(&warm_up), "requested w");

    // Now the UI stops reading while far more arrives than flow control and socket buffers hold.
    let big_input = format!(r#"{{"data":"{}"}}"#, "x".repeat(100 * 1024));
    for b in 0..BATCHES {
        let calls = (0..CALLS)
            .map(|c| call(&format!("big-{b}-{c}"), "write", &big_input))
            .collect();
        let response = submit(&app, batch("flood", calls)).await;
        assert_eq!(response.acks.len(), CALLS);
    }
    let last_label = format!("requested big-{}-{}", BATCHES - 1, CALLS - 1);

    let (received, status) = read_until_error(&mut slow).await;
    assert_eq!(
        status.code(),
        Code::ResourceExhausted,
        "{}",
        status.message()
    );
    assert!(
        received.len() < BATCHES * CALLS,
        "the stream ended before the last event"
    );
    let last_delivered = received.last().map_or(warm_up.seq, |e| e.seq);
    assert_eq!(
        named_after_seq(status.message()),
        Some(last_delivered),
        "`{}` should name after_seq={last_delivered}",
        status.message()
    );
    let trailer = status
        .metadata()
        .get("approvals-last-seq")
        .expect("the approvals-last-seq trailer")
        .to_str()
        .expect("ASCII");
    assert_eq!(trailer, last_delivered.to_string());

    // The reference: the whole log, read at the reader's pace.
    let mut reference = Subscription::open(&app, everything(), Some(0)).await;
    let log = read_until(&mut reference, &last_label).await;
    assert_eq!(log.len(), 1 + BATCHES * CALLS);
    assert_strictly_increasing(&log, 0);
    // What the slow subscriber got was the log's beginning, without a gap.
    let mut seen = vec![warm_up];
    seen.extend(received);
    assert_eq!(seen[..], log[..seen.len()]);

    // Resuming where it was told yields exactly the rest.
    let mut resumed = Subscription::open(&app, everything(), Some(last_delivered)).await;
    let rest = read_until(&mut resumed, &last_label).await;
    assert_eq!(rest[..], log[seen.len()..]);
}

/// How long the slow client below leaves its window closed: longer than the 30 s the broker
/// once gave a blocked client to take the status, after which the stream ended as if all were
/// well (`grpc-status: 0`, no trailer).
const LONGER_THAN_ANY_SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(31);

/// A subscriber that falls behind and then leaves its stream unread for a long time (its HTTP/2
/// window closed) still learns, when it reads again, that it fell behind and where to resume.
/// Storage plays no part, so it runs on SQLite only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_blocked_for_long_after_falling_behind_is_still_told_where_to_resume() {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.streams.subscriber_buffer = 4
    })
    .await;
    // A client whose windows hold less than one event: its window is closed from the first big
    // event on, before the broker finds the subscriber behind, and stays closed while it sleeps.
    let window = 64 * 1024 - 1;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", app.address))
        .expect("endpoint")
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .connect_lazy();
    let stream = ApproverServiceClient::new(channel)
        .subscribe(pb::SubscribeRequest {
            filter: Some(everything()),
            after_seq: None,
        })
        .await
        .expect("subscribe")
        .into_inner();
    let mut slow = Subscription { stream };
    read_snapshot(&mut slow).await;
    submit(&app, batch("warm-up", vec![call("w", "read", "{}")])).await;
    let warm_up = slow.next().await;
    assert_eq!(label(&warm_up), "requested w");

    // Events bigger than the client's window, one at a time while the client does not read:
    // the broker hands the first to HTTP/2, whose window it fills, then queues as many as the
    // subscriber's queue holds, and finds the subscriber behind at the next. By then nothing
    // can leave until the client reads.
    let big_input = format!(r#"{{"data":"{}"}}"#, "x".repeat(100 * 1024));
    for n in 0..16 {
        let calls = vec![call(&format!("big-{n}"), "write", &big_input)];
        submit(&app, batch("flood", calls)).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(LONGER_THAN_ANY_SEND_TIMEOUT).await;

    let (received, status) = read_until_error(&mut slow).await;
    assert_eq!(
        status.code(),
        Code::ResourceExhausted,
        "{}",
        status.message()
    );
    let last_delivered = received.last().map_or(warm_up.seq, |e| e.seq);
    let trailer = status
        .metadata()
        .get("approvals-last-seq")
        .expect("the approvals-last-seq trailer")
        .to_str()
        .expect("ASCII");
    assert_eq!(trailer, last_delivered.to_string());
    assert_eq!(named_after_seq(status.message()), Some(last_delivered));
}

backend_tests! {
    a_subscriber_that_falls_too_far_behind_is_told_where_to_resume_and_resumes_without_gap => |config| config.streams.subscriber_buffer = 4,
    live_requested_and_resolved_events_reach_subscribers_for_matching_calls_only_in_seq_order,
    subscribing_without_a_cursor_sends_a_snapshot_of_exactly_the_matching_pending_calls,
    several_subscribers_see_the_same_requested_and_resolved_events,
    resuming_with_after_seq_yields_every_later_event_without_snapshot_gap_or_duplicate,
    after_seq_beyond_the_last_event_is_refused_naming_after_seq,
}
