"""Decrypts the Web Push bodies the broker sent, with an implementation that is not the
broker's: `http_ece` (PyPI, Mozilla's reference for RFC 8188 / RFC 8291) and `cryptography`.

Reads the captures `tests/api/push.rs` writes when PUSH_CAPTURE_DIR is set (one JSON file per
push: the subscription's PKCS#8 private key and auth secret as a browser would hold them, the
request body, and the fields the decrypted JSON must carry), decrypts each, checks the JSON, and
also checks the RFC 8291 example message decrypts to its plaintext. Exits non-zero on any
failure. Usage: python decrypt.py CAPTURE_DIR
"""

import base64
import json
import pathlib
import sys

import http_ece
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_private_key


def b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def decrypt(body: bytes, private_key: ec.EllipticCurvePrivateKey, auth: bytes) -> bytes:
    return http_ece.decrypt(body, private_key=private_key, auth_secret=auth, version="aes128gcm")


def rfc8291_example() -> None:
    """RFC 8291 section 5: the user agent's keys and the message, as published."""
    ua_private = ec.derive_private_key(
        int.from_bytes(b64("q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94"), "big"), ec.SECP256R1()
    )
    body = b64(
        "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLoc"
        "InmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLV"
        "WGNWQexSgSxsj_Qulcy4a-fN"
    )
    plain = decrypt(body, ua_private, b64("BTBZMqHH6r4Tts7J_aSIgg"))
    assert plain == b"When I grow up, I want to be a watermelon", plain


def main() -> int:
    rfc8291_example()
    print("http_ece decrypts the RFC 8291 example")
    captures = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
    if not captures:
        print(f"no captures in {sys.argv[1]}", file=sys.stderr)
        return 1
    for path in captures:
        capture = json.loads(path.read_text())
        key = load_der_private_key(b64(capture["pkcs8"]), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey), type(key)
        plain = decrypt(b64(capture["body"]), key, b64(capture["auth"]))
        message = json.loads(plain)
        assert message["v"] == 1, message
        for field, wanted in capture["expect"].items():
            assert message.get(field) == wanted, f"{path.name}: {field} is {message.get(field)!r}, not {wanted!r}"
        print(f"decrypted {path.name}: {json.dumps(message, sort_keys=True)}")
    print(f"{len(captures)} pushes decrypted by http_ece and checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
