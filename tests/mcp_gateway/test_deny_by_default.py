"""The gateway is deny-by-default (docs/mcp-gateway.md, "What passes and what does not"; issue 43):
raw JSON-RPC, over standard I/O and over Streamable HTTP (`--listen`), of every kind the MCP
library cannot type (each `tools/call` params field with a wrong JSON type, unknown fields,
`_meta` of every JSON type, batches, unknown methods, malformed envelopes). Behind the gateway is
recording_server.py, which logs every line it receives and would run anything; in front of it a
broker whose rule approves every call, so a message that slipped into review would run too. Each
request must get a JSON-RPC error naming its id, and the server must see nothing but the
handshake. Also: a reused request id is a new call needing its own outcome, and a server that
has exited is reported at once, with no call left at the broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    HERE,
    PATIENCE,
    Decision,
    Listener,
    broker_binary,
    broker_with_policy,
    calls_in,
    clean_env,
    decide,
    free_port,
    next_pending,
    server_command,
)

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
HANDSHAKE = ["initialize", "notifications/initialized"]


def fresh_session() -> str:
    return f"mcp-deny-{uuid.uuid4().hex[:12]}"


def recorder(log: Path, pidfile: Path | None = None) -> list[str]:
    return [sys.executable, str(HERE / "recording_server.py"), str(log), *([str(pidfile)] if pidfile else [])]


def received(log: Path) -> list[Any]:
    """What the server received, message by message (a line it could not parse as it came)."""
    if not log.exists():
        return []
    seen = []
    for line in log.read_text().splitlines():
        try:
            seen.append(json.loads(line))
        except ValueError:
            seen.append(line)
    return seen


def methods(log: Path) -> list[Any]:
    return [m.get("method") if isinstance(m, dict) else m for m in received(log)]


INITIALIZE = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


# --- what the library cannot type -----------------------------------------------------------------

# A JSON value of every type but an object, and an object.
NON_OBJECTS = [None, True, 0, 1.5, "x", [], [1]]


def malformed() -> list[tuple[str, Any, Any, set[int] | None]]:
    """(label, message, the id the reply must carry, the error codes allowed); codes None: a
    notification, which gets no reply. A message is a JSON value, or a str sent as it is."""
    cases: list[tuple[str, Any, Any, set[int] | None]] = []
    good = {"name": "write", "arguments": {"path": "/srv/x", "content": "x"}}

    def call(label: str, params: Any, *, omit: bool = False) -> None:
        request_id = f"c{len(cases)}"
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
        if not omit:
            message["params"] = params
        cases.append((label, message, request_id, {INVALID_PARAMS}))

    # Each params field with each wrong JSON type.
    for field, wrong_values in {
        "name": [v for v in NON_OBJECTS if not isinstance(v, str)] + [{}],
        "arguments": NON_OBJECTS,
        "_meta": NON_OBJECTS,  # `_meta` of every JSON type but an object (an object is valid: below)
        "requestState": NON_OBJECTS + [{}, "opaque-state"],
        "inputResponses": NON_OBJECTS + [{}, {"confirm": {"action": "accept"}}],
        "task": NON_OBJECTS + [{"ttl": 60000}],
    }.items():
        for value in wrong_values:
            call(f"params.{field}={json.dumps(value)}", good | {field: value})
    # Unknown fields, and a name missing.
    call("params.bogus", good | {"bogus": 1})
    call("params.Name", {"Name": "write", "arguments": {}})
    call("params without name", {"arguments": {}})
    call("no params", None, omit=True)
    for value in NON_OBJECTS:
        call(f"params={json.dumps(value)}", value)

    # Methods the gateway does not relay.
    for method in ["x/y", "tasks/get", "tasks/result", "tasks/cancel", "skills/get", "subscriptions/listen",
                   "sampling/createMessage", "tools/call/", "TOOLS/CALL", ""]:
        request_id = f"m{len(cases)}"
        cases.append((f"method {method!r}", {"jsonrpc": "2.0", "id": request_id, "method": method,
                                              "params": {"name": "write", "arguments": {}}},
                      request_id, {METHOD_NOT_FOUND}))
    # A relayed method whose params do not type.
    cases.append(("resources/read uri=5", {"jsonrpc": "2.0", "id": "r1", "method": "resources/read",
                                            "params": {"uri": 5}}, "r1", {INVALID_PARAMS}))
    cases.append(("tools/list _meta=1", {"jsonrpc": "2.0", "id": "r2", "method": "tools/list",
                                          "params": {"_meta": 1}}, "r2", {INVALID_PARAMS}))

    # Envelopes that are not a JSON-RPC 2.0 request.
    cases.append(("no jsonrpc", {"id": "e1", "method": "tools/call", "params": good}, "e1", {INVALID_REQUEST}))
    cases.append(("jsonrpc 1.0", {"jsonrpc": "1.0", "id": "e2", "method": "tools/call", "params": good},
                  "e2", {INVALID_REQUEST}))
    cases.append(("method 5", {"jsonrpc": "2.0", "id": "e3", "method": 5, "params": good}, "e3", {INVALID_REQUEST}))
    for request_id in [None, {}, [], True]:
        cases.append((f"id {json.dumps(request_id)}", {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                                        "params": good}, None, {INVALID_REQUEST}))
    cases.append(("id 1.5", {"jsonrpc": "2.0", "id": 1.5, "method": "tools/call", "params": good},
                  1.5, {INVALID_REQUEST}))
    cases.append(("not JSON", '{"jsonrpc": "2.0", "id": "j1", "method": "tools/call", ', None, {PARSE_ERROR}))
    cases.append(("a number", 5, None, {INVALID_REQUEST}))

    # Batches: each request of one is answered; none of it runs.
    cases.append(("batch of one call", [{"jsonrpc": "2.0", "id": "b1", "method": "tools/call", "params": good}],
                  ["b1"], {INVALID_REQUEST}))
    cases.append(("mixed batch", [
        {"jsonrpc": "2.0", "id": "b2", "method": "tools/list"},
        {"jsonrpc": "2.0", "method": "notifications/x"},
        {"jsonrpc": "2.0", "id": "b3", "method": "tools/call", "params": good | {"requestState": 1}},
    ], ["b2", "b3"], {INVALID_REQUEST}))
    cases.append(("empty batch", [], None, {INVALID_REQUEST}))

    # Notifications, which cannot be answered: not one may reach the server.
    for label, message in [
        ("tools/call as a notification", {"jsonrpc": "2.0", "method": "tools/call", "params": good}),
        ("custom notification", {"jsonrpc": "2.0", "method": "notifications/x", "params": {"a": 1}}),
        ("cancelled, untyped", {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": []}}),
        ("progress, untyped", {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": "x"}}),
        ("batch of notifications", [{"jsonrpc": "2.0", "method": "notifications/x"}]),
    ]:
        cases.append((label, message, None, None))
    return cases


def encoded(message: Any) -> str:
    return message if isinstance(message, str) else json.dumps(message)


# --- raw clients --------------------------------------------------------------------------------


class RawStdio:
    """`approval-broker mcp-gateway` on pipes, spoken to line by line."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=clean_env()
        )
        self.replies: list[Any] = []
        self.arrived = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        self.reader = self.loop.run_in_executor(None, self._read)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            reply = json.loads(line)
            self.loop.call_soon_threadsafe(self._arrive, reply)

    def _arrive(self, reply: Any) -> None:
        self.replies.append(reply)
        self.arrived.set()

    def send(self, message: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((encoded(message) + "\n").encode())
        self.process.stdin.flush()

    async def reply_to(self, request_id: Any) -> dict[str, Any]:
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            for reply in self.replies:
                if isinstance(reply, dict) and reply.get("id") == request_id and ("result" in reply or "error" in reply):
                    self.replies.remove(reply)
                    return reply
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), 1)
            except TimeoutError:
                pass
        raise AssertionError(f"no reply to {request_id!r} within {PATIENCE}s")

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return await self.reply_to(message["id"])

    async def initialize(self) -> None:
        reply = await self.request(INITIALIZE)
        assert "result" in reply, reply
        self.send(INITIALIZED)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class RawHttp:
    """A Streamable HTTP session with the gateway, one POST per message."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session: str | None = None

    def post(self, message: Any) -> tuple[int, Any]:
        """The HTTP status and the JSON-RPC reply (a JSON body, or the reply in an event stream)."""
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            headers |= {"Mcp-Session-Id": self.session, "Mcp-Protocol-Version": "2025-06-18"}
        request = urllib.request.Request(self.url, data=encoded(message).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=PATIENCE) as response:
                status, kind, body = response.status, response.headers.get("Content-Type", ""), response.read()
                self.session = self.session or response.headers.get("Mcp-Session-Id")
        except urllib.error.HTTPError as error:
            status, kind, body = error.code, error.headers.get("Content-Type", ""), error.read()
        text = body.decode()
        if not text.strip():
            return status, None
        if kind.startswith("text/event-stream"):
            for line in text.splitlines():
                if line.startswith("data:") and line[5:].strip():
                    reply = json.loads(line[5:])
                    if "result" in reply or "error" in reply:
                        return status, reply
            return status, None
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        _, reply = await asyncio.to_thread(self.post, message)
        assert isinstance(reply, dict), reply
        return reply

    async def initialize(self) -> None:
        reply = await self.request(INITIALIZE)
        assert "result" in reply, reply
        status, _ = await asyncio.to_thread(self.post, INITIALIZED)
        assert status == 202, status


@asynccontextmanager
async def raw_gateway(transport: str, broker_url: str, server: list[str], tmp_path: Path,
                      *flags: str) -> AsyncIterator[Any]:
    """A raw client of the gateway over `transport` (stdio or http), initialized."""
    if transport == "stdio":
        client = RawStdio([str(broker_binary()), "mcp-gateway", "--broker", broker_url, *flags, "--", *server])
        try:
            await client.initialize()
            yield client
        finally:
            client.close()
    else:
        port = free_port()
        listener = Listener(
            [str(broker_binary()), "mcp-gateway", "--broker", broker_url, *flags,
             "--listen", f"127.0.0.1:{port}", "--", *server],
            port, tmp_path / f"gateway-{port}.log",
        )
        try:
            client = RawHttp(f"http://127.0.0.1:{port}/mcp")
            await client.initialize()
            yield client
        finally:
            listener.stop()


def check_reply(label: str, reply: Any, want_id: Any, codes: set[int]) -> None:
    if isinstance(want_id, list):
        assert isinstance(reply, list), f"{label}: {reply}"
        assert [r["id"] for r in reply] == want_id, f"{label}: {reply}"
        replies = reply
    else:
        assert isinstance(reply, dict) and "error" in reply, f"{label}: {reply}"
        assert reply["id"] == want_id, f"{label}: {reply}"
        replies = [reply]
    for one in replies:
        assert one["error"]["code"] in codes, f"{label}: {one}"
        assert "nothing" in one["error"]["message"].lower(), f"{label}: {one}"


TRANSPORTS = ["stdio", "http"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_request_the_library_cannot_type_is_refused_with_an_error_and_never_reaches_the_server(
    tmp_path: Path, transport: str
) -> None:
    broker = broker_with_policy(tmp_path, [{"id": "everything", "tool": "*", "effect": "allow"}])
    broker.start()
    log = tmp_path / "server.log"
    session = fresh_session()
    cases = malformed()
    try:
        async with raw_gateway(transport, f"http://{broker.target}", recorder(log), tmp_path,
                               "--session", session) as client:
            if transport == "stdio":
                for _, message, _, _ in cases:
                    client.send(message)
                # An id-less reply cannot be told from another: they are counted, in order.
                for label, _, want_id, codes in cases:
                    if codes is None or want_id is None:
                        continue
                    if isinstance(want_id, list):
                        reply = await batch_reply(client, want_id)
                    else:
                        reply = await client.reply_to(want_id)
                    check_reply(label, reply, want_id, codes)
                anonymous = [c for c in cases if c[3] is not None and c[2] is None]
                for label, _, _, codes in anonymous:
                    reply = await client.reply_to(None)
                    assert reply["error"]["code"] in codes | {INVALID_REQUEST, PARSE_ERROR}, f"{label}: {reply}"
                # Nothing else was answered (notifications get no reply): a ping shows the queue empty.
                pong = await client.request({"jsonrpc": "2.0", "id": "last", "method": "ping"})
                assert "result" in pong
                assert client.replies == [], client.replies
            else:
                for label, message, want_id, codes in cases:
                    status, reply = await asyncio.to_thread(client.post, message)
                    if codes is None:
                        assert status == 202 and reply is None, f"{label}: {status} {reply}"
                        continue
                    check_reply(label, reply, want_id, codes)
                    assert status == (400 if want_id is None else 200), f"{label}: {status}"
            assert methods(log) == HANDSHAKE, received(log)
            assert await calls_in(broker.target, session) == []

            # The control: a well-formed call runs (the rule approves it), so the log above would
            # have shown anything that slipped through. The client's `_meta` does not go along.
            ran = await client.request({"jsonrpc": "2.0", "id": "ok", "method": "tools/call", "params": {
                "name": "write", "arguments": {"path": "/srv/x"}, "_meta": {"progressToken": "p", "secret": "s"}}})
        assert ran["result"]["content"][0]["text"] == "ran", ran
        calls = [m for m in received(log) if isinstance(m, dict) and m.get("method") == "tools/call"]
        assert len(calls) == 1 and calls[0]["params"]["arguments"] == {"path": "/srv/x"}, calls
        assert "secret" not in calls[0]["params"].get("_meta", {}), calls
        assert set(calls[0]["params"]) <= {"name", "arguments", "_meta"}, calls
        [call] = await calls_in(broker.target, session)
        assert call.tool == "write"
    finally:
        broker.stop()


async def batch_reply(client: RawStdio, ids: list[str]) -> Any:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        for reply in client.replies:
            if isinstance(reply, list) and [r.get("id") for r in reply] == ids:
                client.replies.remove(reply)
                return reply
        await asyncio.sleep(0.05)
    raise AssertionError(f"no batch reply for {ids} within {PATIENCE}s")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_attack_of_issue_43_writes_no_file(broker: Any, tmp_path: Path, transport: str) -> None:
    """The reported attack as it was: a write_file to the reference filesystem server whose params
    the library cannot type; with the broker down, too."""
    files = tmp_path / "files"
    files.mkdir()
    server = server_command("mcp-server-filesystem", str(files))
    replies = []
    for broker_url in (f"http://{broker.target}", f"http://127.0.0.1:{free_port()}"):
        async with raw_gateway(transport, broker_url, server, tmp_path) as client:
            for n, extra in enumerate([{"requestState": 1}, {"inputResponses": "x"}, {"_meta": 1}]):
                target = files / f"attack-{n}.txt"
                replies.append(await client.request({"jsonrpc": "2.0", "id": 100 + n, "method": "tools/call",
                    "params": {"name": "write_file", "arguments": {"path": str(target), "content": "pwned"}} | extra}))
    assert sorted(f.name for f in files.iterdir()) == [], "the server wrote files with no approval"
    for reply in replies:
        assert reply.get("error", {}).get("code") == INVALID_PARAMS, reply
        assert "the tool was not run" in reply["error"]["message"], reply


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reused_request_id_is_a_new_call_that_needs_its_own_outcome(
    broker: Any, tmp_path: Path, transport: str
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    target = files / "twice.txt"
    session = fresh_session()
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "write_file", "arguments": {"path": str(target), "content": "once"}}}
    async with raw_gateway(transport, f"http://{broker.target}", server_command("mcp-server-filesystem", str(files)),
                           tmp_path, "--session", session) as client:
        first = asyncio.create_task(client.request(call))
        pending = await next_pending(broker.target, session, "write_file")
        await decide(broker.target, session, [Decision(pending.call_id, approve=True)])
        assert "error" not in (reply := await first) and not reply["result"].get("isError"), reply
        assert target.read_text() == "once"
        target.unlink()

        # The same request id again, once the first was answered (JSON-RPC allows it): a new call.
        second = asyncio.create_task(client.request(call))
        again = await asyncio.wait_for(next_pending(broker.target, session, "write_file"), PATIENCE)
        assert again.call_id != pending.call_id
        assert not target.exists(), "the reused id ran the tool with no new approval"
        await decide(broker.target, session, [Decision(again.call_id, approve=False, reason="not again")])
        refused = await second
    assert refused["result"]["isError"] is True and "not again" in json.dumps(refused), refused
    assert not target.exists()
    ids = [c.call_id for c in await calls_in(broker.target, session)]
    assert len(ids) == 2 and len(set(ids)) == 2, ids


def wait_gone(pid: int) -> None:
    """Until the process has exited (a zombie counts: it runs nothing)."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(")")[-1].split()[0] in ("Z", "X"):
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.05)
    raise AssertionError(f"{pid} did not exit")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_call_to_a_server_that_has_exited_is_refused_at_once_and_never_reaches_approvers(
    broker: Any, tmp_path: Path, transport: str
) -> None:
    log, pidfile = tmp_path / "server.log", tmp_path / "server.pid"
    session = fresh_session()
    async with raw_gateway(transport, f"http://{broker.target}", recorder(log, pidfile), tmp_path,
                           "--session", session) as client:
        listed = await client.request({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert listed["result"]["tools"], listed
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(wait_gone, pid)
        # The gateway's --timeout is 10 minutes: an answer within the wait below was not an approver's.
        reply = await asyncio.wait_for(client.request({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "write", "arguments": {"path": "/srv/x"}}}), 30)
    assert reply["result"]["isError"] is True, reply
    text = reply["result"]["content"][0]["text"]
    assert "recording" in text and ("has exited" in text or "cannot be reached" in text), text
    assert "not submitted for approval" in text and "the tool was not run" in text, text
    assert await calls_in(broker.target, session) == []
