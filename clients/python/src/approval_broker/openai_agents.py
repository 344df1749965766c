"""The OpenAI Agents SDK's approvals, answered by the broker.

Function tools declared with `needs_approval=True` (or a predicate) pause the run: its result
lists `interruptions`, one `ToolApprovalItem` per call. `resolve_interruptions` submits them to
the broker as one batch and records each outcome in the run's state; run on from that state:

    result = await Runner.run(agent, prompt)
    while result.interruptions:
        state = await resolve_interruptions(broker, session_id, result)
        result = await Runner.run(agent, state)

APPROVED approves the item; every other outcome rejects it with the broker's text as the message
the model reads. The SDK runs an approved call with the arguments the model sent and refuses a
call whose arguments changed, so an approval with an edited input is recorded as a rejection
whose message gives the input the approver allowed (the model may call the tool again with it).

Shell, apply-patch and custom tools take an `on_approval` callback instead, which `on_approval`
builds: it answers `{"approve": True}` or `{"approve": False, "reason": <text>}`. Those results
cannot carry an edited input either: an approval with an edit is answered the same way.

When the broker cannot be asked, `resolve_interruptions` raises the `BrokerError` (no item is
approved: run nothing further), and `on_approval` rejects with a reason that says so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agents import RunContextWrapper, RunState, ToolApprovalItem

from .client import Broker
from .errors import BrokerError
from .models import OnDeny, Outcome, ToolCall

log = logging.getLogger("approval_broker")

UNREACHABLE_TEXT = "The approval broker could not be asked, so this tool call was not run."
EDITED_TEXT = (
    "The approver allowed this call only with a changed input, which this tool cannot take here; "
    "it was not run. The input the approver allowed: "
)

OnApproval = Callable[[RunContextWrapper[Any], ToolApprovalItem], Awaitable[dict[str, Any]]]


def _raw(item: ToolApprovalItem, name: str) -> Any:
    raw = item.raw_item
    return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)


def tool_call_of(item: ToolApprovalItem) -> ToolCall:
    """The broker call for an approval item: the model's call id, the tool, its arguments (a
    function call's JSON arguments; for other tools, the raw call's fields)."""
    call_id = _raw(item, "call_id") or _raw(item, "id")
    arguments = _raw(item, "arguments")
    if not isinstance(arguments, str):
        raw = item.raw_item if isinstance(item.raw_item, dict) else item.raw_item.model_dump(mode="json", exclude_none=True)
        arguments = json.dumps({k: v for k, v in raw.items() if k not in ("id", "call_id", "type", "status")})
    return ToolCall(call_id=str(call_id), tool=item.tool_name or str(_raw(item, "name")), input=arguments)


async def resolve_interruptions(
    broker: Broker,
    session_id: str,
    result: Any,
    *,
    on_deny: OnDeny = OnDeny.SKIP_REST,
    timeout: float | None = None,
) -> RunState[Any]:
    """Decides every pending approval of `result` (a `RunResult`) through the broker; returns
    the state to run on from. Raises `BrokerError` when the broker cannot be asked."""
    state: RunState[Any] = result.to_state()
    items: Sequence[ToolApprovalItem] = result.interruptions
    outcomes = await broker.review(session_id, [tool_call_of(i) for i in items], on_deny=on_deny, timeout=timeout)
    for item, outcome in zip(items, outcomes):
        apply_outcome(state, item, outcome)
    return state


def apply_outcome(state: RunState[Any], item: ToolApprovalItem, outcome: Outcome) -> None:
    """Approves or rejects one item in `state` as the outcome says."""
    if not outcome.approved:
        state.reject(item, rejection_message=outcome.tool_result)
        return
    if outcome.input_edited:
        # The SDK binds an approval to the arguments the model sent (a changed call is refused as
        # a reused call id), so an edited approval cannot run here: the model is told instead.
        state.reject(item, rejection_message=EDITED_TEXT + outcome.input_json)
        return
    state.approve(item)


def on_approval(broker: Broker, session_id: str, *, timeout: float | None = None) -> OnApproval:
    """An `on_approval` callback for `ShellTool`, `ApplyPatchTool` and custom tools."""

    async def decide(context: RunContextWrapper[Any], item: ToolApprovalItem) -> dict[str, Any]:
        call = tool_call_of(item)
        try:
            [outcome] = await broker.review(session_id, [call], on_deny=OnDeny.INDEPENDENT, timeout=timeout)
        except BrokerError as e:
            log.error("rejected %s %s: %s", call.tool, call.call_id, e)
            return {"approve": False, "reason": f"{UNREACHABLE_TEXT} ({e})"}
        if outcome.approved and not outcome.input_edited:
            return {"approve": True}
        if outcome.approved:
            return {"approve": False, "reason": EDITED_TEXT + outcome.input_json}
        return {"approve": False, "reason": outcome.tool_result}

    return decide
