"""OpenAI Chat Completions: a message's `tool_calls` in, the `role: tool` messages out.

    reply = client.chat.completions.create(...).choices[0].message
    messages.append(reply)
    messages += await tool_messages(broker, session_id, reply.tool_calls, run=run_tool)

`tool_messages` submits the turn's tool calls as one batch, runs the approved ones with their
approved input through `run(name, input)`, and returns one `role: tool` message per tool call,
in order. A call that did not run gets the broker's text as its content. Function tool calls carry
their `arguments` (JSON text) as the input; a custom tool call's free-form input is submitted as
`{"input": "<text>"}`. For control over running, use `review_tool_calls` and `result(...)`.

The Responses API's `function_call` output items work the same way with `function_call_outputs`,
which returns one `function_call_output` input item per call, in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._turns import ReviewedCall, RunTool, field, review_turn, run_approved
from .client import Broker
from .models import OnDeny

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageToolCallUnion, ChatCompletionToolMessageParam
    from openai.types.responses import ResponseInputItemParam, ResponseOutputItem


@dataclass(frozen=True)
class ReviewedToolCall(ReviewedCall):
    def result(self, content: str | None = None) -> ChatCompletionToolMessageParam:
        """The `role: tool` message for this call: for a call that did not run, the broker's
        text; for an approved one, `content`, the tool's output."""
        if not self.approved:
            return {"role": "tool", "tool_call_id": self.call_id, "content": self.outcome.tool_result}
        if content is None:
            raise ValueError(f"{self.call_id} was approved: run it and pass its output")
        return {"role": "tool", "tool_call_id": self.call_id, "content": content}


def calls_of(tool_calls: Iterable[ChatCompletionMessageToolCallUnion | dict[str, Any]] | None) -> list[tuple[str, str, Any]]:
    """The (id, name, input) of each tool call, function or custom."""
    calls = []
    for call in tool_calls or ():
        if field(call, "type") == "custom":
            custom = field(call, "custom")
            calls.append((field(call, "id"), field(custom, "name"), {"input": field(custom, "input")}))
        else:
            function = field(call, "function")
            calls.append((field(call, "id"), field(function, "name"), field(function, "arguments")))
    return calls


async def review_tool_calls(
    broker: Broker,
    session_id: str,
    tool_calls: Iterable[ChatCompletionMessageToolCallUnion | dict[str, Any]] | None,
    *,
    on_deny: OnDeny = OnDeny.SKIP_REST,
    timeout: float | None = None,
    workspace: str = "",
) -> list[ReviewedToolCall]:
    """Submits the tool calls as one batch; one `ReviewedToolCall` per call, in order."""
    calls = calls_of(tool_calls)
    outcomes = await review_turn(broker, session_id, calls, on_deny=on_deny, timeout=timeout, workspace=workspace)
    return [ReviewedToolCall(call_id, name, outcome) for (call_id, name, _), outcome in zip(calls, outcomes)]


async def tool_messages(
    broker: Broker,
    session_id: str,
    tool_calls: Iterable[ChatCompletionMessageToolCallUnion | dict[str, Any]] | None,
    *,
    run: RunTool,
    on_deny: OnDeny = OnDeny.SKIP_REST,
    timeout: float | None = None,
    workspace: str = "",
) -> list[ChatCompletionToolMessageParam]:
    """One `role: tool` message per tool call of the turn; see the module."""
    messages: list[ChatCompletionToolMessageParam] = []
    for item in await review_tool_calls(broker, session_id, tool_calls, on_deny=on_deny, timeout=timeout, workspace=workspace):
        if item.approved:
            output, _ = await run_approved(run, item.name, item.input)
            messages.append(item.result(output))
        else:
            messages.append(item.result())
    return messages


def function_calls_of(output: Iterable[ResponseOutputItem | dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """The (call_id, name, arguments) of each `function_call` item of a Responses API output."""
    return [
        (field(item, "call_id"), field(item, "name"), field(item, "arguments"))
        for item in output
        if field(item, "type") == "function_call"
    ]


async def function_call_outputs(
    broker: Broker,
    session_id: str,
    output: Iterable[ResponseOutputItem | dict[str, Any]],
    *,
    run: RunTool,
    on_deny: OnDeny = OnDeny.SKIP_REST,
    timeout: float | None = None,
    workspace: str = "",
) -> list[ResponseInputItemParam]:
    """Responses API: one `function_call_output` item per `function_call` of `output` (e.g.
    `response.output`), in order: the tool's output when approved, else the broker's text."""
    calls = function_calls_of(output)
    outcomes = await review_turn(broker, session_id, calls, on_deny=on_deny, timeout=timeout, workspace=workspace)
    items: list[ResponseInputItemParam] = []
    for (call_id, name, _), outcome in zip(calls, outcomes):
        text = (await run_approved(run, name, outcome.input))[0] if outcome.approved else outcome.tool_result
        items.append({"type": "function_call_output", "call_id": call_id, "output": text})
    return items
