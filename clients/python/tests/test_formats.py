"""The Anthropic and OpenAI helpers, on message objects built with the official `anthropic` and
`openai` packages (no network), against a real broker. Each test checks that the history the
helper completes is one the provider accepts: every tool call answered exactly once, in order,
right after the turn that asked."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import anthropic.types
import pytest
from conftest import BrokerProcess, Decision, approve_when_pending, free_port
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam, ChatCompletionToolMessageParam
from openai.types.responses import Response, ResponseInputItemParam
from pydantic import TypeAdapter

from approval_broker import Broker, SyncBroker
from approval_broker.anthropic import review_tool_uses, tool_results
from approval_broker.openai import function_call_outputs, tool_messages


def new_session() -> str:
    return f"py-fmt-{uuid.uuid4().hex[:12]}"


def anthropic_reply() -> anthropic.types.Message:
    return anthropic.types.Message.model_validate(
        {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 120, "output_tokens": 80},
            "content": [
                {"type": "text", "text": "I will read the script, clean up, and rewrite it."},
                {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "build.sh"}},
                {"type": "tool_use", "id": "toolu_02", "name": "run_shell", "input": {"command": "rm -rf build"}},
                {"type": "tool_use", "id": "toolu_03", "name": "write_file", "input": {"path": "build.sh", "content": ""}},
            ],
        }
    )


def assert_anthropic_accepts(history: list[dict[str, Any]]) -> None:
    """The Messages API's rules for tool use: roles alternate; the user message after an
    assistant turn with tool_use blocks starts with exactly one tool_result per tool_use, in the
    same order, and no tool_result answers anything else."""
    adapter = TypeAdapter(anthropic.types.ToolResultBlockParam)
    for earlier, later in zip(history, history[1:]):
        assert earlier["role"] != later["role"], "roles must alternate"
    for i, message in enumerate(history):
        if message["role"] != "assistant":
            continue
        uses = [b.id if hasattr(b, "id") else b["id"] for b in message["content"] if getattr(b, "type", None) == "tool_use" or (isinstance(b, dict) and b.get("type") == "tool_use")]
        if not uses:
            continue
        answer = list(history[i + 1]["content"])
        results = [b for b in answer if b["type"] == "tool_result"]
        assert answer[: len(results)] == results, "tool_result blocks must come first"
        for block in results:
            adapter.validate_python(block)
        assert [b["tool_use_id"] for b in results] == uses


async def test_anthropic_tool_results_answer_every_tool_use_in_order(broker_process: BrokerProcess) -> None:
    session = new_session()
    reply = anthropic_reply()
    ran: list[tuple[str, dict[str, Any]]] = []

    async def run(name: str, tool_input: dict[str, Any]) -> str:
        ran.append((name, tool_input))
        return "#!/bin/sh\nmake\n"

    approver = asyncio.create_task(
        approve_when_pending(
            broker_process.target,
            session,
            [
                Decision("toolu_01", approve=True, edited_input_json='{"path": "build.sh", "limit": 5}'),
                Decision("toolu_02", approve=False, reason="use make clean"),
            ],
        )
    )
    async with Broker(broker_process.target) as broker:
        results = await tool_results(broker, session, reply.content, run=run, timeout=30)
    await approver

    # Only the approved call ran, with the approver's edited input.
    assert ran == [("read_file", {"path": "build.sh", "limit": 5})]
    assert results["role"] == "user"
    blocks = list(results["content"])
    assert blocks == [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "#!/bin/sh\nmake\n"},
        {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": True,
         "content": "The user denied this tool call. Reason: use make clean"},
        {"type": "tool_result", "tool_use_id": "toolu_03", "is_error": True,
         "content": "Not run: another tool call in the same batch was denied."},
    ]
    history = [
        {"role": "user", "content": "Tidy up the build."},
        {"role": "assistant", "content": reply.content},
        results,
    ]
    assert_anthropic_accepts(history)  # type: ignore[arg-type]


async def test_anthropic_review_gives_the_input_to_run_and_a_failing_tool_still_gets_a_result(
    broker_process: BrokerProcess,
) -> None:
    session = new_session()
    reply = anthropic_reply()
    approver = asyncio.create_task(
        approve_when_pending(
            broker_process.target, session, [Decision(c, approve=True) for c in ("toolu_01", "toolu_02", "toolu_03")]
        )
    )
    async with Broker(broker_process.target) as broker:
        reviewed = await review_tool_uses(broker, session, reply, timeout=30)  # a whole Message works too
        await approver
        assert [(r.call_id, r.name, r.approved) for r in reviewed] == [
            ("toolu_01", "read_file", True), ("toolu_02", "run_shell", True), ("toolu_03", "write_file", True)
        ]
        assert reviewed[1].input == {"command": "rm -rf build"}
        with pytest.raises(ValueError, match="run it and pass its output"):
            reviewed[0].result()

        def run(name: str, tool_input: dict[str, Any]) -> str:
            if name == "run_shell":
                raise PermissionError("read-only file system")
            return "done"

        # Same calls again: already decided, so the broker answers at once.
        results = await tool_results(broker, session, reply.content, run=run, timeout=5)
    blocks = list(results["content"])
    assert blocks[1] == {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": True,
                         "content": "The tool failed: PermissionError: read-only file system"}
    assert [b["content"] for b in (blocks[0], blocks[2])] == ["done", "done"]
    assert_anthropic_accepts([{"role": "user", "content": "go"}, {"role": "assistant", "content": reply.content}, results])  # type: ignore[list-item]


def openai_reply(arguments_of_second: str = '{"command": "rm -rf build"}') -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_760_000_000,
            "model": "gpt-4.1",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "call_a", "type": "function",
                             "function": {"name": "read_file", "arguments": '{"path": "build.sh"}'}},
                            {"id": "call_b", "type": "function",
                             "function": {"name": "run_shell", "arguments": arguments_of_second}},
                            {"id": "call_c", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch"}},
                        ],
                    },
                }
            ],
        }
    )


def assert_openai_accepts(history: list[Any]) -> None:
    """Chat Completions' rules: an assistant message with tool_calls is followed by one `tool`
    message per tool call id, in order, before any other message."""
    tool_adapter = TypeAdapter(ChatCompletionToolMessageParam)
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(history)
    for i, message in enumerate(history):
        if message["role"] != "assistant" or not message.get("tool_calls"):
            continue
        ids = [c["id"] for c in message["tool_calls"]]
        answers = history[i + 1 : i + 1 + len(ids)]
        for answer in answers:
            tool_adapter.validate_python(answer)
        assert [a["role"] for a in answers] == ["tool"] * len(ids)
        assert [a["tool_call_id"] for a in answers] == ids
        after = history[i + 1 + len(ids) :]
        assert not after or after[0]["role"] != "tool", "no tool message may answer a call twice"


async def test_openai_tool_messages_answer_every_tool_call_in_order(broker_process: BrokerProcess) -> None:
    session = new_session()
    message = openai_reply().choices[0].message
    ran: list[tuple[str, dict[str, Any]]] = []

    def run(name: str, tool_input: dict[str, Any]) -> str:
        ran.append((name, tool_input))
        return f"ok: {name}"

    approver = asyncio.create_task(
        approve_when_pending(
            broker_process.target,
            session,
            [Decision("call_a", approve=True), Decision("call_c", approve=True), Decision("call_b", approve=False, reason="no")],
        )
    )
    async with Broker(broker_process.target) as broker:
        tool_msgs = await tool_messages(broker, session, message.tool_calls, run=run, timeout=30)
    await approver

    assert ran == [("read_file", {"path": "build.sh"}), ("apply_patch", {"input": "*** Begin Patch"})]
    assert tool_msgs == [
        {"role": "tool", "tool_call_id": "call_a", "content": "ok: read_file"},
        {"role": "tool", "tool_call_id": "call_b", "content": "The user denied this tool call. Reason: no"},
        {"role": "tool", "tool_call_id": "call_c", "content": "ok: apply_patch"},
    ]
    history = [
        {"role": "user", "content": "Tidy up the build."},
        message.model_dump(exclude_none=True),
        *tool_msgs,
    ]
    assert_openai_accepts(history)


async def test_a_tool_call_with_arguments_that_are_not_a_json_object_still_gets_its_tool_message(
    broker_process: BrokerProcess,
) -> None:
    session = new_session()
    message = openai_reply(arguments_of_second='{"command": "rm -rf bu').choices[0].message  # cut off
    approver = asyncio.create_task(
        approve_when_pending(broker_process.target, session, [Decision("call_a", approve=True), Decision("call_c", approve=True)])
    )
    async with Broker(broker_process.target) as broker:
        tool_msgs = await tool_messages(broker, session, message.tool_calls, run=lambda n, i: "ok", timeout=30)
    await approver
    assert [m["tool_call_id"] for m in tool_msgs] == ["call_a", "call_b", "call_c"]
    assert tool_msgs[1]["content"].startswith("The approval broker refused this tool call; the tool was not run. Reason:")
    assert "input_json" in tool_msgs[1]["content"]
    assert_openai_accepts([{"role": "user", "content": "go"}, message.model_dump(exclude_none=True), *tool_msgs])


async def test_a_turn_without_tool_calls_asks_nothing() -> None:
    # An unreachable broker: any contact would fail.
    async with Broker(f"127.0.0.1:{free_port()}", unavailable_timeout=0.1) as broker:
        assert await tool_messages(broker, new_session(), None, run=lambda n, i: "") == []
        text_only = [anthropic.types.TextBlock(type="text", text="Done.")]
        assert (await tool_results(broker, new_session(), text_only, run=lambda n, i: ""))["content"] == []


def test_sync_code_reviews_a_turn_and_builds_the_results_itself(broker_process: BrokerProcess) -> None:
    session = new_session()
    reply = anthropic_reply()
    approver = threading.Thread(
        target=lambda: asyncio.run(
            approve_when_pending(broker_process.target, session, [Decision("toolu_01", approve=True), Decision("toolu_02", approve=False)])
        )
    )
    approver.start()
    with SyncBroker(broker_process.target) as broker:
        reviewed = broker.call(review_tool_uses, session, reply.content, timeout=30)
    approver.join()
    results = {"role": "user", "content": [r.result(f"ran {r.name}") if r.approved else r.result() for r in reviewed]}
    assert [b.get("is_error", False) for b in results["content"]] == [False, True, True]
    assert results["content"][0]["content"] == "ran read_file"
    assert_anthropic_accepts([{"role": "user", "content": "go"}, {"role": "assistant", "content": reply.content}, results])


async def test_responses_api_function_calls_get_one_output_each_in_order(broker_process: BrokerProcess) -> None:
    session = new_session()
    response = Response.model_validate(
        {
            "id": "resp_1", "object": "response", "created_at": 1_760_000_000, "model": "gpt-4.1",
            "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "id": "fc_1", "call_id": "call_x", "name": "read_file",
                 "arguments": '{"path": "a.txt"}', "status": "completed"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_y", "name": "run_shell",
                 "arguments": '{"command": "rm -rf /"}', "status": "completed"},
            ],
        }
    )
    approver = asyncio.create_task(
        approve_when_pending(broker_process.target, session, [Decision("call_x", approve=True), Decision("call_y", approve=False, reason="no")])
    )
    async with Broker(broker_process.target) as broker:
        items = await function_call_outputs(broker, session, response.output, run=lambda n, i: f"read {i['path']}", timeout=30)
    await approver
    assert items == [
        {"type": "function_call_output", "call_id": "call_x", "output": "read a.txt"},
        {"type": "function_call_output", "call_id": "call_y", "output": "The user denied this tool call. Reason: no"},
    ]
    # The next request's input: the output items as given back, then one output per call.
    next_input = [*[o.model_dump(exclude_none=True) for o in response.output], *items]
    TypeAdapter(list[ResponseInputItemParam]).validate_python(next_input)
    calls = [i["call_id"] for i in next_input if i["type"] == "function_call"]
    assert [i["call_id"] for i in next_input if i["type"] == "function_call_output"] == calls
