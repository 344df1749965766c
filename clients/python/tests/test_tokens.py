"""`ClientCredentials` against a token endpoint on loopback that the test plays: a token is
fetched once and kept, renewed at 80% of its lifetime, kept working while the provider is down
until it expires and then refused with `TokenUnavailable`; the client secret travels as RFC 6749
says and is read only from a file its owner alone may read. And `Broker` with a provider against
a real broker: a refused token is renewed and the request made once more.
(The same against a real OpenID provider: tests/identity/agents.test.mjs.)"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import BrokerProcess
from test_auth_tls import AGENT_TOKEN, hashed

from approval_broker import AuthenticationError, Broker, ClientCredentials, TokenUnavailable, ToolCall


class TokenEndpoint:
    """A token endpoint on loopback: each grant gets `token-N`, living `expires_in` seconds."""

    def __init__(self, expires_in: float = 60) -> None:
        self.expires_in = expires_in
        self.requests: list[tuple[dict[str, str], dict[str, str]]] = []
        self.refuse = False
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # the discovery document
                body = json.dumps({"issuer": endpoint.issuer, "token_endpoint": f"{endpoint.issuer}/token"})
                self._answer(200, body)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                endpoint.requests.append((form, {k.lower(): v for k, v in self.headers.items()}))
                if endpoint.refuse:
                    self._answer(401, json.dumps({"error": "invalid_client", "error_description": "unknown client"}))
                    return
                token = f"token-{len(endpoint.requests)}"
                self._answer(200, json.dumps({"access_token": token, "token_type": "Bearer", "expires_in": endpoint.expires_in}))

            def _answer(self, status: int, body: str) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.issuer}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[TokenEndpoint]:
    served = TokenEndpoint()
    yield served
    served.stop()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text("s3cret:&=\n")
    path.chmod(0o600)
    return path


async def test_a_token_is_fetched_once_and_kept_while_fresh(endpoint: TokenEndpoint, secret_file: Path) -> None:
    source = ClientCredentials(endpoint.url, client_id="ci bot", client_secret_file=secret_file, scope="approval-agent", resource="urn:broker")
    assert [await source(), await source(), await source()] == ["token-1"] * 3
    assert source.requests == 1
    [(form, headers)] = endpoint.requests
    assert form == {"grant_type": "client_credentials", "scope": "approval-agent", "resource": "urn:broker"}
    # RFC 6749 2.3.1: id and secret form-encoded, then HTTP Basic; never in the form.
    assert headers["authorization"] == "Basic " + base64.b64encode(b"ci+bot:s3cret%3A%26%3D").decode()
    assert "client_secret" not in form


async def test_the_token_is_renewed_at_four_fifths_of_its_lifetime(endpoint: TokenEndpoint, secret_file: Path) -> None:
    endpoint.expires_in = 1
    source = ClientCredentials(endpoint.url, client_id="bot", client_secret_file=secret_file)
    assert await source() == "token-1"
    await asyncio.sleep(0.5)
    assert await source() == "token-1"  # still fresh
    await asyncio.sleep(0.4)  # past 0.8 s
    assert await source() == "token-2"
    assert source.requests == 2


async def test_the_provider_down_the_held_token_works_until_it_expires_then_nothing_is_sent(
    endpoint: TokenEndpoint, secret_file: Path
) -> None:
    endpoint.expires_in = 3
    source = ClientCredentials(endpoint.url, client_id="bot", client_secret_file=secret_file)
    assert await source() == "token-1"
    fetched = time.monotonic()
    endpoint.stop()
    await asyncio.sleep(fetched + 2.6 - time.monotonic())  # due for renewal, the provider gone: the held token, still valid
    assert await source() == "token-1"
    await asyncio.sleep(fetched + 3.2 - time.monotonic())  # expired
    with pytest.raises(TokenUnavailable) as refused:
        await source()
    message = str(refused.value)
    assert "could not be reached" in message and "has expired" in message and "run nothing" in message, message
    assert isinstance(refused.value, AuthenticationError)


async def test_refused_credentials_say_what_the_provider_said(endpoint: TokenEndpoint, secret_file: Path) -> None:
    endpoint.refuse = True
    source = ClientCredentials(endpoint.url, client_id="bot", client_secret_file=secret_file, auth_method="post")
    with pytest.raises(TokenUnavailable, match=r"refused: invalid_client \(unknown client\)"):
        await source()
    [(form, headers)] = endpoint.requests
    assert (form["client_id"], form["client_secret"], "authorization" in headers) == ("bot", "s3cret:&=", False)


async def test_the_token_endpoint_is_discovered_from_the_issuer(endpoint: TokenEndpoint, secret_file: Path) -> None:
    source = ClientCredentials(issuer=endpoint.issuer, client_id="bot", client_secret_file=secret_file)
    assert await source() == "token-1"
    source.invalidate("token-1")
    assert await source() == "token-2"
    source.invalidate("some-other-token")  # not the one held: kept
    assert await source() == "token-2"


def test_the_secret_comes_from_a_file_only_its_owner_reads_and_goes_only_over_https(tmp_path: Path, secret_file: Path) -> None:
    shared = tmp_path / "shared-secret"
    shared.write_text("s3cret")
    shared.chmod(0o644)
    with pytest.raises(ValueError, match="may be read by others .*chmod 600"):
        ClientCredentials("https://idp.example.com/token", client_id="bot", client_secret_file=shared)
    with pytest.raises(ValueError, match="https://"):
        ClientCredentials("http://idp.example.com/token", client_id="bot", client_secret_file=secret_file)
    ClientCredentials("http://[::1]:8080/token", client_id="bot", client_secret_file=secret_file)
    ClientCredentials("https://idp.example.com/token", client_id="bot", client_secret_file=secret_file)


class Rotating:
    """A provider whose first token the broker does not know, and whose next one it does."""

    def __init__(self) -> None:
        self.current = "stale-" + uuid.uuid4().hex
        self.invalidated: list[str] = []

    def __call__(self) -> str:
        return self.current

    def invalidate(self, token: str) -> None:
        self.invalidated.append(token)
        self.current = AGENT_TOKEN


async def test_a_refused_token_is_renewed_and_the_request_made_once_more(tmp_path: Path) -> None:
    """Told its token was refused (`invalidate`), the provider is asked again and the request
    goes through, on the stream (a submit) and in a unary call; a provider that cannot give a
    token fails the review at once, sending nothing."""
    process = BrokerProcess(tmp_path, ["--tokens", f"agent build-bot {hashed(AGENT_TOKEN)}"])
    process.start()
    try:
        on_stream, unary = Rotating(), Rotating()
        async with Broker(process.target, token=on_stream) as broker:
            submitted = await broker.submit("s", [ToolCall("c1", "read_file", {"path": "a"})])
            assert [ack.kind for ack in submitted.acks] == ["accepted"]
        async with Broker(process.target, token=unary) as broker:
            assert await broker.outcomes("s", ["c1"]) == [None]
        assert [t.startswith("stale-") for t in on_stream.invalidated + unary.invalidated] == [True, True]

        async def down() -> str:
            raise TokenUnavailable("no access token: the identity provider could not be reached; run nothing")

        async with Broker(process.target, token=down, unavailable_timeout=30) as broker:
            started = time.monotonic()
            with pytest.raises(TokenUnavailable, match="could not be reached"):
                await broker.review("s", [ToolCall("c2", "read_file", {"path": "a"})])
            assert time.monotonic() - started < 5
    finally:
        process.stop()
