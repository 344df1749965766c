"""What the format helpers share: a model turn's tool calls reviewed as one batch, each with its
outcome, and the running of the approved ones."""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from .client import Broker
from .models import OnDeny, Outcome, ToolCall

# Runs one approved tool: (tool name, approved input) -> the text handed to the model.
RunTool = Callable[[str, dict[str, Any]], Union[Any, Awaitable[Any]]]


@dataclass(frozen=True)
class ReviewedCall:
    """One tool call of the model's turn and its outcome.

    `approved`: run `name` with `input` (the input the approver let through, possibly edited)
    and hand back its result with `result(output)`. Otherwise `result()` is the ready tool result
    carrying the broker's text (denied, skipped, expired...), and the tool must not run.
    """

    call_id: str
    name: str
    outcome: Outcome

    @property
    def approved(self) -> bool:
        return self.outcome.approved

    @property
    def input(self) -> dict[str, Any]:
        """The input to run with (APPROVED only)."""
        if not self.approved:
            raise ValueError(f"{self.call_id} was not approved ({self.outcome.status.value}); do not run it")
        return self.outcome.input


def input_text(value: Any) -> str:
    """The JSON text of a tool input as the model gave it (a dict, or already text)."""
    return value if isinstance(value, str) else json.dumps(value)


async def review_turn(
    broker: Broker,
    session_id: str,
    calls: Sequence[tuple[str, str, Any]],
    *,
    on_deny: OnDeny,
    timeout: float | None,
    workspace: str,
) -> list[Outcome]:
    """Submits (call id, tool name, input) triples as one batch; an empty turn asks nothing."""
    if not calls:
        return []
    return await broker.review(
        session_id,
        [ToolCall(call_id, name, input_text(value), workspace=workspace) for call_id, name, value in calls],
        on_deny=on_deny,
        timeout=timeout,
    )


async def run_approved(run: RunTool, name: str, tool_input: dict[str, Any]) -> tuple[str, bool]:
    """Runs an approved tool; returns (its output as text, whether it failed). A tool that raises
    still gets a result (the error, flagged), so the history stays complete."""
    try:
        output = run(name, tool_input)
        if inspect.isawaitable(output):
            output = await output
    except Exception as e:  # the model reads what went wrong; the turn goes on
        return f"The tool failed: {type(e).__name__}: {e}", True
    return (output if isinstance(output, str) else json.dumps(output)), False


def field(item: Any, name: str) -> Any:
    """A field of an SDK object (pydantic model) or of its dict form."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)
