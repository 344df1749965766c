"""Anthropic Messages: a response's `tool_use` blocks in, the `tool_result` blocks out.

    reply = client.messages.create(...)
    results = await tool_results(broker, session_id, reply.content, run=run_tool)
    messages += [{"role": "assistant", "content": reply.content}, results]

`tool_results` submits the turn's tool calls as one batch, runs the approved ones with their
approved input through `run(name, input)`, and returns the user message that answers the turn:
one `tool_result` per `tool_use`, in order, first in the message as the API requires. A call that
did not run gets the broker's text with `is_error: true`. For control over running, use
`review_tool_uses` and each item's `result(...)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._turns import ReviewedCall, RunTool, field, review_turn, run_approved
from .client import Broker
from .models import OnDeny

if TYPE_CHECKING:
    from anthropic.types import ContentBlock, MessageParam, ToolResultBlockParam


@dataclass(frozen=True)
class ReviewedToolUse(ReviewedCall):
    def result(self, content: Any = None, *, is_error: bool = False) -> ToolResultBlockParam:
        """The `tool_result` block for this `tool_use`: for a call that did not run, the
        broker's text (`is_error`); for an approved one, `content`, the tool's output."""
        if not self.approved:
            return {"type": "tool_result", "tool_use_id": self.call_id, "content": self.outcome.tool_result, "is_error": True}
        if content is None:
            raise ValueError(f"{self.call_id} was approved: run it and pass its output")
        block: ToolResultBlockParam = {"type": "tool_result", "tool_use_id": self.call_id, "content": content}
        if is_error:
            block["is_error"] = True
        return block


def tool_uses(content: Iterable[ContentBlock | dict[str, Any]] | Any) -> list[tuple[str, str, Any]]:
    """The (id, name, input) of each `tool_use` block of a content list (or of a `Message`)."""
    blocks = content.content if hasattr(content, "content") and not isinstance(content, (list, tuple)) else content
    return [(field(b, "id"), field(b, "name"), field(b, "input")) for b in blocks if field(b, "type") == "tool_use"]


async def review_tool_uses(
    broker: Broker,
    session_id: str,
    content: Iterable[ContentBlock | dict[str, Any]] | Any,
    *,
    on_deny: OnDeny = OnDeny.SKIP_REST,
    timeout: float | None = None,
    workspace: str = "",
) -> list[ReviewedToolUse]:
    """Submits the `tool_use` blocks as one batch; one `ReviewedToolUse` per block, in order."""
    calls = tool_uses(content)
    outcomes = await review_turn(broker, session_id, calls, on_deny=on_deny, timeout=timeout, workspace=workspace)
    return [ReviewedToolUse(call_id, name, outcome) for (call_id, name, _), outcome in zip(calls, outcomes)]


async def tool_results(
    broker: Broker,
    session_id: str,
    content: Iterable[ContentBlock | dict[str, Any]] | Any,
    *,
    run: RunTool,
    on_deny: OnDeny = OnDeny.SKIP_REST,
    timeout: float | None = None,
    workspace: str = "",
) -> MessageParam:
    """The user message answering every `tool_use` of the turn; see the module."""
    blocks: list[ToolResultBlockParam] = []
    for item in await review_tool_uses(broker, session_id, content, on_deny=on_deny, timeout=timeout, workspace=workspace):
        if item.approved:
            output, failed = await run_approved(run, item.name, item.input)
            blocks.append(item.result(output, is_error=failed))
        else:
            blocks.append(item.result())
    return {"role": "user", "content": blocks}
