"""Checks a broker's signed receipt before an APPROVED call runs.

The broker signs every outcome as a DSSE envelope over an in-toto Statement (docs/receipts.md):
Ed25519 over DSSE's pre-authentication encoding, `keyid` the SHA-256 (hex) of the raw 32-byte
public key, the payload the statement's RFC 8785 canonical JSON. The client runs a tool only
when such a receipt, signed by a key it trusts, says APPROVED for exactly this session and call
id and exactly the input the client hands back to run (`verify_approval`). The trusted keys come
from the client's configuration or from `ListReceiptKeys`, read once: never from the outcome or
the receipt's own reply.

Everything here is pure: no broker, no network. `ReceiptRejected` names what did not hold.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Union

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://approval-broker.dev/receipt/v1"

# A key as configuration gives it: base64 of the raw 32 bytes (as the broker logs and serves
# it), a `PUBLIC KEY` PEM (text or bytes), the raw 32 bytes, or a `cryptography` key.
KeySource = Union[str, bytes, Ed25519PublicKey]

# What the model reads when an APPROVED outcome fails its check; the reason goes in the brackets.
UNVERIFIED_TEXT = "The broker's outcome for this call could not be verified ({reason}): the tool was not run."


class ReceiptRejected(Exception):
    """The receipt does not prove the approval; `reason` says why (a clause for the model)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class TrustedKey:
    """A public key receipts may be signed with, and (when the broker said so) the window of
    decision times it signed: from `valid_from` (included) until `valid_until` (excluded)."""

    public_key: Ed25519PublicKey
    key_id: str
    valid_from: datetime | None = None
    valid_until: datetime | None = None

    @classmethod
    def of(
        cls, source: KeySource, *, valid_from: datetime | None = None, valid_until: datetime | None = None
    ) -> TrustedKey:
        key = parse_public_key(source)
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return cls(key, hashlib.sha256(raw).hexdigest(), valid_from, valid_until)


def parse_public_key(source: KeySource) -> Ed25519PublicKey:
    """An Ed25519 public key from base64 (raw 32 bytes), PEM, raw bytes, or a key object."""
    if isinstance(source, Ed25519PublicKey):
        return source
    data = source.encode() if isinstance(source, str) else bytes(source)
    if b"-----BEGIN" in data:
        key = serialization.load_pem_public_key(data)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the PEM key is not an Ed25519 public key")
        return key
    if isinstance(source, bytes) and len(data) == 32:
        return Ed25519PublicKey.from_public_bytes(data)
    try:
        raw = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a trusted receipt key must be base64 of the raw 32-byte Ed25519 public key, or a PEM") from None
    if len(raw) != 32:
        raise ValueError(f"a trusted receipt key must be 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def trusted_keys(sources: Iterable[KeySource | TrustedKey]) -> dict[str, TrustedKey]:
    """The keys by key id."""
    keys = [s if isinstance(s, TrustedKey) else TrustedKey.of(s) for s in sources]
    return {k.key_id: k for k in keys}


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def canonical(value: Any) -> bytes:
    """RFC 8785 canonical JSON, as the broker writes inputs and statements."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as e:
        raise ReceiptRejected(f"a value has no canonical JSON form: {e}") from None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _time(text: Any) -> datetime:
    if not isinstance(text, str):
        raise ReceiptRejected("its receipt has no decision time")
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReceiptRejected(f"its receipt's decision time {text!r} is not RFC 3339") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _field(obj: Any, *path: str) -> Any:
    for name in path:
        if not isinstance(obj, dict) or name not in obj:
            raise ReceiptRejected(f"its receipt has no `{'.'.join(path)}`")
        obj = obj[name]
    return obj


def check_signature(envelope_json: str | bytes, keys: Mapping[str, TrustedKey]) -> tuple[dict[str, Any], TrustedKey]:
    """Checks the envelope's signature with the trusted key its `keyid` names; returns the
    statement (whose payload must be canonical JSON) and the key."""
    try:
        envelope = json.loads(envelope_json)
    except (ValueError, TypeError):
        raise ReceiptRejected("its receipt is not a DSSE envelope (not JSON)") from None
    if not isinstance(envelope, dict):
        raise ReceiptRejected("its receipt is not a DSSE envelope")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise ReceiptRejected(f"its receipt's payloadType is not {PAYLOAD_TYPE}")
    try:
        payload = base64.b64decode(str(envelope.get("payload", "")), validate=True)
    except (binascii.Error, ValueError):
        raise ReceiptRejected("its receipt's payload is not base64") from None
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise ReceiptRejected("its receipt carries no signature")
    named: list[str] = []
    signed_by: TrustedKey | None = None
    for signature in signatures:
        if not isinstance(signature, dict):
            continue
        key_id = signature.get("keyid")
        key = keys.get(key_id) if isinstance(key_id, str) else None
        if key is None:
            named.append(f"key {str(key_id)[:16]}…" if key_id else "no key id")
            continue
        try:
            sig = base64.b64decode(str(signature.get("sig", "")), validate=True)
            key.public_key.verify(sig, pae(PAYLOAD_TYPE, payload))
        except (binascii.Error, ValueError, InvalidSignature):
            raise ReceiptRejected(f"its receipt's signature does not verify with key {key.key_id[:16]}…") from None
        signed_by = key
        break
    if signed_by is None:
        raise ReceiptRejected(
            f"its receipt is signed with {', '.join(named) or 'no key'}, which is not a key this client trusts"
        )
    try:
        statement = json.loads(payload)
    except ValueError:
        raise ReceiptRejected("its receipt's statement is not JSON") from None
    if not isinstance(statement, dict) or canonical(statement) != payload:
        raise ReceiptRejected("its receipt's statement is not canonical JSON")
    return statement, signed_by


def verify_approval(
    envelope_json: str | bytes,
    keys: Mapping[str, TrustedKey],
    *,
    session_id: str,
    call_id: str,
    input_json: str,
    tool: str | None = None,
    batch_id: str | None = None,
) -> str:
    """Checks that the receipt, signed by a trusted key, says APPROVED for exactly this session
    and call id (and tool, and batch, when given) and exactly the input `input_json` (the
    outcome's input to run, compared in canonical form). Returns that input's canonical JSON
    text: the input to run. Raises `ReceiptRejected` naming what did not hold."""
    if not keys:
        raise ReceiptRejected("this client trusts no receipt key")
    statement, key = check_signature(envelope_json, keys)
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        raise ReceiptRejected("its receipt is not an approval-broker receipt statement")
    predicate = _field(statement, "predicate")
    call = _field(predicate, "call")
    if call.get("sessionId") != session_id or call.get("callId") != call_id:
        raise ReceiptRejected(
            f"its signed receipt is for session {call.get('sessionId')!r}, call {call.get('callId')!r}, not this call"
        )
    if batch_id and call.get("batchId") != batch_id:
        raise ReceiptRejected("its signed receipt is for another batch of this call id")
    if tool is not None and predicate.get("tool") != tool:
        raise ReceiptRejected(f"its signed receipt is for tool {predicate.get('tool')!r}, not {tool!r}")
    outcome = predicate.get("outcome")
    if outcome != "APPROVED":
        raise ReceiptRejected(f"its signed receipt says {outcome}")
    decided_at = _time(_field(predicate, "times", "decidedAt"))
    if key.valid_from is not None and decided_at < key.valid_from:
        raise ReceiptRejected(f"its receipt was decided before its key {key.key_id[:16]}… started signing")
    if key.valid_until is not None and decided_at >= key.valid_until:
        raise ReceiptRejected(f"its receipt was decided after its key {key.key_id[:16]}… was retired")
    asked = canonical(_field(predicate, "input"))
    subjects = statement.get("subject")
    if (
        not isinstance(subjects, list)
        or len(subjects) != 1
        or not isinstance(subjects[0], dict)
        or _field(subjects[0], "digest", "sha256") != _sha256(asked)
    ):
        raise ReceiptRejected("its receipt's subject is not the digest of its input")
    runs = predicate.get("runs")
    if not isinstance(runs, dict):
        raise ReceiptRejected("its signed receipt says nothing runs")
    to_run = canonical(runs["input"]) if "input" in runs else asked
    if _field(runs, "digest", "sha256") != _sha256(to_run):
        raise ReceiptRejected("its receipt's digest of the input that runs does not match that input")
    try:
        given = canonical(json.loads(input_json))
    except ValueError:
        raise ReceiptRejected("the input to run is not JSON") from None
    if given != to_run:
        raise ReceiptRejected("the input it would run is not the input its signed receipt approved")
    return to_run.decode()
