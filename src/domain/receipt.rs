//! What a receipt says: the in-toto Statement (v1) the broker signs for every outcome, built
//! from the decided call alone, so the same call and chain link always give the same bytes.
//!
//! The subject is the call (`<agent>/<session>/<call id>`) with the SHA-256 of its canonical
//! input (RFC 8785, `domain::json`); the predicate records what was asked, what the approver was
//! shown, what was decided, by whom and when, and the link to the previous receipt of this
//! broker's chain. The payload is the statement's canonical JSON, so a verifier in any language
//! reads the same bytes the broker hashed. Signing and verifying live in `crate::receipts`;
//! this file does no I/O and no cryptography beyond the digests the statement names.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Call, Timestamp, invisible, json};

/// The DSSE payload type of every receipt.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The in-toto Statement version receipts use.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The broker's own predicate type (documented in docs/receipts.md).
pub const PREDICATE_TYPE: &str = "https://approval-broker.dev/receipt/v1";

/// Where a receipt sits in the broker's chain: its position (1 for the first receipt ever
/// written to this database) and the SHA-256 (hex) of the previous receipt's payload, `None`
/// only for the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainLink {
    pub sequence: u64,
    pub previous: Option<String>,
}

impl ChainLink {
    /// The link after a receipt at `sequence` whose payload hashed to `digest` (`None`: the
    /// chain is empty).
    pub fn after(head: Option<(u64, String)>) -> Self {
        match head {
            None => Self {
                sequence: 1,
                previous: None,
            },
            Some((sequence, digest)) => Self {
                sequence: sequence + 1,
                previous: Some(digest),
            },
        }
    }
}

/// Lower-case hex SHA-256 of `bytes`: the digest form receipts use everywhere.
pub fn sha256_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push(HEX[usize::from(byte >> 4)] as char);
        out.push(HEX[usize::from(byte & 0xf)] as char);
    }
    out
}

/// The subject name of a call's receipt: `<agent>/<session>/<call id>`.
pub fn subject_name(call: &Call) -> String {
    format!(
        "{}/{}/{}",
        call.key.agent.as_str(),
        call.key.session.as_str(),
        call.key.call_id.as_str()
    )
}

/// The statement of a decided call's receipt; `None` while the call is pending.
pub fn statement(call: &Call, link: &ChainLink) -> Option<Value> {
    let outcome = call.outcome.as_ref()?;
    let input = parse_stored(call.input.as_str());
    let input_digest = sha256_hex(call.input.as_str().as_bytes());
    // What runs: only an approved call runs, with the approver's edit if there was one. The
    // input is written out again only when it was edited; otherwise it is `input` above, and
    // the digest says so (the same digest as the subject's). Writing it twice made every
    // approved call's receipt nearly twice the size to hash, sign and store.
    let runs = outcome.run_input.as_ref().map(|run| {
        // The call's own input (most approvals) is hashed once, for both digests.
        let own = run.as_str() == call.input.as_str();
        let digest = match own {
            true => input_digest.clone(),
            false => sha256_hex(run.as_str().as_bytes()),
        };
        let mut runs = json!({
            "digest": {"sha256": digest},
            "edited": outcome.input_edited,
        });
        if outcome.input_edited || !own {
            runs["input"] = parse_stored(run.as_str());
        }
        runs
    });
    Some(json!({
        "_type": STATEMENT_TYPE,
        "subject": [{
            "name": subject_name(call),
            "digest": {"sha256": input_digest},
        }],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "chain": {
                "sequence": link.sequence,
                "previous": link.previous,
            },
            "call": {
                "agent": call.key.agent.as_str(),
                "sessionId": call.key.session.as_str(),
                "callId": call.key.call_id.as_str(),
                "batchId": call.batch_id.as_str(),
                "position": call.position,
                "workspace": call.workspace,
            },
            "tool": call.tool.as_str(),
            "input": input,
            "shown": {
                "title": call.title,
                "message": call.message,
                "hiddenCharacters": hidden_characters(call),
            },
            "runs": runs,
            "outcome": outcome.kind.to_string(),
            "reason": outcome.reason,
            "decidedBy": outcome.decided_by.to_string(),
            "times": {
                "requestedAt": rfc3339(call.created_at),
                "decidedAt": rfc3339(outcome.decided_at),
                "deadline": call.deadline.map(rfc3339),
            },
        },
    }))
}

/// The signed bytes of a receipt: the statement's canonical JSON.
pub fn payload(call: &Call, link: &ChainLink) -> Option<String> {
    statement(call, link).map(|statement| json::canonical(&statement))
}

/// The warnings approvers were shown about characters hiding in the call's free text (the
/// same fields and figures as the API's `Call.hidden_characters`).
fn hidden_characters(call: &Call) -> Vec<Value> {
    [
        ("title", call.title.as_str()),
        ("message", call.message.as_str()),
        ("input_json", call.input.as_str()),
    ]
    .into_iter()
    .filter_map(|(field, text)| {
        let (found, count) = invisible::found_in(text);
        (count > 0).then(|| {
            json!({
                "field": field,
                "codePoints": found.into_iter().map(invisible::code_point).collect::<Vec<_>>(),
                "count": count,
            })
        })
    })
    .collect()
}

/// A stored input is canonical JSON the broker wrote itself; kept as text if it somehow is not,
/// so a receipt never fails to say what was stored.
fn parse_stored(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn rfc3339(at: Timestamp) -> String {
    let micros = at.as_micros().max(0) as u64;
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros);
    humantime::format_rfc3339_micros(time).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_lower_case_hex_sha256() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
