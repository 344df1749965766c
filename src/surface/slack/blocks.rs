//! The Slack messages of a call, in Block Kit: built from the call alone (pure), within Block
//! Kit's documented limits, and with every text that came from an agent or a person escaped, so
//! that nothing in a tool input, a title or an identity is read by Slack as markup: no
//! `<!channel>`, no `<@U…>` mention, no `<https://…|link>`, no leaving the code block.
//!
//! The buttons carry the call's key (agent, session, call id) as their value; a click says
//! which call and which verdict, never who decides: that comes from the signed request's user,
//! mapped to an approver (see `interactivity`). A call whose requirement asks for a passkey has
//! no Approve button: Slack cannot carry the person's passkey, so its button opens the call in
//! the inbox instead (Deny needs no passkey and stays).

use serde_json::{Value, json};

use crate::domain::{AgentId, Call, CallId, CallKey, SessionId};

/// Block Kit's documented limits (api.slack.com/reference/block-kit), checked by the tests.
pub mod limits {
    /// Blocks in one message.
    pub const BLOCKS: usize = 50;
    /// Characters of a section's text.
    pub const SECTION_TEXT: usize = 3000;
    /// Characters of a context block's text element.
    pub const CONTEXT_TEXT: usize = 3000;
    /// Characters of a button's value.
    pub const BUTTON_VALUE: usize = 2000;
    /// Characters of a button's text.
    pub const BUTTON_TEXT: usize = 75;
    /// Characters of an action id or block id.
    pub const ACTION_ID: usize = 255;
    /// Characters of a button's URL.
    pub const URL: usize = 3000;
    /// Characters of the top-level `text` Slack keeps (it truncates beyond).
    pub const TEXT: usize = 40_000;
}

/// The action ids of the buttons.
pub const APPROVE: &str = "approve";
pub const DENY: &str = "deny";
pub const OPEN: &str = "open";

/// The most characters of the tool input shown (the code block's fences and escapes fit within
/// a section's 3000).
const INPUT_SHOWN: usize = 2800;

/// Escapes what Slack's mrkdwn reads as markup: `&`, `<` and `>` (its documented three), so
/// `<!channel>` and `<@U123>` are shown as typed and notify nobody.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        _ => out.push(c),
    }
}

/// `text` escaped, and cut (on a character, never inside an escape) to at most `most` bytes
/// with a note of how much was left out.
fn escaped_within(text: &str, most: usize) -> String {
    let mut out = String::new();
    let mut shown = 0;
    for c in text.chars() {
        let before = out.len();
        push_escaped(&mut out, c);
        if out.len() > most {
            out.truncate(before);
            let left = text.len() - shown;
            out.push_str(&format!(
                "\n… ({left} more bytes: open the call to see them all)"
            ));
            return out;
        }
        shown += c.len_utf8();
    }
    out
}

/// The input in a code block: escaped, its own ``` broken (a zero-width space between the
/// backticks) so that it cannot close the block, and bounded.
fn code_block(input: &str) -> String {
    let fenced = input.replace("```", "`\u{200b}`\u{200b}`");
    format!("```{}```", escaped_within(&fenced, INPUT_SHOWN))
}

/// What a button's value says: the call's key.
pub fn button_value(key: &CallKey) -> String {
    json!({"agent": key.agent.as_str(), "session": key.session.as_str(), "call": key.call_id.as_str()})
        .to_string()
}

/// The call a button's value names; `None` for a value the broker did not write.
pub fn parse_button_value(value: &str) -> Option<CallKey> {
    let value: Value = serde_json::from_str(value).ok()?;
    let text = |name: &str| value.get(name)?.as_str().map(str::to_owned);
    Some(CallKey {
        agent: AgentId::parse("agent", text("agent")?).ok()?,
        session: SessionId::parse("session", text("session")?).ok()?,
        call_id: CallId::parse("call", text("call")?).ok()?,
    })
}

/// The one-line summary: Slack's notification text and the fallback where blocks are not shown.
fn summary(call: &Call, lead: &str) -> String {
    let what = if call.title.is_empty() {
        format!("`{}`", escape(call.tool.as_str()))
    } else {
        format!("{} (`{}`)", escape(&call.title), escape(call.tool.as_str()))
    };
    let text = format!(
        "{lead}: {what} (agent {} · session {})",
        escape(call.key.agent.as_str()),
        escape(call.key.session.as_str())
    );
    escaped_cut(&text, limits::SECTION_TEXT)
}

/// Cuts already escaped text to `most` bytes on a character boundary.
fn escaped_cut(text: &str, most: usize) -> String {
    if text.len() <= most {
        return text.to_owned();
    }
    let mut end = most - 1;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end.saturating_sub(2)])
}

/// Who asked and who must answer, in one context line.
fn context(call: &Call) -> String {
    let mut parts = Vec::new();
    if !call.requested_by.is_empty() {
        parts.push(format!("requested by *{}*", escape(&call.requested_by)));
    }
    if !call.workspace.is_empty() {
        parts.push(format!("workspace {}", escape(&call.workspace)));
    }
    parts.push(requirement(call));
    escaped_cut(&parts.join(" · "), limits::CONTEXT_TEXT)
}

/// The call's requirement in words.
pub fn requirement(call: &Call) -> String {
    let Some(approval) = &call.approval else {
        return "any one approver".into();
    };
    let approvers = &approval.requirement.approvers;
    let who = if approvers.groups.is_empty() {
        "any approver".to_owned()
    } else {
        format!("members of {}", escape(&approvers.groups.join(", ")))
    };
    let mut text = match approvers.quorum {
        1 => format!("needs 1 approval from {who}"),
        n => format!("needs {n} approvals from distinct {who}"),
    };
    if approvers.distinct_groups {
        text.push_str(", each from another group");
    }
    if !approval.votes.is_empty() {
        text.push_str(&format!(" ({} vote(s) so far)", approval.votes.len()));
    }
    if let Some(rule) = &approval.requirement.rule {
        text.push_str(&format!(" (rule `{}`)", escape(rule)));
    }
    if approval.requirement.needs_passkey() {
        text.push_str(", each signed with a passkey: approve it in the inbox");
    }
    text
}

/// Whether approving `call` needs a passkey, which only the inbox can carry.
pub fn needs_passkey(call: &Call) -> bool {
    call.approval
        .as_ref()
        .is_some_and(|a| a.requirement.needs_passkey())
}

fn section(text: String) -> Value {
    json!({"type": "section", "text": {"type": "mrkdwn", "text": text}})
}

/// The blocks every message of a call starts with: what, the input, who.
fn call_blocks(call: &Call, lead: &str) -> Vec<Value> {
    vec![
        section(format!("*{}*", summary(call, lead))),
        section(code_block(call.input.as_str())),
        json!({"type": "context", "elements": [{"type": "mrkdwn", "text": context(call)}]}),
    ]
}

/// The inbox's page for the call, if the inbox's address is configured and the link fits.
fn open_url(call: &Call, inbox_url: Option<&str>) -> Option<String> {
    let url = crate::background::webhooks::payload::inbox_link(inbox_url?, call);
    (url.len() <= limits::URL).then_some(url)
}

/// The message for a pending call: Approve, Deny (with a confirmation) and Open; for a call
/// that needs a passkey, "Approve in the inbox" (opening the call there) and Deny.
pub fn pending(call: &Call, inbox_url: Option<&str>) -> Value {
    let mut blocks = call_blocks(call, "Approval requested");
    let value = button_value(&call.key);
    let mut buttons = Vec::new();
    let passkey = needs_passkey(call);
    let open = open_url(call, inbox_url);
    if passkey && let Some(url) = &open {
        buttons.push(json!({
            "type": "button", "action_id": OPEN, "url": url, "style": "primary",
            "text": {"type": "plain_text", "text": "Approve in the inbox"},
        }));
    }
    if value.chars().count() <= limits::BUTTON_VALUE {
        if !passkey {
            buttons.push(json!({
                "type": "button", "action_id": APPROVE, "style": "primary",
                "text": {"type": "plain_text", "text": "Approve"}, "value": value,
            }));
        }
        buttons.push(json!({
            "type": "button", "action_id": DENY, "style": "danger",
            "text": {"type": "plain_text", "text": "Deny"}, "value": value,
            "confirm": {
                "title": {"type": "plain_text", "text": "Deny this call?"},
                "text": {"type": "plain_text", "text": "The agent is told it was denied."},
                "confirm": {"type": "plain_text", "text": "Deny"},
                "deny": {"type": "plain_text", "text": "Cancel"},
            },
        }));
    }
    if !passkey && let Some(url) = open {
        buttons.push(json!({
            "type": "button", "action_id": OPEN, "url": url,
            "text": {"type": "plain_text", "text": "Open"},
        }));
    }
    if !buttons.is_empty() {
        blocks.push(json!({"type": "actions", "block_id": "decide", "elements": buttons}));
    }
    json!({"text": summary(call, "Approval requested"), "blocks": blocks})
}

/// The message once the call is decided: its outcome and who decided, no buttons left.
pub fn decided(call: &Call, inbox_url: Option<&str>) -> Value {
    let Some(outcome) = &call.outcome else {
        return pending(call, inbox_url);
    };
    let lead = format!("{}", outcome.kind);
    let mut blocks = call_blocks(call, &lead);
    let mut text = format!(
        "*{}* by {}",
        outcome.kind,
        escape(&outcome.decided_by.to_string())
    );
    if !outcome.reason.is_empty() {
        text.push_str(&format!(": {}", escape(&outcome.reason)));
    }
    blocks.push(section(escaped_cut(&text, limits::SECTION_TEXT)));
    json!({"text": summary(call, &lead), "blocks": blocks})
}

/// A reply in the call's thread (a reminder, an escalation, a vote recorded).
pub fn thread_note(text: &str) -> Value {
    json!({"text": escaped_cut(&escape(text), limits::SECTION_TEXT)})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_links_and_entities_are_shown_as_typed() {
        assert_eq!(
            escape("<!channel> <@U1> <https://x|y> &amp;"),
            "&lt;!channel&gt; &lt;@U1&gt; &lt;https://x|y&gt; &amp;amp;"
        );
    }

    #[test]
    fn an_input_cannot_close_its_code_block_and_is_bounded_on_a_character() {
        let block = code_block("a```b");
        assert_eq!(block.matches("```").count(), 2, "{block}");
        let long = "é<".repeat(5000);
        let block = code_block(&long);
        assert!(block.len() <= limits::SECTION_TEXT, "{}", block.len());
        assert!(block.contains("more bytes"), "the cut is said");
        assert!(
            !block.contains("&l\n") && !block.contains("&lt\n"),
            "never inside an escape"
        );
    }

    #[test]
    fn a_button_value_names_the_call_and_nothing_else_is_read_as_one() {
        let key = CallKey {
            agent: AgentId::parse("agent", "a").unwrap(),
            session: SessionId::parse("session", "s").unwrap(),
            call_id: CallId::parse("call", "c\"1").unwrap(),
        };
        assert_eq!(parse_button_value(&button_value(&key)), Some(key));
        assert_eq!(parse_button_value("{\"agent\":\"a\"}"), None);
        assert_eq!(parse_button_value("approve"), None);
    }

    #[test]
    fn long_summaries_are_cut_within_the_limit() {
        let cut = escaped_cut(&"é".repeat(4000), limits::SECTION_TEXT);
        assert!(cut.len() <= limits::SECTION_TEXT && cut.ends_with('…'));
    }
}
