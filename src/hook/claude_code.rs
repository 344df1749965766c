//! `approval-broker hook claude-code`: Claude Code's `PreToolUse` and `PermissionRequest` hooks,
//! answered by the broker. Claude Code runs the command with the hook input as JSON on standard
//! input; the command submits the tool call (the hook's `session_id`, and its `tool_use_id` as
//! the call id, so running the hook again for the same call is idempotent), waits for the
//! outcome, and prints the hook's decision JSON with exit code 0: allow (with `updatedInput` when
//! the approver edited the input), or deny with the outcome's tool-result text, which the model
//! reads. The shapes are Claude Code's documented ones (its hooks reference, and the CLI's own
//! output schema). This file must never answer "allow" for anything but an APPROVED outcome: a
//! timeout, an unreachable broker or a refusal answers "deny" or "ask" as configured, and input
//! it cannot read exits 2, which blocks the call.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::receipt_check::{NoKeys, ReceiptCheck, ReceiptCheckArgs, Unverified};
use super::review::{BrokerAddress, Review, ReviewError, one_line, review};
use crate::proto::v1 as pb;

/// The exit code with which Claude Code blocks the call and shows standard error.
const EXIT_BLOCK: u8 = 2;
/// The longest title shown to approvers, in characters (the broker takes 512 bytes).
/// Keys of `tool_input` that say best what a call does, in order of preference.
const SUMMARY_KEYS: [&str; 7] = [
    "command",
    "file_path",
    "notebook_path",
    "path",
    "url",
    "query",
    "pattern",
];

/// The settings of `hook claude-code`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClaudeCodeArgs {
    #[command(flatten)]
    pub broker: BrokerAddress,

    /// How long to wait for a decision, e.g. `90s`, `5m`. Keep it below the `timeout` of the hook
    /// entry in settings.json (Claude Code's default is 600 seconds).
    #[arg(long, env = "APPROVALS_HOOK_TIMEOUT", default_value = "5m", value_parser = crate::domain::time::parse_duration)]
    pub timeout: Duration,

    /// The answer when no decision arrives in time: `deny` (the tool is not run; the model is
    /// told why) or `ask` (Claude Code asks the user in its own prompt). The call is cancelled at
    /// the broker either way.
    #[arg(long, env = "APPROVALS_HOOK_ON_TIMEOUT", value_enum, default_value_t = FailClosed::Deny)]
    pub on_timeout: FailClosed,

    /// The answer when the broker cannot be reached or refuses the request as a whole (network,
    /// TLS, token): `deny` or `ask`, as for --on-timeout.
    #[arg(long, env = "APPROVALS_HOOK_ON_UNREACHABLE", value_enum, default_value_t = FailClosed::Deny)]
    pub on_unreachable: FailClosed,

    /// The workspace recorded with the call (approvers filter on it; workspace grants match it).
    /// Default: the hook input's `cwd`.
    #[arg(long, env = "APPROVALS_HOOK_WORKSPACE")]
    pub workspace: Option<String>,

    #[command(flatten)]
    pub receipts: ReceiptCheckArgs,
}

/// What a hook answers when the broker gave no outcome. Neither runs the tool unasked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailClosed {
    /// The tool is not run, and the model reads why.
    Deny,
    /// Claude Code asks its user, as if there were no hook.
    Ask,
}

/// The hook events this command answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    PreToolUse,
    PermissionRequest,
}

impl HookEvent {
    fn name(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PermissionRequest => "PermissionRequest",
        }
    }
}

/// The fields of Claude Code's hook input this command uses, read once.
#[derive(Debug, Clone, PartialEq)]
pub struct HookInput {
    pub event: HookEvent,
    pub session_id: String,
    /// Present on `PreToolUse`; `PermissionRequest` inputs carry none.
    pub tool_use_id: Option<String>,
    pub tool_name: String,
    pub tool_input: Map<String, Value>,
    pub cwd: Option<String>,
    pub permission_mode: Option<String>,
}

impl HookInput {
    /// Reads the hook input; an error names the field at fault.
    pub fn parse(text: &str) -> Result<HookInput, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("the hook input is not JSON: {e}"))?;
        let Value::Object(mut fields) = value else {
            return Err("the hook input is not a JSON object".into());
        };
        let event = match required_string(&fields, "hook_event_name")?.as_str() {
            "PreToolUse" => HookEvent::PreToolUse,
            "PermissionRequest" => HookEvent::PermissionRequest,
            other => {
                return Err(format!(
                    "hook_event_name: `{other}` is not an event this hook answers \
                     (PreToolUse or PermissionRequest)"
                ));
            }
        };
        let tool_use_id = match event {
            HookEvent::PreToolUse => Some(required_string(&fields, "tool_use_id")?),
            HookEvent::PermissionRequest => optional_string(&fields, "tool_use_id")?,
        };
        let tool_input = match fields.remove("tool_input") {
            Some(Value::Object(input)) => input,
            Some(_) => return Err("tool_input: must be a JSON object".into()),
            None => return Err("tool_input: missing".into()),
        };
        Ok(HookInput {
            event,
            session_id: required_string(&fields, "session_id")?,
            tool_use_id,
            tool_name: required_string(&fields, "tool_name")?,
            tool_input,
            cwd: optional_string(&fields, "cwd")?,
            permission_mode: optional_string(&fields, "permission_mode")?,
        })
    }

    /// The broker call for this hook input. A `PermissionRequest` has no tool-use id, so it gets
    /// a fresh call id: each permission dialog is its own call.
    pub fn call(&self, workspace: Option<&str>) -> pb::CallSpec {
        let call_id = self
            .tool_use_id
            .clone()
            .unwrap_or_else(|| format!("permission-request-{}", uuid::Uuid::now_v7()));
        let workspace = workspace
            .or(self.cwd.as_deref())
            .filter(|w| !w.chars().any(char::is_control))
            .unwrap_or_default();
        pb::CallSpec {
            call_id,
            tool: self.tool_name.clone(),
            input_json: Value::Object(self.tool_input.clone()).to_string(),
            title: self.title(),
            message: self.message(),
            workspace: workspace.into(),
            ..Default::default()
        }
    }

    /// `Bash: npm test`: the tool and the one field that says what it does, on one line.
    fn title(&self) -> String {
        let Some(summary) = SUMMARY_KEYS
            .iter()
            .find_map(|key| self.tool_input.get(*key).and_then(Value::as_str))
        else {
            return one_line(&self.tool_name);
        };
        one_line(&format!("{}: {summary}", self.tool_name))
    }

    fn message(&self) -> String {
        let mut message = format!("Claude Code asks to run `{}`", self.tool_name);
        if let Some(description) = self.tool_input.get("description").and_then(Value::as_str) {
            message.push_str(&format!(": {description}"));
        }
        message.push_str(&format!(
            "\n\nSession `{}`, from its `{}` hook",
            self.session_id,
            self.event.name()
        ));
        if let Some(mode) = &self.permission_mode {
            message.push_str(&format!(", permission mode `{mode}`"));
        }
        message.push('.');
        message.replace('\0', "")
    }
}

fn required_string(fields: &Map<String, Value>, key: &str) -> Result<String, String> {
    optional_string(fields, key)?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{key}: missing or empty"))
}

fn optional_string(fields: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key}: must be a string")),
    }
}

/// The hook's decision, before it is written in an event's shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Run the tool, with `updated_input` instead of the model's input when given.
    Allow {
        reason: String,
        updated_input: Option<Map<String, Value>>,
    },
    /// Do not run it; `reason` is what the model reads.
    Deny {
        reason: String,
        /// Shown to the user too, when the broker gave no outcome.
        system_message: Option<String>,
    },
    /// Let Claude Code ask its user; `reason` is shown in the prompt.
    Ask { reason: String },
}

impl Answer {
    /// The answer an outcome calls for: allow only an APPROVED outcome.
    pub fn from_outcome(outcome: &pb::Outcome) -> Answer {
        if outcome.status != pb::CallStatus::Approved as i32 {
            let reason = if outcome.tool_result.is_empty() {
                "The tool call was not approved; the tool was not run.".to_owned()
            } else {
                outcome.tool_result.clone()
            };
            return Answer::Deny {
                reason,
                system_message: None,
            };
        }
        let reason = format!(
            "Approved through the approval broker ({}).",
            outcome.decided_by
        );
        if !outcome.input_edited {
            return Answer::Allow {
                reason,
                updated_input: None,
            };
        }
        match serde_json::from_str(&outcome.input_json) {
            Ok(Value::Object(input)) => Answer::Allow {
                reason,
                updated_input: Some(input),
            },
            // Running the original input would not be what the approver approved.
            _ => Answer::Deny {
                reason: "The approved, edited input could not be read; the tool was not run."
                    .into(),
                system_message: None,
            },
        }
    }

    /// The fail-closed answer `choice` picks, saying `what` happened.
    pub fn fail_closed(choice: FailClosed, what: &str) -> Answer {
        match choice {
            FailClosed::Deny => Answer::Deny {
                reason: format!("{what} The tool was not run."),
                system_message: Some(format!("{what} The tool call was denied.")),
            },
            FailClosed::Ask => Answer::Ask {
                reason: format!("{what} Decide here instead."),
            },
        }
    }

    /// The hook output JSON for `event`, in the shape Claude Code documents for it.
    pub fn to_hook_output(&self, event: HookEvent) -> Value {
        match (event, self) {
            (
                HookEvent::PreToolUse,
                Answer::Allow {
                    reason,
                    updated_input,
                },
            ) => {
                let mut specific = json!({
                    "hookEventName": "PreToolUse",
                    "permissionDecision": "allow",
                    "permissionDecisionReason": reason,
                });
                if let Some(input) = updated_input {
                    specific["updatedInput"] = Value::Object(input.clone());
                }
                json!({ "hookSpecificOutput": specific })
            }
            (
                HookEvent::PreToolUse,
                Answer::Deny {
                    reason,
                    system_message,
                },
            ) => {
                let mut output = json!({ "hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": "deny",
                    "permissionDecisionReason": reason,
                }});
                if let Some(message) = system_message {
                    output["systemMessage"] = json!(message);
                }
                output
            }
            (HookEvent::PreToolUse, Answer::Ask { reason }) => json!({
                "systemMessage": reason,
                "hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": "ask",
                    "permissionDecisionReason": reason,
                },
            }),
            (HookEvent::PermissionRequest, Answer::Allow { updated_input, .. }) => {
                let mut decision = json!({ "behavior": "allow" });
                if let Some(input) = updated_input {
                    decision["updatedInput"] = Value::Object(input.clone());
                }
                json!({ "hookSpecificOutput": {
                    "hookEventName": "PermissionRequest",
                    "decision": decision,
                }})
            }
            (
                HookEvent::PermissionRequest,
                Answer::Deny {
                    reason,
                    system_message,
                },
            ) => {
                let mut output = json!({ "hookSpecificOutput": {
                    "hookEventName": "PermissionRequest",
                    "decision": { "behavior": "deny", "message": reason },
                }});
                if let Some(message) = system_message {
                    output["systemMessage"] = json!(message);
                }
                output
            }
            // A PermissionRequest hook asks by deciding nothing: Claude Code then shows its own
            // permission dialog. The message tells the user why.
            (HookEvent::PermissionRequest, Answer::Ask { reason }) => json!({
                "systemMessage": reason,
            }),
        }
    }
}

/// Reads the hook input from standard input, reviews the call, prints the answer.
pub async fn run(args: &ClaudeCodeArgs) -> ExitCode {
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        return block(&format!("cannot read the hook input: {e}"));
    }
    let input = match HookInput::parse(&text) {
        Ok(input) => input,
        Err(e) => return block(&e),
    };
    let answer = answer(args, &input).await;
    match &answer {
        Answer::Deny {
            system_message: Some(message),
            ..
        } => warn(message),
        Answer::Ask { reason } => warn(reason),
        _ => {}
    }
    let output = answer.to_hook_output(input.event);
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{output}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => block(&format!("cannot write the hook output: {e}")),
    }
}

/// What the broker's review of `input` calls for; every path but APPROVED fails closed, and an
/// APPROVED outcome allows only once its signed receipt says the same of this call and this
/// input ([`ReceiptCheck`]).
pub async fn answer(args: &ClaudeCodeArgs, input: &HookInput) -> Answer {
    let broker = args.broker.clone();
    // The trusted keys are settled before the call is submitted: an approver is never asked
    // about a call whose approval could not be checked.
    let check = match ReceiptCheck::new(&args.receipts, &broker) {
        Ok(check) => check,
        Err(problem) => return Answer::fail_closed(FailClosed::Deny, &format!("{problem}.")),
    };
    if check.is_off() {
        warn("--no-receipt-check: the APPROVED outcome is not checked against its signed receipt");
    }
    match check.keys().await {
        Ok(_) => {}
        Err(NoKeys::Unreachable(error)) => {
            return Answer::fail_closed(args.on_unreachable, &error.to_string());
        }
        Err(NoKeys::Unverified(unverified)) => return unverified_answer(&unverified),
    }
    let call = input.call(args.workspace.as_deref());
    let call_id = call.call_id.clone();
    match review(&broker, &input.session_id, call, args.timeout).await {
        Ok(Review::Decided(outcome)) => {
            let answer = Answer::from_outcome(&outcome);
            let Answer::Allow { updated_input, .. } = &answer else {
                return answer;
            };
            // What Claude Code runs: the approver's edit, else the model's own input.
            let runs = Value::Object(updated_input.clone().unwrap_or(input.tool_input.clone()));
            match check
                .approve(&input.session_id, &call_id, &outcome, &runs)
                .await
            {
                Ok(()) => answer,
                Err(unverified) => unverified_answer(&unverified),
            }
        }
        Ok(Review::TimedOut { .. }) => Answer::fail_closed(
            args.on_timeout,
            &format!(
                "No approver decided within {}.",
                humantime::format_duration(args.timeout)
            ),
        ),
        Err(error @ ReviewError::Unreachable { .. }) => {
            Answer::fail_closed(args.on_unreachable, &error.to_string())
        }
        Err(error @ ReviewError::Refused(_)) => {
            Answer::fail_closed(FailClosed::Deny, &error.to_string())
        }
    }
}

/// Denies, saying why the outcome could not be verified, to the model and to the user.
fn unverified_answer(unverified: &Unverified) -> Answer {
    Answer::Deny {
        reason: unverified.to_string(),
        system_message: Some(unverified.to_string()),
    }
}

fn warn(message: &str) {
    eprintln!("approval-broker hook claude-code: {message}");
}

/// Exit code 2: Claude Code blocks the tool call and shows standard error.
fn block(message: &str) -> ExitCode {
    warn(&format!("{message}; the tool call is blocked"));
    ExitCode::from(EXIT_BLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hook::review::TITLE_CHARS;

    fn input(tool_input: Value) -> HookInput {
        HookInput::parse(
            &json!({
                "session_id": "s", "transcript_path": "/t.jsonl", "cwd": "/repo",
                "hook_event_name": "PreToolUse", "tool_name": "Bash",
                "tool_input": tool_input, "tool_use_id": "toolu_1",
            })
            .to_string(),
        )
        .expect("a valid input")
    }

    #[test]
    fn titles_are_one_bounded_line_the_broker_accepts() {
        let multi_line = input(json!({"command": "cat <<EOF\nrm -rf /\nEOF"}));
        assert_eq!(multi_line.title(), "Bash: cat <<EOF rm -rf / EOF");
        let long = input(json!({"command": "x".repeat(1000)}));
        let title = long.title();
        assert_eq!(title.chars().count(), TITLE_CHARS);
        assert!(title.ends_with('…'));
        assert_eq!(input(json!({"other": 1})).title(), "Bash");
        let call = multi_line.call(None);
        assert_eq!(
            (call.call_id.as_str(), call.workspace.as_str()),
            ("toolu_1", "/repo")
        );
    }

    #[test]
    fn only_an_approved_outcome_allows() {
        // Every status the proto knows but APPROVED (a new one included).
        let not_approved = (0..64)
            .filter_map(|n| pb::CallStatus::try_from(n).ok())
            .filter(|s| *s != pb::CallStatus::Approved);
        for status in not_approved {
            let outcome = pb::Outcome {
                status: status as i32,
                tool_result: "Not run.".into(),
                ..Default::default()
            };
            let answer = Answer::from_outcome(&outcome);
            assert!(
                matches!(answer, Answer::Deny { .. }),
                "{status:?}: {answer:?}"
            );
        }
        // An edit that cannot be read is not replaced by the original input.
        let garbled = pb::Outcome {
            status: pb::CallStatus::Approved as i32,
            input_edited: true,
            input_json: "[1]".into(),
            ..Default::default()
        };
        assert!(matches!(
            Answer::from_outcome(&garbled),
            Answer::Deny { .. }
        ));
    }

    #[test]
    fn a_permission_request_needs_no_tool_use_id_and_gets_a_fresh_call_id() {
        let text = json!({
            "session_id": "s", "transcript_path": "/t.jsonl", "cwd": "/repo",
            "hook_event_name": "PermissionRequest", "tool_name": "Write",
            "tool_input": {"file_path": "/repo/a.txt", "content": "hi"},
        })
        .to_string();
        let request = HookInput::parse(&text).expect("valid");
        let (a, b) = (request.call(None), request.call(None));
        assert!(a.call_id.starts_with("permission-request-"));
        assert_ne!(a.call_id, b.call_id);
        assert_eq!(a.title, "Write: /repo/a.txt");
    }
}
