"""What the MCP gateway's interoperability tests share: a real broker (the Python client suite's
`BrokerProcess`: the debug binary on a free port with a fresh SQLite file), the real reference
MCP servers from npm (`npm ci` in this directory), and a real MCP client (the `mcp` package)
that starts `approval-broker mcp-gateway` in front of them, as an MCP client config would.

An approver decides through the broker's gRPC API (`ApproverService`), with the stubs of
clients/python. `APPROVAL_BROKER_BIN` names the binary (by default the debug build).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from approval_broker.proto import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    approver_pb2,
    approver_pb2_grpc,
    types_pb2,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BIN = HERE / "node_modules" / ".bin"

# The client suite's broker helpers, loaded under a name of their own (both files are conftests).
_spec = importlib.util.spec_from_file_location("broker_kit", REPO / "clients/python/tests/conftest.py")
assert _spec is not None and _spec.loader is not None
broker_kit = importlib.util.module_from_spec(_spec)
sys.modules["broker_kit"] = broker_kit
_spec.loader.exec_module(broker_kit)
BrokerProcess = broker_kit.BrokerProcess
Decision = broker_kit.Decision
decide = broker_kit.decide
broker_binary = broker_kit.broker_binary
free_port = broker_kit.free_port

# How long a test waits for something that happens at once on an idle machine (not asserted).
PATIENCE = 60.0


def server_command(name: str, *args: str) -> list[str]:
    """A reference server installed by `npm ci`, as a command line."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `npm ci` in {HERE}")
    return [str(path), *args]


def clean_env() -> dict[str, str]:
    """The environment without the gateway's and the broker's settings, so flags alone count."""
    return {k: v for k, v in os.environ.items() if not k.startswith("APPROVALS_")}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Any]:
    process = BrokerProcess(tmp_path)
    process.start()
    yield process
    process.stop(signal.SIGTERM)


def broker_with_policy(directory: Path, rules: list[dict[str, Any]]) -> Any:
    policy = directory / "policy.json"
    policy.write_text(json.dumps({"rules": rules}))
    return BrokerProcess(directory, ["--policy-file", str(policy)])


@asynccontextmanager
async def gateway(
    broker_url: str, server: Sequence[str], *flags: str, **session_options: Any
) -> AsyncIterator[ClientSession]:
    """An MCP client session with `approval-broker mcp-gateway FLAGS -- SERVER` on stdio."""
    params = StdioServerParameters(
        command=str(broker_binary()),
        args=["mcp-gateway", "--broker", broker_url, *flags, "--", *server],
        env=clean_env(),
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, **session_options) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def http_session(url: str, **session_options: Any) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(url) as (read, write):
        async with ClientSession(read, write, **session_options) as session:
            await session.initialize()
            yield session


class Listener:
    """A process that serves HTTP on a port of localhost: started, waited for, stopped."""

    def __init__(self, args: Sequence[str], port: int, log: Path, env: dict[str, str] | None = None) -> None:
        self.port = port
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                list(args), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env or clean_env()
            )
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{args[0]} exited ({self.process.returncode}):\n{log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"{args[0]} did not listen on {port}:\n{log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def calls_in(target: str, session_id: str) -> list[types_pb2.Call]:
    """Every call of the session, as the broker stores it (AdminService; auth is off)."""
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await admin_pb2_grpc.AdminServiceStub(channel).ListCalls(
            admin_pb2.ListCallsRequest(session_id=session_id, page_size=1000), timeout=5
        )
    return list(reply.calls)


async def next_pending(target: str, session_id: str, tool: str) -> types_pb2.Call:
    """The first pending call of `tool` in the session, once the gateway has submitted it."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        try:
            pending = [c for c in await broker_kit.pending_calls(target, session_id) if c.tool == tool]
        except grpc.aio.AioRpcError:
            pending = []
        if pending:
            return pending[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no pending `{tool}` call in {session_id} within {PATIENCE}s")


async def pending_anywhere(target: str, wanted: Callable[[types_pb2.Call], bool]) -> types_pb2.Call:
    """The first pending call in any session that `wanted` picks, once the gateway submitted it
    (for sessions the gateway names itself)."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                reply = await approver_pb2_grpc.ApproverServiceStub(channel).ListPending(
                    approver_pb2.ListPendingRequest(filter=types_pb2.CallFilter()), timeout=5
                )
            found = [c for c in reply.calls if wanted(c)]
        except grpc.aio.AioRpcError:
            found = []
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no such pending call within {PATIENCE}s")


class SilentListener:
    """A TCP port that accepts connections and never says a word: a broker that hangs."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.port = self.socket.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.accepted.append(connection)

    def close(self) -> None:
        self.socket.close()
        for connection in self.accepted:
            connection.close()


async def outcome_of(target: str, session_id: str, call_id: str) -> types_pb2.Outcome | None:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await agent_pb2_grpc.AgentServiceStub(channel).GetOutcomes(
            agent_pb2.GetOutcomesRequest(session_id=session_id, call_ids=[call_id]), timeout=5
        )
    state = reply.calls[0]
    return state.outcome if state.HasField("outcome") else None


async def wait_for_outcome(target: str, session_id: str, call_id: str) -> types_pb2.Outcome:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        outcome = await outcome_of(target, session_id, call_id)
        if outcome is not None:
            return outcome
        await asyncio.sleep(0.05)
    raise AssertionError(f"{session_id}/{call_id} was not decided within {PATIENCE}s")


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")
