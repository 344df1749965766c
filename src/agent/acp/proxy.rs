//! The relay between the editor (the ACP client, on this process's standard I/O) and the agent
//! (a child process, on its standard I/O): every line goes through byte for byte, except the
//! agent's `session/request_permission` requests, which never reach the editor. Each is
//! reviewed through the broker on a task of its own, and answered to the agent by this proxy
//! ([`super::permission`]). It also watches, without changing them, the few messages it needs:
//! `session/new` / `session/load` (a session's `cwd`, the default workspace), `session/update`
//! (the tool calls announced), and `session/cancel` (pending reviews are cancelled at the broker
//! and answered `cancelled`, as ACP requires of a client).
//!
//! It must never answer a permission request with an allow option for anything but a verified
//! APPROVED outcome, and never let a line from the agent that it cannot read reach the editor:
//! such a line could be a permission request the editor would answer itself.

use std::collections::HashMap;
use std::io::BufRead as _;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::AcpProxyArgs;
use super::permission::{self, Answer, PermissionRequest, Reviewed};
use super::tool_calls::ToolCalls;
use crate::agent::hook::receipt_check::{NoKeys, ReceiptCheck};
use crate::agent::hook::review::{self, BrokerAddress, Review};
use crate::proto::v1 as pb;

/// Runs the agent and relays until it exits; the exit code is the agent's.
pub async fn run(args: &AcpProxyArgs) -> ExitCode {
    let check = match ReceiptCheck::new(&args.receipts, &args.broker) {
        Ok(check) => check,
        Err(problem) => {
            warn(&problem);
            return ExitCode::from(2);
        }
    };
    if check.is_off() {
        warn("--no-receipt-check: APPROVED outcomes are not checked against their signed receipts");
    }
    // The token settings are checked (and a client secret read) now, not at the first call.
    if let Err(problem) = args.broker.token_source() {
        warn(&problem);
        return ExitCode::from(2);
    }
    let Some((program, agent_args)) = args.agent.split_first() else {
        warn("no agent command: give it after `--`, e.g. `acp-proxy -- claude-code-acp`");
        return ExitCode::from(2);
    };
    let mut child = match tokio::process::Command::new(program)
        .args(agent_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            warn(&format!("cannot start the agent `{program}`: {e}"));
            return ExitCode::from(127);
        }
    };
    let (Some(agent_in), Some(agent_out)) = (child.stdin.take(), child.stdout.take()) else {
        warn("the agent's standard I/O could not be opened");
        return ExitCode::FAILURE;
    };
    let (to_agent, outbox) = mpsc::unbounded_channel();
    tokio::spawn(write_to_agent(agent_in, outbox));
    let proxy = Arc::new(Proxy {
        reviewer: Reviewer {
            broker: args.broker.clone(),
            timeout: args.timeout,
            workspace: args.workspace.clone(),
            allow_always: args.select_allow_always,
            check,
        },
        state: Mutex::new(State::default()),
        to_agent,
        runtime: tokio::runtime::Handle::current(),
    });
    // A thread, not a task: a read of standard input cannot be cancelled, and a task blocked in
    // one would keep the runtime, and so this process, from ending when the agent exits.
    let from_client = Arc::clone(&proxy);
    std::thread::spawn(move || from_client.relay_from_client());
    relay_from_agent(&proxy, agent_out).await;
    let status = child.wait().await;
    proxy
        .cancel_all("the agent exited before the tool call was decided")
        .await;
    match status {
        Ok(status) => exit_code(status),
        Err(e) => {
            warn(&format!("cannot read the agent's exit status: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// The agent's exit code, or 128 + the signal that ended it, as a shell reports it.
fn exit_code(status: ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return ExitCode::from(u8::try_from(128 + signal).unwrap_or(1));
        }
    }
    ExitCode::FAILURE
}

/// A line for the agent's standard input, or the end of it (the editor closed its side).
enum ToAgent {
    Line(Vec<u8>),
    Close,
}

/// The one writer of the agent's standard input: relayed lines and the proxy's own answers
/// never interleave.
async fn write_to_agent(mut agent_in: ChildStdin, mut outbox: mpsc::UnboundedReceiver<ToAgent>) {
    while let Some(ToAgent::Line(line)) = outbox.recv().await {
        if let Err(e) = agent_in.write_all(&line).await {
            warn(&format!("cannot write to the agent: {e}"));
            break;
        }
        if agent_in.flush().await.is_err() {
            break;
        }
    }
    // Dropping it closes the agent's standard input.
}

/// Relays the agent's lines to the editor until the agent closes its standard output.
async fn relay_from_agent(proxy: &Arc<Proxy>, agent_out: ChildStdout) {
    let mut lines = BufReader::new(agent_out);
    let mut client = tokio::io::stdout();
    let mut client_open = true;
    loop {
        let mut line = Vec::new();
        match lines.read_until(b'\n', &mut line).await {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                warn(&format!("cannot read from the agent: {e}"));
                return;
            }
        }
        if !proxy.take_from_agent(&line) || !client_open {
            continue;
        }
        let written = async {
            client.write_all(&line).await?;
            client.flush().await
        };
        if let Err(e) = written.await {
            // The editor is gone; the agent is left to notice its closed input and exit.
            warn(&format!("cannot write to the editor: {e}"));
            client_open = false;
        }
    }
}

/// The broker side: how a permission request is reviewed.
struct Reviewer {
    broker: BrokerAddress,
    timeout: Duration,
    workspace: Option<String>,
    allow_always: bool,
    check: ReceiptCheck,
}

impl Reviewer {
    /// What the broker's review of `request` calls for. Every path but a verified APPROVED
    /// outcome rejects, saying why.
    async fn review(&self, request: &PermissionRequest, workspace: Option<&str>) -> Reviewed {
        match self.check.keys().await {
            Ok(_) => {}
            Err(NoKeys::Unreachable(error)) => return reject(format!("{error}")),
            Err(NoKeys::Unverified(unverified)) => return reject(unverified.to_string()),
        }
        let input = Value::Object(request.input());
        let call = request.call(workspace);
        match review::review(&self.broker, &request.session_id, call, self.timeout).await {
            Ok(Review::Decided(outcome)) => self.judge(request, &outcome, &input).await,
            Ok(Review::TimedOut { .. }) => reject(format!(
                "No approver decided within {}.",
                humantime::format_duration(self.timeout)
            )),
            Err(error) => reject(error.to_string()),
        }
    }

    async fn judge(
        &self,
        request: &PermissionRequest,
        outcome: &pb::Outcome,
        input: &Value,
    ) -> Reviewed {
        // A remembered decision (a grant) decided the call; the outcome says no more of scopes.
        let remembered = outcome.decided_by.starts_with("grant:");
        if outcome.status != pb::CallStatus::Approved as i32 {
            let reason = if outcome.tool_result.is_empty() {
                "The tool call was not approved.".to_owned()
            } else {
                outcome.tool_result.clone()
            };
            return Reviewed::Reject {
                remembered: remembered && outcome.status == pb::CallStatus::Denied as i32,
                reason,
            };
        }
        if outcome.input_edited {
            return reject(format!(
                "The approver approved an edited input ({}), and an ACP agent cannot be given an \
                 input in place of its own; the call as asked was not approved. Ask again with \
                 the edited input.",
                outcome.input_json
            ));
        }
        match self
            .check
            .approve(&request.session_id, &request.tool_call_id, outcome, input)
            .await
        {
            Ok(()) => Reviewed::Allow {
                remembered: remembered && self.allow_always,
                reason: format!(
                    "Approved through the approval broker ({}).",
                    outcome.decided_by
                ),
            },
            Err(unverified) => reject(unverified.to_string()),
        }
    }
}

fn reject(reason: String) -> Reviewed {
    Reviewed::Reject {
        remembered: false,
        reason,
    }
}

/// What the proxy knows of the conversation; held briefly, never across an await.
#[derive(Default)]
struct State {
    /// Each session's `cwd` (from `session/new` and `session/load`).
    cwd: HashMap<String, String>,
    /// The `cwd` of each `session/new` not answered yet, by request id.
    opening: HashMap<String, String>,
    tool_calls: ToolCalls,
    /// The permission requests being reviewed, by request id.
    pending: HashMap<String, Pending>,
}

struct Pending {
    id: Value,
    session_id: String,
    call_id: String,
    task: AbortHandle,
}

struct Proxy {
    reviewer: Reviewer,
    state: Mutex<State>,
    to_agent: mpsc::UnboundedSender<ToAgent>,
    runtime: tokio::runtime::Handle,
}

impl Proxy {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere leaves maps that are still consistent: each update is one insert
        // or one remove.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn send_to_agent(&self, message: &Value) {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        // Fails only once the agent's input is closed: nobody is left to answer.
        let _ = self.to_agent.send(ToAgent::Line(line));
    }

    /// Reads the editor's lines (blocking: this runs on a thread of its own) and relays each,
    /// unchanged, to the agent; at the end of input, closes the agent's.
    fn relay_from_client(self: Arc<Self>) {
        let mut input = std::io::stdin().lock();
        loop {
            let mut line = Vec::new();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    warn(&format!("cannot read from the editor: {e}"));
                    break;
                }
            }
            let cancelled = self.observe_from_client(&line);
            let _ = self.to_agent.send(ToAgent::Line(line));
            if let Some(session_id) = cancelled {
                self.cancel_session(&session_id);
            }
        }
        let _ = self.to_agent.send(ToAgent::Close);
    }

    /// Notes what the proxy needs of an editor's line; returns the session a `session/cancel`
    /// cancels.
    fn observe_from_client(&self, line: &[u8]) -> Option<String> {
        let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(line) else {
            return None;
        };
        let params = message.get("params");
        let param = |key: &str| params?.get(key)?.as_str().map(str::to_owned);
        match message.get("method").and_then(Value::as_str)? {
            "session/cancel" => param("sessionId"),
            "session/new" => {
                if let (Some(id), Some(cwd)) = (message.get("id"), param("cwd")) {
                    self.state().opening.insert(id_key(id), cwd);
                }
                None
            }
            "session/load" => {
                if let (Some(session_id), Some(cwd)) = (param("sessionId"), param("cwd")) {
                    self.state().cwd.insert(session_id, cwd);
                }
                None
            }
            _ => None,
        }
    }

    /// Whether an agent's line goes on to the editor; a permission request is taken here.
    fn take_from_agent(self: &Arc<Self>, line: &[u8]) -> bool {
        if line.trim_ascii().is_empty() {
            return true;
        }
        let message = match serde_json::from_slice::<Value>(line) {
            Ok(message) => message,
            Err(e) => {
                warn(&format!(
                    "the agent wrote a line that is not JSON ({e}); it is not passed to the \
                     editor, since it could be a permission request this proxy cannot read"
                ));
                return false;
            }
        };
        match message {
            Value::Object(message) => self.take_message(&message),
            Value::Array(batch) => self.take_batch(&batch),
            _ => true,
        }
    }

    fn take_message(self: &Arc<Self>, message: &Map<String, Value>) -> bool {
        match message.get("method").and_then(Value::as_str) {
            Some(permission::METHOD) => {
                self.ask_broker(message);
                false
            }
            Some("session/update") => {
                self.state().tool_calls.observe(message.get("params"));
                true
            }
            Some(_) => true,
            None => {
                self.note_response(message);
                true
            }
        }
    }

    /// A JSON-RPC batch (ACP uses none) goes on unless it holds a permission request, which is
    /// refused; the batch is then not passed on at all.
    fn take_batch(&self, batch: &[Value]) -> bool {
        let requests: Vec<&Value> = batch
            .iter()
            .filter(|m| m.get("method").and_then(Value::as_str) == Some(permission::METHOD))
            .collect();
        if requests.is_empty() {
            return true;
        }
        warn(
            "the agent sent permission requests inside a JSON-RPC batch; they are refused and \
             the batch is not passed to the editor",
        );
        for id in requests.iter().filter_map(|m| m.get("id")) {
            self.send_to_agent(&permission::refusal(
                id,
                "it came inside a JSON-RPC batch, which ACP does not use",
            ));
        }
        false
    }

    /// The answer to a `session/new` names the session its `cwd` belongs to.
    fn note_response(&self, message: &Map<String, Value>) {
        let Some(id) = message.get("id") else { return };
        let mut state = self.state();
        let Some(cwd) = state.opening.remove(&id_key(id)) else {
            return;
        };
        let session_id = message
            .get("result")
            .and_then(|result| result.get("sessionId"))
            .and_then(Value::as_str);
        if let Some(session_id) = session_id {
            state.cwd.insert(session_id.to_owned(), cwd);
        }
    }

    /// Starts the review of a permission request, or refuses one it cannot read.
    fn ask_broker(self: &Arc<Self>, message: &Map<String, Value>) {
        let Some(id) = message.get("id").filter(|id| !id.is_null()).cloned() else {
            warn("the agent sent a permission request without an id; it cannot be answered");
            return;
        };
        let mut state = self.state();
        let parsed = PermissionRequest::parse(message.get("params"), |session, call| {
            state.tool_calls.announced(session, call)
        });
        let request = match parsed {
            Ok(request) => request,
            Err(why) => {
                drop(state);
                warn(&format!(
                    "a permission request was refused, the tool call not approved: {why}"
                ));
                self.send_to_agent(&permission::refusal(&id, &why));
                return;
            }
        };
        let key = id_key(&id);
        if state.pending.contains_key(&key) {
            drop(state);
            let why = format!("another permission request with the id {key} is still pending");
            warn(&format!("a permission request was refused: {why}"));
            self.send_to_agent(&permission::refusal(&id, &why));
            return;
        }
        let workspace = self
            .reviewer
            .workspace
            .clone()
            .or_else(|| state.cwd.get(&request.session_id).cloned());
        let (session_id, call_id) = (request.session_id.clone(), request.tool_call_id.clone());
        let proxy = Arc::clone(self);
        let task_key = key.clone();
        // Inserted under the same lock the task takes to remove it: its answer cannot come
        // before it is pending.
        let task = tokio::spawn(async move {
            let reviewed = proxy.reviewer.review(&request, workspace.as_deref()).await;
            proxy.answer(&task_key, &request, &reviewed);
        });
        state.pending.insert(
            key,
            Pending {
                id,
                session_id,
                call_id,
                task: task.abort_handle(),
            },
        );
    }

    /// Answers a reviewed request, unless a cancel answered it first.
    fn answer(&self, key: &str, request: &PermissionRequest, reviewed: &Reviewed) {
        let Some(pending) = self.state().pending.remove(key) else {
            return;
        };
        let answer = request.answer(reviewed);
        let (approved, reason) = match reviewed {
            Reviewed::Allow { reason, .. } => (true, reason),
            Reviewed::Reject { reason, .. } => (false, reason),
        };
        warn(&format!(
            "session `{}`, tool call `{}`: {reason} Answered {}.",
            pending.session_id,
            pending.call_id,
            answer.describe()
        ));
        let note = json!({"approved": approved, "reason": reason});
        self.send_to_agent(&answer.response(&pending.id, Some(note)));
    }

    /// The editor cancelled `session_id`'s turn: its pending reviews are cancelled at the broker
    /// and answered `cancelled`.
    fn cancel_session(&self, session_id: &str) {
        let cancelled: Vec<Pending> = {
            let mut state = self.state();
            let keys: Vec<String> = state
                .pending
                .iter()
                .filter(|(_, p)| p.session_id == session_id)
                .map(|(key, _)| key.clone())
                .collect();
            keys.iter()
                .filter_map(|key| state.pending.remove(key))
                .collect()
        };
        for pending in cancelled {
            pending.task.abort();
            let note = json!({"approved": false, "reason": "The editor cancelled the turn."});
            self.send_to_agent(&Answer::Cancelled.response(&pending.id, Some(note)));
            let broker = self.reviewer.broker.clone();
            self.runtime.spawn(async move {
                cancel_at_broker(
                    &broker,
                    &pending.session_id,
                    &pending.call_id,
                    "the editor cancelled the turn",
                )
                .await;
            });
        }
    }

    /// Cancels every pending review at the broker (the agent is gone; nobody waits).
    async fn cancel_all(&self, reason: &str) {
        let pending: Vec<Pending> = self.state().pending.drain().map(|(_, p)| p).collect();
        for pending in pending {
            pending.task.abort();
            cancel_at_broker(
                &self.reviewer.broker,
                &pending.session_id,
                &pending.call_id,
                reason,
            )
            .await;
        }
    }
}

async fn cancel_at_broker(broker: &BrokerAddress, session_id: &str, call_id: &str, reason: &str) {
    // A cancel can overtake the submit it cancels (the editor cancelled while the call was still
    // on its way to the broker): the broker then has nothing to cancel yet, and the call would
    // wait for nobody. So an unconfirmed cancel is tried again, a little later, twice.
    let mut result = review::cancel(broker, session_id, call_id, reason).await;
    for wait in CANCEL_AGAIN_AFTER {
        if !matches!(result, Ok(Review::TimedOut { cancelled: false })) {
            break;
        }
        tokio::time::sleep(wait).await;
        result = review::cancel(broker, session_id, call_id, reason).await;
    }
    match result {
        Ok(Review::TimedOut { cancelled: true }) => {}
        Ok(Review::TimedOut { cancelled: false }) => warn(&format!(
            "session `{session_id}`, tool call `{call_id}`: the broker did not confirm the cancel"
        )),
        Ok(Review::Decided(outcome)) => warn(&format!(
            "session `{session_id}`, tool call `{call_id}`: decided ({}) before the cancel \
             reached the broker; the agent was answered `cancelled`",
            outcome.decided_by
        )),
        Err(error) => warn(&format!(
            "session `{session_id}`, tool call `{call_id}`: the cancel failed: {error}"
        )),
    }
}

/// When an unconfirmed cancel is tried again (see [`cancel_at_broker`]).
const CANCEL_AGAIN_AFTER: [std::time::Duration; 2] = [
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(2),
];

/// A JSON-RPC id as a map key: `1` and `"1"` stay apart.
fn id_key(id: &Value) -> String {
    id.to_string()
}

fn warn(message: &str) {
    eprintln!("approval-broker acp-proxy: {message}");
}
