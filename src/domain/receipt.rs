//! What a receipt says: the in-toto Statement (v1) the broker signs for every outcome, built
//! from the decided call alone, so the same call and chain link always give the same bytes.
//!
//! The subject is the call (`<agent>/<session>/<call id>`) with the SHA-256 of its canonical
//! input (RFC 8785, `domain::json`); the predicate records what was asked, what the approver was
//! shown, what was decided, by whom and when, and the link to the previous receipt of this
//! broker's chain. The payload is the statement's canonical JSON, so a verifier in any language
//! reads the same bytes the broker hashed. Signing and verifying live in `crate::receipts`;
//! this file does no I/O and no cryptography beyond the digests the statement names.

use sha2::{Digest, Sha256};

use super::json::{self, ArrayWriter, ObjectWriter};
use super::{Call, OutcomeKind, Timestamp, invisible};

/// The DSSE payload type of every receipt.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The in-toto Statement version receipts use.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The broker's own predicate type (documented in docs/receipts.md).
pub const PREDICATE_TYPE: &str = "https://approval-broker.dev/receipt/v1";

/// A decided call's signed receipt, as read with its outcome (so that every outcome an agent
/// receives carries it): stored whole, its DSSE envelope, or in parts, its payload, key id and
/// signature (`store::receipt_rows`). The envelope of parts is built where the outcome is sent
/// (`receipts::envelope`), not on the thread that read it: SQLite's writer reads back every
/// event it commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sealed {
    Whole(String),
    Parts {
        payload: String,
        key_id: String,
        sig: String,
    },
}

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

/// The signed bytes of a decided call's receipt, `None` while the call is pending: the
/// statement's canonical JSON (RFC 8785), written member by member in canonical key order. The
/// stored input is canonical already and goes in as it is (`json::write_stored`): building the
/// statement as a JSON tree, parsing the input into it and writing it all out again was a tenth
/// of SQLite's writer at the 64-agent peak (docs/benchmarks-notes.md, "A receipt written as it is
/// signed"). The tests hold it byte for byte to the statement built as a tree.
///
/// The statement: `_type` (in-toto Statement v1); `subject`: the call's name and its input's
/// SHA-256; `predicateType` (the broker's receipt v1); `predicate`: `chain` (`sequence`,
/// `previous`), `call` (`agent`, `sessionId`, `callId`, `batchId`, `position`, `workspace`),
/// `tool`, `input`, `shown` (`title`, `message`, `hiddenCharacters`), `runs` (what runs: its
/// `digest`, whether `edited`, and its `input` when edited or not the call's own; `null` when
/// the call does not run), `outcome`, `reason`, `decidedBy`, `times` (`requestedAt`,
/// `decidedAt`, `deadline`); `responded: true` only when a person answered the model with
/// `reason` instead of running the call (`Outcome::responded`); and `stepUp` only on an
/// approval whose requirement asked for passkey-signed votes (see [`write_step_up`]).
pub fn payload(call: &Call, link: &ChainLink) -> Option<String> {
    let outcome = call.outcome.as_ref()?;
    let input = call.input.as_str();
    let input_digest = sha256_hex(input.as_bytes());
    let mut out = String::with_capacity(input.len() + call.title.len() + call.message.len() + 1024);
    let mut statement = ObjectWriter::open(&mut out);
    json::write_string(STATEMENT_TYPE, statement.key("_type"));
    let mut predicate = ObjectWriter::open(statement.key("predicate"));
    {
        let mut about = ObjectWriter::open(predicate.key("call"));
        json::write_string(call.key.agent.as_str(), about.key("agent"));
        json::write_string(call.batch_id.as_str(), about.key("batchId"));
        json::write_string(call.key.call_id.as_str(), about.key("callId"));
        json::write_unsigned(u64::from(call.position), about.key("position"));
        json::write_string(call.key.session.as_str(), about.key("sessionId"));
        json::write_string(&call.workspace, about.key("workspace"));
        about.close();
    }
    {
        let mut chain = ObjectWriter::open(predicate.key("chain"));
        json::write_opt_string(link.previous.as_deref(), chain.key("previous"));
        json::write_unsigned(link.sequence, chain.key("sequence"));
        chain.close();
    }
    json::write_string(&outcome.decided_by.to_string(), predicate.key("decidedBy"));
    json::write_stored(input, predicate.key("input"));
    json::write_string(&outcome.kind.to_string(), predicate.key("outcome"));
    json::write_string(&outcome.reason, predicate.key("reason"));
    // Only on a response (so every other receipt keeps its bytes): the person answered the
    // model with `reason` instead of running the call.
    if outcome.responded() {
        predicate.key("responded").push_str("true");
    }
    write_runs(call, &input_digest, predicate.key("runs"));
    {
        let mut shown = ObjectWriter::open(predicate.key("shown"));
        write_hidden_characters(call, shown.key("hiddenCharacters"));
        json::write_string(&call.message, shown.key("message"));
        json::write_string(&call.title, shown.key("title"));
        shown.close();
    }
    write_step_up(call, &mut predicate);
    {
        let mut times = ObjectWriter::open(predicate.key("times"));
        let deadline = call.deadline.map(rfc3339);
        json::write_opt_string(deadline.as_deref(), times.key("deadline"));
        json::write_string(&rfc3339(outcome.decided_at), times.key("decidedAt"));
        json::write_string(&rfc3339(call.created_at), times.key("requestedAt"));
        times.close();
    }
    json::write_string(call.tool.as_str(), predicate.key("tool"));
    predicate.close();
    json::write_string(PREDICATE_TYPE, statement.key("predicateType"));
    {
        let mut subjects = ArrayWriter::open(statement.key("subject"));
        let mut subject = ObjectWriter::open(subjects.item());
        let mut digest = ObjectWriter::open(subject.key("digest"));
        json::write_string(&input_digest, digest.key("sha256"));
        digest.close();
        json::write_string(&subject_name(call), subject.key("name"));
        subject.close();
        subjects.close();
    }
    statement.close();
    Some(out)
}

/// What runs: only an approved call runs, with the approver's edit if there was one (`null`
/// when the call does not run). The input is written out again when it was edited or is not
/// the call's own; otherwise it is the predicate's `input`, and the digest says so (the
/// subject's). Writing it twice made every approved call's receipt nearly twice the size to
/// hash, sign and store.
fn write_runs(call: &Call, input_digest: &str, out: &mut String) {
    let Some((outcome, run)) = call
        .outcome
        .as_ref()
        .and_then(|outcome| Some((outcome, outcome.run_input.as_ref()?)))
    else {
        out.push_str("null");
        return;
    };
    let own = run.as_str() == call.input.as_str();
    let mut runs = ObjectWriter::open(out);
    {
        let mut digest = ObjectWriter::open(runs.key("digest"));
        let sha256 = digest.key("sha256");
        match own {
            true => json::write_string(input_digest, sha256),
            false => json::write_string(&sha256_hex(run.as_str().as_bytes()), sha256),
        }
        digest.close();
    }
    runs.key("edited").push_str(if outcome.input_edited {
        "true"
    } else {
        "false"
    });
    if outcome.input_edited || !own {
        json::write_stored(run.as_str(), runs.key("input"));
    }
    runs.close();
}

/// Only on an approval whose requirement asks for `step_up: passkey` (so every other receipt
/// keeps its bytes): `stepUp`, the requirement as stored (`requirement`) and each approving
/// vote's passkey assertion with its approver (`approvals`: `approver`, `credentialId`,
/// `publicKey` (COSE), `authenticatorData`, `clientDataJSON`, `signature`, `nonce`,
/// `statementDigest`, `rpId`), enough to check offline that each approver's authenticator
/// signed exactly this call and input (`receipts::verify`).
fn write_step_up(call: &Call, predicate: &mut ObjectWriter<'_>) {
    let Some(approval) = call
        .approval
        .as_ref()
        .filter(|a| a.requirement.needs_passkey())
    else {
        return;
    };
    if call.outcome.as_ref().map(|o| o.kind) != Some(OutcomeKind::Approved) {
        return;
    }
    let mut step_up = ObjectWriter::open(predicate.key("stepUp"));
    {
        let mut approvals = ArrayWriter::open(step_up.key("approvals"));
        for vote in approval.votes.iter().filter(|v| v.approve) {
            let Some(signed) = &vote.passkey else {
                continue;
            };
            let mut value = signed.to_json();
            value["approver"] = serde_json::Value::String(vote.approver.clone());
            approvals.item().push_str(&json::canonical(&value));
        }
        approvals.close();
    }
    let requirement = super::passkey::step_up::requirement_json(&approval.requirement);
    step_up
        .key("requirement")
        .push_str(&json::canonical(&requirement));
    step_up.close();
}

/// The warnings approvers were shown about characters hiding in the call's free text (the
/// same fields and figures as the API's `Call.hidden_characters`).
fn write_hidden_characters(call: &Call, out: &mut String) {
    let fields = [
        ("title", call.title.as_str()),
        ("message", call.message.as_str()),
        ("input_json", call.input.as_str()),
    ];
    let mut warnings = ArrayWriter::open(out);
    for (field, text) in fields {
        let (found, count) = invisible::found_in(text);
        if count == 0 {
            continue;
        }
        let mut warning = ObjectWriter::open(warnings.item());
        let mut points = ArrayWriter::open(warning.key("codePoints"));
        for c in found {
            json::write_string(&invisible::code_point(c), points.item());
        }
        points.close();
        json::write_unsigned(count as u64, warning.key("count"));
        json::write_string(field, warning.key("field"));
        warning.close();
    }
    warnings.close();
}

fn rfc3339(at: Timestamp) -> String {
    let micros = at.as_micros().max(0) as u64;
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros);
    humantime::format_rfc3339_micros(time).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::domain::{DecidedBy, Outcome, OutcomeKind, ToolInput};

    /// The statement built as a JSON tree, as the broker first wrote it: what [`payload`] must
    /// write, byte for byte, once made canonical.
    fn statement(call: &Call, link: &ChainLink) -> Option<Value> {
        let outcome = call.outcome.as_ref()?;
        let input = parse_stored(call.input.as_str());
        let input_digest = sha256_hex(call.input.as_str().as_bytes());
        let runs = outcome.run_input.as_ref().map(|run| {
            let own = run.as_str() == call.input.as_str();
            let mut runs = json!({
                "digest": {"sha256": sha256_hex(run.as_str().as_bytes())},
                "edited": outcome.input_edited,
            });
            if outcome.input_edited || !own {
                runs["input"] = parse_stored(run.as_str());
            }
            runs
        });
        let hidden: Vec<Value> = [
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
        .collect();
        let mut statement = json!({
            "_type": STATEMENT_TYPE,
            "subject": [{"name": subject_name(call), "digest": {"sha256": input_digest}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {
                "chain": {"sequence": link.sequence, "previous": link.previous},
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
                "shown": {"title": call.title, "message": call.message, "hiddenCharacters": hidden},
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
        });
        if outcome.responded() {
            statement["predicate"]["responded"] = json!(true);
        }
        if let Some(approval) = call
            .approval
            .as_ref()
            .filter(|a| a.requirement.needs_passkey() && outcome.kind == OutcomeKind::Approved)
        {
            let approvals: Vec<Value> = approval
                .votes
                .iter()
                .filter(|v| v.approve)
                .filter_map(|v| {
                    let mut value = v.passkey.as_ref()?.to_json();
                    value["approver"] = json!(v.approver);
                    Some(value)
                })
                .collect();
            statement["predicate"]["stepUp"] = json!({
                "approvals": approvals,
                "requirement": serde_json::from_str::<Value>(&approval.requirement.to_stored())
                    .unwrap(),
            });
        }
        Some(statement)
    }

    /// A passkey-signed approval's receipt names the requirement and every signed approving
    /// vote (a denial's none), and is its statement in canonical form too.
    #[test]
    fn a_step_up_approval_carries_each_signed_vote_and_its_requirement() {
        use crate::domain::passkey::SignedApproval;
        use crate::domain::policy::{Approval, Approvers, Requirement, StepUp, Vote};
        let signed = |who: &str| SignedApproval {
            credential_id: format!("cred-{who}"),
            public_key: "pk".into(),
            authenticator_data: "ad".into(),
            client_data_json: "cd".into(),
            signature: "sig".into(),
            nonce: "n".into(),
            statement_digest: "d".into(),
            rp_id: "localhost".into(),
        };
        let vote = |who: &str, approve: bool| Vote {
            approver: who.into(),
            groups: None,
            approve,
            reason: String::new(),
            at: 1,
            remember: None,
            passkey: approve.then(|| signed(who)),
        };
        let mut call = decided("{}", approved(None, false));
        call.approval = Some(Approval {
            requirement: Requirement::default_of(&Approvers {
                quorum: 2,
                step_up: Some(StepUp::Passkey),
                ..Approvers::default()
            }),
            votes: vec![vote("ana", true), vote("ben", true)],
        });
        let link = ChainLink::after(None);
        let written = payload(&call, &link).unwrap();
        assert_eq!(written, json::canonical(&statement(&call, &link).unwrap()));
        let parsed: Value = serde_json::from_str(&written).unwrap();
        let step_up = &parsed["predicate"]["stepUp"];
        assert_eq!(step_up["approvals"][1]["approver"], "ben");
        assert_eq!(step_up["approvals"][1]["credentialId"], "cred-ben");
        assert_eq!(step_up["requirement"]["step_up"], "passkey");
        call.outcome.as_mut().unwrap().kind = OutcomeKind::Denied;
        assert!(!payload(&call, &link).unwrap().contains("stepUp"));
    }

    fn parse_stored(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
    }

    fn decided(input: &str, outcome: Outcome) -> Call {
        let mut call = Call::sample("build-bot", "s1", "c1", "bash", "b1");
        call.input = ToolInput::from_stored(input.into());
        call.created_at = Timestamp::from_micros(1_700_000_000_000_001);
        call.with_outcome(outcome)
    }

    fn approved(run_input: Option<&str>, edited: bool) -> Outcome {
        Outcome {
            kind: OutcomeKind::Approved,
            decided_at: Timestamp::from_micros(1_700_000_050_000_000),
            decided_by: DecidedBy::Approver("ana".into()),
            reason: String::new(),
            tool_result: String::new(),
            run_input: run_input.map(|text| ToolInput::from_stored(text.into())),
            input_edited: edited,
            seq: None,
            receipt: None,
        }
    }

    /// Every branch of the statement (runs absent, own, edited to itself, edited, another
    /// input; a deadline or none; the first link or a later one; hidden characters in each of
    /// the three fields; escapes in every free text; stored inputs canonical, of an older form,
    /// and not JSON at all), written directly and as a tree: the same bytes. Each stored input
    /// is checked to take the path meant for it (as it is, or parsed and written again).
    #[test]
    fn a_payload_is_its_statement_in_canonical_form() {
        // (stored input, whether it goes in as it is)
        let inputs = [
            (r#"{"command":"ls -la","cwd":"/tmp"}"#, true),
            // Escapes and characters beyond ASCII in values, plain keys.
            (
                "{\"a\":\"\\u001f\\n\\\"\\\\\",\"z\":[1,-2,0,true,null,{}],\"\u{e9}\":\"\u{1F600}\"}",
                true,
            ),
            // A hidden character, as is: the input's own warning.
            ("{\"text\":\"zero\u{200b}width \u{202e}turned\"}", true),
            (
                r#"{"a":[1,-2,0,true,false,null,{"b\"q":"\u001f\n"}],"z":{}}"#,
                false,
            ),
            (r#"{"n":1.10,"big":1e+15}"#, false),
            (r#"{ "spaced" : 1 }"#, false),
            (r#"{"b":1,"a":2}"#, false),
            (r#"{"\u0041":1}"#, false),
            (
                "{\"emoji\":\"\u{1F600}\",\"\u{e000}\":1,\"\u{1F600}\":2}",
                false,
            ),
            ("not json at all", false),
            ("", false),
        ];
        let mut outcomes = vec![
            approved(None, false),
            approved(Some(r#"{"command":"ls"}"#), true),
            approved(Some(r#"{"other":"input"}"#), false),
            Outcome {
                kind: OutcomeKind::Denied,
                decided_by: DecidedBy::Policy("no-rm".into()),
                reason: "\"quoted\"\n\ttab \u{7} bell \\ slash".into(),
                ..approved(None, false)
            },
            Outcome {
                kind: OutcomeKind::Expired,
                decided_by: DecidedBy::Deadline,
                ..approved(None, false)
            },
            // A person's response to the model: `responded` is written.
            Outcome {
                kind: OutcomeKind::Denied,
                reason: "use \"npm ci\"".into(),
                tool_result: crate::domain::ToolResultTexts::responded("use \"npm ci\""),
                ..approved(None, false)
            },
        ];
        let mut checked = 0;
        for (input, as_it_is) in inputs {
            assert_eq!(json::is_canonical(input), as_it_is, "{input}");
            // Its own input to run, as an approval without an edit stores it, and "edited"
            // to the same text.
            outcomes.push(approved(Some(input), false));
            outcomes.push(approved(Some(input), true));
            for outcome in &outcomes {
                for (variant, deadline, link, free) in [
                    ("bare", None, ChainLink::after(None), ("", "", "")),
                    (
                        "full",
                        Some(Timestamp::from_micros(1_700_000_100_000_000)),
                        ChainLink::after(Some((41, sha256_hex(b"previous")))),
                        ("List \u{200B}files", "in /tmp\u{202E}\u{2060}", "ws \"1\""),
                    ),
                ] {
                    let mut call = decided(input, outcome.clone());
                    call.deadline = deadline;
                    call.title = free.0.into();
                    call.message = free.1.into();
                    call.workspace = free.2.into();
                    call.position = 3;
                    let expected = json::canonical(&statement(&call, &link).unwrap());
                    assert_eq!(
                        payload(&call, &link).unwrap(),
                        expected,
                        "{input} {outcome:?} {variant}"
                    );
                    checked += 1;
                }
            }
            outcomes.truncate(outcomes.len() - 2);
        }
        assert_eq!(checked, 11 * 8 * 2);
        // The three fields' warnings, in their order, where all three hide characters.
        let call = decided("{\"text\":\"zero\u{200b}width\"}", approved(None, false));
        let call = Call {
            title: "a\u{2060}".into(),
            message: "b\u{202e}".into(),
            ..call
        };
        let written = payload(&call, &ChainLink::after(None)).unwrap();
        let fields: Vec<_> = [
            "\"field\":\"title\"",
            "\"field\":\"message\"",
            "\"field\":\"input_json\"",
        ]
        .iter()
        .map(|field| written.find(field).expect(field))
        .collect();
        assert!(fields.is_sorted(), "{written}");
        let mut pending = decided("{}", approved(None, false));
        pending.outcome = None;
        assert_eq!(payload(&pending, &ChainLink::after(None)), None);
    }

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
