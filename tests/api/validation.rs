//! Bad input gets INVALID_ARGUMENT naming the field; a bad call in a batch is refused alone.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

fn ack_error(ack: &pb::CallAck) -> Option<&pb::ItemError> {
    match &ack.result {
        Some(pb::call_ack::Result::Error(e)) => Some(e),
        _ => None,
    }
}

async fn batch_level_violations_refuse_the_batch_naming_the_field(app: TestApp) {
    let too_many: Vec<_> = (0..129)
        .map(|i| call(&format!("c{i}"), "t", "{}"))
        .collect();
    let cases: Vec<(pb::BatchSpec, &str)> = vec![
        (batch("", vec![call("c1", "t", "{}")]), "batch.session_id"),
        (
            batch(&"s".repeat(257), vec![call("c1", "t", "{}")]),
            "batch.session_id",
        ),
        (
            batch("a\u{7}b", vec![call("c1", "t", "{}")]),
            "batch.session_id",
        ),
        (batch("s", vec![]), "batch.calls"),
        (batch("s", too_many), "batch.calls"),
        (
            batch("s", vec![call("c1", "t", "{}"), call("c1", "t", "{}")]),
            "batch.calls[1].call_id",
        ),
        (
            pb::BatchSpec {
                on_deny: 99,
                ..batch("s", vec![call("c1", "t", "{}")])
            },
            "batch.on_deny",
        ),
    ];
    for (spec, field) in cases {
        let result = app
            .agent()
            .submit(pb::SubmitRequest { batch: Some(spec) })
            .await;
        assert_status(result, Code::InvalidArgument, field);
    }
    let result = app.agent().submit(pb::SubmitRequest { batch: None }).await;
    assert_status(result, Code::InvalidArgument, "batch");
    assert!(
        all_calls(&app).await.is_empty(),
        "nothing refused is stored"
    );
}

async fn a_bad_call_is_refused_alone_naming_its_field_and_the_others_are_stored(app: TestApp) {
    let past = prost_types::Timestamp {
        seconds: 1,
        nanos: 0,
    };
    let bad: Vec<(pb::CallSpec, &str)> = vec![
        (call("", "t", "{}"), "call_id"),
        (call(&"x".repeat(257), "t", "{}"), "call_id"),
        (call("line\nbreak", "t", "{}"), "call_id"),
        (call("c", "", "{}"), "tool"),
        (call("c", &"t".repeat(129), "{}"), "tool"),
        (call("c", "t", "not json"), "input_json"),
        (call("c", "t", "[1, 2]"), "input_json"),
        (call("c", "t", "\"text\""), "input_json"),
        (call("c", "t", ""), "input_json"),
        (
            call("c", "t", &format!("{{\"a\":\"{}\"}}", "x".repeat(1100))),
            "input_json",
        ),
        (
            pb::CallSpec {
                deadline: Some(past),
                ..call("c", "t", "{}")
            },
            "deadline",
        ),
        (
            pb::CallSpec {
                title: "a\u{0}b".into(),
                ..call("c", "t", "{}")
            },
            "title",
        ),
    ];
    for (i, (mut bad_call, field)) in bad.into_iter().enumerate() {
        if bad_call.call_id == "c" {
            bad_call.call_id = format!("bad{i}");
        }
        let session = format!("s{i}");
        let response = submit(
            &app,
            batch(
                &session,
                vec![
                    call("good-0", "t", "{}"),
                    bad_call,
                    call("good-2", "t", "{}"),
                ],
            ),
        )
        .await;
        assert_eq!(response.acks.len(), 3);
        let error = ack_error(&response.acks[1]).expect("the bad call is refused");
        assert_eq!(error.code, Code::InvalidArgument as i32);
        let expected = format!("batch.calls[1].{field}");
        assert!(
            error.message.contains(&expected),
            "{} names {expected}",
            error.message
        );
        for good in [&response.acks[0], &response.acks[2]] {
            assert!(
                matches!(good.result, Some(pb::call_ack::Result::Accepted(_))),
                "{good:?}"
            );
        }
        let positions: Vec<_> = response.acks.iter().map(|a| a.index).collect();
        assert_eq!(positions, vec![0, 1, 2], "acks come in the request's order");
    }
}

async fn decide_and_lookups_refuse_bad_requests_naming_the_field(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    let mut approver = app.approver();
    let cases: Vec<(pb::DecideRequest, &str)> = vec![
        (
            decide_request("", "c1", pb::Decision::Approve, ""),
            "session_id",
        ),
        (
            decide_request("s", "", pb::Decision::Approve, ""),
            "call_id",
        ),
        (
            decide_request("s", "c1", pb::Decision::Unspecified, ""),
            "decision",
        ),
        (
            pb::DecideRequest {
                decision: 42,
                ..decide_request("s", "c1", pb::Decision::Approve, "")
            },
            "decision",
        ),
        (
            pb::DecideRequest {
                approver: String::new(),
                ..decide_request("s", "c1", pb::Decision::Approve, "")
            },
            "approver",
        ),
        (
            pb::DecideRequest {
                edited_input_json: "[1]".into(),
                ..decide_request("s", "c1", pb::Decision::Approve, "")
            },
            "edited_input_json",
        ),
        (
            pb::DecideRequest {
                edited_input_json: "{}".into(),
                ..decide_request("s", "c1", pb::Decision::Deny, "")
            },
            "edited_input_json",
        ),
    ];
    for (request, field) in cases {
        assert_status(approver.decide(request).await, Code::InvalidArgument, field);
    }
    assert!(matches!(
        states(&app, "s", &["c1"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));

    let mut agent = app.agent();
    let lookup = |ids: Vec<String>| pb::GetOutcomesRequest {
        session_id: "s".into(),
        call_ids: ids,
    };
    assert_status(
        agent.get_outcomes(lookup(vec![])).await,
        Code::InvalidArgument,
        "call_ids",
    );
    assert_status(
        agent
            .get_outcomes(lookup((0..1025).map(|i| i.to_string()).collect()))
            .await,
        Code::InvalidArgument,
        "call_ids",
    );
    assert_status(
        agent
            .get_outcomes(lookup(vec!["ok".into(), String::new()]))
            .await,
        Code::InvalidArgument,
        "call_ids[1]",
    );
    assert_status(
        agent
            .cancel(pb::CancelRequest {
                target: Some(pb::CancelTarget {
                    session_id: "s".into(),
                    target: None,
                    reason: String::new(),
                }),
            })
            .await,
        Code::InvalidArgument,
        "target.target",
    );
}

async fn paging_refuses_huge_pages_and_forged_tokens(app: TestApp) {
    let list = |size: u32, token: &str| pb::ListPendingRequest {
        filter: None,
        page_size: size,
        page_token: token.into(),
    };
    let mut approver = app.approver();
    assert_status(
        approver.list_pending(list(1001, "")).await,
        Code::InvalidArgument,
        "page_size",
    );
    for forged in ["garbage", "v1.-5", "v1.", "v2.10", "' OR 1=1 --"] {
        assert_status(
            approver.list_pending(list(10, forged)).await,
            Code::InvalidArgument,
            "page_token",
        );
    }
    let mut admin = app.admin();
    assert_status(
        admin
            .list_calls(pb::ListCallsRequest {
                statuses: vec![77],
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "statuses[0]",
    );
}

async fn filters_full_of_quotes_and_wildcards_match_literally(app: TestApp) {
    let tricky = "it's \"%_' OR '1'='1";
    submit(
        &app,
        pb::BatchSpec {
            calls: vec![pb::CallSpec {
                workspace: tricky.into(),
                ..call("c1", "t", "{}")
            }],
            ..batch("s1", vec![])
        },
    )
    .await;
    submit(&app, batch("s2", vec![call("c1", "t", "{}")])).await;
    for (filter, expected) in [
        (
            pb::CallFilter {
                workspace: tricky.into(),
                ..Default::default()
            },
            1,
        ),
        (
            pb::CallFilter {
                workspace: "%".into(),
                ..Default::default()
            },
            0,
        ),
        (
            pb::CallFilter {
                session_id: "s_".into(),
                ..Default::default()
            },
            0,
        ),
        (
            pb::CallFilter {
                tool: "' OR 1=1 --".into(),
                ..Default::default()
            },
            0,
        ),
    ] {
        let page = app
            .approver()
            .list_pending(pb::ListPendingRequest {
                filter: Some(filter.clone()),
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        assert_eq!(page.calls.len(), expected, "{filter:?}");
    }
}

backend_tests! {
    batch_level_violations_refuse_the_batch_naming_the_field,
    a_bad_call_is_refused_alone_naming_its_field_and_the_others_are_stored => |c| c.requests.max_input_bytes = 1024,
    decide_and_lookups_refuse_bad_requests_naming_the_field,
    paging_refuses_huge_pages_and_forged_tokens,
    filters_full_of_quotes_and_wildcards_match_literally,
}
