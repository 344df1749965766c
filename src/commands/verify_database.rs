//! `approval-broker verify --database`: the receipts are the broker's signed word, the calls'
//! rows only its memory, and an outcome edited in the database file (a DENIED row set to
//! APPROVED with one UPDATE) would be served to the agent as if decided. So the chain is read
//! from the database and verified, and every call's stored state is compared with the receipt
//! that attests it, each difference named by session and call id.
//!
//! Read only, beside a running broker (SQLite's WAL, or any Postgres connection). A call decided
//! while this runs must not read as a mismatch: the receipts are read first, then the calls, then
//! the receipts written meanwhile. An outcome and its receipt commit together, so a call read as
//! decided has its receipt among those read after it, and a call read as pending whose receipt
//! was read before it was decided before it was read: that pending row was edited.

use std::collections::HashMap;

use serde_json::Value;

use crate::domain::json;
use crate::domain::receipt::{ChainLink, payload, sha256_hex};
use crate::domain::{Call, CallQuery};
use crate::receipts::trust::KeySet;
use crate::receipts::verify::{ChainCheck, ChainSummary};
use crate::store::{BackendReads, Database};

/// Receipts read per page.
const RECEIPTS_PAGE: u32 = 1000;
/// Calls read per page.
const CALLS_PAGE: u32 = 500;

/// What the receipts attest of a call that its row also stores, by the names the statement
/// gives them, and where in the statement each is. The chain link and the warnings about hidden
/// characters are left out: the first is the chain's, the second derived from what is compared.
const ATTESTED: [(&str, &str); 13] = [
    ("tool", "/predicate/tool"),
    ("input", "/predicate/input"),
    ("shown.title", "/predicate/shown/title"),
    ("shown.message", "/predicate/shown/message"),
    ("call.workspace", "/predicate/call/workspace"),
    ("call.position", "/predicate/call/position"),
    ("times.requestedAt", "/predicate/times/requestedAt"),
    ("times.deadline", "/predicate/times/deadline"),
    ("outcome", "/predicate/outcome"),
    ("decidedBy", "/predicate/decidedBy"),
    ("reason", "/predicate/reason"),
    ("times.decidedAt", "/predicate/times/decidedAt"),
    ("runs", "/predicate/runs"),
];

/// Where `outcome` is in [`ATTESTED`].
const OUTCOME: usize = 8;

/// The outcome of a database's check: what verified, and every difference found.
#[derive(Debug)]
pub struct Report {
    /// The chain, `None` when the database holds no receipt.
    pub chain: Option<ChainSummary>,
    /// The calls read, and of those the decided ones compared with their receipts.
    pub calls: usize,
    pub compared: usize,
    /// Decided calls with no receipt (decided while receipts were off), when allowed.
    pub unreceipted: usize,
    /// One line per call whose stored state differs from its receipt.
    pub mismatches: Vec<String>,
}

/// A call as its receipt names it: agent, session, call id, batch id.
type Named = (String, String, String, String);

/// What one receipt attests: its sequence and [`ATTESTED`]'s values, as [`shown`] writes them.
struct Attested {
    sequence: u64,
    values: Vec<String>,
}

/// Verifies the chain `database` holds with `keys` and compares every call's stored state with
/// its receipt. `Err` when the chain itself does not verify (or the database cannot be read);
/// the calls that differ are in the report. A decided call without a receipt is a difference
/// unless `allow_unreceipted` (outcomes decided while receipts were off).
pub async fn check(
    database: &Database,
    keys: &KeySet,
    allow_unreceipted: bool,
) -> Result<Report, String> {
    let reads = crate::store::open_reads(database)
        .await
        .map_err(|e| e.to_string())?;
    let mut chain = ChainCheck::default();
    let mut attested: HashMap<Named, Attested> = HashMap::new();
    let read_before_calls = read_receipts(&reads, &mut chain, keys, &mut attested, 0).await?;

    let mut report = Report {
        chain: None,
        calls: 0,
        compared: 0,
        unreceipted: 0,
        mismatches: Vec::new(),
    };
    let mut decided_meanwhile = Vec::new();
    let mut query = CallQuery {
        limit: CALLS_PAGE,
        ..CallQuery::default()
    };
    loop {
        let page = reads.list_calls(&query).await.map_err(|e| e.to_string())?;
        for call in page.calls {
            report.calls += 1;
            let found = attested.get(&named(&call));
            match (&call.outcome, found) {
                (None, None) => {}
                (None, Some(receipt)) => report.mismatches.push(format!(
                    "{}: stored as pending, but receipt {} attests outcome {}",
                    who(&call),
                    receipt.sequence,
                    receipt.values[OUTCOME]
                )),
                (Some(_), Some(receipt)) => {
                    report.compared += 1;
                    if let Some(line) = differences(&call, receipt) {
                        report.mismatches.push(line);
                    }
                }
                (Some(_), None) => decided_meanwhile.push(call),
            }
        }
        match page.next {
            Some(cursor) => query.after = Some(cursor),
            None => break,
        }
    }

    // The receipts of calls decided while the calls were read.
    read_receipts(&reads, &mut chain, keys, &mut attested, read_before_calls).await?;
    for call in decided_meanwhile {
        match attested.get(&named(&call)) {
            Some(receipt) => {
                report.compared += 1;
                if let Some(line) = differences(&call, receipt) {
                    report.mismatches.push(line);
                }
            }
            None if allow_unreceipted => report.unreceipted += 1,
            None => report.mismatches.push(format!(
                "{}: stored as {}, but no receipt attests it",
                who(&call),
                call.outcome
                    .as_ref()
                    .map(|o| o.kind.to_string())
                    .unwrap_or_default()
            )),
        }
    }
    report.chain = chain.summary();
    Ok(report)
}

/// Reads and verifies the receipts after sequence `after`, in order, recording what each
/// attests; returns the last sequence read.
async fn read_receipts(
    reads: &BackendReads,
    chain: &mut ChainCheck,
    keys: &KeySet,
    attested: &mut HashMap<Named, Attested>,
    mut after: u64,
) -> Result<u64, String> {
    loop {
        let page = reads
            .receipts_after(after, RECEIPTS_PAGE)
            .await
            .map_err(|e| e.to_string())?;
        if page.is_empty() {
            return Ok(after);
        }
        for stored in page {
            let (verified, statement) = chain
                .next(&stored.envelope, keys)
                .map_err(|e| format!("{e} (sequence {} in the database)", stored.sequence))?;
            after = stored.sequence;
            let about = &statement["predicate"]["call"];
            let text = |field: &str| about[field].as_str().unwrap_or_default().to_owned();
            // An id used again after retention pruned its call is another batch: the newer
            // receipt is its call's, the older one's call is gone.
            attested.insert(
                (
                    text("agent"),
                    text("sessionId"),
                    text("callId"),
                    text("batchId"),
                ),
                Attested {
                    sequence: verified.sequence,
                    values: values_of(&statement),
                },
            );
        }
    }
}

#[cfg(test)]
#[test]
fn the_outcome_is_where_outcome_says() {
    assert_eq!(ATTESTED[OUTCOME].0, "outcome");
}

fn named(call: &Call) -> Named {
    (
        call.key.agent.as_str().to_owned(),
        call.key.session.as_str().to_owned(),
        call.key.call_id.as_str().to_owned(),
        call.batch_id.as_str().to_owned(),
    )
}

/// A call as a mismatch names it.
fn who(call: &Call) -> String {
    format!(
        "session `{}`, call `{}` (agent `{}`)",
        call.key.session.as_str(),
        call.key.call_id.as_str(),
        call.key.agent.as_str()
    )
}

/// [`ATTESTED`]'s values in `statement`.
fn values_of(statement: &Value) -> Vec<String> {
    ATTESTED
        .iter()
        .map(|(_, at)| shown(statement.pointer(at).unwrap_or(&Value::Null)))
        .collect()
}

/// A value as a mismatch shows it: its canonical JSON, or past 120 bytes (an input) its
/// SHA-256, which is all a comparison needs and keeps a whole chain's worth in memory small.
fn shown(value: &Value) -> String {
    let text = json::canonical(value);
    if text.len() <= 120 {
        return text;
    }
    format!(
        "sha256:{} ({} bytes)",
        sha256_hex(text.as_bytes()),
        text.len()
    )
}

/// How `call`'s stored state differs from what `receipt` attests, as one line naming the call
/// and each field: `None` when it does not. The stored side is the statement the broker would
/// sign for the call as stored, so both sides are written by the same code.
fn differences(call: &Call, receipt: &Attested) -> Option<String> {
    let Some(rebuilt) = payload(call, &ChainLink::after(None)) else {
        return Some(format!("{}: stored with no outcome", who(call)));
    };
    let stored = match serde_json::from_str::<Value>(&rebuilt) {
        Ok(statement) => values_of(&statement),
        Err(e) => return Some(format!("{}: stored state unreadable: {e}", who(call))),
    };
    let differ: Vec<String> = ATTESTED
        .iter()
        .zip(stored.iter().zip(&receipt.values))
        .filter(|(_, (stored, signed))| stored != signed)
        .map(|((name, _), (stored, signed))| format!("{name}: stored {stored}, receipt {signed}"))
        .collect();
    (!differ.is_empty()).then(|| {
        format!(
            "{}: differs from its receipt (sequence {}): {}",
            who(call),
            receipt.sequence,
            differ.join("; ")
        )
    })
}
