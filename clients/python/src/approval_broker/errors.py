"""The errors of the client, one class per thing that can go wrong.

Every error means the same for the agent: no outcome was obtained, so no tool may run. A call
the broker refused on its own (a bad field, or its id reused with another input) is not an error
here: it gets an `Outcome` with status `REFUSED` like any other call that did not run.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Base class of every error this library raises."""


class BrokerUnavailable(BrokerError):
    """The broker could not be reached, or the connection was lost and not regained, within the
    client's `unavailable_timeout`. Nothing was decided by the client: fail closed, run nothing.
    Calls already acknowledged stay pending at the broker; a later `review` of the same calls
    (same session and call ids) picks up their outcomes."""


class AuthenticationError(BrokerError):
    """The broker refused the credentials (UNAUTHENTICATED: no token, or an unknown one)."""


class TokenUnavailable(AuthenticationError):
    """No bearer token to send: the identity provider could not issue one (unreachable, or it
    refused the client's credentials) and the last token it issued has expired. Nothing was sent
    to the broker: fail closed, run nothing."""


class PermissionDenied(BrokerError):
    """The token is valid but of the wrong role for the service (PERMISSION_DENIED)."""


class RequestRefused(BrokerError):
    """The broker refused a whole request (a bad session id, an empty batch...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"the broker refused the request (code {code}): {message}")
        self.code = code
        self.message = message


class ReviewTimeout(BrokerError):
    """`timeout` passed before every call had an outcome. The calls stay pending at the broker
    (or `Broker.cancel` them); `decided` holds the outcomes that did arrive, by call id."""

    def __init__(self, pending: list[str], decided: dict[str, object]) -> None:
        super().__init__(f"no outcome yet for {len(pending)} call(s): {', '.join(pending)}")
        self.pending = pending
        self.decided = decided
