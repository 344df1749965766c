"""Verifies a broker's signed receipts with code that is not the broker's: Ed25519 from the
`cryptography` package, RFC 8785 canonical JSON from the `rfc8785` package, and the DSSE
pre-authentication encoding written out below from the DSSE specification.

Usage: verify_receipts.py PUBLIC_KEY_BASE64 EXPORT_JSON

EXPORT_JSON is what `grpcurl ... approvals.v1.AdminService/ExportReceipts` printed (one page
holding the whole chain). Checks every envelope's signature, that each statement's subject is the
SHA-256 of its canonical input, and that the receipts form one unbroken chain from sequence 1.
Then it checks itself: a changed field, two receipts swapped and one removed must each fail.
Prints `verified N receipts` and exits 0, or names what failed and exits 1.
"""

import base64
import copy
import hashlib
import json
import sys

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

PAYLOAD_TYPE = "application/vnd.in-toto+json"


class Failed(Exception):
    pass


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def check_envelope(envelope: dict, key: Ed25519PublicKey) -> tuple[dict, str]:
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise Failed("payloadType is not " + PAYLOAD_TYPE)
    payload = base64.b64decode(envelope["payload"], validate=True)
    for signature in envelope.get("signatures", []):
        try:
            key.verify(base64.b64decode(signature["sig"]), pae(PAYLOAD_TYPE, payload))
            break
        except InvalidSignature:
            continue
    else:
        raise Failed("no signature verifies")
    statement = json.loads(payload)
    if rfc8785.dumps(statement) != payload:
        raise Failed("the payload is not RFC 8785 canonical JSON")
    if statement["_type"] != "https://in-toto.io/Statement/v1":
        raise Failed("not an in-toto Statement v1")
    predicate = statement["predicate"]
    digest = hashlib.sha256(rfc8785.dumps(predicate["input"])).hexdigest()
    if statement["subject"][0]["digest"]["sha256"] != digest:
        raise Failed("the subject digest is not the SHA-256 of the canonical input")
    runs = predicate["runs"]
    if runs is not None:
        # The input that runs is written out only when the approver edited it.
        runs_digest = (
            hashlib.sha256(rfc8785.dumps(runs["input"])).hexdigest() if "input" in runs else digest
        )
        if runs["digest"]["sha256"] != runs_digest:
            raise Failed("runs.digest is not the SHA-256 of the input that runs")
    return statement, hashlib.sha256(payload).hexdigest()


def check_chain(envelopes: list, key: Ed25519PublicKey) -> int:
    previous = None
    for i, envelope in enumerate(envelopes, start=1):
        try:
            statement, digest = check_envelope(envelope, key)
        except (Failed, ValueError, KeyError) as e:
            raise Failed(f"receipt {i}: {e}") from e
        chain = statement["predicate"]["chain"]
        expected = 1 if previous is None else previous[0] + 1
        if chain["sequence"] != expected:
            raise Failed(f"receipt {i}: sequence {chain['sequence']}, expected {expected}")
        if chain["previous"] != (None if previous is None else previous[1]):
            raise Failed(f"receipt {i}: does not link to the receipt before it")
        previous = (chain["sequence"], digest)
    if previous is None:
        raise Failed("no receipts")
    return len(envelopes)


def must_fail(what: str, envelopes: list, key: Ed25519PublicKey) -> None:
    try:
        check_chain(envelopes, key)
    except Failed as e:
        print(f"as it must, {what} fails: {e}")
        return
    raise Failed(f"{what} verified, but must not")


def main() -> int:
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(sys.argv[1]))
    with open(sys.argv[2]) as f:
        export = json.load(f)
    envelopes = [json.loads(r["envelope"]) for r in export["receipts"]]
    try:
        count = check_chain(envelopes, key)
        if count >= 3:
            changed = copy.deepcopy(envelopes)
            statement = json.loads(base64.b64decode(changed[1]["payload"]))
            statement["predicate"]["outcome"] = "APPROVED" if statement["predicate"]["outcome"] != "APPROVED" else "DENIED"
            changed[1]["payload"] = base64.b64encode(rfc8785.dumps(statement)).decode()
            must_fail("a changed outcome", changed, key)
            must_fail("two receipts swapped", [envelopes[0], envelopes[2], envelopes[1]] + envelopes[3:], key)
            must_fail("a receipt removed", envelopes[:1] + envelopes[2:], key)
    except Failed as e:
        print(f"verification FAILED: {e}")
        return 1
    print(f"verified {count} receipts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
