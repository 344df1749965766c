"""Plain Python values for what the agent sends (`ToolCall`) and gets back (`Outcome`).

The generated protobuf classes stay inside the library; these are what an agent handles.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from ._pb.approvals.v1 import types_pb2
from .receipts import UNVERIFIED_TEXT


class Status(str, enum.Enum):
    """The terminal state of a call: the broker's six outcomes, plus `REFUSED` for a call the
    broker would not store (a bad field, or its id already used with another tool or input), and
    `UNVERIFIED` for an outcome the broker sent as APPROVED whose signed receipt did not prove it
    (no receipt, a key the client does not trust, a bad signature, another outcome or input in
    the receipt...): the client does not run it."""

    APPROVED = "APPROVED"
    DENIED = "DENIED"
    SUPERSEDED = "SUPERSEDED"
    SKIPPED = "SKIPPED"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"
    REFUSED = "REFUSED"
    UNVERIFIED = "UNVERIFIED"


class OnDeny(enum.IntEnum):
    """What a denial does to the rest of a batch."""

    SKIP_REST = types_pb2.ON_DENY_SKIP_REST
    INDEPENDENT = types_pb2.ON_DENY_INDEPENDENT


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for. `call_id` is the model's own id (`toolu_...`,
    `call_...`); `input` a JSON object (a dict, or its JSON text)."""

    call_id: str
    tool: str
    input: Mapping[str, Any] | str = field(default_factory=dict)
    title: str = ""
    message: str = ""
    workspace: str = ""
    supersede_key: str = ""
    deadline: datetime | None = None

    def to_proto(self) -> types_pb2.CallSpec:
        spec = types_pb2.CallSpec(
            call_id=self.call_id,
            tool=self.tool,
            input_json=self.input if isinstance(self.input, str) else json.dumps(dict(self.input)),
            title=self.title,
            message=self.message,
            workspace=self.workspace,
            supersede_key=self.supersede_key,
        )
        if self.deadline is not None:
            deadline = self.deadline if self.deadline.tzinfo else self.deadline.replace(tzinfo=timezone.utc)
            spec.deadline.FromDatetime(deadline.astimezone(timezone.utc))
        return spec


# The text handed to the model for a call the broker refused to store. The broker's reason
# follows it.
REFUSED_TEXT = "The approval broker refused this tool call; the tool was not run."


@dataclass(frozen=True)
class Outcome:
    """How one call ended.

    `approved` is True only for APPROVED: run the tool with `input` (the approver's edit when
    `input_edited`). For every other status, hand the model `tool_result` and do not run it.
    """

    session_id: str
    call_id: str
    status: Status
    decided_by: str = ""
    reason: str = ""
    tool_result: str = ""
    input_json: str = ""
    input_edited: bool = False
    # True when a person answered the model instead of running the call (status DENIED):
    # `reason` is their message, and `tool_result` carries it marked as their words.
    responded: bool = False
    batch_id: str = ""
    position: int = 0
    decided_at: datetime | None = None
    # For an APPROVED outcome the client checked: the sequence of the signed receipt that
    # proved it (None when the check is off).
    receipt_sequence: int | None = None
    # The signed receipt the broker sent with the outcome (its DSSE envelope, JSON text); empty
    # from a broker that sends none, or signs none. Only trusted once it verifies with a key the
    # client trusts.
    receipt: str = field(default="", repr=False)

    @property
    def approved(self) -> bool:
        return self.status is Status.APPROVED

    @property
    def input(self) -> dict[str, Any]:
        """The input to run, parsed (APPROVED only; an empty dict otherwise)."""
        return json.loads(self.input_json) if self.input_json else {}

    @classmethod
    def from_proto(cls, outcome: types_pb2.Outcome) -> Outcome:
        name = types_pb2.CallStatus.Name(outcome.status).removeprefix("CALL_STATUS_")
        return cls(
            session_id=outcome.session_id,
            call_id=outcome.call_id,
            status=Status(name),
            decided_by=outcome.decided_by,
            reason=outcome.reason,
            tool_result=outcome.tool_result,
            input_json=outcome.input_json,
            input_edited=outcome.input_edited,
            responded=outcome.responded,
            batch_id=outcome.batch_id,
            position=outcome.position,
            decided_at=outcome.decided_at.ToDatetime(tzinfo=timezone.utc) if outcome.HasField("decided_at") else None,
            receipt=outcome.receipt,
        )

    @classmethod
    def refused(cls, session_id: str, call_id: str, code: int, message: str) -> Outcome:
        return cls(
            session_id=session_id,
            call_id=call_id,
            status=Status.REFUSED,
            decided_by="broker",
            reason=f"code {code}: {message}",
            tool_result=f"{REFUSED_TEXT} Reason: {message}",
        )


    def unverified(self, reason: str) -> Outcome:
        """This outcome, not approved: its receipt did not prove it (`reason` says why)."""
        return Outcome(
            session_id=self.session_id,
            call_id=self.call_id,
            status=Status.UNVERIFIED,
            decided_by=self.decided_by,
            reason=reason,
            tool_result=UNVERIFIED_TEXT.format(reason=reason),
            batch_id=self.batch_id,
            position=self.position,
            decided_at=self.decided_at,
        )


@dataclass(frozen=True)
class Ack:
    """The broker's acknowledgement of one submitted call, sent after commit."""

    call_id: str
    # "accepted" (stored now), "duplicate" (stored before: nothing new) or "error" (refused).
    kind: str
    batch_id: str = ""
    position: int = 0
    error_code: int = 0
    error_message: str = ""

    @classmethod
    def from_proto(cls, ack: types_pb2.CallAck) -> Ack:
        kind = ack.WhichOneof("result") or "error"
        if kind == "error":
            return cls(ack.call_id, kind, error_code=ack.error.code, error_message=ack.error.message)
        accepted = getattr(ack, kind)
        return cls(ack.call_id, kind, batch_id=accepted.batch_id, position=accepted.position)
