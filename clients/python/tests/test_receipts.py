"""The client checks an APPROVED outcome's signed receipt before it hands the input back to run
(PRODUCT.md guarantee 10, docs/receipts.md "Executors check what they run"), against a real
broker: an approval verifies and runs; an untrusted key, a database row edited to APPROVED, a
forged or garbled receipt, a broker signing nothing or out of reach each fail closed with a
result text naming why. Then the pure verifier, against receipts a real broker signed."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import signal
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
import rfc8785
from conftest import BrokerProcess, Decision, approve_when_pending, decide
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from approval_broker import Broker, Outcome, ReceiptRejected, Status, SyncBroker, ToolCall, TrustedKey, verify_approval
from approval_broker.proto import agent_pb2_grpc, types_pb2
from approval_broker.receipts import PAYLOAD_TYPE, pae, trusted_keys

CALL = ToolCall("toolu_01", "run_shell", {"command": "ls -la", "cwd": "/srv"}, title="List files")
OTHER = ToolCall("toolu_02", "read_file", {"path": "notes.txt"})
UNVERIFIED_PREFIX = "The broker's outcome for this call could not be verified ("
NOT_RUN_SUFFIX = "): the tool was not run."


def new_session() -> str:
    return f"rcpt-{uuid.uuid4().hex[:12]}"


def signing_key(process: BrokerProcess) -> Ed25519PrivateKey:
    """The key the broker generated beside its database on first start."""
    pem = (process.directory / "approvals.db.receipt-key.pem").read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def public_base64(key: Ed25519PublicKey) -> str:
    return base64.b64encode(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


async def reviewed(
    process: BrokerProcess, session: str, decisions: list[Decision], calls: list[ToolCall], **options: Any
) -> list[Outcome]:
    """`review` of the calls, decided as `decisions` say, on a client made with `options`."""
    approver = asyncio.create_task(approve_when_pending(process.target, session, decisions))
    async with Broker(process.target, **options) as broker:
        outcomes = await broker.review(session, calls, timeout=30)
    await approver
    return outcomes


def assert_not_run(outcome: Outcome, why: str) -> None:
    assert outcome.status is Status.UNVERIFIED and not outcome.approved
    assert outcome.input_json == "" and outcome.input == {}
    assert outcome.tool_result.startswith(UNVERIFIED_PREFIX) and outcome.tool_result.endswith(NOT_RUN_SUFFIX)
    assert why in outcome.reason and why in outcome.tool_result, outcome.tool_result


def edit_database(process: BrokerProcess, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """Runs SQL on the broker's SQLite file while the broker is stopped (as someone who can
    write the file, and not the key, would), then starts it again."""
    process.stop(signal.SIGTERM)
    db = sqlite3.connect(process.directory / "approvals.db")
    try:
        for sql, args in statements:
            assert db.execute(sql, args).rowcount == 1, sql
        db.commit()
    finally:
        db.close()
    process.start()


# --- the client, against a real broker -------------------------------------------------------


async def test_the_receipt_an_outcome_carries_is_the_one_checked(broker_process: BrokerProcess) -> None:
    """Every outcome the broker sends carries its signed receipt, and that is what the client
    verifies (no second request): an outcome carrying another call's receipt is not run."""
    session = new_session()
    approved, other = await reviewed(
        broker_process,
        session,
        [Decision("toolu_01", approve=True), Decision("toolu_02", approve=True)],
        [CALL, OTHER],
    )
    assert approved.approved and approved.receipt and other.receipt
    statement = json.loads(base64.b64decode(json.loads(approved.receipt)["payload"]))
    assert statement["predicate"]["call"]["callId"] == "toolu_01"
    assert statement["predicate"]["chain"]["sequence"] == approved.receipt_sequence
    async with Broker(broker_process.target) as broker:
        (swapped,) = await broker._checked([dataclass_replace(approved, receipt=other.receipt)], None)
    assert_not_run(swapped, "not this call")


async def test_an_approved_call_verifies_with_the_brokers_keys_and_runs(broker_process: BrokerProcess) -> None:
    session = new_session()
    outcomes = await reviewed(
        broker_process,
        session,
        [Decision("toolu_01", approve=True), Decision("toolu_02", approve=True, edited_input_json='{"path":"README.md"}')],
        [CALL, OTHER],
    )
    approved, edited = outcomes
    assert approved.status is Status.APPROVED and approved.approved
    assert approved.input == {"command": "ls -la", "cwd": "/srv"}
    # What runs is the canonical text of the input the receipt approved.
    assert approved.input_json == '{"command":"ls -la","cwd":"/srv"}'
    assert approved.receipt_sequence is not None and approved.receipt_sequence >= 1
    assert edited.status is Status.APPROVED and edited.input_edited and edited.input == {"path": "README.md"}
    assert edited.receipt_sequence is not None and edited.receipt_sequence != approved.receipt_sequence
    # A lookup and a later wait check the same receipts.
    async with Broker(broker_process.target) as broker:
        assert await broker.outcomes(session, ["toolu_01", "toolu_02"]) == outcomes
        assert await broker.wait(session, ["toolu_02"], timeout=5) == [edited]
        assert list(await broker.receipt_keys()) == [hashlib.sha256(
            signing_key(broker_process).public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw)).hexdigest()]


@pytest.mark.parametrize("form", ["base64", "pem", "pem-bytes"])
async def test_a_configured_key_verifies_in_each_form(broker_process: BrokerProcess, form: str) -> None:
    public = signing_key(broker_process).public_key()
    key: str | bytes = {
        "base64": public_base64(public), "pem": public_pem(public), "pem-bytes": public_pem(public).encode(),
    }[form]
    session = new_session()
    [outcome] = await reviewed(
        broker_process, session, [Decision("toolu_01", approve=True)], [CALL], trusted_receipt_keys=[key]
    )
    assert outcome.status is Status.APPROVED and outcome.input == dict(CALL.input)


async def test_with_an_untrusted_key_configured_an_approval_fails_closed(broker_process: BrokerProcess) -> None:
    stranger = Ed25519PrivateKey.generate().public_key()
    session = new_session()
    [outcome] = await reviewed(
        broker_process, session, [Decision("toolu_01", approve=True)], [CALL], trusted_receipt_keys=[public_base64(stranger)]
    )
    assert_not_run(outcome, "which is not a key this client trusts")
    # Denials need no receipt check and pass through as they are.
    session = new_session()
    [denied] = await reviewed(
        broker_process, session, [Decision("toolu_01", approve=False, reason="no")], [CALL],
        trusted_receipt_keys=[public_base64(stranger)],
    )
    assert denied.status is Status.DENIED


def test_the_sync_client_checks_too(broker_process: BrokerProcess) -> None:
    session = new_session()
    stranger = public_pem(Ed25519PrivateKey.generate().public_key())
    with SyncBroker(broker_process.target, trusted_receipt_keys=[stranger]) as broker:
        broker.submit(session, [CALL])
        asyncio.run(decide(broker_process.target, session, [Decision("toolu_01", approve=True)]))
        [outcome] = broker.wait(session, ["toolu_01"], timeout=10)
    assert_not_run(outcome, "not a key this client trusts")


async def test_a_denied_row_edited_to_approved_is_not_run(broker_process: BrokerProcess) -> None:
    """The edited-row attack: someone who can write the database (not the key) turns a DENIED
    call into an APPROVED one. The broker serves it as APPROVED; its receipt still says DENIED."""
    session = new_session()
    [denied] = await reviewed(
        broker_process, session, [Decision("toolu_01", approve=False, reason="not on prod")], [CALL]
    )
    assert denied.status is Status.DENIED
    edit_database(
        broker_process,
        ("UPDATE calls SET status = 2, decided_by = 'approver:mallory', reason = '', tool_result = '', "
         "run_input = input WHERE session_id = ? AND call_id = ?", (session, "toolu_01")),
    )
    # The edit took: a client that does not check is handed the call to run.
    async with Broker(broker_process.target, verify_receipts=False) as trusting:
        [served] = await trusting.outcomes(session, ["toolu_01"])
    assert served is not None and served.status is Status.APPROVED and served.input == dict(CALL.input)
    # The checking client refuses it, naming why, on every path that returns outcomes.
    async with Broker(broker_process.target) as broker:
        [looked_up] = await broker.outcomes(session, ["toolu_01"])
        [again] = await broker.review(session, [CALL], timeout=10)
        [waited] = await broker.wait(session, ["toolu_01"], timeout=10)
    for outcome in (looked_up, again, waited):
        assert outcome is not None
        assert_not_run(outcome, "its signed receipt says DENIED")
    assert again.tool_result == (
        "The broker's outcome for this call could not be verified (its signed receipt says DENIED): the tool was not run."
    )


def forge_resigned(statement: dict[str, Any], row: dict[str, str]) -> dict[str, str]:
    """A statement rewritten to APPROVED and signed with the forger's own key."""
    forger = Ed25519PrivateKey.generate()
    payload = rfc8785.dumps(statement)
    raw = forger.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"payload": payload.decode(), "keyid": hashlib.sha256(raw).hexdigest(),
            "sig": base64.b64encode(forger.sign(pae(PAYLOAD_TYPE, payload))).decode()}


def forge_edited(statement: dict[str, Any], row: dict[str, str]) -> dict[str, str]:
    """A statement rewritten to APPROVED, keeping the broker's key id and signature."""
    return {**row, "payload": rfc8785.dumps(statement).decode()}


def forge_garbled(statement: dict[str, Any], row: dict[str, str]) -> dict[str, str]:
    """The statement rewritten, and a signature that is not base64."""
    return {**row, "payload": rfc8785.dumps(statement).decode(), "sig": "not%base64!"}


@pytest.mark.parametrize(
    ("forge", "why"),
    [
        (forge_resigned, "which is not a key this client trusts"),
        (forge_edited, "signature does not verify with key"),
        (forge_garbled, "signature does not verify with key"),
    ],
    ids=["signed-by-another-key", "payload-edited", "garbled-signature"],
)
async def test_a_forged_receipt_fails_closed(
    broker_process: BrokerProcess, forge: Callable[[dict[str, Any], dict[str, str]], dict[str, str]], why: str
) -> None:
    """The row and its receipt both rewritten to APPROVED: only the signature can tell."""
    session = new_session()
    await reviewed(broker_process, session, [Decision("toolu_01", approve=False)], [CALL])
    db = sqlite3.connect(broker_process.directory / "approvals.db")
    try:
        payload, keyid, sig = db.execute(
            "SELECT payload, keyid, sig FROM receipts WHERE session_id = ? AND call_id = ?", (session, "toolu_01")
        ).fetchone()
    finally:
        db.close()
    statement = json.loads(payload)
    predicate = statement["predicate"]
    assert predicate["outcome"] == "DENIED"
    predicate.update(outcome="APPROVED", reason="", decidedBy="approver:mallory",
                     runs={"digest": statement["subject"][0]["digest"], "edited": False})
    forged = forge(statement, {"payload": payload, "keyid": keyid, "sig": sig})
    edit_database(
        broker_process,
        ("UPDATE calls SET status = 2, decided_by = 'approver:mallory', reason = '', tool_result = '', "
         "run_input = input WHERE session_id = ? AND call_id = ?", (session, "toolu_01")),
        ("UPDATE receipts SET payload = ?, keyid = ?, sig = ? WHERE session_id = ? AND call_id = ?",
         (forged["payload"], forged["keyid"], forged["sig"], session, "toolu_01")),
    )
    async with Broker(broker_process.target) as broker:
        [outcome] = await broker.outcomes(session, ["toolu_01"])
    assert outcome is not None
    assert_not_run(outcome, why)


async def test_a_broker_signing_nothing_fails_closed_unless_the_check_is_turned_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    process = BrokerProcess(tmp_path, ["--receipts", "off"])
    process.start()
    try:
        [outcome] = await reviewed(process, new_session(), [Decision("toolu_01", approve=True)], [CALL])
        assert_not_run(outcome, "the broker signs no receipts")
        # With a key configured, the broker's missing receipt is named instead.
        key = public_base64(Ed25519PrivateKey.generate().public_key())
        [outcome] = await reviewed(
            process, new_session(), [Decision("toolu_01", approve=True)], [CALL], trusted_receipt_keys=[key]
        )
        assert_not_run(outcome, "the broker has no receipt for it")
        # The documented opt-out, for such a broker only: it runs, and says so in the log.
        with caplog.at_level(logging.WARNING, logger="approval_broker"):
            [outcome] = await reviewed(
                process, new_session(), [Decision("toolu_01", approve=True)], [CALL], verify_receipts=False
            )
        assert outcome.status is Status.APPROVED and outcome.receipt_sequence is None
        assert "receipt verification is off" in caplog.text
        with pytest.raises(ValueError):
            Broker(process.target, verify_receipts=False, trusted_receipt_keys=[key])
    finally:
        process.stop(signal.SIGTERM)


async def test_a_broker_out_of_reach_for_the_receipt_fails_closed(broker_process: BrokerProcess) -> None:
    session = new_session()
    [approved] = await reviewed(broker_process, session, [Decision("toolu_01", approve=True)], [CALL])
    assert approved.status is Status.APPROVED
    async with Broker(broker_process.target, rpc_timeout=2) as broker:
        broker_process.stop(signal.SIGKILL)
        # The outcome as it arrived, the broker gone before its receipt (and its keys) are read.
        [checked] = await broker._checked([approved], None)
    assert_not_run(checked, "could not be read (")
    broker_process.start()


# --- the verifier alone, on receipts a real broker signed ------------------------------------


async def real_receipt(process: BrokerProcess, approve: bool = True) -> tuple[str, dict[str, TrustedKey], str]:
    """A receipt the broker signed (via AgentService.GetReceipt), the broker's keys (via
    ListReceiptKeys) and the session."""
    session = new_session()
    await reviewed(process, session, [Decision("toolu_01", approve=approve)], [CALL], verify_receipts=False)
    async with grpc.aio.insecure_channel(process.target) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = await stub.GetReceipt(types_pb2.GetReceiptRequest(session_id=session, call_id="toolu_01"), timeout=5)
        keys = await stub.ListReceiptKeys(types_pb2.ListReceiptKeysRequest(), timeout=5)
    assert reply.receipt.envelope and reply.receipt.verified
    assert [k.key.key_id for k in keys.keys] == [reply.key.key_id]
    return reply.receipt.envelope, trusted_keys([k.key.public_key for k in keys.keys]), session


def resign(envelope: str, key: Ed25519PrivateKey, change: Callable[[dict[str, Any]], None], canonical: bool = True) -> str:
    """The envelope with its statement changed and signed again with `key` (the broker's own,
    read from its key file: what the statement says must be checked, not only the signature)."""
    data = json.loads(envelope)
    statement = json.loads(base64.b64decode(data["payload"]))
    change(statement)
    payload = rfc8785.dumps(statement) if canonical else json.dumps(statement, indent=1).encode()
    data["payload"] = base64.b64encode(payload).decode()
    data["signatures"][0]["sig"] = base64.b64encode(key.sign(pae(PAYLOAD_TYPE, payload))).decode()
    return json.dumps(data)


async def test_the_verifier_accepts_a_real_receipt_for_exactly_its_call_and_input(broker_process: BrokerProcess) -> None:
    envelope, keys, session = await real_receipt(broker_process)
    check = dict(session_id=session, call_id="toolu_01", tool="run_shell")
    canonical_input = '{"command":"ls -la","cwd":"/srv"}'
    assert verify_approval(envelope, keys, input_json=canonical_input, **check) == canonical_input
    # The same input in another spelling is the same canonical input.
    assert verify_approval(envelope, keys, input_json='{ "cwd": "/srv", "command": "ls -la" }', **check) == canonical_input
    # Base64, PEM and the key object name the same key.
    public = signing_key(broker_process).public_key()
    for source in (public_base64(public), public_pem(public), public):
        assert verify_approval(envelope, trusted_keys([source]), input_json=canonical_input, **check)

    def rejected(why: str, envelope: str = envelope, keys: dict[str, TrustedKey] = keys, **changes: Any) -> None:
        args: dict[str, Any] = {**check, "input_json": canonical_input, **changes}
        with pytest.raises(ReceiptRejected) as e:
            verify_approval(envelope, keys, **args)
        assert why in e.value.reason, e.value.reason

    rejected("is not the input its signed receipt approved", input_json='{"command":"rm -rf /","cwd":"/srv"}')
    rejected("is not the input its signed receipt approved", input_json='{"command":"ls -la"}')
    rejected("not this call", call_id="toolu_02")
    rejected("not this call", session_id=session + "x")
    rejected("not 'write_file'", tool="write_file")
    rejected("another batch", batch_id="some-other-batch")
    rejected("the input to run is not JSON", input_json="{")
    rejected("trusts no receipt key", keys={})
    stranger = trusted_keys([Ed25519PrivateKey.generate().public_key()])
    rejected("not a key this client trusts", keys=stranger)
    # A key retired before the decision, or not yet signing, does not vouch for it.
    [key] = keys.values()
    from datetime import datetime, timedelta, timezone

    now = datetime.now(timezone.utc)
    retired = {key.key_id: TrustedKey(key.public_key, key.key_id, valid_until=now - timedelta(hours=1))}
    rejected("after its key", keys=retired)
    future = {key.key_id: TrustedKey(key.public_key, key.key_id, valid_from=now + timedelta(hours=1))}
    rejected("before its key", keys=future)


async def test_the_verifier_rejects_forged_and_garbled_envelopes(broker_process: BrokerProcess) -> None:
    envelope, keys, session = await real_receipt(broker_process)
    check: dict[str, Any] = dict(session_id=session, call_id="toolu_01", input_json='{"command":"ls -la","cwd":"/srv"}')
    data = json.loads(envelope)
    statement = json.loads(base64.b64decode(data["payload"]))

    def with_payload(s: dict[str, Any]) -> str:
        return json.dumps({**data, "payload": base64.b64encode(rfc8785.dumps(s)).decode()})

    changed = json.loads(json.dumps(statement))
    changed["predicate"]["input"]["command"] = "rm -rf /"
    sig = data["signatures"][0]
    cases = {
        "not JSON": (envelope[:-5], "not a DSSE envelope"),
        "a JSON list": ("[]", "not a DSSE envelope"),
        "another payload type": (json.dumps({**data, "payloadType": "text/plain"}), "payloadType"),
        "payload not base64": (json.dumps({**data, "payload": "%%%"}), "payload is not base64"),
        "no signatures": (json.dumps({**data, "signatures": []}), "carries no signature"),
        "signature not base64": (json.dumps({**data, "signatures": [{**sig, "sig": "@@"}]}), "does not verify"),
        "signature of other bytes": (
            json.dumps({**data, "signatures": [{**sig, "sig": base64.b64encode(bytes(64)).decode()}]}), "does not verify"),
        "no key id": (json.dumps({**data, "signatures": [{"sig": sig["sig"]}]}), "not a key this client trusts"),
        "statement changed": (with_payload(changed), "does not verify"),
        "payload truncated": (
            json.dumps({**data, "payload": base64.b64encode(base64.b64decode(data["payload"])[:-1]).decode()}),
            "does not verify"),
    }
    for name, (forged, why) in cases.items():
        with pytest.raises(ReceiptRejected) as e:
            verify_approval(forged, keys, **check)
        assert why in e.value.reason, (name, e.value.reason)

    # Signed with the broker's own key, yet not proving this approval: each is named.
    key = signing_key(broker_process)

    def set_outcome(s: dict[str, Any]) -> None:
        s["predicate"].update(outcome="DENIED", runs=None)

    def edit_run(s: dict[str, Any]) -> None:
        s["predicate"]["runs"]["input"] = {"command": "rm -rf /", "cwd": "/srv"}

    def bad_subject(s: dict[str, Any]) -> None:
        s["subject"][0]["digest"]["sha256"] = "0" * 64

    def not_a_statement(s: dict[str, Any]) -> None:
        s["_type"] = "https://example.com/other"

    for change, why, canonical in [
        (set_outcome, "its signed receipt says DENIED", True),
        (edit_run, "digest of the input that runs does not match", True),
        (bad_subject, "subject is not the digest of its input", True),
        (not_a_statement, "not an approval-broker receipt statement", True),
        (lambda s: None, "not canonical JSON", False),
    ]:
        with pytest.raises(ReceiptRejected) as e:
            verify_approval(resign(envelope, key, change, canonical), keys, **check)
        assert why in e.value.reason, e.value.reason
    # An edited approval signed so verifies with the input it names, and only with that.
    def edit_properly(s: dict[str, Any]) -> None:
        run = {"command": "ls", "cwd": "/srv"}
        s["predicate"]["runs"] = {"digest": {"sha256": hashlib.sha256(rfc8785.dumps(run)).hexdigest()},
                                  "edited": True, "input": run}

    edited = resign(envelope, key, edit_properly)
    assert verify_approval(edited, keys, **{**check, "input_json": '{"cwd":"/srv","command":"ls"}'}) == \
        '{"command":"ls","cwd":"/srv"}'
    with pytest.raises(ReceiptRejected, match="is not the input its signed receipt approved"):
        verify_approval(edited, keys, **check)


async def test_a_real_denied_receipt_never_verifies_as_an_approval(broker_process: BrokerProcess) -> None:
    envelope, keys, session = await real_receipt(broker_process, approve=False)
    with pytest.raises(ReceiptRejected, match="its signed receipt says DENIED"):
        verify_approval(envelope, keys, session_id=session, call_id="toolu_01", input_json=json.dumps(CALL.input))


def test_trusted_keys_refuse_what_is_not_an_ed25519_public_key() -> None:
    with pytest.raises(ValueError):
        TrustedKey.of("bm90IGEga2V5")  # base64, not 32 bytes
    with pytest.raises(ValueError):
        TrustedKey.of("not base64 at all!")
    with pytest.raises(ValueError):
        Broker("127.0.0.1:1", trusted_receipt_keys=[])
