//! Offline verification of receipts: one envelope, or a chain of them in order (an export). It
//! needs the public key and nothing else, and says exactly what failed: the signature, the
//! payload's form, the statement's type, the subject's digest, or the chain's order.
//!
//! The signature covers every byte of the payload, so a changed field fails on the signature;
//! the other checks catch a receipt that a holder of the key signed wrongly (a subject digest
//! that is not the input's, a run input that is not what its digest says), and a passkey-signed
//! approval's assertions (`stepUp`): each must be its approver's authenticator's signature over
//! exactly this call, input and requirement, one for every approver the outcome names.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value;

use super::pae;
use super::trust::{Keys, TrustedKey};
use crate::domain::identity::canonical;
use crate::domain::json;
use crate::domain::passkey::{Shown, SignedApproval};
use crate::domain::receipt::{PAYLOAD_TYPE, PREDICATE_TYPE, STATEMENT_TYPE, sha256_hex};

/// What a verified receipt says about its place and its call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub sequence: u64,
    pub previous: Option<String>,
    /// The SHA-256 (hex) of the payload: what the next receipt's `previous` must be.
    pub digest: String,
    pub subject: String,
    pub outcome: String,
    /// The id of the key whose signature verified.
    pub key_id: String,
    /// How many passkey-signed approvals it carries, each checked (`stepUp`).
    pub passkey_approvals: usize,
}

/// What a verified chain covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSummary {
    pub receipts: usize,
    pub first: u64,
    pub last: u64,
    /// The keys that signed it, in the order each first signed.
    pub keys: Vec<KeyUse>,
    /// How many passkey-signed approvals its receipts carry, each checked.
    pub passkey_approvals: usize,
}

/// How much of a chain one key signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyUse {
    pub key_id: String,
    pub receipts: usize,
    pub first: u64,
    pub last: u64,
}

/// Whether the statement in `envelope` (verified or not) attests a call of batch `batch_id`:
/// how a receipt is told from those of earlier calls under the same id (see
/// `Broker::receipt`). A batch id is the broker's own and never reused.
pub fn names_batch(envelope: &str, batch_id: &str) -> bool {
    let statement = serde_json::from_str::<Value>(envelope)
        .ok()
        .and_then(|envelope| BASE64.decode(envelope["payload"].as_str()?).ok())
        .and_then(|payload| serde_json::from_slice::<Value>(&payload).ok());
    statement.is_some_and(|s| s["predicate"]["call"]["batchId"].as_str() == Some(batch_id))
}

/// Checks one DSSE envelope (JSON text) against `keys`; the error says what failed.
pub fn receipt(envelope: &str, keys: &impl Keys) -> Result<Verified, String> {
    statement(envelope, keys).map(|(verified, _)| verified)
}

/// [`receipt`], and the statement it verified.
pub fn statement(envelope: &str, keys: &impl Keys) -> Result<(Verified, Value), String> {
    let envelope: Value =
        serde_json::from_str(envelope).map_err(|e| format!("the envelope is not JSON: {e}"))?;
    let payload_type = envelope["payloadType"].as_str().unwrap_or_default();
    if payload_type != PAYLOAD_TYPE {
        return Err(format!(
            "payloadType is `{payload_type}`, not `{PAYLOAD_TYPE}`"
        ));
    }
    let payload = envelope["payload"]
        .as_str()
        .and_then(|p| BASE64.decode(p).ok())
        .ok_or("payload is not base64")?;
    let signatures = envelope["signatures"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if signatures.is_empty() {
        return Err("the envelope has no signature".into());
    }
    let signer = signed_by(&signatures, &pae(PAYLOAD_TYPE, &payload), keys)?;
    let text = std::str::from_utf8(&payload).map_err(|_| "the payload is not UTF-8")?;
    let statement = json::parse("payload", text).map_err(|e| e.to_string())?;
    if json::canonical(&statement) != text {
        return Err("the payload is not canonical JSON (RFC 8785)".into());
    }
    let mut verified = statement_says(&statement, &payload)?;
    // A key signs only while it is current: a retired key (perhaps lost since) cannot vouch
    // for what was decided after it was retired.
    let decided_at = statement["predicate"]["times"]["decidedAt"].as_str();
    if let Some(why) = signer.refuses(decided_at) {
        return Err(why);
    }
    verified.key_id = signer.key_id;
    Ok((verified, statement))
}

/// The trusted key one of `signatures` verifies `message` with: the key each signature names
/// (`keyid`), or, for a signature naming none the verifier knows, any trusted key (DSSE leaves
/// `keyid` unauthenticated, so it only says which key to try first).
fn signed_by(signatures: &[Value], message: &[u8], keys: &impl Keys) -> Result<TrustedKey, String> {
    let mut named = Vec::new();
    for signature in signatures {
        let Some(sig) = signature["sig"]
            .as_str()
            .and_then(|sig| BASE64.decode(sig).ok())
        else {
            continue;
        };
        let key_id = signature["keyid"].as_str().unwrap_or_default();
        let candidates = match keys.by_id(key_id) {
            Some(key) => vec![key],
            None => {
                named.push(key_id.to_owned());
                keys.all()
            }
        };
        if let Some(key) = candidates
            .into_iter()
            .find(|k| k.key.verifies(message, &sig))
        {
            return Ok(key);
        }
        if let Some(key) = keys.by_id(key_id) {
            return Err(format!(
                "the signature does not verify with key {}",
                key.key_id
            ));
        }
    }
    let given: Vec<String> = keys.all().into_iter().map(|k| k.key_id).collect();
    Err(format!(
        "the signature does not verify with key {}: the receipt names key {}, which is not \
         among those given",
        given.join(" or "),
        match named.as_slice() {
            [] => "none".to_owned(),
            ids => ids.join(", "),
        }
    ))
}

/// The checks of a signed statement's content.
fn statement_says(statement: &Value, payload: &[u8]) -> Result<Verified, String> {
    if statement["_type"] != STATEMENT_TYPE {
        return Err(format!("_type is not `{STATEMENT_TYPE}`"));
    }
    if statement["predicateType"] != PREDICATE_TYPE {
        return Err(format!("predicateType is not `{PREDICATE_TYPE}`"));
    }
    let predicate = &statement["predicate"];
    let call = &predicate["call"];
    let subject = &statement["subject"][0];
    let name = format!(
        "{}/{}/{}",
        call["agent"].as_str().unwrap_or_default(),
        call["sessionId"].as_str().unwrap_or_default(),
        call["callId"].as_str().unwrap_or_default()
    );
    if subject["name"] != name.as_str() {
        return Err(format!("subject.name is not the predicate's call `{name}`"));
    }
    let input_digest = sha256_hex(json::canonical(&predicate["input"]).as_bytes());
    if subject["digest"]["sha256"] != input_digest.as_str() {
        return Err("subject.digest.sha256 is not the SHA-256 of the canonical input".into());
    }
    let runs = &predicate["runs"];
    if !runs.is_null() {
        // The input that runs is written out only when it differs from `input`.
        let runs_digest = match runs.get("input") {
            Some(edited) => sha256_hex(json::canonical(edited).as_bytes()),
            None => input_digest.clone(),
        };
        if runs["digest"]["sha256"] != runs_digest.as_str() {
            return Err("runs.digest.sha256 is not the SHA-256 of the input that runs".into());
        }
    }
    let passkey_approvals = step_up_says(predicate)?;
    let chain = &predicate["chain"];
    let sequence = chain["sequence"]
        .as_u64()
        .filter(|s| *s >= 1)
        .ok_or("chain.sequence is not a positive integer")?;
    let previous = match &chain["previous"] {
        Value::Null if sequence == 1 => None,
        Value::String(digest) if sequence > 1 && digest.len() == 64 => Some(digest.clone()),
        _ => {
            return Err(format!(
                "chain.previous must be null for the first receipt and a SHA-256 after it \
                 (sequence {sequence})"
            ));
        }
    };
    Ok(Verified {
        sequence,
        previous,
        digest: sha256_hex(payload),
        subject: name,
        outcome: predicate["outcome"].as_str().unwrap_or_default().to_owned(),
        key_id: String::new(),
        passkey_approvals,
    })
}

/// The checks of a passkey-signed approval (`predicate.stepUp`, absent on every other
/// receipt): each assertion verifies, offline, as its approver's authenticator's signature over
/// the statement this receipt's call, input and requirement make, and every approver the
/// outcome names signed one (and nobody else). How many were checked.
fn step_up_says(predicate: &Value) -> Result<usize, String> {
    let Some(step_up) = predicate.get("stepUp") else {
        return Ok(0);
    };
    if predicate["outcome"] != "APPROVED" {
        return Err("stepUp is on a receipt whose outcome is not APPROVED".into());
    }
    let requirement = &step_up["requirement"];
    if requirement["step_up"] != "passkey" {
        return Err("stepUp.requirement does not ask for step_up passkey".into());
    }
    let runs = &predicate["runs"];
    let input = json::canonical(runs.get("input").unwrap_or(&predicate["input"]));
    let call = &predicate["call"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let (agent, session, call_id) = (
        text(&call["agent"]),
        text(&call["sessionId"]),
        text(&call["callId"]),
    );
    let (tool, title, message) = (
        text(&predicate["tool"]),
        text(&predicate["shown"]["title"]),
        text(&predicate["shown"]["message"]),
    );
    let shown = Shown {
        approver: "",
        agent: &agent,
        session: &session,
        call_id: &call_id,
        tool: &tool,
        input: &input,
        edited: runs["edited"] == true,
        title: &title,
        message: &message,
        requirement: requirement.clone(),
    };
    let approvals = step_up["approvals"]
        .as_array()
        .ok_or("stepUp.approvals is not a list")?;
    let decided_by = predicate["decidedBy"].as_str().unwrap_or_default();
    let approvers: Vec<String> = decided_by
        .strip_prefix("approver:")
        .map(|names| names.split(',').map(canonical).collect())
        .unwrap_or_default();
    let mut signers = Vec::new();
    for (i, entry) in approvals.iter().enumerate() {
        let approver = entry["approver"].as_str().unwrap_or_default();
        let at = format!("stepUp.approvals[{i}] (`{approver}`)");
        let shown = Shown {
            approver,
            ..shown.clone()
        };
        if !approvers.contains(&canonical(approver)) {
            return Err(format!(
                "{at}: an assertion of someone the outcome does not name ({decided_by})"
            ));
        }
        let signed =
            SignedApproval::from_json(entry).ok_or_else(|| format!("{at}: a field is missing"))?;
        signed.check(&shown).map_err(|why| format!("{at}: {why}"))?;
        signers.push(canonical(approver));
    }
    if let Some(unsigned) = approvers.iter().find(|a| !signers.contains(a)) {
        return Err(format!(
            "stepUp: `{unsigned}` approved, but the receipt carries no passkey assertion of theirs"
        ));
    }
    Ok(approvals.len())
}

/// Checks receipts given in chain order: each one, and that each links to the one before it
/// (its sequence the next, its `previous` that receipt's payload digest), so a receipt removed,
/// added or moved fails. A chain starting at sequence 1 is the broker's whole history. Each
/// receipt is checked with the key it names, so a chain signed across key rotations verifies
/// with the keys of its time.
pub fn chain<'a>(
    envelopes: impl IntoIterator<Item = &'a str>,
    keys: &impl Keys,
) -> Result<ChainSummary, String> {
    let mut check = ChainCheck::default();
    for envelope in envelopes {
        check.next(envelope, keys)?;
    }
    check.summary().ok_or_else(|| "no receipt to verify".into())
}

/// A chain checked a receipt at a time, as it is read (a page at a time from a database).
#[derive(Debug, Default)]
pub struct ChainCheck {
    before: Option<Verified>,
    summary: Option<ChainSummary>,
}

impl ChainCheck {
    /// Checks the next receipt of the chain; the error names it by its place in what was read
    /// (`receipt 3`).
    pub fn next(&mut self, envelope: &str, keys: &impl Keys) -> Result<(Verified, Value), String> {
        let at = self.summary.as_ref().map_or(0, |s| s.receipts) + 1;
        let (this, statement) =
            statement(envelope, keys).map_err(|e| format!("receipt {at}: {e}"))?;
        if let Some(before) = &self.before {
            if this.sequence != before.sequence + 1 {
                return Err(format!(
                    "receipt {at}: sequence {} follows {}: a receipt is missing or out of order",
                    this.sequence, before.sequence
                ));
            }
            if this.previous.as_deref() != Some(before.digest.as_str()) {
                return Err(format!(
                    "receipt {at}: chain.previous is not the digest of receipt {} (sequence {})",
                    at - 1,
                    before.sequence
                ));
            }
        }
        let summary = self.summary.get_or_insert(ChainSummary {
            receipts: 0,
            first: this.sequence,
            last: this.sequence,
            keys: Vec::new(),
            passkey_approvals: 0,
        });
        summary.receipts += 1;
        summary.passkey_approvals += this.passkey_approvals;
        summary.last = this.sequence;
        match summary.keys.iter_mut().find(|k| k.key_id == this.key_id) {
            Some(used) => {
                used.receipts += 1;
                used.last = this.sequence;
            }
            None => summary.keys.push(KeyUse {
                key_id: this.key_id.clone(),
                receipts: 1,
                first: this.sequence,
                last: this.sequence,
            }),
        }
        self.before = Some(this.clone());
        Ok((this, statement))
    }

    /// What was checked so far; `None` before the first receipt.
    pub fn summary(&self) -> Option<ChainSummary> {
        self.summary.clone()
    }
}

/// The envelopes in `text`: one JSON document or JSON Lines, each an envelope, a `Receipt` (its
/// `envelope` field), GetReceipt's reply (its `receipt`) or an ExportReceipts page (its
/// `receipts`).
pub fn envelopes_in(text: &str) -> Result<Vec<String>, String> {
    if let Ok(document) = serde_json::from_str::<Value>(text) {
        return envelopes_of(&document).ok_or_else(|| {
            "the document is neither an envelope, a Receipt nor an ExportReceipts page".into()
        });
    }
    let mut envelopes = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let document: Value =
            serde_json::from_str(line).map_err(|e| format!("line {} is not JSON: {e}", i + 1))?;
        envelopes.extend(
            envelopes_of(&document)
                .ok_or_else(|| format!("line {} is neither an envelope nor a Receipt", i + 1))?,
        );
    }
    Ok(envelopes)
}

fn envelopes_of(document: &Value) -> Option<Vec<String>> {
    if document.get("payloadType").is_some() {
        return Some(vec![document.to_string()]);
    }
    if let Some(envelope) = document.get("envelope").and_then(Value::as_str) {
        return Some(vec![envelope.to_owned()]);
    }
    if let Some(receipt) = document.get("receipt") {
        return envelopes_of(receipt);
    }
    let receipts = document.get("receipts")?.as_array()?;
    receipts
        .iter()
        .map(|r| r.get("envelope").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::receipt::{ChainLink, payload};
    use crate::domain::{
        AgentId, BatchId, Call, CallId, CallKey, DecidedBy, Outcome, OutcomeKind, SessionId,
        Timestamp, ToolInput, ToolName,
    };
    use crate::receipts::Notary;
    use crate::receipts::trust::KeySet;

    fn decided(call_id: &str, kind: OutcomeKind) -> Call {
        let input = ToolInput::from_stored(r#"{"command":"ls -la","cwd":"/tmp"}"#.into());
        Call {
            action: None,
            host: None,
            key: CallKey {
                agent: AgentId::parse("agent", "build-bot").unwrap(),
                session: SessionId::parse("session_id", "s1").unwrap(),
                call_id: CallId::parse("call_id", call_id).unwrap(),
            },
            batch_id: BatchId::parse("batch_id", "b1").unwrap(),
            position: 0,
            batch_size: 1,
            tool: ToolName::parse("tool", "bash").unwrap(),
            input: input.clone(),
            title: "List files".into(),
            message: "in /tmp\u{202E}".into(),
            workspace: "repo".into(),
            supersede_key: None,
            deadline: Some(Timestamp::from_micros(1_700_000_100_000_000)),
            created_at: Timestamp::from_micros(1_700_000_000_000_000),
            escalation: None,
            requested_by: String::new(),
            approval: None,
            outcome: Some(Outcome {
                kind,
                decided_at: Timestamp::from_micros(1_700_000_050_000_000),
                decided_by: DecidedBy::Approver("ana".into()),
                reason: "looks fine".into(),
                tool_result: String::new(),
                run_input: (kind == OutcomeKind::Approved).then_some(input),
                input_edited: false,
                seq: None,
                receipt: None,
            }),
        }
    }

    /// Three chained receipts, as the broker would write them.
    fn chain_of_three(notary: &Notary) -> Vec<String> {
        let mut head = None;
        let mut out = Vec::new();
        for (id, kind) in [
            ("c1", OutcomeKind::Approved),
            ("c2", OutcomeKind::Denied),
            ("c3", OutcomeKind::Expired),
        ] {
            let link = ChainLink::after(head.take());
            let payload = payload(&decided(id, kind), &link).unwrap();
            head = Some((link.sequence, sha256_hex(payload.as_bytes())));
            out.push(notary.seal(&payload));
        }
        out
    }

    fn notary() -> Notary {
        Notary::from_seed(&[42; 32]).unwrap()
    }

    /// Every leaf of a JSON value, as a JSON pointer.
    fn leaves(value: &Value, at: String, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => map
                .iter()
                .for_each(|(k, v)| leaves(v, format!("{at}/{k}"), out)),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .for_each(|(i, v)| leaves(v, format!("{at}/{i}"), out)),
            _ => out.push(at),
        }
    }

    fn statement_of(envelope: &str) -> Value {
        let envelope: Value = serde_json::from_str(envelope).unwrap();
        let payload = BASE64
            .decode(envelope["payload"].as_str().unwrap())
            .unwrap();
        serde_json::from_slice(&payload).unwrap()
    }

    fn with_statement(envelope: &str, statement: &Value) -> String {
        let mut envelope: Value = serde_json::from_str(envelope).unwrap();
        envelope["payload"] = BASE64.encode(json::canonical(statement)).into();
        envelope.to_string()
    }

    #[test]
    fn a_receipt_the_broker_sealed_verifies_with_its_public_key() {
        let notary = notary();
        let receipts = chain_of_three(&notary);
        let first = receipt(&receipts[0], notary.public_key()).unwrap();
        assert_eq!(first.sequence, 1);
        assert_eq!(first.previous, None);
        assert_eq!(first.subject, "build-bot/s1/c1");
        assert_eq!(first.outcome, "APPROVED");
        let summary = chain(receipts.iter().map(String::as_str), notary.public_key()).unwrap();
        assert_eq!((summary.receipts, summary.first, summary.last), (3, 1, 3));
    }

    #[test]
    fn changing_any_field_of_the_statement_fails_the_signature() {
        let notary = notary();
        let sealed = &chain_of_three(&notary)[1];
        let statement = statement_of(sealed);
        let mut paths = Vec::new();
        leaves(&statement, String::new(), &mut paths);
        assert!(paths.len() > 20, "{paths:?}");
        for path in paths {
            let mut changed = statement.clone();
            let leaf = changed.pointer_mut(&path).unwrap();
            *leaf = match leaf {
                Value::String(s) => Value::String(format!("{s}x")),
                Value::Number(n) => (n.as_f64().unwrap() + 1.0).into(),
                Value::Bool(b) => Value::Bool(!*b),
                _ => Value::String("x".into()),
            };
            let err =
                receipt(&with_statement(sealed, &changed), notary.public_key()).expect_err(&path);
            assert!(err.contains("signature does not verify"), "{path}: {err}");
        }
    }

    #[test]
    fn a_changed_signature_another_key_or_another_payload_type_fails() {
        let notary = notary();
        let sealed = &chain_of_three(&notary)[0];
        let mut envelope: Value = serde_json::from_str(sealed).unwrap();
        let mut sig = BASE64
            .decode(envelope["signatures"][0]["sig"].as_str().unwrap())
            .unwrap();
        sig[10] ^= 1;
        envelope["signatures"][0]["sig"] = BASE64.encode(&sig).into();
        let err = receipt(&envelope.to_string(), notary.public_key()).unwrap_err();
        assert!(err.contains("signature does not verify"), "{err}");

        let other = Notary::from_seed(&[1; 32]).unwrap();
        let err = receipt(sealed, other.public_key()).unwrap_err();
        assert!(err.contains("signature does not verify"), "{err}");

        let mut envelope: Value = serde_json::from_str(sealed).unwrap();
        envelope["payloadType"] = "application/json".into();
        let err = receipt(&envelope.to_string(), notary.public_key()).unwrap_err();
        assert!(err.contains("payloadType"), "{err}");
    }

    #[test]
    fn a_validly_signed_receipt_whose_subject_is_not_its_input_fails() {
        let notary = notary();
        let mut statement = statement_of(&chain_of_three(&notary)[0]);
        statement["predicate"]["input"]["command"] = "rm -rf /".into();
        let resealed = notary.seal(&json::canonical(&statement));
        let err = receipt(&resealed, notary.public_key()).unwrap_err();
        assert!(err.contains("subject.digest"), "{err}");
    }

    #[test]
    fn the_input_that_runs_is_written_out_only_when_the_approver_edited_it() {
        let notary = notary();
        let as_asked = statement_of(&chain_of_three(&notary)[0]);
        let runs = &as_asked["predicate"]["runs"];
        assert!(runs.get("input").is_none(), "{runs}");
        assert_eq!(runs["digest"], as_asked["subject"][0]["digest"]);
        assert_eq!(runs["edited"], false);

        let mut call = decided("c9", OutcomeKind::Approved);
        let edited = ToolInput::from_stored(r#"{"command":"ls"}"#.into());
        let outcome = call.outcome.as_mut().unwrap();
        (outcome.run_input, outcome.input_edited) = (Some(edited), true);
        let sealed = notary.seal(&payload(&call, &ChainLink::after(None)).unwrap());
        assert!(receipt(&sealed, notary.public_key()).is_ok());
        let runs = statement_of(&sealed)["predicate"]["runs"].clone();
        assert_eq!(runs["input"]["command"], "ls");
        assert_eq!(runs["edited"], true);

        // Validly signed, but what it says runs is not what its digest names.
        for mut statement in [as_asked, statement_of(&sealed)] {
            statement["predicate"]["runs"]["digest"]["sha256"] = sha256_hex(b"{}").into();
            let resealed = notary.seal(&json::canonical(&statement));
            let err = receipt(&resealed, notary.public_key()).unwrap_err();
            assert!(err.contains("runs.digest"), "{err}");
        }
    }

    #[test]
    fn swapping_deleting_or_replacing_a_receipt_of_a_chain_fails() {
        let notary = notary();
        let r = chain_of_three(&notary);
        let key = notary.public_key();
        let swapped = chain([&r[0], &r[2], &r[1]].map(String::as_str), key).unwrap_err();
        assert!(swapped.contains("missing or out of order"), "{swapped}");
        let deleted = chain([&r[0], &r[2]].map(String::as_str), key).unwrap_err();
        assert!(deleted.contains("missing or out of order"), "{deleted}");
        // A receipt with the right sequence that is not the one the chain signed next.
        let mut statement = statement_of(&r[1]);
        statement["predicate"]["chain"]["previous"] = sha256_hex(b"another history").into();
        let forged = notary.seal(&json::canonical(&statement));
        let relinked = chain([&r[0], &forged, &r[2]].map(String::as_str), key).unwrap_err();
        assert!(relinked.contains("receipt 2: chain.previous"), "{relinked}");
    }

    /// Three receipts signed by the first key, then three by the second (a rotation), in one
    /// chain.
    fn rotated_chain(old: &Notary, new: &Notary) -> Vec<String> {
        let mut head = None;
        let mut out = Vec::new();
        for (i, notary) in [old, old, old, new, new, new].into_iter().enumerate() {
            let link = ChainLink::after(head.take());
            let payload = payload(&decided(&format!("c{i}"), OutcomeKind::Denied), &link).unwrap();
            head = Some((link.sequence, sha256_hex(payload.as_bytes())));
            out.push(notary.seal(&payload));
        }
        out
    }

    #[test]
    fn a_chain_signed_across_a_key_rotation_verifies_with_both_keys_each_receipt_with_its_own() {
        let (old, new) = (notary(), Notary::from_seed(&[43; 32]).unwrap());
        let r = rotated_chain(&old, &new);
        let both = KeySet::from_values(&[new.public_key().to_base64(), old.public_key().to_pem()])
            .unwrap();
        let summary = chain(r.iter().map(String::as_str), &both).unwrap();
        assert_eq!((summary.receipts, summary.first, summary.last), (6, 1, 6));
        let used: Vec<_> = summary
            .keys
            .iter()
            .map(|k| (k.key_id.as_str(), k.receipts, k.first, k.last))
            .collect();
        assert_eq!(
            used,
            [(old.key_id(), 3, 1, 3), (new.key_id(), 3, 4, 6)],
            "each receipt checked with the key it names"
        );
        // Either key alone fails where the other signed, naming the key the receipt names.
        let err = chain(r.iter().map(String::as_str), old.public_key()).unwrap_err();
        assert!(
            err.starts_with("receipt 4: the signature does not verify"),
            "{err}"
        );
        assert!(err.contains(new.key_id()), "{err}");
        let err = chain(r.iter().map(String::as_str), new.public_key()).unwrap_err();
        assert!(err.starts_with("receipt 1: "), "{err}");
        // A receipt naming one key but signed by the other fails: the id only says which key.
        let mut envelope: Value = serde_json::from_str(&r[0]).unwrap();
        envelope["signatures"][0]["keyid"] = new.key_id().into();
        let err = receipt(&envelope.to_string(), &both).unwrap_err();
        assert_eq!(
            err,
            format!("the signature does not verify with key {}", new.key_id())
        );
        // A signature naming no key the verifier knows is tried with every key.
        envelope["signatures"][0]["keyid"] = "".into();
        assert_eq!(
            receipt(&envelope.to_string(), &both).unwrap().key_id,
            old.key_id()
        );
    }

    /// `decided` is decided at 2023-11-14T22:14:10Z: a key whose window ends before then (it
    /// was retired, and may have been lost since) does not vouch for it.
    #[test]
    fn a_key_verifies_only_receipts_decided_within_its_validity_window() {
        let (old, new) = (notary(), Notary::from_seed(&[43; 32]).unwrap());
        let r = rotated_chain(&old, &new);
        let keys = |old_until: &str| {
            let mut set = KeySet::default();
            set.read(&format!(
                "{} until={old_until}\n{} from={old_until}\n",
                old.public_key().to_base64(),
                new.public_key().to_base64()
            ))
            .unwrap();
            set
        };
        let err = chain(r.iter().map(String::as_str), &keys("2023-11-14T22:00:00Z")).unwrap_err();
        assert!(
            err.starts_with(
                "receipt 1: decided at 2023-11-14T22:14:10.000000Z but signed with key"
            ) && err.contains("valid until 2023-11-14T22:00:00Z"),
            "{err}"
        );
        let err = chain(r.iter().map(String::as_str), &keys("2023-11-15T00:00:00Z")).unwrap_err();
        assert!(err.starts_with("receipt 4: decided at"), "{err}");
        assert!(err.contains("valid from 2023-11-15T00:00:00Z"), "{err}");
    }

    #[test]
    fn receipts_are_read_from_an_envelope_a_receipt_reply_an_export_page_or_json_lines() {
        let notary = notary();
        let r = chain_of_three(&notary);
        assert_eq!(envelopes_in(&r[0]).unwrap(), vec![r[0].clone()]);
        let receipt = serde_json::json!({"sequence": "1", "envelope": r[0]});
        assert_eq!(
            envelopes_in(&receipt.to_string()).unwrap(),
            vec![r[0].clone()]
        );
        let reply = serde_json::json!({"receipt": receipt, "key": {"keyId": "x"}}).to_string();
        assert_eq!(envelopes_in(&reply).unwrap(), vec![r[0].clone()]);
        let page = serde_json::json!({"receipts": [{"envelope": r[0]}, {"envelope": r[1]}]});
        assert_eq!(envelopes_in(&page.to_string()).unwrap().len(), 2);
        let lines = format!("{}\n{}\n\n{}\n", r[0], r[1], r[2]);
        assert_eq!(envelopes_in(&lines).unwrap(), r);
    }

    /// A call approved by two people's passkeys, sealed as the broker seals it: the receipt
    /// verifies; validly re-signed with another person named, another input, or the assertion
    /// of another call, it is refused naming the assertion.
    #[test]
    fn a_passkey_signed_approval_verifies_only_for_its_call_input_and_people() {
        use crate::domain::passkey::step_up::challenge;
        use crate::domain::passkey::webauthn::{read_assertion, tests::Soft, verify_registration};
        use crate::domain::policy::{Approval, Approvers, Requirement, StepUp, Vote};
        const ORIGIN: &str = "http://localhost:8080";
        let requirement = Requirement::default_of(&Approvers {
            quorum: 2,
            step_up: Some(StepUp::Passkey),
            ..Approvers::default()
        });
        let mut call = decided("c1", OutcomeKind::Approved);
        call.outcome.as_mut().unwrap().decided_by = DecidedBy::Approver("ana,ben".into());
        let sign = |call: &Call, who: &str| {
            let soft = Soft::new();
            let rp = crate::domain::passkey::webauthn::tests::rp();
            let key = verify_registration("c", &soft.register("r", "localhost", ORIGIN), "r", &rp)
                .unwrap()
                .public_key;
            let digest = Shown::of(who, call, None, &requirement).digest();
            let nonce = [who.len() as u8; 32];
            let json = soft.assert(&challenge(&digest, &nonce), "localhost", ORIGIN, 1);
            let assertion = read_assertion("c", &json).unwrap();
            Vote {
                approver: who.into(),
                groups: None,
                approve: true,
                reason: String::new(),
                at: 1,
                remember: None,
                passkey: Some(SignedApproval::of(
                    &assertion,
                    &key,
                    &nonce,
                    &digest,
                    "localhost",
                )),
            }
        };
        let votes = vec![sign(&call, "ana"), sign(&call, "ben")];
        call.approval = Some(Approval {
            requirement: requirement.clone(),
            votes: votes.clone(),
        });
        let notary = notary();
        let sealed = notary.seal(&payload(&call, &ChainLink::after(None)).unwrap());
        let verified = receipt(&sealed, notary.public_key()).unwrap();
        assert_eq!(verified.passkey_approvals, 2);
        let statement = statement_of(&sealed);
        let refused = |statement: &Value| {
            receipt(
                &notary.seal(&json::canonical(statement)),
                notary.public_key(),
            )
            .unwrap_err()
        };
        // Another person named for Ben's assertion.
        let mut other_person = statement.clone();
        other_person["predicate"]["stepUp"]["approvals"][1]["approver"] = "eve".into();
        assert!(refused(&other_person).contains("does not name"));
        // The outcome names Eve too, but she signed nothing.
        let mut unsigned = statement.clone();
        unsigned["predicate"]["decidedBy"] = "approver:ana,ben,eve".into();
        assert!(refused(&unsigned).contains("`eve` approved"));
        // Another input (the subject's digest made to match): the assertions signed another.
        let mut other_input = statement.clone();
        other_input["predicate"]["input"] = serde_json::json!({"command": "rm -rf /"});
        let digest = sha256_hex(json::canonical(&other_input["predicate"]["input"]).as_bytes());
        other_input["subject"][0]["digest"]["sha256"] = digest.clone().into();
        other_input["predicate"]["runs"]["digest"]["sha256"] = digest.into();
        let err = refused(&other_input);
        assert!(
            err.contains("stepUp.approvals[0]") && err.contains("another statement"),
            "{err}"
        );
        // Ben's assertion of another call, carried by this one's receipt.
        let mut other = decided("c2", OutcomeKind::Approved);
        other.outcome.as_mut().unwrap().decided_by = DecidedBy::Approver("ana,ben".into());
        let of_other = sign(&other, "ben").passkey.unwrap();
        let mut swapped = statement.clone();
        let mut entry = of_other.to_json();
        entry["approver"] = "ben".into();
        swapped["predicate"]["stepUp"]["approvals"][1] = entry;
        assert!(refused(&swapped).contains("stepUp.approvals[1]"));
    }
}
