//! What every host's hook has in common, so that each host's file only reads its input and
//! writes its answer: the hook's settings ([`HookArgs`]), a host-neutral tool call
//! ([`HostCall`]), the review through the broker with the signed-receipt check, and a
//! host-neutral answer ([`Answer`]). This is where "fail closed" lives: nothing but an APPROVED
//! outcome whose receipt says so for exactly the input that will run becomes an
//! [`Answer::Allow`]; a timeout, an unreachable or refusing broker, an unverifiable receipt and
//! an edit the host cannot be handed back all become a denial (or, where configured and where the
//! host can ask its own user, [`Answer::Ask`]). A host file must never turn any other answer into
//! an allow.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::time::Instant;

use super::receipt_check::{NoKeys, ReceiptCheck, ReceiptCheckArgs, Unverified};
use super::review::{BrokerAddress, Review, ReviewError, one_line, review};
use crate::domain::Host;
use crate::domain::json::canonical;
use crate::domain::receipt::sha256_hex;
use crate::proto::v1 as pb;

/// Keys of a tool input that say best what a call does, in order of preference.
const SUMMARY_KEYS: [&str; 7] = [
    "command",
    "file_path",
    "notebook_path",
    "path",
    "url",
    "query",
    "pattern",
];

/// What a hook run may take beyond `--timeout`: reading the receipt keys, cancelling the call
/// after the limit and fetching a receipt each have their own bounds (see `review.rs`), all
/// inside this. The host's own hook timeout must be longer than `--timeout` plus this, since
/// most hosts treat a hook that runs out of time as "no opinion" and run the tool.
pub const OVERRUN: Duration = Duration::from_secs(15);

/// The settings every `hook <host>` command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct HookArgs {
    #[command(flatten)]
    pub broker: BrokerAddress,

    /// How long to wait for a decision, e.g. `90s`, `5m`. The hook answers within this plus 15
    /// seconds at most; keep the host's own hook timeout above that, since a host whose hook
    /// times out runs the tool. Default per host: claude-code and codex 5m (their hook timeout
    /// defaults to 600 s), gemini-cli 40s (60 s), copilot 15s (30 s), cursor 15s.
    #[arg(long, env = "APPROVALS_HOOK_TIMEOUT", value_parser = crate::domain::time::parse_duration)]
    pub timeout: Option<Duration>,

    /// The answer when no decision arrives in time: `deny` (the tool is not run; the model is
    /// told why) or `ask` (the host asks its user in its own prompt, where it has one that cannot
    /// hang or be skipped; Codex's PreToolUse, Gemini CLI and Cursor's beforeReadFile deny
    /// instead). The call is cancelled at the broker either way.
    #[arg(long, env = "APPROVALS_HOOK_ON_TIMEOUT", value_enum, default_value_t = FailClosed::Deny)]
    pub on_timeout: FailClosed,

    /// The answer when the broker cannot be reached or refuses the request as a whole (network,
    /// TLS, token): `deny` or `ask`, as for --on-timeout.
    #[arg(long, env = "APPROVALS_HOOK_ON_UNREACHABLE", value_enum, default_value_t = FailClosed::Deny)]
    pub on_unreachable: FailClosed,

    /// The workspace recorded with the call (approvers filter on it; workspace grants match it).
    /// Default: the hook input's working directory (Cursor: its first workspace root).
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
    /// The host asks its user, as if there were no hook.
    Ask,
}

/// The agent hosts with a hook adapter: those of [`Host`] (the hosts the broker knows) that
/// call a hook command, which `acp` is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookHost {
    ClaudeCode,
    Codex,
    GeminiCli,
    Copilot,
    Cursor,
}

impl HookHost {
    /// The host as the broker knows it.
    pub fn host(self) -> Host {
        match self {
            HookHost::ClaudeCode => Host::ClaudeCode,
            HookHost::Codex => Host::Codex,
            HookHost::GeminiCli => Host::GeminiCli,
            HookHost::Copilot => Host::Copilot,
            HookHost::Cursor => Host::Cursor,
        }
    }

    /// The name `CallSpec.host` and the command line use: the broker's own.
    pub fn id(self) -> &'static str {
        self.host().as_str()
    }

    /// The name people know the host by, in the approver's message.
    pub fn label(self) -> &'static str {
        match self {
            HookHost::ClaudeCode => "Claude Code",
            HookHost::Codex => "Codex",
            HookHost::GeminiCli => "Gemini CLI",
            HookHost::Copilot => "GitHub Copilot",
            HookHost::Cursor => "Cursor",
        }
    }

    /// `--timeout` when none is given: with [`OVERRUN`], shorter than the host's default hook
    /// timeout, so that an unconfigured host still hears "deny" before it gives up on the hook.
    pub fn default_timeout(self) -> Duration {
        match self {
            HookHost::ClaudeCode | HookHost::Codex => Duration::from_secs(300),
            HookHost::GeminiCli => Duration::from_secs(40),
            HookHost::Copilot | HookHost::Cursor => Duration::from_secs(15),
        }
    }
}

/// One tool call a host asks about, in no host's shape: what is submitted to the broker.
#[derive(Debug, Clone, PartialEq)]
pub struct HostCall {
    /// The host's own conversation id.
    pub session_id: String,
    /// The host's own id of the tool call, or one derived from what identifies it
    /// ([`derived_call_id`]): never random, so a retried hook is the same call.
    pub call_id: String,
    /// The tool's name as the host gives it.
    pub tool_name: String,
    /// The tool's input as the host gives it (a host's text input is wrapped in an object by
    /// its file, which says how).
    pub tool_input: Map<String, Value>,
    /// The directory the host says the call runs in; the default workspace.
    pub cwd: Option<String>,
    pub title: String,
    pub message: String,
}

impl HostCall {
    /// The broker call `host` submits; `workspace` (from `--workspace`) wins over the call's cwd.
    pub fn spec(&self, host: HookHost, workspace: Option<&str>) -> pb::CallSpec {
        let workspace = workspace
            .or(self.cwd.as_deref())
            .filter(|w| !w.chars().any(char::is_control))
            .unwrap_or_default();
        pb::CallSpec {
            call_id: self.call_id.clone(),
            tool: self.tool_name.clone(),
            input_json: Value::Object(self.tool_input.clone()).to_string(),
            title: self.title.clone(),
            message: self.message.clone(),
            workspace: workspace.into(),
            host: host.id().into(),
            ..Default::default()
        }
    }
}

/// `Bash: npm test`: the tool and the one field that says what it does, on one bounded line.
pub fn summary_title(tool_name: &str, tool_input: &Map<String, Value>) -> String {
    let Some(summary) = SUMMARY_KEYS
        .iter()
        .find_map(|key| tool_input.get(*key).and_then(Value::as_str))
    else {
        return one_line(tool_name);
    };
    one_line(&format!("{tool_name}: {summary}"))
}

/// The approver's message: which host asks for which tool (with the model's own description of
/// the call when the input has one), in which session, from which hook; `facts` are added to
/// that line (e.g. a permission mode), `details` as paragraphs after it (e.g. an MCP server).
pub fn approver_message(
    host: HookHost,
    call: (&str, &Map<String, Value>),
    session_id: &str,
    event: &str,
    facts: &[String],
    details: &[String],
) -> String {
    let (tool_name, tool_input) = call;
    let mut message = format!("{} asks to run `{tool_name}`", host.label());
    if let Some(description) = tool_input.get("description").and_then(Value::as_str) {
        message.push_str(&format!(": {description}"));
    }
    message.push_str(&format!(
        "\n\nSession `{session_id}`, from its `{event}` hook"
    ));
    for fact in facts {
        message.push_str(&format!(", {fact}"));
    }
    message.push('.');
    for detail in details {
        message.push_str(&format!("\n\n{detail}"));
    }
    message.replace('\0', "")
}

/// A call id for a host that gives its tool calls none: `prefix-` and a hash of `parts` (what
/// identifies the call: session, event, timestamp, tool) and the input's canonical JSON, so the
/// same hook input run again is the same call (idempotent at the broker), and two calls differ
/// wherever their parts or input do.
pub fn derived_call_id(prefix: &str, parts: &[&str], tool_input: &Map<String, Value>) -> String {
    let mut identity = String::new();
    for part in parts {
        identity.push_str(part);
        identity.push('\0');
    }
    identity.push_str(&canonical(&Value::Object(tool_input.clone())));
    let hash = sha256_hex(identity.as_bytes());
    format!("{prefix}-{}", &hash[..32])
}

/// A string field of a hook input; an error names the field.
pub fn required_string(fields: &Map<String, Value>, key: &str) -> Result<String, String> {
    optional_string(fields, key)?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{key}: missing or empty"))
}

/// A string field that may be absent (or null); any other type is refused, naming the field.
pub fn optional_string(fields: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key}: must be a string")),
    }
}

/// An object field of a hook input; an error names the field.
pub fn required_object(
    fields: &mut Map<String, Value>,
    key: &str,
) -> Result<Map<String, Value>, String> {
    match fields.remove(key) {
        Some(Value::Object(object)) => Ok(object),
        Some(_) => Err(format!("{key}: must be a JSON object")),
        None => Err(format!("{key}: missing")),
    }
}

/// Reads `text` as a JSON object; the error says what it is instead.
pub fn json_object(text: &str) -> Result<Map<String, Value>, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("the hook input is not JSON: {e}"))?;
    match value {
        Value::Object(fields) => Ok(fields),
        _ => Err("the hook input is not a JSON object".into()),
    }
}

/// The hook's decision, before it is written in a host's shape.
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
    /// Let the host ask its user; `reason` is shown in the prompt.
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
}

/// One host's hook: how it reads its input and writes its answers. Everything between (the
/// review, the receipt check, failing closed) is [`answer`]'s, the same for every host.
pub trait HostHook {
    const HOST: HookHost;
    /// Which of the host's hook events an input is, with what its answer's shape depends on.
    type Event;

    /// Reads the hook input; an error names the field at fault.
    fn parse(text: &str) -> Result<(Self::Event, HostCall), String>;

    /// Whether the host can be handed `edited` (the approver's edit of `call`'s input) for
    /// `event` so that exactly it runs; the error, for the model, says why not.
    fn hand_back(
        event: &Self::Event,
        call: &HostCall,
        edited: &Map<String, Value>,
    ) -> Result<(), String>;

    /// The host's answer: what to print (nothing, for "no opinion") and the exit code.
    fn render(event: &Self::Event, answer: &Answer) -> Rendered;

    /// Whether the host can ask its own user for `event` without hanging a headless run or
    /// reading "ask" as "no opinion" (and running the tool); where it cannot, `--on-timeout ask`
    /// and `--on-unreachable ask` deny instead.
    fn can_ask(_event: &Self::Event) -> bool {
        true
    }

    /// The answer to input that could not be read (`problem` names the field): a denial in
    /// whatever form the host honours without knowing the event. Default: exit code 2 with
    /// the problem on standard error, which Claude Code, Codex, Gemini CLI and Cursor all read
    /// as "block".
    fn unreadable(_text: &str, _problem: &str) -> Rendered {
        Rendered {
            stdout: None,
            exit: EXIT_BLOCK,
        }
    }
}

/// The exit code with which the hosts (most of them) block a call and show standard error.
pub const EXIT_BLOCK: u8 = 2;

/// What a hook run prints and exits with.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// One JSON line on standard output, or nothing.
    pub stdout: Option<Value>,
    pub exit: u8,
}

impl Rendered {
    /// Prints `output` and exits 0: the way every host reads a JSON answer.
    pub fn json(output: Value) -> Rendered {
        Rendered {
            stdout: Some(output),
            exit: 0,
        }
    }

    /// Prints nothing and exits 0: "no opinion", where that is what the answer means.
    pub fn nothing() -> Rendered {
        Rendered {
            stdout: None,
            exit: 0,
        }
    }
}

/// Reads the hook input from standard input, reviews the call, prints the host's answer.
pub async fn run<H: HostHook>(args: &HookArgs) -> ExitCode {
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        return refuse::<H>(&text, &format!("cannot read the hook input: {e}"));
    }
    let (event, call) = match H::parse(&text) {
        Ok(parsed) => parsed,
        Err(problem) => return refuse::<H>(&text, &problem),
    };
    let answer = answer::<H>(args, &event, &call).await;
    match &answer {
        Answer::Deny {
            system_message: Some(message),
            ..
        } => warn(H::HOST, message),
        Answer::Ask { reason } => warn(H::HOST, reason),
        _ => {}
    }
    print::<H>(&H::render(&event, &answer))
}

fn refuse<H: HostHook>(text: &str, problem: &str) -> ExitCode {
    warn(H::HOST, &format!("{problem}; the tool call is blocked"));
    print::<H>(&H::unreadable(text, problem))
}

fn print<H: HostHook>(rendered: &Rendered) -> ExitCode {
    let Some(output) = &rendered.stdout else {
        return ExitCode::from(rendered.exit);
    };
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{output}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::from(rendered.exit),
        Err(e) => {
            warn(
                H::HOST,
                &format!("cannot write the hook output: {e}; the tool call is blocked"),
            );
            ExitCode::from(EXIT_BLOCK)
        }
    }
}

/// What the broker's review of `call` calls for; every path but APPROVED fails closed, and an
/// APPROVED outcome allows only once the host can be handed the approved input and its signed
/// receipt says APPROVED for this call and exactly that input ([`ReceiptCheck`]). The whole
/// review ends within `--timeout` plus [`OVERRUN`].
pub async fn answer<H: HostHook>(args: &HookArgs, event: &H::Event, call: &HostCall) -> Answer {
    let limit = args.timeout.unwrap_or(H::HOST.default_timeout());
    let fallback = |choice: FailClosed| {
        if H::can_ask(event) {
            choice
        } else {
            FailClosed::Deny
        }
    };
    let (on_timeout, on_unreachable) = (fallback(args.on_timeout), fallback(args.on_unreachable));
    let timed_out = || {
        Answer::fail_closed(
            on_timeout,
            &format!(
                "No approver decided within {}.",
                humantime::format_duration(limit)
            ),
        )
    };
    let review = review_in_time::<H>(args, event, call, (limit, on_unreachable), timed_out);
    tokio::time::timeout(limit + OVERRUN, review)
        .await
        .unwrap_or_else(|_| timed_out())
}

async fn review_in_time<H: HostHook>(
    args: &HookArgs,
    event: &H::Event,
    call: &HostCall,
    (limit, on_unreachable): (Duration, FailClosed),
    timed_out: impl Fn() -> Answer,
) -> Answer {
    let started = Instant::now();
    let broker = args.broker.clone();
    // The trusted keys are settled before the call is submitted: an approver is never asked
    // about a call whose approval could not be checked.
    let check = match ReceiptCheck::new(&args.receipts, &broker) {
        Ok(check) => check,
        Err(problem) => return Answer::fail_closed(FailClosed::Deny, &format!("{problem}.")),
    };
    if check.is_off() {
        warn(
            H::HOST,
            "--no-receipt-check: the APPROVED outcome is not checked against its signed receipt",
        );
    }
    match check.keys().await {
        Ok(_) => {}
        Err(NoKeys::Unreachable(error)) => {
            return Answer::fail_closed(on_unreachable, &error.to_string());
        }
        Err(NoKeys::Unverified(unverified)) => return unverified_answer(&unverified),
    }
    let spec = call.spec(H::HOST, args.workspace.as_deref());
    let remaining = limit.saturating_sub(started.elapsed());
    match review(&broker, &call.session_id, spec, remaining).await {
        Ok(Review::Decided(outcome)) => {
            let answer = Answer::from_outcome(&outcome);
            let Answer::Allow { updated_input, .. } = &answer else {
                return answer;
            };
            if let Some(edited) = updated_input
                && let Err(why) = H::hand_back(event, call, edited)
            {
                return Answer::Deny {
                    reason: format!(
                        "The approver approved an edited input, but {why}; the tool was not run."
                    ),
                    system_message: None,
                };
            }
            // What the host runs: the approver's edit, else the model's own input.
            let runs = Value::Object(updated_input.clone().unwrap_or(call.tool_input.clone()));
            match check
                .approve(&call.session_id, &call.call_id, &outcome, &runs)
                .await
            {
                Ok(()) => answer,
                Err(unverified) => unverified_answer(&unverified),
            }
        }
        Ok(Review::TimedOut { .. }) => timed_out(),
        Err(error @ ReviewError::Unreachable { .. }) => {
            Answer::fail_closed(on_unreachable, &error.to_string())
        }
        Err(error @ (ReviewError::Refused(_) | ReviewError::NoToken(_))) => {
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

/// A line on standard error, which the hosts show their user (standard output is the answer).
pub fn warn(host: HookHost, message: &str) {
    eprintln!("approval-broker hook {}: {message}", host.id());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::hook::review::TITLE_CHARS;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().expect("an object").clone()
    }

    #[test]
    fn titles_are_one_bounded_line_the_broker_accepts() {
        let title = |input| summary_title("Bash", &object(input));
        assert_eq!(
            title(json!({"command": "cat <<EOF\nrm -rf /\nEOF"})),
            "Bash: cat <<EOF rm -rf / EOF"
        );
        let long = title(json!({"command": "x".repeat(1000)}));
        assert_eq!(long.chars().count(), TITLE_CHARS);
        assert!(long.ends_with('…'));
        assert_eq!(title(json!({"other": 1})), "Bash");
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
    fn a_derived_call_id_is_the_same_for_the_same_call_and_differs_otherwise() {
        let input = object(json!({"command": "ls", "dir": "/tmp"}));
        let same_reordered = object(json!({"dir": "/tmp", "command": "ls"}));
        let id = derived_call_id("gemini", &["s", "2026-12-07T08:00:00Z", "run"], &input);
        assert!(id.starts_with("gemini-") && id.len() == "gemini-".len() + 32);
        assert_eq!(
            id,
            derived_call_id(
                "gemini",
                &["s", "2026-12-07T08:00:00Z", "run"],
                &same_reordered
            )
        );
        for other in [
            derived_call_id("gemini", &["t", "2026-12-07T08:00:00Z", "run"], &input),
            derived_call_id("gemini", &["s", "2026-12-07T08:00:01Z", "run"], &input),
            derived_call_id("gemini", &["s", "2026-12-07T08:00:00Z", "ru"], &input),
            derived_call_id("gemini", &["s", "2026-12-07T08:00:00Zr", "un"], &input),
            derived_call_id(
                "gemini",
                &["s", "2026-12-07T08:00:00Z", "run"],
                &object(json!({})),
            ),
        ] {
            assert_ne!(id, other);
        }
    }

    #[test]
    fn every_host_is_submitted_under_its_own_name() {
        let call = HostCall {
            session_id: "s".into(),
            call_id: "c".into(),
            tool_name: "Bash".into(),
            tool_input: object(json!({"command": "ls"})),
            cwd: Some("/repo".into()),
            title: "Bash: ls".into(),
            message: "m".into(),
        };
        let names: Vec<String> = [
            HookHost::ClaudeCode,
            HookHost::Codex,
            HookHost::GeminiCli,
            HookHost::Copilot,
            HookHost::Cursor,
        ]
        .into_iter()
        .map(|host| call.spec(host, None).host)
        .collect();
        assert_eq!(
            names,
            ["claude-code", "codex", "gemini-cli", "copilot", "cursor"]
        );
        assert_eq!(call.spec(HookHost::Codex, None).workspace, "/repo");
        assert_eq!(call.spec(HookHost::Codex, Some("/w")).workspace, "/w");
        let mut bad = call.clone();
        bad.cwd = Some("/re\npo".into());
        assert_eq!(bad.spec(HookHost::Codex, None).workspace, "");
    }
}
