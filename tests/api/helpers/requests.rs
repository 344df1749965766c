//! Builders of the requests tests send: calls, batches, decisions, matchers and rules, with every
//! field a test does not name at its default.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use approval_broker::proto::v1 as pb;

/// A call with a small JSON input.
pub fn call(call_id: &str, tool: &str, input_json: &str) -> pb::CallSpec {
    pb::CallSpec {
        call_id: call_id.into(),
        tool: tool.into(),
        input_json: input_json.into(),
        ..Default::default()
    }
}

/// A call with a workspace.
pub fn call_in(workspace: &str, call_id: &str, tool: &str, input_json: &str) -> pb::CallSpec {
    pb::CallSpec {
        workspace: workspace.into(),
        ..call(call_id, tool, input_json)
    }
}

/// A batch of `calls` in `session` with the default options.
pub fn batch(session: &str, calls: Vec<pb::CallSpec>) -> pb::BatchSpec {
    pb::BatchSpec {
        session_id: session.into(),
        calls,
        ..Default::default()
    }
}

pub fn decide_request(
    session: &str,
    call_id: &str,
    decision: pb::Decision,
    reason: &str,
) -> pb::DecideRequest {
    pb::DecideRequest {
        session_id: session.into(),
        call_id: call_id.into(),
        decision: decision as i32,
        reason: reason.into(),
        approver: "alice@example.com".into(),
        ..Default::default()
    }
}

/// A matcher of every input.
pub fn any_input() -> pb::InputMatcher {
    pb::InputMatcher {
        kind: Some(pb::input_matcher::Kind::Any(pb::AnyInput {})),
    }
}

/// A matcher of exactly this input.
pub fn exact_input(input_json: &str) -> pb::InputMatcher {
    pb::InputMatcher {
        kind: Some(pb::input_matcher::Kind::ExactJson(input_json.into())),
    }
}

/// A matcher of inputs where every condition holds.
pub fn fields(conditions: Vec<pb::FieldCondition>) -> pb::InputMatcher {
    pb::InputMatcher {
        kind: Some(pb::input_matcher::Kind::Fields(pb::FieldConditions {
            conditions,
        })),
    }
}

fn condition(field: &str, test: pb::field_condition::Test) -> pb::FieldCondition {
    pb::FieldCondition {
        field: field.into(),
        test: Some(test),
    }
}

pub fn prefix(field: &str, prefix: &str) -> pb::FieldCondition {
    condition(field, pb::field_condition::Test::Prefix(prefix.into()))
}

pub fn glob(field: &str, glob: &str) -> pb::FieldCondition {
    condition(field, pb::field_condition::Test::Glob(glob.into()))
}

pub fn equals(field: &str, value: &str) -> pb::FieldCondition {
    condition(field, pb::field_condition::Test::Equals(value.into()))
}

pub fn equals_json(field: &str, json: &str) -> pb::FieldCondition {
    condition(field, pb::field_condition::Test::EqualsJson(json.into()))
}

/// A rule for CreateRule.
pub fn rule(
    id: &str,
    tool: &str,
    effect: pb::Effect,
    priority: i32,
    matcher: Option<pb::InputMatcher>,
) -> pb::Rule {
    pb::Rule {
        id: id.into(),
        tool: tool.into(),
        matcher,
        effect: effect as i32,
        priority,
        ..Default::default()
    }
}

/// The wall-clock time `d` from now, as a protobuf timestamp (a call's deadline).
pub fn in_future(d: Duration) -> prost_types::Timestamp {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock") + d;
    prost_types::Timestamp {
        seconds: t.as_secs() as i64,
        nanos: t.subsec_nanos() as i32,
    }
}
