//! An ACP agent's `session/request_permission` read as a broker call, and the broker's review
//! written back as the agent's answer. This file does no I/O: the proxy ([`super::proxy`]) reads
//! the lines and talks to the broker.
//!
//! # The request (ACP v1)
//! `params = {sessionId, toolCall: ToolCallUpdate, options: [PermissionOption]}`. The tool call
//! a request carries is often partial (claude-code-acp sends `toolCallId`, `rawInput` and
//! `title` only), so it is laid over what the agent announced for the same `toolCallId` in its
//! `session/update` `tool_call` / `tool_call_update` notifications ([`super::tool_calls`]).
//! A request without `toolCall` (the shape of ACP's v2 draft), an option of a kind v1 does not
//! name, or any field of the wrong type is refused: the proxy answers the request with a
//! JSON-RPC error saying why, and the tool does not run.
//!
//! # The broker call (host `acp`)
//! - session id: the request's `sessionId`; call id: `toolCall.toolCallId` (a retried request
//!   for the same tool call is the same broker call).
//! - tool: the agent's own tool name where it gives one (`toolCall.name`, else a `toolName`
//!   string in one of `_meta`'s objects, as claude-code-acp's `_meta.claudeCode.toolName`),
//!   else the ACP `kind` (`execute`, `edit`, `read`, ...), else `other`.
//! - input: `rawInput` when it is a JSON object (the agent's own arguments, e.g.
//!   `{"command": "git status"}`). Otherwise an object built from what the request shows:
//!   `{"kind", "title", "path", "locations", "oldText", "newText", "diffs", "rawInput"}`, each
//!   key present only when known: `path` is `locations[0].path`, else the first diff's path;
//!   `locations` is the ACP list as sent (`[{path, line?}]`); one `{type: "diff"}` content item
//!   gives `oldText` (null for a new file) and `newText`, several give `diffs`, a list of
//!   `{path, oldText, newText}`; `rawInput` is a raw input that is not an object.
//!   A normaliser reads such a call as: kind = the ACP `kind` (or the tool name), command =
//!   `rawInput.command` / input `command` for `execute`, path = `locations[0].path` / `path`
//!   for files.
//! - title: the ACP `title` on one line, else the tool name; message: the tool, its kind, its
//!   title and locations, for the approver. workspace: `--workspace`, else the session's `cwd`.
//!
//! # The answer
//! Options are chosen by their `kind` only, never by their id or name: an APPROVED outcome
//! (verified against its receipt by the proxy) selects `allow_once` (or `allow_always`, see
//! [`Reviewed::Allow`]); anything else selects `reject_once`, or `reject_always` for a denial a
//! broker grant made; with no option of the kind needed the answer is `cancelled`. Never an
//! allow for anything but a verified approval.

use serde_json::{Map, Value, json};

use crate::agent::hook::review::one_line;
use crate::proto::v1 as pb;

/// The method of the agent's permission request.
pub const METHOD: &str = "session/request_permission";
/// The value of `CallSpec.host` for calls this proxy submits.
pub const HOST: &str = "acp";
/// JSON-RPC's "Invalid params": the answer to a permission request this proxy cannot read.
pub const INVALID_PARAMS: i64 = -32602;

/// The kinds of permission option ACP v1 defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionKind {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
}

impl OptionKind {
    fn parse(text: &str) -> Option<OptionKind> {
        match text {
            "allow_once" => Some(OptionKind::AllowOnce),
            "allow_always" => Some(OptionKind::AllowAlways),
            "reject_once" => Some(OptionKind::RejectOnce),
            "reject_always" => Some(OptionKind::RejectAlways),
            _ => None,
        }
    }

    /// The kind as ACP spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OptionKind::AllowOnce => "allow_once",
            OptionKind::AllowAlways => "allow_always",
            OptionKind::RejectOnce => "reject_once",
            OptionKind::RejectAlways => "reject_always",
        }
    }
}

/// One option the agent offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionOption {
    pub option_id: String,
    pub kind: OptionKind,
}

/// A permission request, read once.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionRequest {
    pub session_id: String,
    pub tool_call_id: String,
    /// The tool call: what the agent announced for it, with the request's own fields on top.
    pub tool_call: Map<String, Value>,
    pub options: Vec<PermissionOption>,
}

impl PermissionRequest {
    /// Reads `params`; `announced` is what the agent's `session/update`s said of the tool call
    /// (see [`Self::tool_call_key`]). The error says what is wrong, for the agent and the log.
    pub fn parse(
        params: Option<&Value>,
        announced: impl FnOnce(&str, &str) -> Option<Map<String, Value>>,
    ) -> Result<PermissionRequest, String> {
        let Some(Value::Object(params)) = params else {
            return Err("`params` is missing or not an object".into());
        };
        let session_id = non_empty_string(params, "sessionId", "sessionId")?;
        let tool_call = match params.get("toolCall") {
            Some(Value::Object(tool_call)) => tool_call,
            None | Some(Value::Null) => {
                return Err(
                    "the request has no `toolCall` (the shape of ACP's v2 draft, which this \
                     proxy does not answer; it speaks ACP v1)"
                        .into(),
                );
            }
            Some(_) => return Err("`toolCall` is not an object".into()),
        };
        let tool_call_id = non_empty_string(tool_call, "toolCallId", "toolCall.toolCallId")?;
        let Some(Value::Array(listed)) = params.get("options") else {
            return Err("`options` is missing or not an array".into());
        };
        let options = listed
            .iter()
            .enumerate()
            .map(|(i, option)| read_option(i, option))
            .collect::<Result<Vec<_>, _>>()?;
        let mut merged = announced(&session_id, &tool_call_id).unwrap_or_default();
        lay_over(&mut merged, tool_call);
        Ok(PermissionRequest {
            session_id,
            tool_call_id,
            tool_call: merged,
            options,
        })
    }

    /// The agent's own tool name, if it gives one.
    fn tool_name(&self) -> Option<String> {
        if let Some(name) = self.string("name") {
            return Some(name.to_owned());
        }
        let Some(Value::Object(meta)) = self.tool_call.get("_meta") else {
            return None;
        };
        meta.values()
            .filter_map(|value| value.get("toolName")?.as_str())
            .find(|name| !name.is_empty())
            .map(str::to_owned)
    }

    /// The tool name the broker records: the agent's, else the ACP kind, else `other`.
    pub fn tool(&self) -> String {
        self.tool_name()
            .or_else(|| self.string("kind").map(str::to_owned))
            .unwrap_or_else(|| "other".into())
    }

    /// The input the broker records (see the module's documentation for its shape).
    pub fn input(&self) -> Map<String, Value> {
        if let Some(Value::Object(raw)) = self.tool_call.get("rawInput") {
            return raw.clone();
        }
        let mut input = Map::new();
        for key in ["kind", "title"] {
            if let Some(text) = self.string(key) {
                input.insert(key.into(), json!(text));
            }
        }
        let locations = self.tool_call.get("locations").and_then(Value::as_array);
        let diffs: Vec<Value> = self
            .tool_call
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("diff"))
            .map(|diff| {
                json!({
                    "path": diff.get("path").cloned().unwrap_or(Value::Null),
                    "oldText": diff.get("oldText").cloned().unwrap_or(Value::Null),
                    "newText": diff.get("newText").cloned().unwrap_or(Value::Null),
                })
            })
            .collect();
        let path = locations
            .and_then(|l| l.first())
            .and_then(|l| l.get("path"))
            .or_else(|| diffs.first().and_then(|d| d.get("path")))
            .and_then(Value::as_str);
        if let Some(path) = path {
            input.insert("path".into(), json!(path));
        }
        if let Some(locations) = locations.filter(|l| !l.is_empty()) {
            input.insert("locations".into(), Value::Array(locations.clone()));
        }
        match <[Value; 1]>::try_from(diffs) {
            Ok([diff]) => {
                input.insert("oldText".into(), diff["oldText"].clone());
                input.insert("newText".into(), diff["newText"].clone());
            }
            Err(diffs) if !diffs.is_empty() => {
                input.insert("diffs".into(), Value::Array(diffs));
            }
            Err(_) => {}
        }
        if let Some(raw) = self.tool_call.get("rawInput").filter(|raw| !raw.is_null()) {
            input.insert("rawInput".into(), raw.clone());
        }
        input
    }

    /// The broker call for this request; `workspace` is `--workspace` or the session's `cwd`.
    pub fn call(&self, workspace: Option<&str>) -> pb::CallSpec {
        let tool = self.tool();
        pb::CallSpec {
            call_id: self.tool_call_id.clone(),
            input_json: Value::Object(self.input()).to_string(),
            title: one_line(self.string("title").unwrap_or(&tool)),
            message: self.message(&tool),
            workspace: workspace
                .filter(|w| !w.chars().any(char::is_control))
                .unwrap_or_default()
                .into(),
            tool,
            host: HOST.into(),
            ..Default::default()
        }
    }

    fn message(&self, tool: &str) -> String {
        let mut message = format!("An ACP agent asks to run `{tool}`");
        if let Some(kind) = self.string("kind") {
            message.push_str(&format!(" (kind `{kind}`)"));
        }
        if let Some(title) = self.string("title") {
            message.push_str(&format!(": {title}"));
        }
        let paths: Vec<&str> = self
            .tool_call
            .get("locations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|l| l.get("path")?.as_str())
            .collect();
        if !paths.is_empty() {
            message.push_str(&format!("\n\nLocations: `{}`", paths.join("`, `")));
        }
        message.push_str(&format!(
            "\n\nSession `{}`, tool call `{}`, through `approval-broker acp-proxy`.",
            self.session_id, self.tool_call_id
        ));
        message.replace('\0', "")
    }

    fn string(&self, key: &str) -> Option<&str> {
        self.tool_call
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }

    /// The option of `kind` the agent offers first, if any.
    fn offered(&self, kind: OptionKind) -> Option<&PermissionOption> {
        self.options.iter().find(|option| option.kind == kind)
    }

    /// The answer `reviewed` calls for, chosen among the offered options by kind.
    pub fn answer(&self, reviewed: &Reviewed) -> Answer {
        let wanted: &[OptionKind] = match reviewed {
            Reviewed::Allow {
                remembered: true, ..
            } => &[OptionKind::AllowAlways, OptionKind::AllowOnce],
            Reviewed::Allow {
                remembered: false, ..
            } => &[OptionKind::AllowOnce],
            Reviewed::Reject {
                remembered: true, ..
            } => &[OptionKind::RejectAlways, OptionKind::RejectOnce],
            Reviewed::Reject {
                remembered: false, ..
            } => &[OptionKind::RejectOnce],
        };
        wanted
            .iter()
            .find_map(|kind| self.offered(*kind))
            .map_or(Answer::Cancelled, |option| Answer::Selected(option.clone()))
    }
}

/// What the broker's review calls for, before an option is chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Reviewed {
    /// A verified APPROVED outcome. `remembered`: the agent may be told "always" (only when the
    /// proxy is asked to, and a remembered decision approved the call); `reason` says who
    /// approved.
    Allow { remembered: bool, reason: String },
    /// Anything else; `reason` says why, for the log and the agent. `remembered`: a denial a
    /// remembered decision made.
    Reject { remembered: bool, reason: String },
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Selected(PermissionOption),
    Cancelled,
}

impl Answer {
    /// The JSON-RPC response to request `id`; `note` (the broker's status and reason) rides in
    /// `_meta.approvalBroker`, which ACP reserves for such additions.
    pub fn response(&self, id: &Value, note: Option<Value>) -> Value {
        let outcome = match self {
            Answer::Selected(option) => {
                json!({"outcome": "selected", "optionId": option.option_id})
            }
            Answer::Cancelled => json!({"outcome": "cancelled"}),
        };
        let mut result = json!({ "outcome": outcome });
        if let Some(note) = note {
            result["_meta"] = json!({ "approvalBroker": note });
        }
        json!({"jsonrpc": "2.0", "id": id, "result": result})
    }

    /// How the answer reads in a log line.
    pub fn describe(&self) -> String {
        match self {
            Answer::Selected(option) => {
                format!("`{}` ({})", option.option_id, option.kind.as_str())
            }
            Answer::Cancelled => "cancelled (no suitable option was offered)".into(),
        }
    }
}

/// The JSON-RPC error answering request `id` that could not be read.
pub fn refusal(id: &Value, why: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": INVALID_PARAMS,
            "message": format!(
                "approval-broker acp-proxy could not read this permission request ({why}); the \
                 tool call was not approved."
            ),
        },
    })
}

/// Fields of `update` set (not null) replace those of `base`, as ACP's `tool_call_update` does.
pub fn lay_over(base: &mut Map<String, Value>, update: &Map<String, Value>) {
    for (key, value) in update {
        if !value.is_null() {
            base.insert(key.clone(), value.clone());
        }
    }
}

fn read_option(i: usize, option: &Value) -> Result<PermissionOption, String> {
    let Value::Object(fields) = option else {
        return Err(format!("`options[{i}]` is not an object"));
    };
    let option_id = non_empty_string(fields, "optionId", &format!("options[{i}].optionId"))?;
    let kind = fields.get("kind").and_then(Value::as_str).unwrap_or("");
    let kind = OptionKind::parse(kind).ok_or_else(|| {
        format!(
            "`options[{i}].kind` is `{kind}`, not a kind ACP v1 defines (allow_once, \
             allow_always, reject_once, reject_always)"
        )
    })?;
    Ok(PermissionOption { option_id, kind })
}

fn non_empty_string(fields: &Map<String, Value>, key: &str, path: &str) -> Result<String, String> {
    match fields.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(format!("`{path}` is missing or not a non-empty string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(params: Value) -> Result<PermissionRequest, String> {
        PermissionRequest::parse(Some(&params), |_, _| None)
    }

    /// Option ids and names that say the opposite of their kind: only the kind counts.
    fn options() -> Value {
        json!([
            {"optionId": "reject", "name": "Reject", "kind": "allow_once"},
            {"optionId": "allow", "name": "Allow", "kind": "reject_once"},
            {"optionId": "forever", "name": "No, never", "kind": "allow_always"},
        ])
    }

    fn allow(remembered: bool) -> Reviewed {
        Reviewed::Allow {
            remembered,
            reason: "approved".into(),
        }
    }

    fn claude_code_acp() -> PermissionRequest {
        request(json!({
            "sessionId": "s1",
            "toolCall": {"toolCallId": "toolu_1", "rawInput": {"command": "git status"},
                         "title": "`git status`"},
            "options": options(),
        }))
        .unwrap()
    }

    #[test]
    fn options_are_chosen_by_kind_never_by_id_or_name() {
        let request = claude_code_acp();
        let chosen = |reviewed| match request.answer(&reviewed) {
            Answer::Selected(option) => option.option_id,
            Answer::Cancelled => "cancelled".into(),
        };
        assert_eq!(chosen(allow(false)), "reject");
        assert_eq!(chosen(allow(true)), "forever");
        let reject = |remembered| Reviewed::Reject {
            remembered,
            reason: "no".into(),
        };
        assert_eq!(chosen(reject(false)), "allow");
        // No reject_always offered: a remembered denial rejects once.
        assert_eq!(chosen(reject(true)), "allow");
    }

    #[test]
    fn with_no_option_of_the_kind_needed_the_answer_is_cancelled() {
        let only_always = request(json!({
            "sessionId": "s1", "toolCall": {"toolCallId": "t"},
            "options": [{"optionId": "a", "name": "a", "kind": "allow_always"},
                        {"optionId": "r", "name": "r", "kind": "reject_always"}],
        }))
        .unwrap();
        assert_eq!(only_always.answer(&allow(false)), Answer::Cancelled);
        let reject = Reviewed::Reject {
            remembered: false,
            reason: "no".into(),
        };
        assert_eq!(only_always.answer(&reject), Answer::Cancelled);
        assert_eq!(
            Answer::Cancelled.response(&json!(7), None),
            json!({"jsonrpc": "2.0", "id": 7, "result": {"outcome": {"outcome": "cancelled"}}})
        );
    }

    #[test]
    fn a_v2_request_an_unknown_kind_and_a_bad_field_are_refused() {
        let v2 = request(json!({
            "sessionId": "s1", "title": "Run git status",
            "subject": {"type": "command", "command": "git status"},
            "options": [{"optionId": "a", "name": "a", "kind": "allow_once"}],
        }));
        assert!(v2.unwrap_err().contains("v2 draft"));
        let unknown = request(json!({
            "sessionId": "s1", "toolCall": {"toolCallId": "t"},
            "options": [{"optionId": "a", "name": "a", "kind": "allow_sometimes"}],
        }));
        assert!(unknown.unwrap_err().contains("options[0].kind"));
        let no_id = request(json!({"sessionId": "s1", "toolCall": {}, "options": []}));
        assert!(no_id.unwrap_err().contains("toolCall.toolCallId"));
        assert!(PermissionRequest::parse(None, |_, _| None).is_err());
        let refused = refusal(&json!("r1"), "why");
        assert_eq!(refused["error"]["code"], json!(INVALID_PARAMS));
        assert_eq!(refused["id"], json!("r1"));
    }

    #[test]
    fn the_call_takes_the_agents_tool_name_and_raw_input() {
        let mut announced = Map::new();
        announced.insert("kind".into(), json!("execute"));
        announced.insert("_meta".into(), json!({"claudeCode": {"toolName": "Bash"}}));
        announced.insert("rawInput".into(), json!({"command": "old"}));
        let request = PermissionRequest::parse(
            Some(&json!({
                "sessionId": "s1",
                "toolCall": {"toolCallId": "toolu_1", "rawInput": {"command": "git status"},
                             "title": "git\nstatus", "kind": null},
                "options": options(),
            })),
            |session, call| {
                assert_eq!((session, call), ("s1", "toolu_1"));
                Some(announced)
            },
        )
        .unwrap();
        let call = request.call(Some("/repo"));
        assert_eq!(call.tool, "Bash");
        assert_eq!(call.call_id, "toolu_1");
        assert_eq!(call.host, "acp");
        assert_eq!(call.workspace, "/repo");
        assert_eq!(call.title, "git status");
        assert_eq!(
            serde_json::from_str::<Value>(&call.input_json).unwrap(),
            json!({"command": "git status"})
        );
        assert!(
            call.message.contains("(kind `execute`)"),
            "{}",
            call.message
        );
    }

    #[test]
    fn without_a_raw_object_the_input_is_built_from_what_the_request_shows() {
        let request = request(json!({
            "sessionId": "s1",
            "toolCall": {
                "toolCallId": "t1", "kind": "edit", "title": "Edit a.txt",
                "locations": [{"path": "/repo/a.txt", "line": 3}],
                "content": [{"type": "diff", "path": "/repo/a.txt", "oldText": "a", "newText": "b"},
                            {"type": "content", "content": {"type": "text", "text": "x"}}],
            },
            "options": options(),
        }))
        .unwrap();
        assert_eq!(request.tool(), "edit");
        assert_eq!(
            Value::Object(request.input()),
            json!({
                "kind": "edit", "title": "Edit a.txt", "path": "/repo/a.txt",
                "locations": [{"path": "/repo/a.txt", "line": 3}],
                "oldText": "a", "newText": "b",
            })
        );
        let two = super::tests::request(json!({
            "sessionId": "s1",
            "toolCall": {
                "toolCallId": "t3", "kind": "edit",
                "content": [{"type": "diff", "path": "/r/a", "oldText": null, "newText": "1"},
                            {"type": "diff", "path": "/r/b", "oldText": "x", "newText": "2"}],
            },
            "options": [],
        }))
        .unwrap();
        assert_eq!(
            Value::Object(two.input()),
            json!({
                "kind": "edit", "path": "/r/a",
                "diffs": [{"path": "/r/a", "oldText": null, "newText": "1"},
                          {"path": "/r/b", "oldText": "x", "newText": "2"}],
            })
        );
        let bare = super::tests::request(json!({
            "sessionId": "s1", "toolCall": {"toolCallId": "t2", "rawInput": "ls"}, "options": [],
        }))
        .unwrap();
        assert_eq!(bare.tool(), "other");
        assert_eq!(Value::Object(bare.input()), json!({"rawInput": "ls"}));
    }
}
