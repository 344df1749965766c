"""Bearer tokens and TLS: the options `Broker` takes, against a broker started with tokens and
with a certificate."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess, Decision, broker_binary, decide
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from approval_broker import AuthenticationError, Broker, BrokerError, BrokerUnavailable, PermissionDenied, Status, ToolCall

AGENT_TOKEN = "agent-token-" + uuid.uuid4().hex
APPROVER_TOKEN = "approver-token-" + uuid.uuid4().hex


def hashed(token: str) -> str:
    """The broker's own `hash-token`, so the test configures tokens as an operator does."""
    return subprocess.run([str(broker_binary()), "hash-token", token], check=True, capture_output=True, text=True).stdout.strip()


async def until_stored(broker: Broker, session: str, call_id: str) -> None:
    """Looks the call up (through the agent's own credentials) until the broker holds it."""
    for _ in range(200):
        try:
            if await broker.outcomes(session, [call_id]) == [None]:
                return
        except BrokerError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{call_id} was never stored")


@pytest.fixture
def broker_with_tokens(tmp_path: Path) -> Iterator[BrokerProcess]:
    tokens = f"agent build-bot {hashed(AGENT_TOKEN)};approver alice {hashed(APPROVER_TOKEN)}"
    process = BrokerProcess(tmp_path, ["--tokens", tokens])
    process.start()
    yield process
    process.stop()


async def test_an_agent_token_is_sent_as_a_bearer_token(broker_with_tokens: BrokerProcess) -> None:
    session = f"auth-{uuid.uuid4().hex[:8]}"
    async with Broker(broker_with_tokens.target, token=AGENT_TOKEN) as broker:
        review = asyncio.create_task(broker.review(session, [ToolCall("c1", "read_file", {"path": "a"})], timeout=30))
        await until_stored(broker, session, "c1")
        [decided] = await decide(
            broker_with_tokens.target, session, [Decision("c1", approve=True)],
            agent="build-bot", token=APPROVER_TOKEN,
        )
        [outcome] = await review
    assert outcome.status is Status.APPROVED
    # The token's identities, not the request's fields, are recorded.
    assert outcome.decided_by == decided.decided_by == "approver:alice"


async def test_missing_or_wrong_credentials_fail_with_typed_errors_at_once(broker_with_tokens: BrokerProcess) -> None:
    call = [ToolCall("c1", "read_file", {"path": "a"})]
    async with Broker(broker_with_tokens.target, unavailable_timeout=30) as anonymous:
        with pytest.raises(AuthenticationError):
            await asyncio.wait_for(anonymous.review("s", call), 10)  # not retried for 30 s
    async with Broker(broker_with_tokens.target, token="not-a-token") as unknown:
        with pytest.raises(AuthenticationError):
            await unknown.outcomes("s", ["c1"])
    async with Broker(broker_with_tokens.target, token=APPROVER_TOKEN) as approver:
        with pytest.raises(PermissionDenied):
            await asyncio.wait_for(approver.review("s", call), 10)


def write_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for 127.0.0.1 and localhost."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


class TlsBrokerProcess(BrokerProcess):
    """The health check of the fixture speaks plaintext; over TLS, wait for the port instead."""

    def wait_until_serving(self) -> bool:
        import socket
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                time.sleep(0.1)
        pytest.fail("the TLS broker did not listen within 60s")


async def test_tls_with_the_broker_ca_and_plaintext_refused(tmp_path: Path) -> None:
    ca, cert, key = write_certificates(tmp_path)
    process = TlsBrokerProcess(tmp_path, ["--tls-cert", str(cert), "--tls-key", str(key)])
    process.start()
    try:
        session = f"tls-{uuid.uuid4().hex[:8]}"
        async with Broker(f"https://localhost:{process.port}", root_certificates=ca.read_bytes()) as broker:
            review = asyncio.create_task(broker.review(session, [ToolCall("c1", "read_file", {"path": "a"})], timeout=30))
            # Everything over TLS: the lookup until the call is stored, then a cancel.
            await until_stored(broker, session, "c1")
            await broker.cancel(session, call_ids=["c1"], reason="over TLS")
            [outcome] = await review
        assert outcome.status is Status.CANCELLED
        # A client that does not trust the broker's CA never gets an outcome.
        async with Broker(f"https://localhost:{process.port}", unavailable_timeout=1) as untrusting:
            with pytest.raises(BrokerUnavailable):
                await untrusting.review(session, [ToolCall("c2", "read_file", {"path": "a"})])
        async with Broker(f"http://127.0.0.1:{process.port}", unavailable_timeout=1) as plaintext:
            with pytest.raises(BrokerUnavailable):
                await plaintext.review(session, [ToolCall("c2", "read_file", {"path": "a"})])
    finally:
        process.stop()


def test_plaintext_scheme_with_tls_options_is_a_mistake() -> None:
    with pytest.raises(ValueError, match="plaintext"):
        Broker("http://127.0.0.1:1", root_certificates=b"x")

