//! A `tools/call` as the broker sees it, and the broker's answer as the client sees it. The
//! tool's annotations (`readOnlyHint`, `destructiveHint`, `idempotentHint`, `openWorldHint`)
//! come from the server and are only claims: they are shown to the approver as such, and put in
//! the call's input under [`HINTS_KEY`] so policy rules can match them with field conditions
//! (`_mcp_hints.readOnlyHint` equals_json `true`). That key is the gateway's alone: arguments
//! that already hold it are refused, or a model could claim hints for itself, and it is removed
//! again before approved arguments reach the server. Nothing here runs a tool; only an APPROVED
//! outcome yields arguments to run.

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde_json::{Map, Value};

use crate::agent::hook::review::one_line;
use crate::proto::v1 as pb;

/// The input key that carries the tool's annotations to approvers and policy rules.
pub const HINTS_KEY: &str = "_mcp_hints";
/// The longest title shown to approvers, in characters (the broker takes 512 bytes).
/// Keys of the arguments that say best what a call does, in order of preference.
const SUMMARY_KEYS: [&str; 8] = [
    "command",
    "path",
    "file_path",
    "uri",
    "url",
    "query",
    "name",
    "pattern",
];

/// What the server declared about a tool, from its `tools/list` entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolFacts {
    pub title: Option<String>,
    pub description: Option<String>,
    pub annotations: Option<ToolAnnotations>,
}

impl From<&Tool> for ToolFacts {
    fn from(tool: &Tool) -> ToolFacts {
        ToolFacts {
            title: tool
                .title
                .clone()
                .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.clone())),
            description: tool.description.as_deref().map(str::to_owned),
            annotations: tool.annotations.clone(),
        }
    }
}

/// The declared hints, as the JSON object put under [`HINTS_KEY`]; `None` when the tool
/// declares none.
pub fn hints(annotations: Option<&ToolAnnotations>) -> Option<Map<String, Value>> {
    let annotations = annotations?;
    let mut hints = Map::new();
    for (key, value) in [
        ("readOnlyHint", annotations.read_only_hint),
        ("destructiveHint", annotations.destructive_hint),
        ("idempotentHint", annotations.idempotent_hint),
        ("openWorldHint", annotations.open_world_hint),
    ] {
        if let Some(value) = value {
            hints.insert(key.to_owned(), Value::Bool(value));
        }
    }
    (!hints.is_empty()).then_some(hints)
}

/// Why a tool call was not submitted at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSubmitted(pub String);

/// The broker call for a `tools/call` of `tool` with `arguments`.
pub fn call_spec(
    call_id: String,
    server: &str,
    tool: &str,
    arguments: Option<&JsonObject>,
    facts: Option<&ToolFacts>,
    workspace: Option<&str>,
) -> Result<pb::CallSpec, NotSubmitted> {
    let mut input = arguments.cloned().unwrap_or_default();
    if input.contains_key(HINTS_KEY) {
        return Err(NotSubmitted(format!(
            "The arguments hold the key `{HINTS_KEY}`, which the approval gateway reserves for \
             the tool's annotations; the tool was not run. Call it without that key."
        )));
    }
    let hints = facts.and_then(|f| hints(f.annotations.as_ref()));
    let message = message(server, tool, facts, hints.as_ref());
    let title = title(tool, facts, &input);
    if let Some(hints) = hints {
        input.insert(HINTS_KEY.to_owned(), Value::Object(hints));
    }
    Ok(pb::CallSpec {
        call_id,
        tool: tool.to_owned(),
        input_json: Value::Object(input).to_string(),
        title,
        message,
        workspace: workspace.unwrap_or_default().to_owned(),
        ..Default::default()
    })
}

/// `Write File: /srv/notes.txt`: the tool and the one argument that says what it does.
fn title(tool: &str, facts: Option<&ToolFacts>, input: &JsonObject) -> String {
    let name = facts
        .and_then(|f| f.title.as_deref())
        .filter(|t| !t.trim().is_empty())
        .unwrap_or(tool);
    let summary = SUMMARY_KEYS
        .iter()
        .find_map(|key| input.get(*key).and_then(Value::as_str));
    match summary {
        Some(summary) => one_line(&format!("{name}: {summary}")),
        None => one_line(name),
    }
}

fn message(
    server: &str,
    tool: &str,
    facts: Option<&ToolFacts>,
    hints: Option<&Map<String, Value>>,
) -> String {
    let mut message =
        format!("An MCP client asks to run the tool `{tool}` of the server `{server}`.");
    if let Some(description) = facts.and_then(|f| f.description.as_deref()) {
        message.push_str("\n\nThe server describes it: ");
        message.push_str(description.trim());
    }
    match hints {
        Some(hints) => {
            let listed: Vec<String> = hints.iter().map(|(k, v)| format!("`{k}: {v}`")).collect();
            message.push_str(&format!(
                "\n\nThe server declares {} (hints it gives about itself, not checked by anyone; \
                 also in the input as `{HINTS_KEY}`, which is not passed to the tool).",
                listed.join(", ")
            ));
        }
        None => message.push_str("\n\nThe server declares no hints about this tool."),
    }
    message.replace('\0', "")
}

/// What an outcome calls for.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// Run the tool with these arguments (the approved input, without [`HINTS_KEY`]).
    Run(JsonObject),
    /// Do not run it; the client gets this error result.
    Refuse(CallToolResult),
}

/// Only an APPROVED outcome whose input reads as an object runs the tool.
pub fn disposition(outcome: &pb::Outcome) -> Disposition {
    if outcome.status != pb::CallStatus::Approved as i32 {
        let text = if outcome.tool_result.is_empty() {
            "The tool call was not approved; the tool was not run."
        } else {
            outcome.tool_result.as_str()
        };
        return Disposition::Refuse(refusal(text));
    }
    match serde_json::from_str(&outcome.input_json) {
        Ok(Value::Object(mut input)) => {
            input.remove(HINTS_KEY);
            Disposition::Run(input)
        }
        // Running anything else would not be what the approver approved.
        _ => Disposition::Refuse(refusal(
            "The approved input could not be read as a JSON object; the tool was not run.",
        )),
    }
}

/// A tool result with `isError: true` and this text, which the model reads.
pub fn refusal(text: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn annotated(read_only: bool, destructive: Option<bool>) -> ToolFacts {
        let mut annotations = ToolAnnotations::new();
        annotations.read_only_hint = Some(read_only);
        annotations.destructive_hint = destructive;
        ToolFacts {
            title: Some("Write File".into()),
            description: Some("Writes a file.".into()),
            annotations: Some(annotations),
        }
    }

    fn object(value: Value) -> JsonObject {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    #[test]
    fn declared_hints_go_into_the_input_and_the_message_as_claims() {
        let facts = annotated(false, Some(true));
        let args = object(json!({"path": "/srv/a.txt", "content": "hi"}));
        let call = call_spec(
            "3".into(),
            "fs",
            "write_file",
            Some(&args),
            Some(&facts),
            None,
        )
        .expect("submitted");
        let input: Value = serde_json::from_str(&call.input_json).unwrap();
        assert_eq!(
            input[HINTS_KEY],
            json!({"readOnlyHint": false, "destructiveHint": true})
        );
        assert_eq!(input["path"], "/srv/a.txt");
        assert_eq!(call.title, "Write File: /srv/a.txt");
        assert!(
            call.message.contains("`destructiveHint: true`"),
            "{}",
            call.message
        );
        assert!(call.message.contains("not checked"), "{}", call.message);
    }

    /// The inbox reads the server and tool from this sentence (web/src/input.ts, `MCP_MESSAGE`)
    /// and shows them as fields: reword one, reword the other.
    #[test]
    fn the_message_opens_with_the_sentence_the_inbox_reads_the_server_and_tool_from() {
        let call = call_spec("1".into(), "files", "delete_file", None, None, None).unwrap();
        assert!(
            call.message.starts_with(
                "An MCP client asks to run the tool `delete_file` of the server `files`."
            ),
            "{}",
            call.message
        );
        let page = include_str!("../../../web/src/input.ts");
        assert!(
            page.contains(
                "/^An MCP client asks to run the tool `([^`]*)` of the server `([^`]*)`\\./"
            ),
            "web/src/input.ts reads another sentence"
        );
    }

    #[test]
    fn a_tool_without_hints_gets_no_hints_key() {
        let call = call_spec("1".into(), "s", "echo", None, None, Some("/repo")).unwrap();
        assert_eq!(call.input_json, "{}");
        assert_eq!(call.workspace, "/repo");
        assert!(call.message.contains("declares no hints"));
    }

    #[test]
    fn arguments_that_claim_hints_for_themselves_are_refused() {
        let args = object(json!({HINTS_KEY: {"readOnlyHint": true}}));
        let refused = call_spec("1".into(), "s", "rm", Some(&args), None, None).unwrap_err();
        assert!(refused.0.contains(HINTS_KEY));
    }

    #[test]
    fn only_an_approved_outcome_runs_and_without_the_hints() {
        // Every status the proto knows but APPROVED (a new one included).
        let not_approved = (0..64)
            .filter_map(|n| pb::CallStatus::try_from(n).ok())
            .filter(|s| *s != pb::CallStatus::Approved);
        for status in not_approved {
            let outcome = pb::Outcome {
                status: status as i32,
                tool_result: "The user denied this tool call.".into(),
                input_json: "{}".into(),
                ..Default::default()
            };
            let Disposition::Refuse(result) = disposition(&outcome) else {
                panic!("{status:?} ran the tool");
            };
            assert_eq!(result.is_error, Some(true));
        }
        let approved = pb::Outcome {
            status: pb::CallStatus::Approved as i32,
            input_json: json!({"path": "/b", HINTS_KEY: {"readOnlyHint": true}}).to_string(),
            input_edited: true,
            ..Default::default()
        };
        assert_eq!(
            disposition(&approved),
            Disposition::Run(object(json!({"path": "/b"})))
        );
        let garbled = pb::Outcome {
            status: pb::CallStatus::Approved as i32,
            input_json: "[1]".into(),
            ..Default::default()
        };
        assert!(matches!(disposition(&garbled), Disposition::Refuse(_)));
    }
}
