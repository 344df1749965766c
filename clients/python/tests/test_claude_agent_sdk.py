"""The `can_use_tool` adapter, called the way the Claude Agent SDK calls it: by the SDK's own
control-request handler (`Query._handle_control_request`, what runs when Claude Code asks for a
permission), with the SDK's `ToolPermissionContext`, and its answer read back as the JSON the SDK
writes to Claude Code. No model, no CLI, no network: a recording transport stands in for Claude
Code."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, PermissionResultAllow, PermissionResultDeny, ToolPermissionContext
from claude_agent_sdk._internal.query import Query
from claude_agent_sdk._internal.transport import Transport
from conftest import BrokerProcess, Decision, approve_when_pending, free_port, pending_calls, wait_until_pending

from approval_broker import Broker, Status
from approval_broker.claude_agent_sdk import can_use_tool


class RecordingTransport(Transport):
    """Claude Code's side of the control protocol: keeps what the SDK writes."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def connect(self) -> None: ...

    async def write(self, data: str) -> None:
        self.written.append(json.loads(data))

    def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        raise NotImplementedError

    async def close(self) -> None: ...

    def is_ready(self) -> bool:
        return True

    async def end_input(self) -> None: ...


def permission_request(request_id: str, tool_use_id: str, tool: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    """A `can_use_tool` control request as Claude Code sends it."""
    return {
        "type": "control_request",
        "request_id": request_id,
        "request": {
            "subtype": "can_use_tool",
            "tool_name": tool,
            "input": tool_input,
            "tool_use_id": tool_use_id,
            "permission_suggestions": [],
            "title": f"Claude wants to use {tool}",
            "display_name": tool,
        },
    }


async def test_claude_code_gets_allow_with_the_approved_input_and_deny_with_the_broker_text(
    broker_process: BrokerProcess,
) -> None:
    session = f"claude-{uuid.uuid4().hex[:8]}"
    async with Broker(broker_process.target) as broker:
        callback = can_use_tool(broker, session)
        options = ClaudeAgentOptions(can_use_tool=callback)  # what a user writes
        transport = RecordingTransport()
        query = Query(transport=transport, is_streaming_mode=True, can_use_tool=options.can_use_tool)
        asks = [
            asyncio.create_task(query._handle_control_request(permission_request("req_1", "toolu_A", "Bash", {"command": "ls"}))),  # type: ignore[arg-type]
            asyncio.create_task(query._handle_control_request(permission_request("req_2", "toolu_B", "Write", {"file_path": "/etc/hosts", "content": "x"}))),  # type: ignore[arg-type]
        ]
        await wait_until_pending(broker_process.target, session, ["toolu_A", "toolu_B"])
        [shown] = [c for c in await pending_calls(broker_process.target, session) if c.call_id == "toolu_A"]
        assert (shown.tool, shown.title) == ("Bash", "Claude wants to use Bash")
        await approve_when_pending(
            broker_process.target,
            session,
            [
                Decision("toolu_A", approve=True, edited_input_json='{"command": "ls -la"}'),
                Decision("toolu_B", approve=False, reason="not the hosts file"),
            ],
        )
        await asyncio.gather(*asks)

    answers = {w["response"]["request_id"]: w["response"] for w in transport.written}
    assert answers["req_1"] == {
        "subtype": "success", "request_id": "req_1", "response": {"behavior": "allow", "updatedInput": {"command": "ls -la"}}
    }
    assert answers["req_2"] == {
        "subtype": "success",
        "request_id": "req_2",
        "response": {"behavior": "deny", "message": "The user denied this tool call. Reason: not the hosts file"},
    }


async def test_can_use_tool_denies_when_the_broker_is_unreachable() -> None:
    async with Broker(f"127.0.0.1:{free_port()}", unavailable_timeout=0.5) as broker:
        result = await can_use_tool(broker, "s")("Bash", {"command": "rm -rf /"}, ToolPermissionContext(tool_use_id="toolu_X"))
    assert isinstance(result, PermissionResultDeny)
    assert result.message.startswith("The approval broker could not be asked, so this tool call was not run.")
    assert not result.interrupt


async def test_can_use_tool_returns_the_sdk_result_types(broker_process: BrokerProcess) -> None:
    session = f"claude-{uuid.uuid4().hex[:8]}"
    async with Broker(broker_process.target) as broker:
        ask = asyncio.create_task(
            can_use_tool(broker, session)("Read", {"file_path": "README.md"}, ToolPermissionContext(tool_use_id="toolu_R"))
        )
        await approve_when_pending(broker_process.target, session, [Decision("toolu_R", approve=True)])
        result = await ask
    assert result == PermissionResultAllow(updated_input={"file_path": "README.md"})


async def test_a_withdrawn_permission_request_cancels_the_call(broker_process: BrokerProcess) -> None:
    session = f"claude-{uuid.uuid4().hex[:8]}"
    async with Broker(broker_process.target) as broker:
        # What the SDK does on Claude Code's control_cancel_request: it cancels the callback's task.
        ask = asyncio.create_task(can_use_tool(broker, session)("Bash", {"command": "sleep 1"}, ToolPermissionContext(tool_use_id="toolu_W")))
        await wait_until_pending(broker_process.target, session, ["toolu_W"])
        ask.cancel()
        [outcome] = await asyncio.wait_for(broker.wait(session, ["toolu_W"]), 10)
    assert outcome.status is Status.CANCELLED
    assert outcome.tool_result.endswith("Claude withdrew the permission request")
