//! AgentService/Cancel: a malformed cancel is refused naming the field and cancels nothing; a batch
//! id with control characters is refused too, alone or on a `Connect` stream.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use super::connect::connect;
use super::table::*;
use crate::helpers::*;

fn cancel(name: &'static str, target: Option<pb::CancelTarget>, expect: Expect) -> Case {
    case(name, expect, move |channel| {
        let request = pb::CancelRequest {
            target: target.clone(),
        };
        async move { unary(AgentServiceClient::new(channel).cancel(request).await) }
    })
}

pub(super) fn target(
    session: &str,
    target: Option<pb::cancel_target::Target>,
) -> Option<pb::CancelTarget> {
    Some(pb::CancelTarget {
        session_id: session.into(),
        target,
        reason: String::new(),
    })
}

pub(super) fn batch_target(batch_id: &str) -> Option<pb::cancel_target::Target> {
    Some(pb::cancel_target::Target::BatchId(batch_id.into()))
}

pub(super) fn calls_target(ids: &[&str]) -> Option<pb::cancel_target::Target> {
    Some(pb::cancel_target::Target::Calls(pb::CallIds {
        call_ids: ids.iter().map(|s| s.to_string()).collect(),
    }))
}

pub(super) fn cancel_cases() -> Vec<Case> {
    vec![
        cancel("cancel: no target", None, invalid("target")),
        cancel(
            "cancel: empty session id",
            target("", Some(pb::cancel_target::Target::WholeSession(true))),
            invalid("target.session_id"),
        ),
        cancel(
            "cancel: missing target oneof",
            target("seed", None),
            invalid("target.target"),
        ),
        cancel(
            "cancel: whole_session=false",
            target("seed", Some(pb::cancel_target::Target::WholeSession(false))),
            invalid("target.target"),
        ),
        cancel(
            "cancel: empty batch id",
            target("seed", batch_target("")),
            invalid("target.batch_id"),
        ),
        cancel(
            "cancel: empty call id list",
            target("seed", calls_target(&[])),
            invalid("target.calls.call_ids"),
        ),
        cancel(
            "cancel: a call id with a newline",
            target("seed", calls_target(&["c1\n"])),
            invalid("target.calls.call_ids[0]"),
        ),
        cancel(
            "cancel: reason over 4 KiB",
            Some(pb::CancelTarget {
                reason: "r".repeat(4 * 1024 + 1),
                ..target("seed", calls_target(&["c1"])).unwrap()
            }),
            invalid("target.reason"),
        ),
        cancel(
            "cancel: reason with NUL",
            Some(pb::CancelTarget {
                reason: "a\0b".into(),
                ..target("seed", calls_target(&["c1"])).unwrap()
            }),
            invalid("target.reason"),
        ),
        cancel(
            "cancel: unknown batch",
            target("seed", batch_target("no-such-batch")),
            Expect::Status(Code::NotFound, "no-such-batch"),
        ),
        cancel(
            "cancel: a batch id with an escape",
            target("seed", batch_target("\u{1b}[2J")),
            invalid("target.batch_id"),
        ),
        cancel(
            "cancel: a batch id that is an SQL fragment",
            target("seed", batch_target("' OR '1'='1")),
            Expect::Status(Code::NotFound, "' OR '1'='1"),
        ),
    ]
}

/// Cancel.
async fn a_malformed_cancel_is_refused_naming_its_field_and_cancels_nothing(app: TestApp) {
    refuses_every_case(&app, |_| cancel_cases()).await;
}

/// A batch id with control characters is refused naming the field (once, it reached Postgres,
/// which refused the NUL with INTERNAL).
pub(super) fn control_characters_in_batch_id_cases() -> Vec<Case> {
    use pb::agent_request::Request as Req;
    vec![
        cancel(
            "cancel: a batch id with NUL",
            target("seed", batch_target("a\0b")),
            invalid("target.batch_id"),
        ),
        connect(
            "connect: cancel of a batch id with NUL",
            Some(Req::Cancel(pb::CancelTarget {
                session_id: "seed".into(),
                target: batch_target("\0"),
                reason: String::new(),
            })),
            item("cancel.batch_id"),
        ),
    ]
}

async fn a_batch_id_with_control_characters_is_refused_naming_the_field(app: TestApp) {
    refuses_every_case(&app, |_| control_characters_in_batch_id_cases()).await;
}

backend_tests! {
    a_malformed_cancel_is_refused_naming_its_field_and_cancels_nothing => crate::bad_input::table::small_limits,
    a_batch_id_with_control_characters_is_refused_naming_the_field => crate::bad_input::table::small_limits,
}
