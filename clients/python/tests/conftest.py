"""A real broker for the tests: the debug binary, on a free port, with a fresh SQLite file in a
temporary directory, like `.ci/lib.sh` starts it. `APPROVAL_BROKER_BIN` names the binary; by
default `$CARGO_TARGET_DIR/debug/approval-broker` (or the repository's `target/`).

`approve_when_pending` plays the approver UI: it subscribes through `ApproverService` and decides
the named calls, in the given order, once it has seen all of them pending.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from approval_broker.proto import approver_pb2, approver_pb2_grpc, types_pb2

REPO = Path(__file__).resolve().parents[3]
START_TIMEOUT = 60.0


def broker_binary() -> Path:
    if os.environ.get("APPROVAL_BROKER_BIN"):
        return Path(os.environ["APPROVAL_BROKER_BIN"])
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    if not target_dir.is_absolute():
        target_dir = REPO / target_dir
    return target_dir / "debug" / "approval-broker"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokerProcess:
    """One broker process; `restart` keeps its port and its database."""

    def __init__(self, directory: Path, args: Sequence[str] = ()) -> None:
        self.directory = directory
        self.args = list(args)
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / "broker.log"
        self.started_once = False

    def start(self) -> None:
        """Starts the broker. Its port was free when chosen, but on a busy machine another
        process may take it before the broker binds it: then, on a first start only, it picks
        another port and tries again."""
        for attempt in range(5):
            if self._spawn_and_wait():
                return
            if self.started_once or attempt == 4:
                break
            self.port = free_port()
            self.target = f"127.0.0.1:{self.port}"
        assert self.process is not None
        pytest.fail(f"the broker exited during start ({self.process.returncode}):\n{self.log.read_text()}")

    def _spawn_and_wait(self) -> bool:
        """True once the broker serves; False when it exited because its port was taken."""
        binary = broker_binary()
        if not binary.exists():
            pytest.fail(f"no broker binary at {binary}: run `cargo build --locked --bin approval-broker`")
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVALS_") and k != "DATABASE_URL"}
        log_start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(binary), "--listen", self.target, "--metrics-listen", "off",
                 "--database-url", f"sqlite://{self.directory / 'approvals.db'}", *self.args],
                cwd=self.directory, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        if not self.wait_until_serving():
            assert self.process is not None
            self.process.wait()
            with open(self.log, "rb") as log:
                log.seek(log_start)
                if b"Address already in use" in log.read():
                    return False
            pytest.fail(f"the broker exited during start ({self.process.returncode}):\n{self.log.read_text()}")
        self.started_once = True
        return True

    def wait_until_serving(self) -> bool:
        """True once Health/Check answers SERVING; False if the process exits first."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                with grpc.insecure_channel(self.target) as channel:
                    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        pytest.fail(f"the broker did not serve within {START_TIMEOUT}s:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)
        self.start()


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path)
    process.start()
    yield process
    process.stop(signal.SIGTERM)


@dataclass
class Decision:
    call_id: str
    approve: bool
    reason: str = ""
    edited_input_json: str = ""
    # A message for the model instead of running the call (DECISION_RESPOND; `approve` ignored).
    response: str = ""


async def pending_calls(target: str, session_id: str) -> list[types_pb2.Call]:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await approver_pb2_grpc.ApproverServiceStub(channel).ListPending(
            approver_pb2.ListPendingRequest(filter=types_pb2.CallFilter(session_id=session_id)), timeout=5
        )
    return list(reply.calls)


async def wait_until_pending(target: str, session_id: str, call_ids: Sequence[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if set(call_ids) <= {c.call_id for c in await pending_calls(target, session_id)}:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{call_ids} were not all pending within {timeout}s")


async def decide(
    target: str, session_id: str, decisions: Sequence[Decision], *, agent: str = "", token: str = ""
) -> list[types_pb2.Outcome]:
    """Decides the calls in order, as the approver `alice@example.com` (or the token's identity)."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    outcomes = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = approver_pb2_grpc.ApproverServiceStub(channel)
        for d in decisions:
            reply = await stub.Decide(
                approver_pb2.DecideRequest(
                    session_id=session_id,
                    call_id=d.call_id,
                    decision=(
                        approver_pb2.DECISION_RESPOND
                        if d.response
                        else approver_pb2.DECISION_APPROVE
                        if d.approve
                        else approver_pb2.DECISION_DENY
                    ),
                    reason=d.reason,
                    response=d.response,
                    edited_input_json=d.edited_input_json,
                    approver="alice@example.com",
                    agent=agent,
                ),
                metadata=metadata,
                timeout=5,
            )
            outcomes.append(reply.outcome)
    return outcomes


async def approve_when_pending(target: str, session_id: str, decisions: Sequence[Decision]) -> list[types_pb2.Outcome]:
    """The approver UI: subscribes to the session, and once every named call is pending, decides
    them in order."""
    wanted = {d.call_id for d in decisions}
    seen: set[str] = set()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = approver_pb2_grpc.ApproverServiceStub(channel)
        events = stub.Subscribe(approver_pb2.SubscribeRequest(filter=types_pb2.CallFilter(session_id=session_id)))
        try:
            async for event in events:
                kind = event.WhichOneof("event")
                if kind in ("snapshot", "requested"):
                    seen.add(getattr(event, kind).call_id)
                if wanted <= seen:
                    break
        finally:
            events.cancel()
    return await decide(target, session_id, decisions)


class CuttableProxy:
    """A TCP proxy in front of the broker whose connections the test can cut (as a network drop
    would) and later let through again, while the broker itself keeps running."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.open = True
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        """Drops every connection and refuses new ones."""
        self.open = False
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.open = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
