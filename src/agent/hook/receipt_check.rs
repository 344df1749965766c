//! Executors check what they run (docs/receipts.md): before the Claude Code hook or the MCP
//! gateway lets a tool run on an APPROVED outcome, it takes the call's signed receipt (carried
//! by the outcome; asked for with `GetReceipt` from a broker that sends none), verifies
//! it with a key it trusts, and checks that the receipt says APPROVED for exactly this call and
//! exactly the input about to run. An outcome is only what the broker's database says now, and a
//! row edited in the database (no key needed) reads APPROVED; the receipt was signed when the
//! call was decided, and still says what was decided.
//!
//! The trusted keys are the executor's own (`--trusted-receipt-key`), or, when it is given none,
//! the broker's `ListReceiptKeys` read once at start: never anything that comes with the outcome
//! or the receipt. Every way of not knowing fails closed, with a text the model reads saying why.
//! `--no-receipt-check` (for a broker running `--receipts off`) is the one way around the check,
//! and is logged as a warning at start.

use serde_json::Value;
use tokio::sync::OnceCell;

use super::review::{self, BrokerAddress};
use crate::domain::json;
use crate::domain::receipt::sha256_hex;
use crate::proto::v1 as pb;
use crate::receipts::PublicKey;
use crate::receipts::trust::{KeySet, TrustedKey};
use crate::receipts::verify;

/// The receipt-check settings every executor takes (the hook, the gateway).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ReceiptCheckArgs {
    /// A public key the executor trusts receipts signed with: a file or the key itself, in the
    /// format `approval-broker verify --key` reads (PEM blocks, or base64 lines with optional
    /// `from=`/`until=`). Repeatable; the environment variable takes a comma-separated list.
    /// Without one, the broker's own keys are read once at start (`ListReceiptKeys`).
    #[arg(
        long = "trusted-receipt-key",
        env = "APPROVALS_TRUSTED_RECEIPT_KEY",
        value_delimiter = ',',
        value_name = "KEY or FILE"
    )]
    pub trusted_keys: Vec<String>,

    /// Run APPROVED calls without checking their signed receipt: only for a broker running
    /// `--receipts off`, which signs none. Logged as a warning at start.
    #[arg(
        long = "no-receipt-check",
        env = "APPROVALS_NO_RECEIPT_CHECK",
        conflicts_with = "trusted_keys"
    )]
    pub no_receipt_check: bool,
}

/// Why an APPROVED outcome is not acted on; its text is what the model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("The broker's outcome for this call could not be verified ({0}): the tool was not run.")]
pub struct Unverified(pub String);

/// Why the trusted keys are not known: the broker could not be reached to read them (answered
/// as any unreachable broker is), or what it served cannot be trusted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NoKeys {
    #[error("{0}")]
    Unreachable(review::ReviewError),
    #[error("{0}")]
    Unverified(Unverified),
}

impl From<NoKeys> for Unverified {
    fn from(no_keys: NoKeys) -> Unverified {
        match no_keys {
            NoKeys::Unverified(unverified) => unverified,
            NoKeys::Unreachable(error) => Unverified(format!(
                "the broker's receipt keys could not be read: {error}"
            )),
        }
    }
}

/// Where the trusted keys come from.
#[derive(Debug)]
enum Source {
    /// `--no-receipt-check`.
    Off,
    /// `--trusted-receipt-key`.
    Given,
    /// The broker's `ListReceiptKeys`, read once.
    Broker,
}

/// One executor's receipt check: its trusted keys, read once, and the check itself.
#[derive(Debug)]
pub struct ReceiptCheck {
    source: Source,
    broker: BrokerAddress,
    keys: OnceCell<KeySet>,
}

impl ReceiptCheck {
    /// The check the settings ask for; an unreadable key given is refused here, at start.
    pub fn new(args: &ReceiptCheckArgs, broker: &BrokerAddress) -> Result<Self, String> {
        let keys = OnceCell::new();
        let source = if args.no_receipt_check {
            tracing::warn!(
                "--no-receipt-check: APPROVED outcomes are acted on without checking their \
                 signed receipts; an outcome edited in the broker's database would run"
            );
            Source::Off
        } else if args.trusted_keys.is_empty() {
            Source::Broker
        } else {
            let set = KeySet::from_values(&args.trusted_keys)
                .map_err(|e| format!("--trusted-receipt-key: {e}"))?;
            keys.set(set).expect("a fresh cell");
            Source::Given
        };
        Ok(Self {
            source,
            broker: broker.clone(),
            keys,
        })
    }

    /// Whether the check is off (`--no-receipt-check`).
    pub fn is_off(&self) -> bool {
        matches!(self.source, Source::Off)
    }

    /// The trusted keys, reading the broker's the first time they are needed and never again
    /// (a failed read is tried again at the next call: no key was trusted from it).
    pub async fn keys(&self) -> Result<Option<&KeySet>, NoKeys> {
        if self.is_off() {
            return Ok(None);
        }
        self.keys
            .get_or_try_init(|| async {
                let listed = review::receipt_keys(&self.broker)
                    .await
                    .map_err(NoKeys::Unreachable)?;
                broker_keys(&listed).map_err(NoKeys::Unverified)
            })
            .await
            .map(Some)
    }

    /// Checks that the call `call_id` of `session_id`, whose outcome is `outcome` (APPROVED),
    /// may run with `runs`, the input about to run: its receipt verifies with a trusted key, and
    /// says APPROVED for this agent, session, call and batch, and for exactly this input.
    pub async fn approve(
        &self,
        session_id: &str,
        call_id: &str,
        outcome: &pb::Outcome,
        runs: &Value,
    ) -> Result<(), Unverified> {
        let Some(keys) = self.keys().await.map_err(Unverified::from)? else {
            return Ok(());
        };
        // The outcome carries its receipt; one from a broker that sends none with outcomes is
        // asked for. Either way it is only trusted once it verifies with a trusted key.
        let envelope = if outcome.receipt.is_empty() {
            review::receipt(&self.broker, session_id, call_id)
                .await
                .map_err(Unverified)?
                .receipt
                .map(|r| r.envelope)
                .ok_or_else(|| Unverified("the broker sent no receipt".into()))?
        } else {
            outcome.receipt.clone()
        };
        judge(&envelope, keys, session_id, call_id, outcome, runs).map_err(Unverified)
    }
}

/// The keys a `ListReceiptKeys` answer names, with their windows: an empty answer is a broker
/// that signs nothing, which this check cannot trust.
fn broker_keys(listed: &pb::ListReceiptKeysResponse) -> Result<KeySet, Unverified> {
    let mut set = KeySet::default();
    for validity in &listed.keys {
        let Some(served) = &validity.key else {
            continue;
        };
        let key = PublicKey::parse(&served.public_key).map_err(|e| {
            Unverified(format!(
                "the broker served a key that could not be read: {e}"
            ))
        })?;
        let at = |t: &Option<prost_types::Timestamp>| {
            t.and_then(|t| std::time::SystemTime::try_from(t).ok())
        };
        let mut trusted = TrustedKey::new(key);
        trusted.from = at(&validity.valid_from);
        trusted.until = at(&validity.valid_until);
        set.add(trusted)
            .map_err(|e| Unverified(format!("the broker's receipt keys: {e}")))?;
    }
    if set.keys().is_empty() {
        return Err(Unverified(
            "the broker signs no receipts (is it running with --receipts off? Then start this \
             executor with --no-receipt-check)"
                .into(),
        ));
    }
    Ok(set)
}

/// The receipt's verdict on running `runs` for this call; the error says what differs.
fn judge(
    envelope: &str,
    keys: &KeySet,
    session_id: &str,
    call_id: &str,
    outcome: &pb::Outcome,
    runs: &Value,
) -> Result<(), String> {
    let (verified, statement) = verify::statement(envelope, keys)
        .map_err(|e| format!("its receipt does not verify with a trusted key: {e}"))?;
    if verified.outcome != "APPROVED" {
        return Err(format!("its signed receipt says {}", verified.outcome));
    }
    let call = &statement["predicate"]["call"];
    let expected = format!("{}/{}/{}", outcome.agent, session_id, call_id);
    let batch = call["batchId"].as_str().unwrap_or_default();
    if verified.subject != expected || batch != outcome.batch_id {
        return Err(format!(
            "its signed receipt is of call `{}` (batch `{batch}`), not `{expected}` (batch `{}`)",
            verified.subject, outcome.batch_id
        ));
    }
    // `verify::statement` checked `runs.digest` against the input it names, so the digest is
    // what the receipt approved to run.
    let approved = statement["predicate"]["runs"]["digest"]["sha256"].as_str();
    if approved != Some(sha256_hex(json::canonical(runs).as_bytes()).as_str()) {
        return Err("its signed receipt approves another input than the one about to run".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::receipt::{ChainLink, payload};
    use crate::domain::{Call, DecidedBy, Outcome, OutcomeKind, Timestamp, ToolInput};
    use crate::receipts::Notary;
    use serde_json::json;

    fn decided(kind: OutcomeKind, input: &str, run: Option<&str>) -> Call {
        let mut call = Call::sample("bot", "s", "c1", "shell", "b1");
        call.input = ToolInput::from_stored(input.into());
        call.with_outcome(Outcome {
            kind,
            decided_at: Timestamp::now(),
            decided_by: DecidedBy::Approver("alice".into()),
            reason: String::new(),
            tool_result: String::new(),
            run_input: run.map(|r| ToolInput::from_stored(r.into())),
            input_edited: run.is_some_and(|r| r != input),
            seq: None,
            receipt: None,
        })
    }

    fn sealed(notary: &Notary, call: &Call) -> String {
        notary.seal(&payload(call, &ChainLink::after(None)).unwrap())
    }

    fn approved_outcome() -> pb::Outcome {
        pb::Outcome {
            agent: "bot".into(),
            session_id: "s".into(),
            call_id: "c1".into(),
            status: pb::CallStatus::Approved as i32,
            batch_id: "b1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_trusted_receipt_approving_this_call_and_this_input_passes() {
        let notary = Notary::from_seed(&[5; 32]).unwrap();
        let keys = KeySet::from(*notary.public_key());
        let input = r#"{"command":"ls"}"#;
        let ok = sealed(&notary, &decided(OutcomeKind::Approved, input, Some(input)));
        let outcome = approved_outcome();
        let runs = json!({"command": "ls"});
        assert_eq!(judge(&ok, &keys, "s", "c1", &outcome, &runs), Ok(()));

        let other_input = judge(&ok, &keys, "s", "c1", &outcome, &json!({"command": "rm"}));
        assert!(other_input.unwrap_err().contains("another input"));
        let other_call = judge(&ok, &keys, "s", "c2", &outcome, &runs).unwrap_err();
        assert!(other_call.contains("not `bot/s/c2`"), "{other_call}");

        let denied = sealed(&notary, &decided(OutcomeKind::Denied, input, None));
        let why = judge(&denied, &keys, "s", "c1", &outcome, &runs).unwrap_err();
        assert_eq!(why, "its signed receipt says DENIED");

        let stranger = KeySet::from(*Notary::from_seed(&[6; 32]).unwrap().public_key());
        let why = judge(&ok, &stranger, "s", "c1", &outcome, &runs).unwrap_err();
        assert!(why.starts_with("its receipt does not verify"), "{why}");
        assert_eq!(
            Unverified("its signed receipt says DENIED".into()).to_string(),
            "The broker's outcome for this call could not be verified (its signed receipt says \
             DENIED): the tool was not run."
        );
    }

    #[test]
    fn an_edited_approval_passes_only_with_the_edited_input() {
        let notary = Notary::from_seed(&[5; 32]).unwrap();
        let keys = KeySet::from(*notary.public_key());
        let edited = sealed(
            &notary,
            &decided(
                OutcomeKind::Approved,
                r#"{"command":"rm -rf /"}"#,
                Some(r#"{"command":"ls"}"#),
            ),
        );
        let outcome = approved_outcome();
        let check = |runs: Value| judge(&edited, &keys, "s", "c1", &outcome, &runs);
        assert_eq!(check(json!({"command": "ls"})), Ok(()));
        assert!(check(json!({"command": "rm -rf /"})).is_err());
    }

    /// The outcome's own receipt is checked with no request to the broker (here one that cannot
    /// be reached: a port nothing listens on); a carried receipt that says otherwise refuses,
    /// and an outcome without one is asked for and, unreachable, refused.
    #[tokio::test]
    async fn the_receipt_an_outcome_carries_is_checked_without_asking_the_broker() {
        let notary = Notary::from_seed(&[5; 32]).unwrap();
        let args = ReceiptCheckArgs {
            trusted_keys: vec![notary.public_key().to_base64()],
            no_receipt_check: false,
        };
        let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let broker = BrokerAddress::new(format!("http://{}", nowhere.local_addr().unwrap()));
        drop(nowhere);
        let check = ReceiptCheck::new(&args, &broker).unwrap();
        let input = r#"{"command":"ls"}"#;
        let runs = json!({"command": "ls"});
        let mut outcome = approved_outcome();
        outcome.receipt = sealed(&notary, &decided(OutcomeKind::Approved, input, Some(input)));
        assert_eq!(check.approve("s", "c1", &outcome, &runs).await, Ok(()));

        outcome.receipt = sealed(&notary, &decided(OutcomeKind::Denied, input, None));
        let why = check.approve("s", "c1", &outcome, &runs).await.unwrap_err();
        assert_eq!(why.0, "its signed receipt says DENIED");

        outcome.receipt.clear();
        let why = check.approve("s", "c1", &outcome, &runs).await.unwrap_err();
        assert!(
            why.0.starts_with("its receipt could not be fetched"),
            "{why}"
        );
    }

    #[test]
    fn a_broker_serving_no_key_is_not_trusted() {
        let why = broker_keys(&pb::ListReceiptKeysResponse { keys: vec![] }).unwrap_err();
        assert!(why.0.contains("--no-receipt-check"), "{why}");
    }
}
