//! AgentService/GetOutcomes and WatchOutcomes: malformed requests are refused naming the field;
//! valid ones over unknown or odd ids list exactly what they should.

use approval_broker::proto::v1 as pb;

use super::table::*;
use crate::helpers::*;

fn get_outcomes(name: &'static str, session: &str, ids: Vec<String>, expect: Expect) -> Case {
    let request = pb::GetOutcomesRequest {
        session_id: session.into(),
        call_ids: ids,
    };
    case(name, expect, move |channel| {
        let request = request.clone();
        async move {
            match AgentServiceClient::new(channel).get_outcomes(request).await {
                Err(status) => Got::Status(status),
                Ok(response) => Got::Listed(
                    response
                        .into_inner()
                        .calls
                        .iter()
                        .map(|c| {
                            let state = match &c.state {
                                Some(pb::call_state::State::Outcome(_)) => "decided",
                                Some(pb::call_state::State::Pending(_)) => "pending",
                                Some(pb::call_state::State::Unknown(_)) => "unknown",
                                None => "none",
                            };
                            format!("{}={state}", c.call_id)
                        })
                        .collect(),
                ),
            }
        }
    })
}

/// WatchOutcomes: a refusal, or the outcomes sent before `caught_up` (`session/call_id`).
fn watch(name: &'static str, session: &str, ids: Vec<String>, expect: Expect) -> Case {
    let request = pb::WatchOutcomesRequest {
        session_id: session.into(),
        call_ids: ids,
    };
    case(name, expect, move |channel| {
        let request = request.clone();
        async move {
            use pb::watch_outcomes_response::Event as E;
            let mut stream = match AgentServiceClient::new(channel)
                .watch_outcomes(request)
                .await
            {
                Ok(response) => response.into_inner(),
                Err(status) => return Got::Status(status),
            };
            let mut outcomes = Vec::new();
            loop {
                match stream.message().await {
                    Err(status) => return Got::Status(status),
                    Ok(None) => return Got::Other("the watch ended before caught_up".into()),
                    Ok(Some(message)) => match message.event {
                        Some(E::Outcome(o)) => {
                            outcomes.push(format!("{}/{}", o.session_id, o.call_id))
                        }
                        Some(E::CaughtUp(_)) => return Got::Listed(outcomes),
                        _ => {}
                    },
                }
            }
        }
    })
}

pub(super) fn get_outcomes_cases() -> Vec<Case> {
    vec![
        get_outcomes(
            "get_outcomes: empty session id",
            "",
            vec!["c1".into()],
            invalid("session_id"),
        ),
        get_outcomes(
            "get_outcomes: no call ids",
            "seed",
            vec![],
            invalid("call_ids"),
        ),
        get_outcomes(
            "get_outcomes: 1025 call ids",
            "seed",
            ids(1025),
            invalid("call_ids"),
        ),
        get_outcomes(
            "get_outcomes: an empty call id among good ones",
            "seed",
            vec!["c1".into(), String::new()],
            invalid("call_ids[1]"),
        ),
        get_outcomes(
            "get_outcomes: a call id with an escape",
            "seed",
            vec!["\u{1b}[2J".into()],
            invalid("call_ids[0]"),
        ),
        get_outcomes(
            "get_outcomes: message over the gRPC limit",
            "seed",
            (0..300).map(|i| format!("{i:0>250}")).collect(),
            OVERSIZED,
        ),
        get_outcomes(
            "get_outcomes: wildcard call ids match nothing (valid)",
            "seed",
            vec!["c%".into(), "c_".into(), "c1".into()],
            Expect::Lists(&["c%=unknown", "c_=unknown", "c1=pending"]),
        ),
    ]
}

/// GetOutcomes.
async fn a_malformed_get_outcomes_is_refused_naming_its_field(app: TestApp) {
    refuses_every_case(&app, |_| get_outcomes_cases()).await;
}

pub(super) fn watch_cases() -> Vec<Case> {
    let big = "x".repeat(MESSAGE_LIMIT + 1);
    vec![
        watch("watch: empty session id", "", vec![], invalid("session_id")),
        watch(
            "watch: 257-byte session id",
            &"s".repeat(257),
            vec![],
            invalid("session_id"),
        ),
        watch(
            "watch: an empty call id",
            "seed",
            vec![String::new()],
            invalid("call_ids[0]"),
        ),
        watch(
            "watch: 1025 call ids",
            "seed",
            ids(1025),
            invalid("call_ids"),
        ),
        watch(
            "watch: message over the gRPC limit",
            &big,
            vec![],
            OVERSIZED,
        ),
        watch(
            "watch: a wildcard session matches nothing (valid)",
            "seed%",
            vec![],
            Expect::Lists(&[]),
        ),
    ]
}

/// WatchOutcomes.
async fn a_malformed_watch_outcomes_is_refused_naming_its_field(app: TestApp) {
    refuses_every_case(&app, |_| watch_cases()).await;
}

backend_tests! {
    a_malformed_get_outcomes_is_refused_naming_its_field => crate::bad_input::table::small_limits,
    a_malformed_watch_outcomes_is_refused_naming_its_field => crate::bad_input::table::small_limits,
}
