//! Inputs that mean something other than they look (lookalike and hidden text): JSON naming a key twice (the
//! approver sees one value, a tool may run the other) is refused; one number spelled three ways
//! is one input, so a client that re-serialises numbers still retries idempotently; ids and
//! names refuse characters that hide themselves, and approvers are shown those in free text.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

fn ack_error(response: &pb::SubmitResponse, index: usize) -> &pb::ItemError {
    match &response.acks[index].result {
        Some(pb::call_ack::Result::Error(e)) => e,
        other => panic!("call {index} was not refused: {other:?}"),
    }
}

async fn one_number_spelled_three_ways_is_one_call_retried(app: TestApp) {
    let first = submit(&app, batch("s", vec![call("c1", "t", r#"{"n":1.0}"#)])).await;
    assert_eq!(ack_status(&first, 0), CallStatus::Pending);
    for spelling in [r#"{"n":1}"#, r#"{"n":1e0}"#, r#"{ "n" : 10E-1 }"#] {
        let again = submit(&app, batch("s", vec![call("c1", "t", spelling)])).await;
        assert!(
            matches!(
                again.acks[0].result,
                Some(pb::call_ack::Result::Duplicate(_))
            ),
            "{spelling} is the same call retried: {again:?}"
        );
    }
    let calls = all_calls(&app).await;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].input_json, r#"{"n":1}"#, "RFC 8785 canonical form");
    // A different number is a different input.
    let other = submit(&app, batch("s", vec![call("c1", "t", r#"{"n":1.5}"#)])).await;
    assert_eq!(ack_error(&other, 0).code, Code::AlreadyExists as i32);
}

async fn a_key_named_twice_is_refused_naming_the_field_and_the_key(app: TestApp) {
    let response = submit(
        &app,
        batch(
            "s",
            vec![
                call("twice", "t", r#"{"a":1,"a":2}"#),
                call("nested", "t", r#"{"o":{"list":[{"k":1,"k":1}]}}"#),
                call("fine", "t", r#"{"a":{"a":1}}"#),
            ],
        ),
    )
    .await;
    let error = ack_error(&response, 0);
    assert_eq!(error.code, Code::InvalidArgument as i32);
    assert!(
        error.message.starts_with("batch.calls[0].input_json: ")
            && error.message.contains("the key `a` appears twice"),
        "{}",
        error.message
    );
    let error = ack_error(&response, 1);
    assert!(
        error.message.starts_with("batch.calls[1].input_json: ")
            && error
                .message
                .contains("the key `o.list[0].k` appears twice"),
        "{}",
        error.message
    );
    assert_eq!(ack_status(&response, 2), CallStatus::Pending);

    // An approver's edited input, and the JSON of matchers, are held to the same rule.
    let edited = app
        .approver()
        .decide(pb::DecideRequest {
            edited_input_json: r#"{"a":{"b":1,"b":2}}"#.into(),
            ..decide_request("s", "fine", pb::Decision::Approve, "")
        })
        .await;
    assert_status(edited, Code::InvalidArgument, "edited_input_json");
    let edited = app
        .approver()
        .decide(pb::DecideRequest {
            edited_input_json: r#"{"a":{"b":1,"b":2}}"#.into(),
            ..decide_request("s", "fine", pb::Decision::Approve, "")
        })
        .await
        .unwrap_err();
    assert!(
        edited.message().contains("`a.b` appears twice"),
        "{edited:?}"
    );
    for (matcher, field) in [
        (
            fields(vec![equals_json("n", r#"{"x":1,"x":2}"#)]),
            "rule.matcher.fields.conditions[0].equals_json",
        ),
        (exact_input(r#"{"a":1,"a":1}"#), "rule.matcher.exact_json"),
    ] {
        let created = app
            .admin()
            .create_rule(pb::CreateRuleRequest {
                rule: Some(rule("r", "t", pb::Effect::Deny, 0, Some(matcher))),
            })
            .await;
        assert_status(created, Code::InvalidArgument, field);
    }
    assert_eq!(outcome_or_pending(&app, "fine").await, CallStatus::Pending);
}

async fn outcome_or_pending(app: &TestApp, call_id: &str) -> CallStatus {
    match states(app, "s", &[call_id]).await.remove(0).state {
        Some(pb::call_state::State::Outcome(o)) => status_of(&o),
        _ => CallStatus::Pending,
    }
}

/// The hidden characters ids refuse (bidi overrides, isolates, marks, zero-width), one of each kind.
const HIDDEN: [char; 7] = [
    '\u{202E}', '\u{2066}', '\u{200F}', '\u{061C}', '\u{200B}', '\u{2060}', '\u{FEFF}',
];

async fn ids_and_names_holding_hidden_characters_are_refused_naming_the_code_point(app: TestApp) {
    for (n, c) in HIDDEN.into_iter().enumerate() {
        let code_point = format!("U+{:04X}", c as u32);
        let session = format!("s{n}");
        let result = app
            .agent()
            .submit(pb::SubmitRequest {
                batch: Some(batch(&format!("s{c}"), vec![call("c1", "t", "{}")])),
            })
            .await;
        assert_status(result, Code::InvalidArgument, "batch.session_id");
        let calls = vec![
            call(&format!("c{c}1"), "t", "{}"),
            call("c2", &format!("read{c}_file"), "{}"),
            call_in(&format!("ws{c}"), "c3", "t", "{}"),
            pb::CallSpec {
                supersede_key: format!("k{c}"),
                ..call("c4", "t", "{}")
            },
            pb::CallSpec {
                title: format!("free text keeps it {c}"),
                ..call("c5", "t", &format!(r#"{{"text":"{c}"}}"#))
            },
        ];
        let response = submit(&app, batch(&session, calls)).await;
        for (i, field) in ["call_id", "tool", "workspace", "supersede_key"]
            .into_iter()
            .enumerate()
        {
            let error = ack_error(&response, i);
            assert_eq!(error.code, Code::InvalidArgument as i32);
            assert!(
                error
                    .message
                    .starts_with(&format!("batch.calls[{i}].{field}: "))
                    && error.message.contains(&code_point),
                "{}",
                error.message
            );
        }
        assert_eq!(ack_status(&response, 4), CallStatus::Pending);
        approve(&app, &session, "c5").await;
        let decide = app
            .approver()
            .decide(decide_request(
                &session,
                &format!("c5{c}"),
                pb::Decision::Approve,
                "",
            ))
            .await;
        assert_status(decide, Code::InvalidArgument, "call_id");
    }
}

async fn approvers_are_shown_the_hidden_characters_of_free_text(app: TestApp) {
    let spec = pb::CallSpec {
        title: "Delete \u{202E}txt.tmp\u{202C} \\ now".into(),
        message: "zero\u{200B}width\u{200B}".into(),
        ..call("hiding", "t", "{\"path\":\"\u{2066}/etc\u{2069}\"}")
    };
    submit(
        &app,
        batch("s", vec![spec, call("plain", "t", r#"{"path":"/tmp"}"#)]),
    )
    .await;
    let mut sub = Subscription::open(&app, pb::CallFilter::default(), None).await;
    let (calls, _) = sub.snapshot().await;
    let shown = |id: &str| {
        calls
            .iter()
            .find(|c| c.call_id == id)
            .unwrap_or_else(|| panic!("{id} in the snapshot"))
            .clone()
    };
    let hiding = shown("hiding");
    assert_eq!(
        hiding.title, "Delete \u{202E}txt.tmp\u{202C} \\ now",
        "free text is kept as sent"
    );
    let by_field = |field: &str| {
        hiding
            .hidden_characters
            .iter()
            .find(|h| h.field == field)
            .unwrap_or_else(|| panic!("{field} listed: {:?}", hiding.hidden_characters))
            .clone()
    };
    let title = by_field("title");
    assert_eq!(title.code_points, ["U+202E", "U+202C"]);
    assert_eq!(title.count, 2);
    assert_eq!(title.revealed, r"Delete \u{202E}txt.tmp\u{202C} \\ now");
    let message = by_field("message");
    assert_eq!(message.code_points, ["U+200B"]);
    assert_eq!(message.count, 2);
    assert_eq!(message.revealed, r"zero\u{200B}width\u{200B}");
    let input = by_field("input_json");
    assert_eq!(input.code_points, ["U+2066", "U+2069"]);
    assert_eq!(input.revealed, "", "a UI reveals the input itself");
    assert_eq!(hiding.hidden_characters.len(), 3);
    assert!(shown("plain").hidden_characters.is_empty());
    // ListCalls (the audit view) shows the same.
    let listed = all_calls(&app).await;
    let listed = listed
        .iter()
        .find(|c| c.call_id == "hiding")
        .expect("listed");
    assert_eq!(listed.hidden_characters, hiding.hidden_characters);
}

backend_tests! {
    one_number_spelled_three_ways_is_one_call_retried,
    a_key_named_twice_is_refused_naming_the_field_and_the_key,
    ids_and_names_holding_hidden_characters_are_refused_naming_the_code_point,
    approvers_are_shown_the_hidden_characters_of_free_text,
}
