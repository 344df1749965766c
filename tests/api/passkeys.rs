//! Passkey-signed approvals (issue 46): approvers register passkeys, and a call whose
//! requirement asks for `step_up: passkey` is approved only by votes carrying an assertion, by
//! the voter's own registered passkey, over the statement they were shown (the call, its input,
//! the requirement) and a nonce the broker issued for it. Without one, with another person's,
//! a revoked one, a used nonce, one made for another call or another input, or from another
//! origin or relying party, the vote never counts; a denial needs none; a quorum needs as many
//! signed people; nobody approves their own call; a grant never stands in for a passkey. The
//! receipt carries each assertion, and `verify` (the library and the command) accepts it and
//! refuses a receipt re-signed with the assertion moved to another call, input or person.
//!
//! The authenticator is software written here with `ring` (a P-256 key, `fmt: none`
//! attestation): the test is the browser.

use std::sync::atomic::{AtomicU32, Ordering};

use approval_broker::config::Config;
use approval_broker::domain::policy::{Approvers, StepUp};
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use approval_broker::receipts::{Notary, PublicKey, verify};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as B64URL};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tonic::Code;

use crate::helpers::*;
use crate::routing::{admin_as, approver_as, bearer};

const BOT: &str = "passkey-token-of-bot";
const BOT_AS_APPROVER: &str = "passkey-token-of-bot-approving";
const ALICE: &str = "passkey-token-of-alice";
const BOB: &str = "passkey-token-of-bob";
const ROOT: &str = "passkey-token-of-root";
/// The inbox's origin, as the broker is told to accept it.
const ORIGIN: &str = "http://localhost:8080";
/// The receipt key's seed (the tests re-sign statements with it to prove the checks behind the
/// signature).
const SEED: [u8; 32] = [46; 32];

fn receipt_key() -> PublicKey {
    *Notary::from_seed(&SEED).unwrap().public_key()
}

fn with_passkeys(config: &mut Config, quorum: u32) {
    config.auth.tokens = Some(format!(
        "agent bot {}\napprover bot {}\napprover alice {}\napprover bob {}\nadmin root {}",
        hash_token(BOT),
        hash_token(BOT_AS_APPROVER),
        hash_token(ALICE),
        hash_token(BOB),
        hash_token(ROOT),
    ));
    config.policy.default_approvers = Some(Approvers {
        quorum,
        step_up: Some(StepUp::Passkey),
        ..Approvers::default()
    });
    config.passkeys.passkey_origin = vec![ORIGIN.into()];
    let path = tempfile::NamedTempFile::new()
        .unwrap()
        .into_temp_path()
        .keep()
        .unwrap();
    std::fs::write(&path, SEED).unwrap();
    config.receipts.receipt_key = Some(path);
}

fn one_signed_approval(config: &mut Config) {
    with_passkeys(config, 1);
}

fn two_signed_approvals(config: &mut Config) {
    with_passkeys(config, 2);
}

fn sha256(parts: &[&[u8]]) -> Vec<u8> {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().to_vec()
}

/// A software authenticator holding one P-256 credential, as a browser drives it.
struct Authenticator {
    pair: EcdsaKeyPair,
    id: Vec<u8>,
    rng: SystemRandom,
    count: AtomicU32,
}

impl Authenticator {
    fn new(id: u8) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        Self {
            pair,
            id: vec![id; 16],
            rng,
            count: AtomicU32::new(0),
        }
    }

    fn credential_id(&self) -> String {
        B64URL.encode(&self.id)
    }

    fn client_data(kind: &str, challenge: &str, origin: &str) -> Vec<u8> {
        json!({"type": kind, "challenge": challenge, "origin": origin, "crossOrigin": false})
            .to_string()
            .into_bytes()
    }

    /// `navigator.credentials.create` with the broker's creation options, `.toJSON()`.
    fn create(&self, options_json: &str) -> String {
        let options: Value = serde_json::from_str(options_json).unwrap();
        let rp_id = options["rp"]["id"].as_str().unwrap();
        assert!(
            options["pubKeyCredParams"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["alg"] == -7),
            "{options}"
        );
        let challenge = options["challenge"].as_str().unwrap();
        let point = self.pair.public_key().as_ref();
        // COSE: {1: 2, 3: -7, -1: 1, -2: x, -3: y}
        let mut cose = vec![0xa5, 0x01, 0x02, 0x03, 0x26, 0x20, 0x01, 0x21, 0x58, 32];
        cose.extend_from_slice(&point[1..33]);
        cose.extend_from_slice(&[0x22, 0x58, 32]);
        cose.extend_from_slice(&point[33..65]);
        let mut auth = sha256(&[rp_id.as_bytes()]);
        auth.push(0x01 | 0x04 | 0x40); // UP, UV, AT
        auth.extend_from_slice(&0u32.to_be_bytes());
        auth.extend_from_slice(&[0; 16]); // aaguid
        auth.extend_from_slice(&(self.id.len() as u16).to_be_bytes());
        auth.extend_from_slice(&self.id);
        auth.extend_from_slice(&cose);
        // {"fmt": "none", "attStmt": {}, "authData": h'...'}
        let mut object = vec![0xa3, 0x63];
        object.extend_from_slice(b"fmt");
        object.push(0x64);
        object.extend_from_slice(b"none");
        object.push(0x67);
        object.extend_from_slice(b"attStmt");
        object.push(0xa0);
        object.push(0x68);
        object.extend_from_slice(b"authData");
        object.extend_from_slice(&[0x58, auth.len() as u8]);
        object.extend_from_slice(&auth);
        let client = Self::client_data("webauthn.create", challenge, ORIGIN);
        json!({
            "id": self.credential_id(), "rawId": self.credential_id(), "type": "public-key",
            "response": {
                "clientDataJSON": B64URL.encode(client),
                "attestationObject": B64URL.encode(object),
                "transports": ["internal"],
            },
            "clientExtensionResults": {},
        })
        .to_string()
    }

    /// `navigator.credentials.get` with the broker's request options, `.toJSON()`, as used
    /// from `origin` for relying party `rp_id` (the options' own when `None`).
    fn get_as(&self, options_json: &str, origin: &str, rp_id: Option<&str>) -> String {
        let options: Value = serde_json::from_str(options_json).unwrap();
        let rp_id = rp_id.unwrap_or_else(|| options["rpId"].as_str().unwrap());
        let challenge = options["challenge"].as_str().unwrap();
        let mut auth = sha256(&[rp_id.as_bytes()]);
        auth.push(0x01 | 0x04); // UP, UV
        let count = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        auth.extend_from_slice(&count.to_be_bytes());
        let client = Self::client_data("webauthn.get", challenge, origin);
        let mut signed = auth.clone();
        signed.extend_from_slice(&sha256(&[&client]));
        let signature = self.pair.sign(&self.rng, &signed).unwrap();
        json!({
            "id": self.credential_id(), "rawId": self.credential_id(), "type": "public-key",
            "response": {
                "clientDataJSON": B64URL.encode(client),
                "authenticatorData": B64URL.encode(auth),
                "signature": B64URL.encode(signature.as_ref()),
            },
            "clientExtensionResults": {},
        })
        .to_string()
    }

    /// As an authenticator cloned from one that signed `count` times already would sign.
    fn set_count(&self, count: u32) {
        self.count.store(count, Ordering::SeqCst);
    }

    fn get(&self, options_json: &str) -> String {
        self.get_as(options_json, ORIGIN, None)
    }
}

/// Registers `authenticator` as `token`'s passkey.
async fn register(app: &TestApp, token: &str, authenticator: &Authenticator) -> pb::Passkey {
    register_across(app, app, token, authenticator).await
}

/// Registers `authenticator` as `token`'s passkey: begun on `begin_on`, finished on `finish_on`
/// (the same broker, or two replicas of one database).
async fn register_across(
    begin_on: &TestApp,
    finish_on: &TestApp,
    token: &str,
    authenticator: &Authenticator,
) -> pb::Passkey {
    let begun = approver_as(&begin_on.channel, token)
        .begin_passkey_registration(pb::BeginPasskeyRegistrationRequest {})
        .await
        .expect("begin registration")
        .into_inner();
    approver_as(&finish_on.channel, token)
        .finish_passkey_registration(pb::FinishPasskeyRegistrationRequest {
            registration_id: begun.registration_id,
            credential_json: authenticator.create(&begun.options_json),
            name: "laptop".into(),
        })
        .await
        .expect("finish registration")
        .into_inner()
}

/// Submits calls `ids` (tool `deploy`, input `{"env":"prod"}`) in session `s` as `bot`.
async fn submit(app: &TestApp, ids: &[&str]) {
    let calls = ids
        .iter()
        .map(|id| call(id, "deploy", r#"{"env":"prod"}"#))
        .collect();
    AgentServiceClient::with_interceptor(app.channel.clone(), bearer(BOT))
        .submit(pb::SubmitRequest {
            batch: Some(pb::BatchSpec {
                on_deny: pb::OnDeny::Independent as i32,
                ..batch("s", calls)
            }),
        })
        .await
        .expect("submit");
}

async fn begin_step_up(
    app: &TestApp,
    token: &str,
    call_id: &str,
    edited: &str,
) -> Result<pb::BeginStepUpResponse, tonic::Status> {
    approver_as(&app.channel, token)
        .begin_step_up(pb::BeginStepUpRequest {
            session_id: "s".into(),
            call_id: call_id.into(),
            agent: "bot".into(),
            edited_input_json: edited.into(),
            approver: String::new(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The Decide request for `call_id` of `bot`'s session `s`, approving `edited` when it is not
/// empty, with `assertion` (a credential's JSON) when given; the approver is the token's.
fn step_up_decision(
    call_id: &str,
    verdict: pb::Decision,
    edited: &str,
    assertion: Option<String>,
) -> pb::DecideRequest {
    let mut request = decide_request("s", call_id, verdict, "");
    request.agent = "bot".into();
    request.approver = String::new();
    request.edited_input_json = edited.into();
    request.passkey = assertion.map(|credential_json| pb::PasskeyAssertion { credential_json });
    request
}

/// Decides `call_id` as `token`, with `assertion` (a credential's JSON) when given.
async fn decide(
    app: &TestApp,
    token: &str,
    call_id: &str,
    verdict: pb::Decision,
    edited: &str,
    assertion: Option<String>,
) -> Result<pb::DecideResponse, tonic::Status> {
    approver_as(&app.channel, token)
        .decide(step_up_decision(call_id, verdict, edited, assertion))
        .await
        .map(tonic::Response::into_inner)
}

/// Approves `call_id` (its input as submitted) as `token` with `assertion`.
async fn approve(
    app: &TestApp,
    token: &str,
    call_id: &str,
    assertion: String,
) -> Result<pb::DecideResponse, tonic::Status> {
    decide(
        app,
        token,
        call_id,
        pb::Decision::Approve,
        "",
        Some(assertion),
    )
    .await
}

/// Starts a step-up for `call_id` as `token` (for the input `edited`, or the call's own when
/// empty) and answers its request options with `sign`, as a browser would: the assertion.
async fn signed_with(
    app: &TestApp,
    token: &str,
    call_id: &str,
    edited: &str,
    sign: impl FnOnce(&str) -> String,
) -> String {
    let offer = begin_step_up(app, token, call_id, edited)
        .await
        .expect("begin step-up");
    sign(&offer.options_json)
}

/// Starts a step-up for `call_id` as `token` and signs it with `authenticator`.
async fn signed(
    app: &TestApp,
    token: &str,
    call_id: &str,
    authenticator: &Authenticator,
) -> String {
    signed_with(app, token, call_id, "", |options| {
        authenticator.get(options)
    })
    .await
}

async fn the_call(app: &TestApp, call_id: &str) -> pb::Call {
    admin_as(&app.channel, ROOT)
        .get_call(pb::GetCallRequest {
            agent: "bot".into(),
            session_id: "s".into(),
            call_id: call_id.into(),
        })
        .await
        .expect("get call")
        .into_inner()
}

fn refused(result: Result<pb::DecideResponse, tonic::Status>, code: Code, says: &str) {
    let status = result.expect_err(says);
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(says), "{says}: {status:?}");
}

async fn receipt_statement(app: &TestApp, call_id: &str) -> (String, Value) {
    let receipt = approver_as(&app.channel, ROOT)
        .get_receipt(pb::GetReceiptRequest {
            agent: "bot".into(),
            session_id: "s".into(),
            call_id: call_id.into(),
        })
        .await
        .expect("receipt")
        .into_inner()
        .receipt
        .expect("a receipt");
    let envelope: Value = serde_json::from_str(&receipt.envelope).unwrap();
    let payload = BASE64
        .decode(envelope["payload"].as_str().unwrap())
        .unwrap();
    (receipt.envelope, serde_json::from_slice(&payload).unwrap())
}

/// The statement, re-signed with the broker's own key after a change: only the checks behind
/// the signature can refuse it.
fn resealed(statement: &Value) -> String {
    let canonical = approval_broker::domain::json::canonical(statement);
    Notary::from_seed(&SEED).unwrap().seal(&canonical)
}

/// `approval-broker verify --key <the receipt key>` of one envelope: whether it passed, and
/// what it said.
fn verify_command(envelope: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("receipt.json");
    std::fs::write(&file, envelope).unwrap();
    verify_with(&[file.to_str().unwrap()])
}

/// `approval-broker verify --key <the receipt key> <args>`: whether it passed, and what it said.
fn verify_with(args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.pub");
    std::fs::write(&key, receipt_key().to_pem()).unwrap();
    let out = broker_binary()
        .arg("verify")
        .arg("--key")
        .arg(&key)
        .args(args)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

async fn a_registered_passkey_approves_a_step_up_call_and_its_receipt_proves_it(app: TestApp) {
    let alice = Authenticator::new(1);
    let registered = register(&app, ALICE, &alice).await;
    assert_eq!(registered.approver, "alice");
    assert_eq!(registered.credential_id, alice.credential_id());
    assert_eq!(registered.algorithm, -7);
    let mine = approver_as(&app.channel, ALICE)
        .list_my_passkeys(pb::ListMyPasskeysRequest {})
        .await
        .unwrap()
        .into_inner()
        .passkeys;
    assert_eq!(mine.len(), 1);
    let listed = admin_as(&app.channel, ROOT)
        .list_passkeys(pb::ListPasskeysRequest {
            approver: "Alice".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .passkeys;
    assert_eq!(listed, mine);

    submit(&app, &["c1"]).await;
    let pending = the_call(&app, "c1").await;
    let approvers = pending.approval.unwrap().approvers.unwrap();
    assert_eq!(approvers.step_up, pb::StepUp::Passkey as i32);
    refused(
        decide(&app, ALICE, "c1", pb::Decision::Approve, "", None).await,
        Code::PermissionDenied,
        "needs a passkey-signed approval",
    );

    let offer = begin_step_up(&app, ALICE, "c1", "").await.unwrap();
    // What is signed is what the approver is shown: the statement, its digest, and a challenge
    // made of the digest and the nonce.
    let statement: Value = serde_json::from_str(&offer.statement_json).unwrap();
    assert_eq!(statement["call"]["callId"], "c1");
    assert_eq!(statement["tool"], "deploy");
    assert_eq!(statement["input"], json!({"env": "prod"}));
    assert_eq!(statement["requirement"]["step_up"], "passkey");
    let digest = sha256(&[offer.statement_json.as_bytes()]);
    assert_eq!(hex(&digest), offer.statement_digest);
    let nonce = B64URL.decode(&offer.nonce).unwrap();
    let options: Value = serde_json::from_str(&offer.options_json).unwrap();
    assert_eq!(
        options["challenge"],
        B64URL.encode(sha256(&[&digest, &nonce]))
    );
    assert_eq!(options["allowCredentials"][0]["id"], alice.credential_id());

    let approved = approve(&app, ALICE, "c1", alice.get(&offer.options_json))
        .await
        .expect("a signed approval counts");
    let outcome = approved.outcome.unwrap();
    assert_eq!(outcome.status, pb::CallStatus::Approved as i32);
    assert_eq!(outcome.decided_by, "approver:alice");

    let (envelope, statement) = receipt_statement(&app, "c1").await;
    let step_up = &statement["predicate"]["stepUp"];
    assert_eq!(step_up["approvals"][0]["approver"], "alice");
    assert_eq!(
        step_up["approvals"][0]["credentialId"],
        alice.credential_id()
    );
    assert_eq!(step_up["approvals"][0]["publicKey"], registered.public_key);
    assert_eq!(
        step_up["approvals"][0]["statementDigest"],
        offer.statement_digest
    );
    assert_eq!(step_up["approvals"][0]["nonce"], offer.nonce);
    let verified = verify::receipt(&envelope, &receipt_key()).expect("the receipt verifies");
    assert_eq!(verified.passkey_approvals, 1);
    let (passed, said) = verify_command(&envelope);
    assert!(
        passed && said.contains("1 passkey-signed approval"),
        "{said}"
    );

    // Re-signed by the broker's own key, the assertion now under another input: refused.
    let mut other_input = statement.clone();
    other_input["predicate"]["input"] = json!({"env": "staging"});
    let input = approval_broker::domain::json::canonical(&other_input["predicate"]["input"]);
    let digest = hex(&sha256(&[input.as_bytes()]));
    other_input["subject"][0]["digest"]["sha256"] = digest.clone().into();
    other_input["predicate"]["runs"]["digest"]["sha256"] = digest.into();
    let (passed, said) = verify_command(&resealed(&other_input));
    assert!(!passed && said.contains("another statement"), "{said}");
    // ... or under another person's name.
    let mut other_person = statement.clone();
    other_person["predicate"]["decidedBy"] = "approver:bob".into();
    other_person["predicate"]["stepUp"]["approvals"][0]["approver"] = "bob".into();
    let err = verify::receipt(&resealed(&other_person), &receipt_key()).unwrap_err();
    assert!(err.contains("another"), "{err}");
}

async fn a_vote_without_a_valid_assertion_never_counts_and_a_denial_needs_none(app: TestApp) {
    let (alice, bob) = (Authenticator::new(1), Authenticator::new(2));
    register(&app, ALICE, &alice).await;
    register(&app, BOB, &bob).await;
    submit(&app, &["c1", "c2", "c3"]).await;

    // Bob's challenge, signed by Bob, sent by Alice.
    let bobs = signed(&app, BOB, "c1", &bob).await;
    refused(
        approve(&app, ALICE, "c1", bobs).await,
        Code::PermissionDenied,
        "issued to `bob`",
    );
    // Alice's challenge, signed with Bob's passkey.
    let with_bobs_passkey = signed(&app, ALICE, "c1", &bob).await;
    refused(
        approve(&app, ALICE, "c1", with_bobs_passkey).await,
        Code::PermissionDenied,
        "is not a passkey `alice` registered",
    );
    // From another origin, or for another relying party.
    let elsewhere = signed_with(&app, ALICE, "c1", "", |options| {
        alice.get_as(options, "https://evil.example", None)
    })
    .await;
    refused(
        approve(&app, ALICE, "c1", elsewhere).await,
        Code::PermissionDenied,
        "origin `https://evil.example`",
    );
    let other_rp = signed_with(&app, ALICE, "c1", "", |options| {
        alice.get_as(options, ORIGIN, Some("evil.example"))
    })
    .await;
    refused(
        approve(&app, ALICE, "c1", other_rp).await,
        Code::PermissionDenied,
        "another relying party",
    );
    // Made for another call.
    let for_c2 = signed(&app, ALICE, "c2", &alice).await;
    refused(
        approve(&app, ALICE, "c1", for_c2).await,
        Code::PermissionDenied,
        "made for another call `c2`",
    );
    // Made for another (edited) input, or for an edit and sent without it.
    let for_staging = signed_with(&app, ALICE, "c1", r#"{"env":"staging"}"#, |options| {
        alice.get(options)
    })
    .await;
    refused(
        decide(
            &app,
            ALICE,
            "c1",
            pb::Decision::Approve,
            r#"{"env":"dev"}"#,
            Some(for_staging.clone()),
        )
        .await,
        Code::PermissionDenied,
        "another statement",
    );
    refused(
        approve(&app, ALICE, "c1", for_staging).await,
        Code::PermissionDenied,
        "another statement",
    );
    // A passkey revoked after its challenge was issued (and signed).
    let before_revoking = signed(&app, ALICE, "c1", &alice).await;
    let revoked = admin_as(&app.channel, ROOT)
        .revoke_passkey(pb::RevokePasskeyRequest {
            credential_id: alice.credential_id(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(revoked.revoked_by, "root");
    refused(
        approve(&app, ALICE, "c1", before_revoking).await,
        Code::PermissionDenied,
        "was revoked by `root`",
    );
    let none_left = begin_step_up(&app, ALICE, "c1", "").await.unwrap_err();
    assert_eq!(none_left.code(), Code::FailedPrecondition, "{none_left:?}");

    // Nothing of the above counted.
    let c1 = the_call(&app, "c1").await;
    assert!(c1.outcome.is_none(), "{c1:?}");
    assert!(c1.approval.unwrap().votes.is_empty());

    // A denial needs no passkey (and takes none).
    refused(
        decide(&app, ALICE, "c3", pb::Decision::Deny, "", Some("{}".into())).await,
        Code::InvalidArgument,
        "passkey",
    );
    let denied = decide(&app, ALICE, "c3", pb::Decision::Deny, "", None)
        .await
        .expect("a denial needs no passkey");
    assert_eq!(
        denied.outcome.unwrap().status,
        pb::CallStatus::Denied as i32
    );
    // An edit approved as signed runs the edit.
    let staging = r#"{"env":"staging"}"#;
    let signed_edit = signed_with(&app, BOB, "c2", staging, |options| bob.get(options)).await;
    let edited = decide(
        &app,
        BOB,
        "c2",
        pb::Decision::Approve,
        staging,
        Some(signed_edit),
    )
    .await
    .expect("the signed edit counts");
    let outcome = edited.outcome.unwrap();
    assert_eq!(outcome.status, pb::CallStatus::Approved as i32);
    let (envelope, statement) = receipt_statement(&app, "c2").await;
    assert_eq!(
        statement["predicate"]["runs"]["input"],
        json!({"env": "staging"})
    );
    verify::receipt(&envelope, &receipt_key()).expect("the edit's receipt verifies");
    // The whole chain, and every stored call against its receipt (the votes with their
    // assertions included).
    let (passed, said) = verify_with(&["--database", &app.database_url]);
    assert!(
        passed
            && said.contains("its 1 passkey-signed approval")
            && said.contains("2 decided compared"),
        "{said}"
    );
}

async fn a_quorum_needs_two_signed_people_and_a_nonce_signs_one_vote(app: TestApp) {
    let (alice, bob) = (Authenticator::new(1), Authenticator::new(2));
    register(&app, ALICE, &alice).await;
    register(&app, BOB, &bob).await;
    submit(&app, &["c1", "c2"]).await;
    let alices = signed(&app, ALICE, "c1", &alice).await;
    let first = approve(&app, ALICE, "c1", alices.clone())
        .await
        .expect("alice's signed vote");
    let pending = first.pending.expect("one of two");
    let votes = pending.approval.unwrap().votes;
    assert_eq!(votes[0].passkey_credential_id, alice.credential_id());
    // The same assertion again: its nonce signed one vote.
    refused(
        approve(&app, ALICE, "c1", alices).await,
        Code::FailedPrecondition,
        "used already",
    );
    // A sign count that did not increase (a cloned credential, or an assertion replayed):
    // refused.
    alice.set_count(0);
    let replayed_count = signed(&app, ALICE, "c2", &alice).await;
    refused(
        approve(&app, ALICE, "c2", replayed_count).await,
        Code::PermissionDenied,
        "sign count (1) did not increase past 1",
    );
    let bobs = signed(&app, BOB, "c1", &bob).await;
    let decided = approve(&app, BOB, "c1", bobs)
        .await
        .expect("bob's signed vote completes it");
    assert_eq!(decided.outcome.unwrap().decided_by, "approver:alice,bob");
    let (envelope, statement) = receipt_statement(&app, "c1").await;
    let approvals = statement["predicate"]["stepUp"]["approvals"]
        .as_array()
        .unwrap();
    let who: Vec<&str> = approvals
        .iter()
        .map(|a| a["approver"].as_str().unwrap())
        .collect();
    assert_eq!(who, ["alice", "bob"]);
    assert_eq!(
        verify::receipt(&envelope, &receipt_key())
            .unwrap()
            .passkey_approvals,
        2
    );
    // Bob's assertion swapped for one of another call: refused behind a good signature.
    let mut swapped = statement.clone();
    let c2 = signed(&app, BOB, "c2", &bob).await;
    let c2: Value = serde_json::from_str(&c2).unwrap();
    swapped["predicate"]["stepUp"]["approvals"][1]["clientDataJSON"] =
        c2["response"]["clientDataJSON"].clone();
    swapped["predicate"]["stepUp"]["approvals"][1]["signature"] =
        c2["response"]["signature"].clone();
    swapped["predicate"]["stepUp"]["approvals"][1]["authenticatorData"] =
        c2["response"]["authenticatorData"].clone();
    let err = verify::receipt(&resealed(&swapped), &receipt_key()).unwrap_err();
    assert!(err.contains("stepUp.approvals[1]"), "{err}");
}

async fn nobody_approves_their_own_call_and_no_grant_stands_in_for_a_passkey(app: TestApp) {
    let (bot, alice) = (Authenticator::new(9), Authenticator::new(1));
    register(&app, BOT_AS_APPROVER, &bot).await;
    register(&app, ALICE, &alice).await;
    submit(&app, &["c1"]).await;
    let own = begin_step_up(&app, BOT_AS_APPROVER, "c1", "")
        .await
        .unwrap_err();
    assert_eq!(own.code(), Code::PermissionDenied, "{own:?}");
    assert!(own.message().contains("no self-approval"), "{own:?}");

    // Alice approves, signed, asking to remember it for the session: the grant is kept but
    // approves no later step-up call.
    let alices = signed(&app, ALICE, "c1", &alice).await;
    let mut request = step_up_decision("c1", pb::Decision::Approve, "", Some(alices));
    request.scope = pb::Scope::Session as i32;
    let remembered = approver_as(&app.channel, ALICE)
        .decide(request)
        .await
        .expect("a signed, remembered approval")
        .into_inner();
    assert!(
        remembered.grant_note.contains("a grant signs nothing"),
        "{remembered:?}"
    );
    submit(&app, &["c2"]).await;
    assert!(
        the_call(&app, "c2").await.outcome.is_none(),
        "the grant approved nothing"
    );
}

/// Two replicas on one Postgres schema: a challenge issued by one is answered on the other, a
/// registration begun on one finishes on the other, and an assertion counts once however many
/// replicas it is sent to, even at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn on_two_replicas_a_challenge_is_answered_anywhere_and_counts_once() {
    let a = spawn_app_on(Backend::postgres(), two_signed_approvals).await;
    let b = a.replica(two_signed_approvals).await;
    let (alice, bob) = (Authenticator::new(1), Authenticator::new(2));
    // A registration begun on A finishes on B.
    register_across(&a, &b, ALICE, &alice).await;
    register(&b, BOB, &bob).await;
    submit(&a, &["c1"]).await;

    let alices = signed(&a, ALICE, "c1", &alice).await;
    let first = approve(&b, ALICE, "c1", alices.clone())
        .await
        .expect("a challenge issued by A is answered on B");
    assert!(first.pending.is_some());
    refused(
        approve(&a, ALICE, "c1", alices).await,
        Code::FailedPrecondition,
        "used already",
    );

    let bobs = signed(&b, BOB, "c1", &bob).await;
    let (on_a, on_b) = tokio::join!(
        approve(&a, BOB, "c1", bobs.clone()),
        approve(&b, BOB, "c1", bobs),
    );
    let counted: Vec<_> = [on_a, on_b]
        .into_iter()
        .filter_map(Result::ok)
        .filter(|r| !r.replayed)
        .collect();
    assert_eq!(counted.len(), 1, "one of the two decides the call");
    let outcome = counted[0].outcome.as_ref().expect("decided");
    assert_eq!(outcome.decided_by, "approver:alice,bob");
    let (envelope, _) = receipt_statement(&a, "c1").await;
    assert_eq!(
        verify::receipt(&envelope, &receipt_key())
            .unwrap()
            .passkey_approvals,
        2
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

backend_tests!(
    a_registered_passkey_approves_a_step_up_call_and_its_receipt_proves_it => super::one_signed_approval,
    a_vote_without_a_valid_assertion_never_counts_and_a_denial_needs_none => super::one_signed_approval,
    a_quorum_needs_two_signed_people_and_a_nonce_signs_one_vote => super::two_signed_approvals,
    nobody_approves_their_own_call_and_no_grant_stands_in_for_a_passkey => super::one_signed_approval,
);
