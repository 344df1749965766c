//! `approval-broker export`: the audit of a time range as JSON Lines, one object per call
//! requested in it (who asked, what, and the outcome: who or what decided, why, when), read
//! from the database directly, so it works while the broker runs and without its tokens.
//! Inputs are left out unless `--inputs` asks for them: they may hold secrets, and the audit
//! of who decided what rarely needs them.
//!
//! It is an operator's read (whoever can open the database file sees every call), so it asks no
//! visibility question: the readers `Call::visible_to` limits are those who come through the
//! API with a token.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Args;
use serde_json::{Value, json};

use crate::domain::{Call, CallQuery, Timestamp};
use crate::error::{Error, Result};
use crate::store::{BackendReads, Database};

/// Calls read per page.
const PAGE: u32 = 500;

/// `approval-broker export [--from T] [--to T] [--inputs] [--output FILE]`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// Only calls requested at or after this time (RFC 3339, e.g. `2026-11-01T00:00:00Z`).
    /// Default: the first call.
    #[arg(long, value_parser = parse_time)]
    pub from: Option<Timestamp>,

    /// Only calls requested before this time (RFC 3339). Default: now, and later calls too.
    #[arg(long, value_parser = parse_time)]
    pub to: Option<Timestamp>,

    /// Include each call's input (`inputJson`, and `runInputJson` when an approver edited
    /// it). Off by default: inputs may hold secrets.
    #[arg(long)]
    pub inputs: bool,

    /// Write to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// An RFC 3339 time (`2026-11-01T00:00:00Z`, fractions and offsets allowed).
fn parse_time(s: &str) -> std::result::Result<Timestamp, String> {
    let at = humantime::parse_rfc3339_weak(s.trim())
        .map_err(|e| format!("`{s}` is not a time like 2026-11-01T00:00:00Z: {e}"))?;
    let micros = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| format!("`{s}` is before 1970"))?
        .as_micros();
    i64::try_from(micros)
        .map(Timestamp::from_micros)
        .map_err(|_| format!("`{s}` is too far ahead"))
}

/// Runs the command: the exit code, with any error on standard error.
pub async fn run(database: &Database, args: &ExportArgs) -> ExitCode {
    match export(database, args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("export failed: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn export(database: &Database, args: &ExportArgs) -> Result<()> {
    if let (Some(from), Some(to)) = (args.from, args.to)
        && from >= to
    {
        return Err(Error::invalid("--to", "must be later than --from"));
    }
    let reads = crate::store::open_reads(database).await?;
    match &args.output {
        Some(path) => {
            let file = std::fs::File::create(path).map_err(|e| {
                Error::invalid("--output", format!("cannot create {}: {e}", path.display()))
            })?;
            write_calls(&reads, args, std::io::BufWriter::new(file)).await
        }
        None => {
            write_calls(
                &reads,
                args,
                std::io::BufWriter::new(std::io::stdout().lock()),
            )
            .await
        }
    }
}

/// Writes every call the range holds, oldest first, a line each.
pub async fn write_calls(
    reads: &BackendReads,
    args: &ExportArgs,
    mut out: impl Write,
) -> Result<()> {
    let mut query = CallQuery {
        created_after: args.from,
        created_before: args.to,
        limit: PAGE,
        ..CallQuery::default()
    };
    loop {
        let page = reads.list_calls(&query).await?;
        for call in &page.calls {
            let line = audit_line(call, args.inputs).to_string();
            writeln!(out, "{line}").map_err(output_failed)?;
        }
        match page.next {
            Some(cursor) => query.after = Some(cursor),
            None => break,
        }
    }
    out.flush().map_err(output_failed)
}

fn output_failed(e: std::io::Error) -> Error {
    Error::invalid("--output", format!("cannot write: {e}"))
}

/// One call as an audit line (the schema is in docs/data-lifecycle.md): the API's names for
/// its fields (lowerCamelCase, as grpcurl prints them), every field present (`null` when unset).
pub fn audit_line(call: &Call, inputs: bool) -> Value {
    let outcome = call.outcome.as_ref();
    let mut line = json!({
        "agent": call.key.agent.as_str(),
        "sessionId": call.key.session.as_str(),
        "callId": call.key.call_id.as_str(),
        "batchId": call.batch_id.as_str(),
        "tool": call.tool.as_str(),
        "workspace": call.workspace,
        "title": call.title,
        "createdAt": time(call.created_at),
        "deadline": call.deadline.map(time),
        "status": status(call),
        "decidedAt": outcome.map(|o| time(o.decided_at)),
        "decidedBy": outcome.map(|o| o.decided_by.to_string()),
        "reason": outcome.map(|o| o.reason.as_str()),
        "inputEdited": outcome.is_some_and(|o| o.input_edited),
        "responded": outcome.is_some_and(|o| o.responded()),
    });
    if inputs {
        line["inputJson"] = json!(call.input.as_str());
        if let Some(edited) = outcome
            .filter(|o| o.input_edited)
            .and_then(|o| o.run_input.as_ref())
        {
            line["runInputJson"] = json!(edited.as_str());
        }
    }
    line
}

/// The status as the API names it (`CALL_STATUS_APPROVED`).
fn status(call: &Call) -> String {
    match &call.outcome {
        None => "CALL_STATUS_PENDING".to_owned(),
        Some(outcome) => format!("CALL_STATUS_{}", outcome.kind),
    }
}

/// RFC 3339 in UTC, to the microsecond.
fn time(at: Timestamp) -> String {
    let micros = u64::try_from(at.as_micros()).unwrap_or(0);
    humantime::format_rfc3339_micros(SystemTime::UNIX_EPOCH + Duration::from_micros(micros))
        .to_string()
}
