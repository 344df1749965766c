"""`SyncBroker`: the same client for code without an event loop.

It runs an `asyncio` loop on a thread of its own, with a `Broker` inside it, and each method waits
for the matching `Broker` coroutine. Same arguments, same results, same errors.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from .client import Broker, Submitted
from .models import OnDeny, Outcome, ToolCall

T = TypeVar("T")


class SyncBroker:
    """A blocking client of the approval broker; see `Broker` for the arguments.

    Use it as `with SyncBroker(...) as broker:`, or call `close()`.
    """

    def __init__(self, target: str = "127.0.0.1:50051", **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="approval-broker", daemon=True)
        self._thread.start()

        async def make() -> Broker:
            return Broker(target, **options)

        self._broker = self._run(make())

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> SyncBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._broker.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def review(
        self,
        session_id: str,
        calls: Iterable[ToolCall],
        *,
        on_deny: OnDeny = OnDeny.SKIP_REST,
        supersede_pending: bool = False,
        timeout: float | None = None,
    ) -> list[Outcome]:
        return self._run(
            self._broker.review(session_id, list(calls), on_deny=on_deny, supersede_pending=supersede_pending, timeout=timeout)
        )

    def submit(
        self, session_id: str, calls: Iterable[ToolCall], *, on_deny: OnDeny = OnDeny.SKIP_REST, supersede_pending: bool = False
    ) -> Submitted:
        return self._run(self._broker.submit(session_id, list(calls), on_deny=on_deny, supersede_pending=supersede_pending))

    def wait(self, session_id: str, call_ids: Sequence[str], *, timeout: float | None = None) -> list[Outcome]:
        return self._run(self._broker.wait(session_id, call_ids, timeout=timeout))

    def cancel(self, session_id: str, *, call_ids: Sequence[str] = (), batch_id: str = "", reason: str = "") -> list[Outcome]:
        return self._run(self._broker.cancel(session_id, call_ids=call_ids, batch_id=batch_id, reason=reason))

    def outcomes(self, session_id: str, call_ids: Sequence[str]) -> list[Outcome | None]:
        return self._run(self._broker.outcomes(session_id, call_ids))

    def call(self, helper: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        """Runs one of the library's async helpers that take a `Broker` first, e.g.
        `broker.call(review_tool_uses, session_id, reply.content)`, and returns its result.
        (Prefer the `review_*` helpers here: they run no tool, so the tools run on the caller's
        thread, not on the client's loop.)"""
        return self._run(helper(self._broker, *args, **kwargs))
