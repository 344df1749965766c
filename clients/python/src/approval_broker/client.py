"""`Broker`: the agent's side of the approval broker, on one `AgentService.Connect` stream.

One stream per `Broker` carries every `review` of every session, concurrently. Each request has a
request id; the broker answers after commit. When the stream breaks (the broker restarts, a
replica drains, the network drops), the client reconnects with backoff, sends again every submit
and cancel that had no answer (safe: calls are idempotent by session and call id), and sends
`resume` for every session with calls still waiting, so outcomes decided meanwhile still arrive.
If the broker stays unreachable for `unavailable_timeout` seconds, everything waiting fails with
`BrokerUnavailable`: the client never invents an outcome.

Before an APPROVED outcome reaches the caller, the client fetches its signed receipt
(`AgentService.GetReceipt`) and checks it with a key it trusts (`receipts.verify_approval`): the
keys given as `trusted_receipt_keys`, or else those `ListReceiptKeys` serves, read once. An
outcome whose receipt does not prove it becomes `UNVERIFIED`: not approved, with a tool result
saying why.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import time
import uuid
from datetime import timezone
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import grpc
import grpc.aio

from ._pb.approvals.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from .errors import (
    AuthenticationError,
    BrokerError,
    BrokerUnavailable,
    PermissionDenied,
    RequestRefused,
    ReviewTimeout,
    TokenUnavailable,
)
from .models import Ack, OnDeny, Outcome, ToolCall
from .receipts import KeySource, ReceiptRejected, TrustedKey, trusted_keys, verify_approval
from .tokens import TokenProvider

log = logging.getLogger("approval_broker")

DEFAULT_TARGET = "127.0.0.1:50051"

Key = tuple[str, str]  # (session_id, call_id)
T = TypeVar("T")


@dataclass(frozen=True)
class Submitted:
    """The broker's answer to a submit: one `Ack` per call, in order, and the outcomes of the
    calls already decided (duplicates of decided calls, calls a rule or a grant decided)."""

    session_id: str
    batch_id: str
    acks: list[Ack]
    outcomes: list[Outcome]


@dataclass
class _Pending:
    """A request on the stream waiting for its answer."""

    request: agent_pb2.AgentRequest
    future: asyncio.Future[agent_pb2.AgentResponse]
    # Submits and cancels are sent again after a reconnect; resumes are rebuilt from the waiters.
    resend: bool


@dataclass
class _Stream:
    call: Any  # grpc.aio.StreamStreamCall
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _split_target(target: str) -> tuple[str, bool | None]:
    for scheme, tls in (("https://", True), ("http://", False)):
        if target.startswith(scheme):
            return target[len(scheme):].rstrip("/"), tls
    return target, None


class Broker:
    """An async client of the approval broker, for one agent.

    `target` is `host:port`, `http://host:port` (plaintext) or `https://host:port` (TLS). TLS is
    on with an `https://` target, `tls=True`, or any of the certificate arguments:
    `root_certificates` (PEM of the CA that signed the broker's certificate; the system roots
    when absent), `certificate_chain` and `private_key` (PEM, for mutual TLS). `token` is sent as
    `authorization: Bearer <token>` (role `agent`): a fixed token, or a provider called before
    each request for the token to send (`tokens.ClientCredentials`, which gets it from the
    organisation's identity provider and renews it before it expires; or any callable returning
    the token or an awaitable of it). When the broker refuses a provider's token, the provider's
    `invalidate(token)` (if it has one) is called and the request is made once more with its next
    token; a provider that raises fails what was waiting (`TokenUnavailable`: run nothing).

    `trusted_receipt_keys`: the public keys (base64 of the raw 32 bytes, as the broker logs them,
    or `PUBLIC KEY` PEMs) an APPROVED outcome's signed receipt must verify with before the client
    returns it to run. Without them, the client reads the broker's keys once, at first use, from
    `AgentService.ListReceiptKeys` (which trusts the broker at that moment; configured keys do
    not). `verify_receipts=False` turns the check off: only for a broker running
    `--receipts off`, which signs nothing (a warning is logged).

    `unavailable_timeout`: how long (seconds) the client keeps trying to reach the broker, at
    the first connect and after the stream breaks, before whatever is waiting fails with
    `BrokerUnavailable`. `rpc_timeout` bounds each unary call (`outcomes`, `cancel`).

    Use it as `async with Broker(...) as broker:`, or call `close()`.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | TokenProvider | None = None,
        tls: bool | None = None,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        unavailable_timeout: float = 30.0,
        rpc_timeout: float = 10.0,
        channel_options: Sequence[tuple[str, Any]] = (),
        trusted_receipt_keys: Iterable[KeySource | TrustedKey] | None = None,
        verify_receipts: bool = True,
    ) -> None:
        address, scheme_tls = _split_target(target)
        use_tls = tls if tls is not None else bool(scheme_tls or root_certificates or certificate_chain or private_key)
        if scheme_tls is False and use_tls:
            raise ValueError(f"target {target!r} says plaintext (http://) but TLS options were given")
        self.target = address
        self._tls = use_tls
        self._credentials = (
            grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain) if use_tls else None
        )
        self._token = token
        self.unavailable_timeout = unavailable_timeout
        self.rpc_timeout = rpc_timeout
        self._options = [
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            *channel_options,
        ]
        self._channel: grpc.aio.Channel | None = None
        self._stub: agent_pb2_grpc.AgentServiceStub | None = None
        self._stream: _Stream | None = None
        self._stream_task: asyncio.Task[None] | None = None
        self._pending: dict[str, _Pending] = {}
        self._waiters: dict[Key, list[asyncio.Future[Outcome]]] = {}
        self._closed = False
        self.verify_receipts = verify_receipts
        configured = None if trusted_receipt_keys is None else trusted_keys(trusted_receipt_keys)
        if not verify_receipts:
            if configured:
                raise ValueError("trusted_receipt_keys were given, but verify_receipts=False turns the check off")
            log.warning(
                "receipt verification is off (verify_receipts=False): APPROVED outcomes are run on the broker's "
                "word alone, unsigned; only for a broker running `--receipts off`"
            )
        elif configured is not None and not configured:
            raise ValueError("trusted_receipt_keys is empty: give at least one key, or leave it out to read the broker's")
        self._configured_keys = configured
        self._broker_keys: dict[str, TrustedKey] | None = None
        self._keys_lock = asyncio.Lock()
        # How many times the stream was (re)opened; tests and logs read it.
        self.connects = 0

    # --- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the stream and the channel. Calls still waiting stay pending at the broker."""
        self._closed = True
        if self._stream_task is not None:
            self._stream_task.cancel()
            try:
                await self._stream_task
            except (asyncio.CancelledError, Exception):
                pass
        self._fail_everything(BrokerError("the client was closed"))
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def _agent_stub(self) -> agent_pb2_grpc.AgentServiceStub:
        if self._closed:
            raise BrokerError("the client is closed")
        if self._stub is None:
            if self._credentials is not None:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    # --- the agent's operations ----------------------------------------------------------------

    async def review(
        self,
        session_id: str,
        calls: Iterable[ToolCall],
        *,
        on_deny: OnDeny = OnDeny.SKIP_REST,
        supersede_pending: bool = False,
        timeout: float | None = None,
    ) -> list[Outcome]:
        """Submits one model turn's calls as a batch and waits for every outcome.

        Returns one `Outcome` per call, in the calls' order. Submitting calls that were submitted
        before (same session and call ids, same tool and input) is safe: the broker returns the
        stored calls and, once decided, their outcomes. A call the broker refuses on its own
        gets status `REFUSED`; an APPROVED outcome whose signed receipt does not prove it,
        `UNVERIFIED`. Raises `ReviewTimeout` when `timeout` seconds pass first,
        `BrokerUnavailable` when the broker cannot be reached (see the class), `RequestRefused`
        when the whole batch is refused.
        """
        calls = list(calls)
        keys = [(session_id, call.call_id) for call in calls]
        tools = {call.call_id: call.tool for call in calls}
        futures = [self._wait_for(key) for key in keys]
        try:
            submitted = await self._submit(session_id, calls, on_deny, supersede_pending, check=False)
            for ack, future in zip(submitted.acks, futures):
                if ack.kind == "error" and not future.done():
                    future.set_result(Outcome.refused(session_id, ack.call_id, ack.error_code, ack.error_message))
            return await self._checked(await self._gather_checked(keys, futures, timeout, tools), tools)
        finally:
            self._forget(keys, futures)

    async def submit(
        self,
        session_id: str,
        calls: Iterable[ToolCall],
        *,
        on_deny: OnDeny = OnDeny.SKIP_REST,
        supersede_pending: bool = False,
    ) -> Submitted:
        """Submits a batch and returns the acknowledgements without waiting for decisions;
        `wait` gets the outcomes later (also from another process)."""
        return await self._submit(session_id, list(calls), on_deny, supersede_pending, check=True)

    async def wait(self, session_id: str, call_ids: Sequence[str], *, timeout: float | None = None) -> list[Outcome]:
        """Waits for the outcomes of calls submitted earlier (by this or another client), in the
        given order. Raises `BrokerError` naming call ids the session does not hold."""
        keys = [(session_id, call_id) for call_id in call_ids]
        futures = [self._wait_for(key) for key in keys]
        try:
            reply = await self._request(
                agent_pb2.AgentRequest(resume=agent_pb2.ResumeRequest(session_id=session_id, call_ids=call_ids)),
                resend=True,
            )
            if reply.resumed.unknown_call_ids:
                raise BrokerError(f"session {session_id!r} holds no call {', '.join(reply.resumed.unknown_call_ids)}")
            return await self._checked(await self._gather_checked(keys, futures, timeout, None), None)
        finally:
            self._forget(keys, futures)

    async def cancel(
        self,
        session_id: str,
        *,
        call_ids: Sequence[str] = (),
        batch_id: str = "",
        reason: str = "",
    ) -> list[Outcome]:
        """Cancels the named calls, or a batch, or (neither given) every pending call of the
        session. Returns the outcome that stands for each call touched: CANCELLED, or the earlier
        outcome of calls already decided."""
        target = types_pb2.CancelTarget(session_id=session_id, reason=reason)
        if call_ids:
            target.calls.call_ids.extend(call_ids)
        elif batch_id:
            target.batch_id = batch_id
        else:
            target.whole_session = True
        reply = await self._request(agent_pb2.AgentRequest(cancel=target), resend=True)
        result = reply.cancelled
        return await self._checked([Outcome.from_proto(o) for o in (*result.cancelled, *result.already_decided)], None)

    async def outcomes(self, session_id: str, call_ids: Sequence[str]) -> list[Outcome | None]:
        """Looks the calls up now (GetOutcomes): each one's outcome, or None while it is pending.
        Raises `BrokerError` naming call ids the session does not hold."""
        try:
            reply = await self._unary(
                self._agent_stub().GetOutcomes, agent_pb2.GetOutcomesRequest(session_id=session_id, call_ids=call_ids)
            )
        except grpc.aio.AioRpcError as e:
            raise _error_from_status(e) from None
        unknown = [state.call_id for state in reply.calls if state.WhichOneof("state") == "unknown"]
        if unknown:
            raise BrokerError(f"session {session_id!r} holds no call {', '.join(unknown)}")
        found = [Outcome.from_proto(s.outcome) for s in reply.calls if s.WhichOneof("state") == "outcome"]
        checked = iter(await self._checked(found, None))
        return [next(checked) if s.WhichOneof("state") == "outcome" else None for s in reply.calls]

    # --- receipts ------------------------------------------------------------------------------

    async def receipt_keys(self) -> dict[str, TrustedKey]:
        """The keys receipts must verify with, by key id: the configured ones, or the broker's
        (`ListReceiptKeys`), read once. Raises `ReceiptRejected` when there are none."""
        if self._configured_keys is not None:
            return self._configured_keys
        async with self._keys_lock:
            if self._broker_keys is None:
                try:
                    reply = await self._unary(self._agent_stub().ListReceiptKeys, types_pb2.ListReceiptKeysRequest())
                except grpc.aio.AioRpcError as e:
                    raise ReceiptRejected(
                        f"the broker's receipt keys could not be read ({e.code().name}: {e.details()})"
                    ) from None
                keys: list[TrustedKey] = []
                for k in reply.keys:
                    try:
                        keys.append(
                            TrustedKey.of(
                                k.key.public_key,
                                valid_from=k.valid_from.ToDatetime(tzinfo=timezone.utc) if k.HasField("valid_from") else None,
                                valid_until=k.valid_until.ToDatetime(tzinfo=timezone.utc) if k.HasField("valid_until") else None,
                            )
                        )
                    except ValueError as e:
                        log.warning("the broker serves a receipt key this client cannot read (%s); ignored", e)
                if not keys:
                    raise ReceiptRejected(
                        "the broker signs no receipts (`--receipts off`?) and this client was given no key to trust"
                    )
                self._broker_keys = trusted_keys(keys)
                log.info(
                    "verifying receipts with the broker's keys %s (read once from ListReceiptKeys)",
                    ", ".join(k[:16] for k in self._broker_keys),
                )
            return self._broker_keys

    async def _checked(self, outcomes: list[Outcome], tools: dict[str, str] | None) -> list[Outcome]:
        """Each APPROVED outcome checked against its signed receipt (or made `UNVERIFIED`)."""
        if not self.verify_receipts or not any(o.approved for o in outcomes):
            return outcomes
        return list(
            await asyncio.gather(
                *(self._check(o, None if tools is None else tools.get(o.call_id)) if o.approved else _same(o) for o in outcomes)
            )
        )

    async def _check(self, outcome: Outcome, tool: str | None) -> Outcome:
        try:
            keys = await self.receipt_keys()
            # The outcome carries its receipt; a broker that sends none with outcomes is asked.
            envelope = outcome.receipt or await self._fetch_receipt(outcome)
            to_run = verify_approval(
                envelope,
                keys,
                session_id=outcome.session_id,
                call_id=outcome.call_id,
                input_json=outcome.input_json,
                tool=tool,
                batch_id=outcome.batch_id or None,
            )
        except ReceiptRejected as e:
            log.warning(
                "not running call %s/%s: the broker said APPROVED, but %s",
                outcome.session_id, outcome.call_id, e.reason,
            )
            return outcome.unverified(e.reason)
        return dataclasses.replace(outcome, input_json=to_run, receipt_sequence=_chain_sequence(envelope))

    async def _fetch_receipt(self, outcome: Outcome) -> str:
        """The outcome's receipt asked for (`AgentService.GetReceipt`), for an outcome that came
        without one. The reply's own key (`reply.key`) and `verified` are the broker's word: not
        used."""
        try:
            reply = await self._unary(
                self._agent_stub().GetReceipt,
                types_pb2.GetReceiptRequest(session_id=outcome.session_id, call_id=outcome.call_id),
            )
        except grpc.aio.AioRpcError as e:
            raise ReceiptRejected(_receipt_error(e)) from None
        if not reply.HasField("receipt") or not reply.receipt.envelope:
            raise ReceiptRejected("the broker sent no receipt for it")
        return str(reply.receipt.envelope)

    async def _gather_checked(
        self, keys: list[Key], futures: list[asyncio.Future[Outcome]], timeout: float | None, tools: dict[str, str] | None
    ) -> list[Outcome]:
        """`_gather`, with the outcomes a `ReviewTimeout` carries checked too."""
        try:
            return await self._gather(keys, futures, timeout)
        except ReviewTimeout as e:
            decided = [o for o in e.decided.values() if isinstance(o, Outcome)]
            e.decided = {o.call_id: o for o in await self._checked(decided, tools)}
            raise

    # --- the bearer token -----------------------------------------------------------------------

    async def _bearer(self) -> str | None:
        """The token to send now (a provider is asked each time; it keeps its own cache)."""
        if self._token is None or isinstance(self._token, str):
            return self._token
        token = self._token()
        if not isinstance(token, str):
            token = await token
        return token

    def _renewable(self, e: grpc.aio.AioRpcError, token: str | None) -> bool:
        """Whether a refusal of `token` is worth one more try with the provider's next token
        (which is told the token was refused)."""
        if e.code() != grpc.StatusCode.UNAUTHENTICATED or self._token is None or isinstance(self._token, str):
            return False
        invalidate = getattr(self._token, "invalidate", None)
        if callable(invalidate) and token is not None:
            invalidate(token)
        return True

    async def _unary(self, method: Callable[..., Awaitable[T]], request: object) -> T:
        """A unary call with the bearer token, made once more with a renewed token when refused."""
        token = await self._bearer()
        try:
            return await method(request, metadata=_authorization(token), timeout=self.rpc_timeout)
        except grpc.aio.AioRpcError as e:
            if not self._renewable(e, token):
                raise
        return await method(request, metadata=_authorization(await self._bearer()), timeout=self.rpc_timeout)

    # --- requests and waiters ------------------------------------------------------------------

    async def _submit(
        self, session_id: str, calls: list[ToolCall], on_deny: OnDeny, supersede: bool, *, check: bool
    ) -> Submitted:
        batch = types_pb2.BatchSpec(
            session_id=session_id,
            calls=[call.to_proto() for call in calls],
            on_deny=cast("types_pb2.OnDeny", int(on_deny)),
            supersede_pending=supersede,
        )
        reply = (await self._request(agent_pb2.AgentRequest(submit=batch), resend=True)).submitted
        outcomes = [Outcome.from_proto(o) for o in reply.outcomes]
        if check:
            outcomes = await self._checked(outcomes, {call.call_id: call.tool for call in calls})
        return Submitted(
            session_id=reply.session_id,
            batch_id=reply.batch_id,
            acks=[Ack.from_proto(ack) for ack in reply.acks],
            outcomes=outcomes,
        )

    async def _request(self, request: agent_pb2.AgentRequest, *, resend: bool) -> agent_pb2.AgentResponse:
        request.request_id = uuid.uuid4().hex
        future: asyncio.Future[agent_pb2.AgentResponse] = asyncio.get_running_loop().create_future()
        self._pending[request.request_id] = _Pending(request, future, resend)
        try:
            self._ensure_stream()
            if self._stream is not None:
                await self._write(self._stream, request)
            return await future
        finally:
            self._pending.pop(request.request_id, None)

    def _wait_for(self, key: Key) -> asyncio.Future[Outcome]:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(future)
        return future

    def _forget(self, keys: list[Key], futures: list[asyncio.Future[Outcome]]) -> None:
        for key, future in zip(keys, futures):
            waiting = self._waiters.get(key, [])
            if future in waiting:
                waiting.remove(future)
            if not waiting:
                self._waiters.pop(key, None)
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved: the error already reached the caller another way

    async def _gather(self, keys: list[Key], futures: list[asyncio.Future[Outcome]], timeout: float | None) -> list[Outcome]:
        if futures:
            done, pending = await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    raise future.exception()  # type: ignore[misc]
            if pending:
                decided: dict[str, object] = {key[1]: f.result() for key, f in zip(keys, futures) if f.done()}
                raise ReviewTimeout([key[1] for key, f in zip(keys, futures) if not f.done()], decided)
        return [future.result() for future in futures]

    def _resolve(self, outcome: types_pb2.Outcome) -> None:
        waiting = self._waiters.get((outcome.session_id, outcome.call_id))
        if not waiting:
            return
        value = Outcome.from_proto(outcome)
        for future in waiting:
            if not future.done():
                future.set_result(value)

    def _fail_everything(self, error: BrokerError) -> None:
        for pending in list(self._pending.values()):
            if not pending.future.done():
                pending.future.set_exception(error)
        for waiting in self._waiters.values():
            for future in waiting:
                if not future.done():
                    future.set_exception(error)

    def _has_demand(self) -> bool:
        return bool(self._pending) or any(not f.done() for w in self._waiters.values() for f in w)

    # --- the stream ----------------------------------------------------------------------------

    def _ensure_stream(self) -> None:
        if self._stream_task is None or self._stream_task.done():
            self._agent_stub()
            self._stream_task = asyncio.get_running_loop().create_task(self._keep_stream(), name="approval-broker-connect")

    async def _write(self, stream: _Stream, request: agent_pb2.AgentRequest) -> None:
        try:
            async with stream.write_lock:
                await stream.call.write(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            # The stream broke: the reconnect sends this request again.
            log.debug("write on a broken stream (%s); it is sent again after the reconnect", e)

    async def _keep_stream(self) -> None:
        """Keeps one Connect stream open while anything waits; reconnects and resumes."""
        down_since: float | None = None
        backoff = 0.05
        last_error = "not connected yet"
        # Whether the last refusal of a token was already answered with a renewed one.
        renewed = False
        while not self._closed:
            stub = self._agent_stub()
            try:
                token = await self._bearer()
            except Exception as e:  # the provider's failure, whatever it raised: run nothing
                self._fail_everything(e if isinstance(e, BrokerError) else TokenUnavailable(f"the token provider failed: {e!r}"))
                return
            call = stub.Connect(metadata=_authorization(token))
            try:
                await call.wait_for_connection()
                stream = _Stream(call)
                self._stream = stream
                self.connects += 1
                if down_since is not None:
                    log.info("reconnected to the approval broker at %s", self.target)
                down_since, backoff = None, 0.05
                await self._send_after_connect(stream)
                while True:
                    response = await call.read()
                    if response is grpc.aio.EOF:
                        last_error = "the broker ended the stream"
                        break
                    renewed = False
                    self._dispatch(response)
            except grpc.aio.AioRpcError as e:
                last_error = f"{e.code().name}: {e.details()}"
                if not renewed and self._renewable(e, token):
                    renewed = True
                    continue
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    self._stream = None
                    self._fail_everything(_error_from_status(e))
                    return
            finally:
                self._stream = None
                call.cancel()
            if not self._has_demand():
                return
            now = time.monotonic()
            if down_since is None:
                down_since = now
                log.warning("lost the approval broker at %s (%s); reconnecting", self.target, last_error)
            if now - down_since >= self.unavailable_timeout:
                self._fail_everything(
                    BrokerUnavailable(
                        f"the approval broker at {self.target} was unreachable for {self.unavailable_timeout:g}s "
                        f"({last_error}); no outcome was decided, run nothing"
                    )
                )
                return
            await asyncio.sleep(min(backoff, max(0.0, down_since + self.unavailable_timeout - now)))
            backoff = min(backoff * 2, 2.0)

    async def _send_after_connect(self, stream: _Stream) -> None:
        """After a (re)connect: sends the unanswered submits and cancels again, then resumes each
        session whose other calls are still waiting."""
        in_submits: set[Key] = set()
        for pending in list(self._pending.values()):
            if pending.resend:
                if pending.request.WhichOneof("request") == "submit":
                    batch = pending.request.submit
                    in_submits.update((batch.session_id, c.call_id) for c in batch.calls)
                await self._write(stream, pending.request)
        sessions: dict[str, list[str]] = {}
        for (session_id, call_id), waiting in self._waiters.items():
            if (session_id, call_id) not in in_submits and any(not f.done() for f in waiting):
                sessions.setdefault(session_id, []).append(call_id)
        for session_id, call_ids in sessions.items():
            request = agent_pb2.AgentRequest(
                request_id=f"resume-{uuid.uuid4().hex}",
                resume=agent_pb2.ResumeRequest(session_id=session_id, call_ids=call_ids),
            )
            await self._write(stream, request)

    def _dispatch(self, response: agent_pb2.AgentResponse) -> None:
        kind = response.WhichOneof("response")
        if kind == "outcome":
            self._resolve(response.outcome)
            return
        if kind == "batch_complete":
            for outcome in response.batch_complete.outcomes:
                self._resolve(outcome)
            return
        if kind == "submitted":
            for outcome in (*response.submitted.outcomes, *response.submitted.superseded):
                self._resolve(outcome)
        elif kind == "cancelled":
            for outcome in (*response.cancelled.cancelled, *response.cancelled.already_decided):
                self._resolve(outcome)
        elif kind == "resumed" and response.request_id.startswith("resume-"):
            self._fail_unknown(response.resumed.session_id, response.resumed.unknown_call_ids)
        pending = self._pending.get(response.request_id)
        if pending is None or pending.future.done():
            return
        if kind == "error":
            pending.future.set_exception(RequestRefused(response.error.code, response.error.message))
        else:
            pending.future.set_result(response)

    def _fail_unknown(self, session_id: str, call_ids: Iterable[str]) -> None:
        """A resume after a reconnect found calls the broker does not hold (never the case for an
        acknowledged call): their waiters fail rather than wait forever."""
        for call_id in call_ids:
            for future in self._waiters.get((session_id, call_id), []):
                if not future.done():
                    future.set_exception(BrokerError(f"the broker does not hold call {session_id}/{call_id}"))


def _authorization(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


async def _same(outcome: Outcome) -> Outcome:
    return outcome


def _chain_sequence(envelope: str) -> int | None:
    """The chain sequence a receipt names; read once the receipt verified."""
    statement = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
    sequence = statement.get("predicate", {}).get("chain", {}).get("sequence")
    return sequence if isinstance(sequence, int) else None


def _receipt_error(e: grpc.aio.AioRpcError) -> str:
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return f"the broker has no receipt for it: {details}"
    if code == grpc.StatusCode.NOT_FOUND:
        return f"the broker has no receipt for it (NOT_FOUND: {details})"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "the broker does not serve receipts to agents (AgentService.GetReceipt): upgrade it"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"the broker could not be reached for its receipt ({code.name})"
    return f"its receipt could not be read ({code.name}: {details})"


def _error_from_status(e: grpc.aio.AioRpcError) -> BrokerError:
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return AuthenticationError(f"the broker refused the credentials: {details}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"the token may not call AgentService: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return BrokerUnavailable(f"the approval broker is unreachable ({code.name}: {details}); run nothing")
    return RequestRefused(code.value[0], details)


