//! The audit view: every call with its outcome, filtered and keyset-paged.

use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

async fn list(app: &TestApp, request: pb::ListCallsRequest) -> Vec<pb::Call> {
    app.admin()
        .list_calls(request)
        .await
        .expect("list")
        .into_inner()
        .calls
}

fn now() -> prost_types::Timestamp {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    prost_types::Timestamp {
        seconds: t.as_secs() as i64,
        nanos: t.subsec_nanos() as i32,
    }
}

async fn list_calls_filters_by_session_tool_status_and_time(app: TestApp) {
    submit(
        &app,
        pb::BatchSpec {
            on_deny: pb::OnDeny::Independent as i32,
            ..batch(
                "s1",
                vec![
                    call("a", "read", "{}"),
                    call("b", "write", "{}"),
                    call("c", "write", "{}"),
                ],
            )
        },
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let between = now();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    submit(&app, batch("s2", vec![call("a", "read", "{}")])).await;
    approve(&app, "s1", "a").await;
    deny(&app, "s1", "b", "").await;

    let ids = |calls: Vec<pb::Call>| -> Vec<String> {
        calls
            .iter()
            .map(|c| format!("{}/{}", c.session_id, c.call_id))
            .collect()
    };
    assert_eq!(
        ids(list(
            &app,
            pb::ListCallsRequest {
                session_id: "s1".into(),
                ..Default::default()
            }
        )
        .await),
        ["s1/a", "s1/b", "s1/c"]
    );
    assert_eq!(
        ids(list(
            &app,
            pb::ListCallsRequest {
                tool: "read".into(),
                ..Default::default()
            }
        )
        .await),
        ["s1/a", "s2/a"]
    );
    assert_eq!(
        ids(list(
            &app,
            pb::ListCallsRequest {
                statuses: vec![CallStatus::Pending as i32],
                ..Default::default()
            }
        )
        .await),
        ["s1/c", "s2/a"]
    );
    assert_eq!(
        ids(list(
            &app,
            pb::ListCallsRequest {
                statuses: vec![CallStatus::Approved as i32, CallStatus::Denied as i32],
                ..Default::default()
            }
        )
        .await),
        ["s1/a", "s1/b"]
    );
    assert_eq!(
        ids(list(
            &app,
            pb::ListCallsRequest {
                created_after: Some(between),
                ..Default::default()
            }
        )
        .await),
        ["s2/a"]
    );
    assert_eq!(
        ids(list(
            &app,
            pb::ListCallsRequest {
                created_before: Some(between),
                ..Default::default()
            }
        )
        .await),
        ["s1/a", "s1/b", "s1/c"]
    );
    let denied = &list(
        &app,
        pb::ListCallsRequest {
            statuses: vec![CallStatus::Denied as i32],
            ..Default::default()
        },
    )
    .await[0];
    assert_eq!(
        denied.outcome.as_ref().expect("outcome").decided_by,
        "approver:alice@example.com"
    );
}

async fn paging_visits_every_call_exactly_once_in_order(app: TestApp) {
    for b in 0..7 {
        let calls = (0..3)
            .map(|i| call(&format!("b{b}c{i}"), "t", "{}"))
            .collect();
        submit(&app, batch("s", calls)).await;
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = app
            .approver()
            .list_pending(pb::ListPendingRequest {
                filter: None,
                page_size: 4,
                page_token: token,
            })
            .await
            .expect("page")
            .into_inner();
        assert!(page.calls.len() <= 4);
        pages += 1;
        seen.extend(page.calls.into_iter().map(|c| c.call_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(pages, 6);
    assert_eq!(seen.len(), 21);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 21);
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "oldest first");
}

/// A history view reads the most recent calls first, page after page, each call once.
async fn newest_first_lists_the_latest_calls_first_and_pages_on_in_that_order(app: TestApp) {
    for b in 0..5 {
        let calls = (0..2)
            .map(|i| call(&format!("b{b}c{i}"), "t", "{}"))
            .collect();
        submit(&app, batch("s", calls)).await;
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = app
            .admin()
            .list_calls(pb::ListCallsRequest {
                newest_first: true,
                page_size: 3,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("page")
            .into_inner();
        assert!(page.calls.len() <= 3);
        seen.extend(page.calls.into_iter().map(|c| c.call_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut oldest_first: Vec<String> = (0..5)
        .flat_map(|b| (0..2).map(move |i| format!("b{b}c{i}")))
        .collect();
    oldest_first.reverse();
    assert_eq!(seen, oldest_first, "newest first, each call once");
    let default = list(&app, pb::ListCallsRequest::default()).await;
    assert_eq!(default.first().map(|c| c.call_id.as_str()), Some("b0c0"));
}

async fn get_call_returns_the_call_with_its_outcome_or_not_found(app: TestApp) {
    submit(
        &app,
        batch(
            "s",
            vec![pb::CallSpec {
                title: "Delete a file".into(),
                message: "Remove `a.txt`?".into(),
                workspace: "repo".into(),
                ..call("c1", "rm", r#"{"path":"a.txt"}"#)
            }],
        ),
    )
    .await;
    deny(&app, "s", "c1", "keep it").await;
    let got = get_call(&app, "s", "c1").await;
    assert_eq!(got.agent, "default");
    assert_eq!(
        (
            got.title.as_str(),
            got.message.as_str(),
            got.workspace.as_str()
        ),
        ("Delete a file", "Remove `a.txt`?", "repo")
    );
    assert_eq!(got.status, CallStatus::Denied as i32);
    assert_eq!(got.outcome.expect("outcome").reason, "keep it");
    let missing = app
        .admin()
        .get_call(pb::GetCallRequest {
            session_id: "s".into(),
            call_id: "c2".into(),
            agent: String::new(),
        })
        .await;
    assert_status(missing, Code::NotFound, "c2");
}

backend_tests! {
    list_calls_filters_by_session_tool_status_and_time,
    paging_visits_every_call_exactly_once_in_order,
    newest_first_lists_the_latest_calls_first_and_pages_on_in_that_order,
    get_call_returns_the_call_with_its_outcome_or_not_found,
}
