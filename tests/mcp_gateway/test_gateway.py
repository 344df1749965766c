"""`approval-broker mcp-gateway` between a real MCP client (the `mcp` package) and the reference
MCP servers from npm, with a real broker and an approver deciding through its gRPC API. Each
test names the promise it proves; none asserts a duration."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from approval_broker.proto import types_pb2
from conftest import (
    Decision,
    Listener,
    SilentListener,
    broker_binary,
    broker_with_policy,
    calls_in,
    clean_env,
    decide,
    free_port,
    gateway,
    http_session,
    next_pending,
    pending_anywhere,
    server_command,
    text_of,
    wait_for_outcome,
)

HINTS_KEY = "_mcp_hints"


def fresh_session() -> str:
    return f"mcp-test-{uuid.uuid4().hex[:12]}"


def url_of(broker: Any) -> str:
    return f"http://{broker.target}"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    directory = tmp_path / "files"
    directory.mkdir()
    return directory


def filesystem(directory: Path) -> list[str]:
    return server_command("mcp-server-filesystem", str(directory))


async def test_an_approved_write_really_writes_the_file_and_the_approver_sees_the_hints(
    broker: Any, files: Path
) -> None:
    session = fresh_session()
    target = files / "approved.txt"
    async with gateway(url_of(broker), filesystem(files), "--session", session) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert listed["write_file"].annotations.destructive_hint is True
        call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "hello"}))
        pending = await next_pending(broker.target, session, "write_file")
        assert not target.exists(), "the tool ran before anyone approved it"
        shown = json.loads(pending.input_json)
        assert shown["path"] == str(target) and shown["content"] == "hello"
        # The server's annotations reach the approver as claims, beside the arguments.
        assert shown[HINTS_KEY] == {
            "readOnlyHint": False, "idempotentHint": True, "destructiveHint": True, "openWorldHint": False,
        }
        assert "not checked" in pending.message and "`destructiveHint: true`" in pending.message
        assert pending.title.endswith(str(target))
        # A session given by flag: the call id is the connection's prefix and the MCP request id.
        assert "/" in pending.call_id
        await decide(broker.target, session, [Decision(pending.call_id, approve=True)])
        result = await call
    assert not result.is_error, text_of(result)
    assert target.read_text() == "hello"


async def test_an_edited_approval_runs_the_approved_input(broker: Any, files: Path) -> None:
    session = fresh_session()
    target = files / "edited.txt"
    async with gateway(url_of(broker), filesystem(files), "--session", session) as client:
        call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "rm -rf"}))
        pending = await next_pending(broker.target, session, "write_file")
        edited = json.loads(pending.input_json) | {"content": "safe"}
        await decide(broker.target, session, [Decision(pending.call_id, approve=True, edited_input_json=json.dumps(edited))])
        result = await call
    assert not result.is_error, text_of(result)
    assert target.read_text() == "safe"


async def test_a_denied_write_is_not_run_and_the_client_reads_the_denial(broker: Any, files: Path) -> None:
    session = fresh_session()
    target = files / "denied.txt"
    async with gateway(url_of(broker), filesystem(files), "--session", session) as client:
        call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "no"}))
        pending = await next_pending(broker.target, session, "write_file")
        [outcome] = await decide(broker.target, session, [Decision(pending.call_id, approve=False, reason="not that file")])
        result = await call
        # The session goes on: the client can still use the server.
        assert (await client.list_tools()).tools
    assert result.is_error
    assert text_of(result) == outcome.tool_result
    assert "not that file" in text_of(result)
    assert not target.exists()


async def test_a_policy_rule_allowing_read_file_needs_no_human(tmp_path: Path, files: Path) -> None:
    broker = broker_with_policy(
        tmp_path, [{"id": "reads-are-fine", "tool": "read_file", "effect": "allow", "description": "reads"}]
    )
    broker.start()
    try:
        session = fresh_session()
        (files / "notes.txt").write_text("remember the milk")
        async with gateway(url_of(broker), filesystem(files), "--session", session) as client:
            # Nobody approves anything in this test: the rule decides at submit.
            result = await client.call_tool("read_file", {"path": str(files / "notes.txt")})
        assert not result.is_error, text_of(result)
        assert "remember the milk" in text_of(result)
        [call] = await calls_in(broker.target, session)
        assert call.tool == "read_file"
        assert call.outcome.status == types_pb2.CALL_STATUS_APPROVED
        assert call.outcome.decided_by == "policy:reads-are-fine"
    finally:
        broker.stop()


async def test_a_rule_can_match_the_hints_the_server_declares(tmp_path: Path, files: Path) -> None:
    broker = broker_with_policy(tmp_path, [{
        "id": "declared-read-only", "tool": "*", "effect": "allow",
        "match": {"fields": [{"field": f"{HINTS_KEY}.readOnlyHint", "equals": True}]},
    }])
    broker.start()
    try:
        session = fresh_session()
        (files / "a.txt").write_text("a")
        async with gateway(url_of(broker), filesystem(files), "--session", session) as client:
            listing = await client.call_tool("list_directory", {"path": str(files)})
            assert not listing.is_error and "a.txt" in text_of(listing)
            # A write declares readOnlyHint false: it still waits for a human.
            write = asyncio.create_task(client.call_tool("write_file", {"path": str(files / "b.txt"), "content": "b"}))
            pending = await next_pending(broker.target, session, "write_file")
            await decide(broker.target, session, [Decision(pending.call_id, approve=False)])
            assert (await write).is_error
        decided = {c.tool: c.outcome.decided_by for c in await calls_in(broker.target, session)}
        assert decided == {"list_directory": "policy:declared-read-only", "write_file": "approver:alice@example.com"}
        assert not (files / "b.txt").exists()
    finally:
        broker.stop()


async def test_arguments_that_claim_hints_for_themselves_are_refused_unsubmitted(broker: Any, files: Path) -> None:
    session = fresh_session()
    target = files / "sneaky.txt"
    async with gateway(url_of(broker), filesystem(files), "--session", session) as client:
        result = await client.call_tool(
            "write_file", {"path": str(target), "content": "x", HINTS_KEY: {"readOnlyHint": True}}
        )
    assert result.is_error and HINTS_KEY in text_of(result)
    assert not target.exists()
    assert await calls_in(broker.target, session) == []


async def test_a_client_cancellation_cancels_the_call_at_the_broker(broker: Any, files: Path) -> None:
    session = fresh_session()
    target = files / "cancelled.txt"
    async with gateway(url_of(broker), filesystem(files), "--session", session) as client:
        call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "x"}))
        pending = await next_pending(broker.target, session, "write_file")
        # Cancelling the request makes the client send `notifications/cancelled`.
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        outcome = await wait_for_outcome(broker.target, session, pending.call_id)
        assert outcome.status == types_pb2.CALL_STATUS_CANCELLED
        assert outcome.decided_by == "agent"
        assert "cancelled" in outcome.reason
        # The gateway goes on serving the client.
        assert (await client.list_tools()).tools
    assert not target.exists()


async def test_a_call_waiting_across_a_broker_restart_still_gets_its_outcome(broker: Any, files: Path) -> None:
    session = fresh_session()
    target = files / "after-restart.txt"
    async with gateway(url_of(broker), filesystem(files), "--session", session) as client:
        call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "durable"}))
        pending = await next_pending(broker.target, session, "write_file")
        broker.restart()  # SIGKILL, then the same port and database
        assert not call.done()
        await decide(broker.target, session, [Decision(pending.call_id, approve=True)])
        result = await call
    assert not result.is_error, text_of(result)
    assert target.read_text() == "durable"


async def test_an_unreachable_broker_fails_closed_naming_the_problem(files: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    target = files / "unreviewed.txt"
    async with gateway(nowhere, filesystem(files)) as client:
        # Listing needs no broker: only tool calls are reviewed.
        assert (await client.list_tools()).tools
        result = await client.call_tool("write_file", {"path": str(target), "content": "x"})
    assert result.is_error
    assert f"The approval broker at {nowhere} could not be reached" in text_of(result)
    assert "The tool was not run." in text_of(result)
    assert not target.exists()


async def test_a_call_nobody_decides_in_time_is_cancelled_and_not_run(broker: Any, files: Path) -> None:
    session = fresh_session()
    target = files / "too-late.txt"
    async with gateway(url_of(broker), filesystem(files), "--session", session, "--timeout", "2s") as client:
        result = await client.call_tool("write_file", {"path": str(target), "content": "x"})
    assert result.is_error
    assert "No approver decided within 2s" in text_of(result)
    [call] = await calls_in(broker.target, session)
    assert call.outcome.status == types_pb2.CALL_STATUS_CANCELLED
    assert not target.exists()


async def test_a_session_per_connection_numbers_its_calls_and_shows_the_mcp_request_id(broker: Any, files: Path) -> None:
    workspace = f"/ws/{uuid.uuid4().hex}"
    async with gateway(url_of(broker), filesystem(files), "--workspace", workspace) as client:
        call = asyncio.create_task(client.call_tool("list_allowed_directories", {}))
        pending = await pending_anywhere(broker.target, lambda c: c.workspace == workspace)
        assert pending.session_id.startswith("mcp-")
        # The call's number on this connection, then the MCP request id: a reused request id is
        # a new call (test_deny_by_default.py).
        number, request_id = pending.call_id.split("/")
        assert number == "1" and request_id.isdigit(), pending.call_id
        await decide(broker.target, pending.session_id, [Decision(pending.call_id, approve=True)])
        assert not (await call).is_error


async def test_a_broker_that_accepts_but_never_answers_fails_closed(files: Path) -> None:
    hung = SilentListener()
    target = files / "hung.txt"
    try:
        async with gateway(f"http://127.0.0.1:{hung.port}", filesystem(files), "--timeout", "2s") as client:
            result = await client.call_tool("write_file", {"path": str(target), "content": "x"})
    finally:
        hung.close()
    assert result.is_error
    assert "No approver decided within 2s" in text_of(result)
    assert "The tool was not run." in text_of(result)
    assert not target.exists()


async def test_everything_but_tool_calls_passes_through_untouched(broker: Any) -> None:
    """server-everything's tools, resources, prompts, progress, and a request of its own to the
    client (roots/list): the same through the gateway as without it."""
    everything = server_command("mcp-server-everything", "stdio")
    progress: list[float] = []
    roots_asked = asyncio.Event()

    async def list_roots(_context: Any) -> mcp_types.ListRootsResult:
        roots_asked.set()
        return mcp_types.ListRootsResult(roots=[mcp_types.Root(uri="file:///srv/project", name="project")])

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    session = fresh_session()
    async with gateway(url_of(broker), everything, "--session", session, list_roots_callback=list_roots) as client:
        through = await client.list_tools()
        resources = await client.list_resources()
        first = resources.resources[0]
        read = await client.read_resource(first.uri)
        prompts = await client.list_prompts()
        prompt = await client.get_prompt("simple-prompt")

        run = asyncio.create_task(client.call_tool(
            "trigger-long-running-operation", {"duration": 1, "steps": 3}, progress_callback=on_progress
        ))
        pending = await next_pending(broker.target, session, "trigger-long-running-operation")
        await decide(broker.target, session, [Decision(pending.call_id, approve=True)])
        finished = await run

        roots = asyncio.create_task(client.call_tool("get-roots-list", {}))
        pending = await next_pending(broker.target, session, "get-roots-list")
        await decide(broker.target, session, [Decision(pending.call_id, approve=True)])
        listed_roots = await roots

    params = StdioServerParameters(command=everything[0], args=everything[1:], env=clean_env())
    async with stdio_client(params) as (read_stream, write_stream):
        async with ClientSession(read_stream, write_stream, list_roots_callback=list_roots) as direct:
            await direct.initialize()
            direct_tools = await direct.list_tools()
            direct_resources = await direct.list_resources()
            direct_prompts = await direct.list_prompts()

    def described(tools: Any) -> list[Any]:
        return sorted((t.name, t.annotations.model_dump() if t.annotations else None, t.input_schema) for t in tools.tools)

    assert described(through) == described(direct_tools)
    assert [r.uri for r in resources.resources] == [r.uri for r in direct_resources.resources]
    assert read.contents and str(read.contents[0].uri) == str(first.uri)
    assert [p.name for p in prompts.prompts] == [p.name for p in direct_prompts.prompts]
    assert prompt.messages
    assert not finished.is_error, text_of(finished)
    # The server's progress reaches the client under the client's own token. (Each is relayed as
    # it comes, so the last one may arrive just after the result, and the client drops it.)
    assert progress and progress[0] == 1.0, progress
    assert roots_asked.is_set()
    assert not listed_roots.is_error and "file:///srv/project" in text_of(listed_roots)


async def test_streamable_http_on_both_sides(broker: Any, tmp_path: Path) -> None:
    """A client over Streamable HTTP (`--listen`) and a server over Streamable HTTP (`--upstream`)."""
    server_port, gateway_port = free_port(), free_port()
    env = clean_env() | {"PORT": str(server_port)}
    server = Listener(server_command("mcp-server-everything", "streamableHttp"), server_port, tmp_path / "server.log", env)
    session = fresh_session()
    gateway_process = Listener(
        [str(broker_binary()), "mcp-gateway", "--broker", url_of(broker), "--session", session,
         "--listen", f"127.0.0.1:{gateway_port}", "--upstream", f"http://127.0.0.1:{server_port}/mcp"],
        gateway_port, tmp_path / "gateway.log",
    )
    try:
        async with http_session(f"http://127.0.0.1:{gateway_port}/mcp") as client:
            assert "echo" in {t.name for t in (await client.list_tools()).tools}
            approved = asyncio.create_task(client.call_tool("echo", {"message": "over http"}))
            pending = await next_pending(broker.target, session, "echo")
            await decide(broker.target, session, [Decision(pending.call_id, approve=True)])
            denied = asyncio.create_task(client.call_tool("echo", {"message": "not this"}))
            second = await next_pending(broker.target, session, "echo")
            await decide(broker.target, session, [Decision(second.call_id, approve=False, reason="no")])
            approved_result, denied_result = await approved, await denied
        assert not approved_result.is_error and "over http" in text_of(approved_result)
        assert denied_result.is_error and "not this" not in text_of(denied_result)
    finally:
        gateway_process.stop()
        server.stop()


async def test_streamable_http_clients_each_get_their_own_server_process(broker: Any, tmp_path: Path, files: Path) -> None:
    """`--listen` in front of a stdio server: each MCP session spawns its own server."""
    port = free_port()
    session = fresh_session()
    process = Listener(
        [str(broker_binary()), "mcp-gateway", "--broker", url_of(broker), "--session", session,
         "--listen", f"127.0.0.1:{port}", "--", *filesystem(files)],
        port, tmp_path / "gateway.log",
    )
    try:
        for name in ("one.txt", "two.txt"):
            async with http_session(f"http://127.0.0.1:{port}/mcp") as client:
                write = asyncio.create_task(client.call_tool("write_file", {"path": str(files / name), "content": name}))
                pending = await next_pending(broker.target, session, "write_file")
                await decide(broker.target, session, [Decision(pending.call_id, approve=True)])
                assert not (await write).is_error
        assert (files / "one.txt").read_text() == "one.txt" and (files / "two.txt").read_text() == "two.txt"
        # Two connections, one shared session: distinct call ids although each started at the same request id.
        ids = [c.call_id for c in await calls_in(broker.target, session)]
        assert len(set(ids)) == 2
    finally:
        process.stop()


def documented_entries() -> list[dict[str, Any]]:
    """The client config entries of docs/mcp-gateway.md (its ```json blocks naming servers)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "mcp-gateway.md").read_text()
    entries = []
    for block in text.split("```json\n")[1:]:
        config = json.loads(block.split("\n```", 1)[0])
        servers = config.get("mcpServers") or config.get("servers")
        if servers:
            entries.extend(servers.values())
    return entries


@pytest.mark.parametrize("index", [0, 1], ids=["mcpServers", "vscode-servers"])
async def test_the_documented_client_config_entries_run_as_written(broker: Any, files: Path, index: int) -> None:
    """Each entry, with only the binary's path, the broker's address and the folder filled in;
    `npx -y` finds the server `npm ci` installed beside this file, so no download happens."""
    entries = documented_entries()
    assert len(entries) == 2, entries
    entry = entries[index]
    assert entry["command"] == "approval-broker" and entry.get("type", "stdio") == "stdio"
    fill = {"http://127.0.0.1:50051": url_of(broker), "/Users/me/Documents": str(files), "${workspaceFolder}": str(files)}
    args = [fill.get(arg, arg) for arg in entry["args"]]
    assert url_of(broker) in args and str(files) in args
    params = StdioServerParameters(
        command=str(broker_binary()), args=args, env=clean_env(), cwd=str(Path(__file__).resolve().parent)
    )
    target = files / "from-the-docs.txt"
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as client:
            await client.initialize()
            call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "documented"}))
            pending = await pending_anywhere(broker.target, lambda c: c.tool == "write_file")
            await decide(broker.target, pending.session_id, [Decision(pending.call_id, approve=True)])
            assert not (await call).is_error
    assert target.read_text() == "documented"


async def test_the_high_level_client_in_its_default_auto_mode_falls_back_to_initialize(broker: Any, files: Path) -> None:
    """`mcp.Client` probes `server/discover` first; the gateway, which speaks the handshake era,
    makes it fall back to `initialize`, and tool calls are reviewed as ever."""
    from mcp import Client

    session = fresh_session()
    target = files / "auto.txt"
    params = StdioServerParameters(
        command=str(broker_binary()),
        args=["mcp-gateway", "--broker", url_of(broker), "--session", session, "--", *filesystem(files)],
        env=clean_env(),
    )
    async with Client(params) as client:
        assert client.session.initialize_result is not None
        assert client.session.protocol_version == "2025-11-25"
        call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "auto"}))
        pending = await next_pending(broker.target, session, "write_file")
        await decide(broker.target, session, [Decision(pending.call_id, approve=True)])
        assert not (await call).is_error
    assert target.read_text() == "auto"


async def test_calls_left_waiting_by_a_client_that_disconnects_are_cancelled(broker: Any, files: Path) -> None:
    """The client sends a tools/call and goes away (its end of standard input closes) without
    cancelling: approvers are not left with a question nobody waits for."""
    session = fresh_session()
    target = files / "abandoned.txt"
    gateway_process = subprocess.Popen(
        [str(broker_binary()), "mcp-gateway", "--broker", url_of(broker), "--session", session, "--",
         *filesystem(files)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=clean_env(),
    )
    assert gateway_process.stdin is not None and gateway_process.stdout is not None

    def send(message: dict[str, Any]) -> None:
        assert gateway_process.stdin is not None
        gateway_process.stdin.write((json.dumps(message) + "\n").encode())
        gateway_process.stdin.flush()

    try:
        send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        initialized = json.loads(await asyncio.to_thread(gateway_process.stdout.readline))
        assert initialized["id"] == 0 and "result" in initialized, initialized
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"name": "write_file", "arguments": {"path": str(target), "content": "x"}}})
        pending = await next_pending(broker.target, session, "write_file")
        gateway_process.stdin.close()
        outcome = await wait_for_outcome(broker.target, session, pending.call_id)
        assert outcome.status == types_pb2.CALL_STATUS_CANCELLED
        assert "disconnected" in outcome.reason
        assert await asyncio.to_thread(gateway_process.wait, 60) == 0
    finally:
        if gateway_process.poll() is None:
            gateway_process.kill()
            gateway_process.wait()
    assert not target.exists()
