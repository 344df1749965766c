"""The OpenAI Agents SDK adapter, inside a real `Runner.run`: a scripted model (the SDK's `Model`
interface, no network) asks for two function tools declared `needs_approval=True`; the run
pauses with its interruptions; `resolve_interruptions` decides them through the broker; the run
goes on from that state, runs only what was approved, and hands the model the broker's text for
the rest."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, Model, ModelResponse, RunContextWrapper, Runner, ToolApprovalItem, Usage, function_tool, set_tracing_disabled
from conftest import BrokerProcess, Decision, approve_when_pending, free_port
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from approval_broker import Broker, BrokerUnavailable
from approval_broker.openai_agents import EDITED_TEXT, on_approval, resolve_interruptions

set_tracing_disabled(True)


class ScriptedModel(Model):
    """First turn: two tool calls. Second turn: a final answer. Keeps every input it was given."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(input)
        if len(self.inputs) == 1:
            output: list[Any] = [
                ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_read", name="read_file",
                                         arguments='{"path": "build.sh"}', status="completed"),
                ResponseFunctionToolCall(type="function_call", id="fc_2", call_id="call_delete", name="delete_file",
                                         arguments='{"path": "build"}', status="completed"),
            ]
        else:
            output = [ResponseOutputMessage(type="message", id="msg_1", role="assistant", status="completed",
                                            content=[ResponseOutputText(type="output_text", text="done", annotations=[])])]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def agent_with_tools(model: Model, ran: list[tuple[str, str]]) -> Agent[Any]:
    @function_tool(needs_approval=True)
    def read_file(path: str) -> str:
        """Reads a file."""
        ran.append(("read_file", path))
        return f"contents of {path}"

    @function_tool(needs_approval=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        ran.append(("delete_file", path))
        return "deleted"

    return Agent(name="builder", instructions="Tidy up.", model=model, tools=[read_file, delete_file])


def tool_outputs(model_input: list[Any]) -> dict[str, str]:
    return {i["call_id"]: i["output"] for i in model_input if isinstance(i, dict) and i.get("type") == "function_call_output"}


async def test_a_paused_run_goes_on_with_the_broker_outcomes(broker_process: BrokerProcess) -> None:
    session = f"agents-{uuid.uuid4().hex[:8]}"
    model, ran = ScriptedModel(), []
    agent = agent_with_tools(model, ran)

    result = await Runner.run(agent, "Tidy up the build.")
    assert [i.tool_name for i in result.interruptions] == ["read_file", "delete_file"]
    assert ran == []

    approver = asyncio.create_task(
        approve_when_pending(
            broker_process.target,
            session,
            [
                Decision("call_read", approve=True),
                Decision("call_delete", approve=False, reason="keep the build directory"),
            ],
        )
    )
    async with Broker(broker_process.target) as broker:
        state = await resolve_interruptions(broker, session, result, timeout=30)
    await approver
    result = await Runner.run(agent, state)

    assert result.final_output == "done"
    assert ran == [("read_file", "build.sh")]  # the denied call did not run
    outputs = tool_outputs(model.inputs[-1])
    assert outputs["call_read"] == "contents of build.sh"
    assert outputs["call_delete"] == "The user denied this tool call. Reason: keep the build directory"


async def test_an_approval_with_an_edited_input_does_not_run_the_original(broker_process: BrokerProcess) -> None:
    session = f"agents-{uuid.uuid4().hex[:8]}"
    model, ran = ScriptedModel(), []
    agent = agent_with_tools(model, ran)
    result = await Runner.run(agent, "Tidy up the build.")
    approver = asyncio.create_task(
        approve_when_pending(
            broker_process.target,
            session,
            [Decision("call_read", approve=True, edited_input_json='{"path": "Makefile"}'), Decision("call_delete", approve=True)],
        )
    )
    async with Broker(broker_process.target) as broker:
        state = await resolve_interruptions(broker, session, result, timeout=30)
    await approver
    result = await Runner.run(agent, state)
    assert ran == [("delete_file", "build")]
    outputs = tool_outputs(model.inputs[-1])
    assert outputs["call_read"] == EDITED_TEXT + '{"path":"Makefile"}'
    assert outputs["call_delete"] == "deleted"


async def test_resolve_interruptions_raises_when_the_broker_is_unreachable() -> None:
    model, ran = ScriptedModel(), []
    result = await Runner.run(agent_with_tools(model, ran), "Tidy up.")
    async with Broker(f"127.0.0.1:{free_port()}", unavailable_timeout=0.5) as broker:
        with pytest.raises(BrokerUnavailable):
            await resolve_interruptions(broker, "s", result)
    assert ran == []


async def test_on_approval_answers_with_the_sdk_result_shape(broker_process: BrokerProcess) -> None:
    session = f"agents-{uuid.uuid4().hex[:8]}"
    raw = {"type": "custom_tool_call", "call_id": "call_patch", "name": "apply_patch", "input": "*** Begin Patch"}
    items = [ToolApprovalItem(agent=Agent(name="a"), raw_item=raw, tool_name="apply_patch")]
    context = RunContextWrapper(context=None)
    async with Broker(broker_process.target) as broker:
        decide = on_approval(broker, session)
        ask = asyncio.create_task(decide(context, items[0]))
        await approve_when_pending(broker_process.target, session, [Decision("call_patch", approve=False, reason="no")])
        assert await ask == {"approve": False, "reason": "The user denied this tool call. Reason: no"}
    async with Broker(f"127.0.0.1:{free_port()}", unavailable_timeout=0.3) as nobody:
        answer = await on_approval(nobody, session)(context, items[0])
    assert answer["approve"] is False and answer["reason"].startswith("The approval broker could not be asked")
