//! Numbers a double cannot hold as written (I-JSON, RFC 7493): canonical form (RFC 8785) would
//! round `18446744073709551617` to `18446744073709552000`, and the tool would run with another id
//! than the one the model wrote and the approver was shown. Such a call is refused alone,
//! naming the number's path; its siblings are stored; an approver's edit is held to the same rule.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

async fn a_number_a_double_cannot_hold_is_refused_for_that_call_alone(app: TestApp) {
    let response = submit(
        &app,
        batch(
            "s",
            vec![
                call(
                    "fine",
                    "t",
                    r#"{"order":{"id":9007199254740992,"amount":0.1}}"#,
                ),
                call("id", "t", r#"{"order":{"id":18446744073709551617}}"#),
                call("big", "t", r#"{"ids":[1,123456789012345678901234567890]}"#),
                call("after", "t", r#"{"order":{"id":"18446744073709551617"}}"#),
            ],
        ),
    )
    .await;
    assert_eq!(ack_status(&response, 0), CallStatus::Pending);
    for (index, path, number) in [
        (1, "order.id", "18446744073709551617"),
        (2, "ids[1]", "123456789012345678901234567890"),
    ] {
        let error = match &response.acks[index].result {
            Some(pb::call_ack::Result::Error(e)) => e,
            other => panic!("call {index} was not refused: {other:?}"),
        };
        assert_eq!(error.code, Code::InvalidArgument as i32, "{error:?}");
        let prefix = format!("batch.calls[{index}].input_json: the number {number} at `{path}` ");
        assert!(
            error.message.starts_with(&prefix) && error.message.contains("cannot be held exactly"),
            "{}",
            error.message
        );
    }
    assert_eq!(ack_status(&response, 3), CallStatus::Pending);
    let mut stored: Vec<(String, String)> = all_calls(&app)
        .await
        .into_iter()
        .map(|c| (c.call_id, c.input_json))
        .collect();
    stored.sort();
    assert_eq!(
        stored,
        [
            (
                "after".to_owned(),
                r#"{"order":{"id":"18446744073709551617"}}"#.to_owned()
            ),
            (
                "fine".to_owned(),
                r#"{"order":{"amount":0.1,"id":9007199254740992}}"#.to_owned()
            ),
        ],
        "the refused calls left nothing behind, the others are stored as written"
    );

    // An approver's edit is the input that runs: held to the same rule.
    let edited = app
        .approver()
        .decide(pb::DecideRequest {
            edited_input_json: r#"{"order":{"id":9007199254740993}}"#.into(),
            ..decide_request("s", "fine", pb::Decision::Approve, "")
        })
        .await
        .unwrap_err();
    assert_eq!(edited.code(), Code::InvalidArgument);
    assert!(
        edited
            .message()
            .contains("the number 9007199254740993 at `order.id` cannot be held exactly"),
        "{edited:?}"
    );
}

backend_tests! {
    a_number_a_double_cannot_hold_is_refused_for_that_call_alone,
}
