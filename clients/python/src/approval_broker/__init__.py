"""Python client of the approval broker (`approvals.v1`).

    async with Broker("127.0.0.1:50051") as broker:
        outcomes = await broker.review(session_id, [ToolCall("toolu_01", "read_file", {"path": "a.txt"})])

# Layout
- `client`: `Broker`, the async client on one `Connect` stream (reconnect, resume, request ids).
- `sync`: `SyncBroker`, the same for code without an event loop.
- `models`: `ToolCall` in, `Outcome` out, `Status`, `OnDeny`.
- `errors`: what can go wrong; every error means "no outcome: run nothing".
- `tokens`: `ClientCredentials`, the agent's token from its identity provider, renewed before it
  expires.
- `receipts`: the check of an APPROVED outcome's signed receipt, before it runs.
- `anthropic`, `openai`: the LLM message formats: tool calls in, tool results out.
- `claude_agent_sdk`, `openai_agents`: the agent SDKs' approval hooks.
- `proto`: the generated `approvals.v1` modules, for approver UIs and admin scripts.
- `_pb`: the gRPC stubs, generated from `proto/` when the package is built.
"""

from .client import DEFAULT_TARGET, Broker, Submitted
from .errors import (
    AuthenticationError,
    BrokerError,
    BrokerUnavailable,
    PermissionDenied,
    RequestRefused,
    ReviewTimeout,
    TokenUnavailable,
)
from .models import Ack, OnDeny, Outcome, Status, ToolCall
from .receipts import ReceiptRejected, TrustedKey, verify_approval
from .sync import SyncBroker
from .tokens import ClientCredentials, TokenProvider

__all__ = [
    "DEFAULT_TARGET",
    "Ack",
    "AuthenticationError",
    "Broker",
    "BrokerError",
    "BrokerUnavailable",
    "ClientCredentials",
    "OnDeny",
    "Outcome",
    "PermissionDenied",
    "ReceiptRejected",
    "RequestRefused",
    "ReviewTimeout",
    "Status",
    "Submitted",
    "SyncBroker",
    "TokenProvider",
    "TokenUnavailable",
    "ToolCall",
    "TrustedKey",
    "verify_approval",
]
