"""The Claude Agent SDK's permission hook, answered by the broker.

    options = ClaudeAgentOptions(can_use_tool=can_use_tool(broker, session_id))

Claude asks `can_use_tool(tool_name, input, context)` before each tool it wants to run (the tools
its permission rules do not already allow). Each ask becomes one broker call, with the SDK's
`tool_use_id` as the call id and its prompt (`title`, `description`) for the approver. APPROVED
answers `PermissionResultAllow` with the approved (possibly edited) input; every other outcome
`PermissionResultDeny` with the broker's text, which Claude reads as the tool's result and goes
on. When the broker cannot be asked (unreachable, the credentials refused, the timeout passed),
the answer is a deny whose message says so: the tool never runs without an outcome. When Claude
withdraws a request (the SDK cancels the callback), the call is cancelled at the broker, so it
ends CANCELLED and leaves the approvers' inboxes.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from claude_agent_sdk import CanUseTool, PermissionResult, PermissionResultAllow, PermissionResultDeny, ToolPermissionContext

from .client import Broker
from .errors import BrokerError
from .models import OnDeny, ToolCall

log = logging.getLogger("approval_broker")

UNREACHABLE_TEXT = "The approval broker could not be asked, so this tool call was not run."
WITHDRAWN_REASON = "Claude withdrew the permission request"

# Cancels in flight, kept so they are not collected before they finish.
_withdrawals: set[asyncio.Task[Any]] = set()


def _withdraw(broker: Broker, session_id: str, call_id: str) -> None:
    """Cancels the call at the broker without holding up the cancellation that caused it."""

    def done(task: asyncio.Task[Any]) -> None:
        _withdrawals.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not cancel %s/%s at the broker: %s", session_id, call_id, task.exception())

    task = asyncio.get_running_loop().create_task(broker.cancel(session_id, call_ids=[call_id], reason=WITHDRAWN_REASON))
    _withdrawals.add(task)
    task.add_done_callback(done)


def can_use_tool(broker: Broker, session_id: str, *, workspace: str = "", timeout: float | None = None) -> CanUseTool:
    """A `can_use_tool` callback that submits each tool call to `broker` under `session_id`."""

    async def decide(tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext) -> PermissionResult:
        call = ToolCall(
            call_id=context.tool_use_id or f"claude-{uuid.uuid4().hex}",
            tool=tool_name,
            input=tool_input,
            title=context.title or context.display_name or "",
            message="\n\n".join(p for p in (context.description, context.decision_reason, context.blocked_path) if p),
            workspace=workspace,
        )
        try:
            [outcome] = await broker.review(session_id, [call], on_deny=OnDeny.INDEPENDENT, timeout=timeout)
        except asyncio.CancelledError:
            _withdraw(broker, session_id, call.call_id)
            raise
        except BrokerError as e:
            log.error("denied %s %s: %s", tool_name, call.call_id, e)
            return PermissionResultDeny(message=f"{UNREACHABLE_TEXT} ({e})")
        if outcome.approved:
            return PermissionResultAllow(updated_input=outcome.input)
        return PermissionResultDeny(message=outcome.tool_result)

    return decide
