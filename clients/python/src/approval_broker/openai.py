"""OpenAI Chat Completions: a message's `tool_calls` in, the `role: tool` messages out.

    reply = client.chat.completions.create(...).choices[0].message
    messages.append(reply)
    messages += await tool_messages(broker, session_id, reply.tool_calls, run=run_tool)

`tool_messages` submits the turn's tool calls as one batch, runs the approved ones with their
approved input through `run(name, input)`, and returns one `role: tool` message per tool call,
in order. A call that did not run gets the broker's text as its content. Function tool calls carry
their `arguments` (JSON text) as the input; a custom tool call's free-form input is submitted as
`{"input": "<text>"}`. For control over running, use `review_tool_calls` and `result(...)`.
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
