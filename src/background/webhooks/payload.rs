//! What an endpoint receives for an event: a CloudEvents 1.0 JSON event, or a Slack
//! incoming-webhook message. Built from the event alone, so a retry sends the same body (only
//! the signature's timestamp changes). A Slack message never carries the tool input: it goes to
//! a chat channel, and the inbox link is where the input is shown.

use serde_json::{Value, json};

use crate::domain::webhook::PayloadFormat;
use crate::domain::{Call, Event, EventKind, Timestamp};

/// The CloudEvents `source` of every event.
const SOURCE: &str = "approval-broker";

/// The message id of an event, the same on every attempt (`webhook-id`, CloudEvents `id`).
pub fn message_id(event: &Event) -> String {
    format!("evt_{}", event.seq)
}

/// The body of `event` in `format`; `inbox_url` is the inbox's base URL for links, `link` a
/// signed approval link to its call ([`signed_link`]), carried by CloudEvents as `data.link`.
pub fn body(
    event: &Event,
    format: PayloadFormat,
    inbox_url: Option<&str>,
    link: Option<String>,
) -> Vec<u8> {
    let value = match format {
        PayloadFormat::CloudEvents => {
            let mut value = cloud_event(event);
            if let Some(link) = link {
                value["data"]["link"] = Value::String(link);
            }
            value
        }
        PayloadFormat::Slack => slack_message(event, inbox_url),
    };
    serde_json::to_vec(&value).expect("JSON values always serialise")
}

/// A signed approval link to `event`'s call (docs/answers.md), when the broker has a link key and
/// knows the inbox's URL. It expires a link's lifetime after the call was requested, so a retry
/// sends the same body.
pub fn signed_link(
    event: &Event,
    inbox_url: Option<&str>,
    links: Option<&(
        std::sync::Arc<crate::door::links::LinkKey>,
        std::time::Duration,
    )>,
) -> Option<String> {
    let (key, lifetime) = links?;
    let call = &event.call;
    Some(
        key.sign(&call.key, call.created_at.saturating_add(*lifetime))
            .url(inbox_url?),
    )
}

/// The CloudEvents `type` of an event kind.
pub fn event_type(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Requested => "approvals.v1.call.requested",
        EventKind::Resolved => "approvals.v1.call.resolved",
        EventKind::Reminded => "approvals.v1.call.reminded",
        EventKind::Escalated => "approvals.v1.call.escalated",
        EventKind::ApprovalRecorded => "approvals.v1.call.approval_recorded",
    }
}

/// When an event happened, from the event alone (so a retry sends the same body): a decision's
/// time, a fired step's due time, or the request's.
fn event_time(event: &Event) -> Timestamp {
    let call = &event.call;
    match (&event.kind, &call.outcome, event.fired_step()) {
        (EventKind::Resolved, Some(outcome), _) => outcome.decided_at,
        (_, _, Some(step)) => call.created_at.saturating_add(step.after),
        _ => call.created_at,
    }
}

fn cloud_event(event: &Event) -> Value {
    let call = &event.call;
    let time = event_time(event);
    json!({
        "specversion": "1.0",
        "id": message_id(event),
        "source": SOURCE,
        "type": event_type(event.kind),
        "subject": format!("{}/{}/{}", call.key.agent, call.key.session, call.key.call_id),
        "time": rfc3339(time),
        "datacontenttype": "application/json",
        "data": call_data(event),
    })
}

fn call_data(event: &Event) -> Value {
    let call = &event.call;
    let input: Value = serde_json::from_str(call.input.as_str()).unwrap_or(Value::Null);
    let mut data = json!({
        "seq": event.seq,
        "agent": call.key.agent.as_str(),
        "session_id": call.key.session.as_str(),
        "call_id": call.key.call_id.as_str(),
        "batch_id": call.batch_id.as_str(),
        "position": call.position,
        "batch_size": call.batch_size,
        "tool": call.tool.as_str(),
        "input": input,
        "title": call.title,
        "message": call.message,
        "workspace": call.workspace,
        "created_at": rfc3339(call.created_at),
        "deadline": call.deadline.map(rfc3339),
        "status": status(call),
    });
    if let Some(outcome) = &call.outcome {
        data["outcome"] = json!({
            "status": outcome.kind.to_string(),
            "decided_by": outcome.decided_by.to_string(),
            "decided_at": rfc3339(outcome.decided_at),
            "reason": outcome.reason,
            "input_edited": outcome.input_edited,
            "responded": outcome.responded(),
        });
        data["batch_completed"] = json!(event.batch_completed);
    }
    if let (Some(index), Some(step)) = (event.step, event.fired_step()) {
        data["escalation"] = json!({
            "step": index,
            "kind": step.kind.as_str(),
            "after": humantime::format_duration(step.after).to_string(),
            "endpoints": step.endpoints.iter().map(|e| e.as_str()).collect::<Vec<_>>(),
        });
    }
    data
}

fn status(call: &Call) -> String {
    match &call.outcome {
        None => "PENDING".into(),
        Some(outcome) => outcome.kind.to_string(),
    }
}

/// A Slack incoming-webhook message: `text` (the summary, which Slack shows in notifications)
/// and one `section` block with the same text.
fn slack_message(event: &Event, inbox_url: Option<&str>) -> Value {
    let call = &event.call;
    let what = if call.title.is_empty() {
        format!("`{}`", escape(call.tool.as_str()))
    } else {
        format!("{} (`{}`)", escape(&call.title), escape(call.tool.as_str()))
    };
    let who = format!(
        "agent {} · session {}",
        escape(call.key.agent.as_str()),
        escape(call.key.session.as_str())
    );
    let mut text = match (&event.kind, &call.outcome) {
        (EventKind::Resolved, Some(outcome)) => format!(
            "{}: {what} ({who}), decided by {}",
            outcome.kind,
            escape(&outcome.decided_by.to_string())
        ),
        (EventKind::Reminded, _) => format!(
            "Reminder: approval still waiting{}: {what} ({who})",
            waiting_for(event)
        ),
        (EventKind::Escalated, _) => format!(
            "Escalated: approval still waiting{}: {what} ({who})",
            waiting_for(event)
        ),
        _ => format!("Approval requested: {what} ({who})"),
    };
    if let Some(base) = inbox_url {
        text.push_str(&format!(" <{}|Open in the inbox>", inbox_link(base, call)));
    }
    json!({
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
    })
}

/// ` for 15m`: how long a fired step's call has waited (nothing for other events).
fn waiting_for(event: &Event) -> String {
    event
        .fired_step()
        .map(|step| format!(" for {}", humantime::format_duration(step.after)))
        .unwrap_or_default()
}

/// The inbox's page for a call: `<base>/#call/<agent>/<session>/<call>`.
pub fn inbox_link(base: &str, call: &Call) -> String {
    format!(
        "{}/#call/{}/{}/{}",
        base.trim_end_matches('/'),
        percent(call.key.agent.as_str()),
        percent(call.key.session.as_str()),
        percent(call.key.call_id.as_str())
    )
}

/// Escapes what Slack's mrkdwn treats as markup (its documented three).
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Percent-encodes all but unreserved characters, so an id cannot break the link or its
/// `<url|label>` markup.
fn percent(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A timestamp as RFC 3339 UTC with microseconds.
pub fn rfc3339(time: Timestamp) -> String {
    let micros = time.as_micros().max(0) as u64;
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros);
    humantime::format_rfc3339_micros(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_percent_encoded_in_inbox_links() {
        assert_eq!(percent("a b/c|d"), "a%20b%2Fc%7Cd");
        assert_eq!(escape("<x> & y"), "&lt;x&gt; &amp; y");
    }

    /// A pending call requested at 0 whose ladder is a 15-minute reminder and a 1-hour
    /// escalation to `oncall`, as the event of its step `step` leaves it.
    fn fired(step: u32, kind: EventKind) -> Event {
        use crate::domain::escalation::{Escalation, Ladder};
        let steps = serde_json::json!([
            {"after": "15m"},
            {"after": "1h", "kind": "escalation", "endpoints": ["oncall"]}
        ]);
        let ladder = Ladder::from_json("escalation", &steps).unwrap();
        let call = Call {
            escalation: Some(Escalation {
                ladder,
                fired: step + 1,
                next_at: None,
            }),
            ..Call::sample("a", "s", "c", "deploy", "b")
        };
        Event {
            seq: 7,
            kind,
            call,
            batch_completed: false,
            step: Some(step),
        }
    }

    #[test]
    fn a_fired_step_is_typed_by_its_kind_timed_when_due_and_names_its_step() {
        let event = fired(1, EventKind::Escalated);
        let body: Value =
            serde_json::from_slice(&body(&event, PayloadFormat::CloudEvents, None, None)).unwrap();
        assert_eq!(body["type"], "approvals.v1.call.escalated");
        assert_eq!(body["time"], "1970-01-01T01:00:00.000000Z");
        assert_eq!(body["data"]["status"], "PENDING");
        assert_eq!(
            body["data"]["escalation"],
            json!({"step": 1, "kind": "escalation", "after": "1h", "endpoints": ["oncall"]})
        );
        let slack: Value =
            serde_json::from_slice(&body_of_slack(&fired(0, EventKind::Reminded))).unwrap();
        let text = slack["text"].as_str().unwrap();
        assert!(
            text.starts_with("Reminder: approval still waiting for 15m: `deploy`"),
            "{text}"
        );
    }

    fn body_of_slack(event: &Event) -> Vec<u8> {
        body(event, PayloadFormat::Slack, None, None)
    }
}
