"""`Broker.review` against a real broker: one outcome per call, in order, whatever happens to
the connection in between."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid

import pytest
from conftest import BrokerProcess, CuttableProxy, Decision, approve_when_pending, decide, free_port, wait_until_pending

from approval_broker import (
    Broker,
    BrokerError,
    BrokerUnavailable,
    OnDeny,
    RequestRefused,
    ReviewTimeout,
    Status,
    SyncBroker,
    ToolCall,
)

TURN = [
    ToolCall("toolu_01", "read_file", {"path": "build.sh"}, title="Read the build script"),
    ToolCall("toolu_02", "run_shell", {"command": "rm -rf build"}, title="Delete the build directory"),
    ToolCall("toolu_03", "write_file", {"path": "build.sh", "content": "#!/bin/sh\n"}),
]


def new_session() -> str:
    return f"py-{uuid.uuid4().hex[:12]}"


async def test_review_returns_one_outcome_per_call_in_the_batch_order(broker_process: BrokerProcess) -> None:
    session = new_session()
    approver = asyncio.create_task(
        approve_when_pending(
            broker_process.target,
            session,
            [
                Decision("toolu_01", approve=True, edited_input_json='{"path": "build.sh", "lines": 10}'),
                Decision("toolu_02", approve=False, reason="never delete the build directory"),
            ],
        )
    )
    async with Broker(broker_process.target) as broker:
        outcomes = await broker.review(session, TURN, timeout=30)
    await approver

    assert [o.call_id for o in outcomes] == ["toolu_01", "toolu_02", "toolu_03"]
    assert [o.status for o in outcomes] == [Status.APPROVED, Status.DENIED, Status.SKIPPED]
    approved, denied, skipped = outcomes
    assert approved.approved and approved.input_edited
    assert approved.input == {"path": "build.sh", "lines": 10}
    assert approved.decided_by == "approver:alice@example.com"
    assert not denied.approved and denied.input == {}
    assert not denied.responded
    assert denied.tool_result == "The user denied this tool call. Reason: never delete the build directory"
    assert skipped.tool_result == "Not run: another tool call in the same batch was denied."
    assert skipped.decided_by == "broker"


async def test_a_response_comes_back_denied_and_marked_with_the_persons_words(broker_process: BrokerProcess) -> None:
    session = new_session()
    approver = asyncio.create_task(
        approve_when_pending(
            broker_process.target, session, [Decision("toolu_02", approve=False, response="Move it to build.old instead")]
        )
    )
    async with Broker(broker_process.target) as broker:
        (answered,) = await broker.review(session, [TURN[1]], timeout=30)
    await approver

    assert answered.status is Status.DENIED and not answered.approved
    assert answered.responded
    assert answered.reason == "Move it to build.old instead"
    assert answered.tool_result == (
        'The user did not run this tool call and answered instead: "Move it to build.old instead"'
    )
    assert answered.input == {}


async def test_independent_batches_and_concurrent_reviews_share_one_stream(broker_process: BrokerProcess) -> None:
    sessions = [new_session() for _ in range(3)]
    async with Broker(broker_process.target) as broker:
        reviews = [
            asyncio.create_task(broker.review(s, TURN[:2], on_deny=OnDeny.INDEPENDENT, timeout=30)) for s in sessions
        ]
        for s in sessions:
            await wait_until_pending(broker_process.target, s, ["toolu_01", "toolu_02"])
            # Deny first: with INDEPENDENT the sibling is not skipped.
            await decide(broker_process.target, s, [Decision("toolu_01", approve=False), Decision("toolu_02", approve=True)])
        results = await asyncio.gather(*reviews)
        assert broker.connects == 1
    for outcomes in results:
        assert [o.status for o in outcomes] == [Status.DENIED, Status.APPROVED]


def test_sync_broker_reviews_without_an_event_loop(broker_process: BrokerProcess) -> None:
    session = new_session()
    decided = threading.Thread(
        target=lambda: asyncio.run(
            approve_when_pending(broker_process.target, session, [Decision("toolu_01", approve=True)])
        )
    )
    decided.start()
    with SyncBroker(broker_process.target) as broker:
        outcomes = broker.review(session, TURN[:1], timeout=30)
        assert broker.outcomes(session, ["toolu_01"]) == outcomes
    decided.join()
    assert [o.status for o in outcomes] == [Status.APPROVED]
    assert outcomes[0].input == {"path": "build.sh"}


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "drained"])
async def test_review_gets_its_outcome_after_the_broker_restarts_mid_wait(
    broker_process: BrokerProcess, how: signal.Signals
) -> None:
    session = new_session()
    async with Broker(broker_process.target, unavailable_timeout=60) as broker:
        review = asyncio.create_task(broker.review(session, TURN[:2], timeout=60))
        await wait_until_pending(broker_process.target, session, ["toolu_01", "toolu_02"])
        assert broker.connects == 1
        # The stream dies with the broker; the calls were acknowledged, so they survive it.
        await asyncio.to_thread(broker_process.restart, how)
        await decide(
            broker_process.target, session, [Decision("toolu_01", approve=True), Decision("toolu_02", approve=False)]
        )
        outcomes = await review
        assert broker.connects >= 2
    assert [o.status for o in outcomes] == [Status.APPROVED, Status.DENIED]


async def test_outcomes_decided_while_the_agent_was_away_arrive_after_it_reconnects(
    broker_process: BrokerProcess,
) -> None:
    session = new_session()
    async with Broker(broker_process.target, unavailable_timeout=60) as broker:
        review = asyncio.create_task(broker.review(session, TURN[:1], timeout=60))
        await wait_until_pending(broker_process.target, session, ["toolu_01"])
        broker_process.stop(signal.SIGKILL)
        await asyncio.sleep(0.5)  # the client notices and starts backing off
        # Restart and decide at once: the decision lands before (or while) the client resumes.
        await asyncio.to_thread(broker_process.start)
        await decide(broker_process.target, session, [Decision("toolu_01", approve=False, reason="no")])
        outcomes = await review
    assert [o.status for o in outcomes] == [Status.DENIED]


async def test_submitting_the_same_calls_again_is_idempotent(broker_process: BrokerProcess) -> None:
    session = new_session()
    async with Broker(broker_process.target) as first:
        submitted = await first.submit(session, TURN[:2])
        assert [a.kind for a in submitted.acks] == ["accepted", "accepted"]
        # The agent crashed and retries the same turn from a new process: nothing new is stored.
        async with Broker(broker_process.target) as retry:
            again = await retry.submit(session, TURN[:2])
            assert [a.kind for a in again.acks] == ["duplicate", "duplicate"]
            assert {a.batch_id for a in again.acks} == {submitted.batch_id}
            waiting = asyncio.create_task(retry.review(session, TURN[:2], timeout=30))
            await decide(broker_process.target, session, [Decision("toolu_01", approve=True), Decision("toolu_02", approve=True)])
            retried = await waiting
        # Once decided, a further retry returns the stored outcomes at once.
        replay = await first.review(session, TURN[:2], timeout=5)
    assert [o.status for o in retried] == [Status.APPROVED, Status.APPROVED]
    assert replay == retried


async def test_a_reused_call_id_with_another_input_is_refused_for_that_call_alone(
    broker_process: BrokerProcess,
) -> None:
    session = new_session()
    async with Broker(broker_process.target) as broker:
        await broker.submit(session, TURN[:1])
        changed = ToolCall("toolu_01", "read_file", {"path": "/etc/shadow"})
        review = asyncio.create_task(broker.review(session, [changed, TURN[1]], on_deny=OnDeny.INDEPENDENT, timeout=30))
        await wait_until_pending(broker_process.target, session, ["toolu_02"])
        await decide(broker_process.target, session, [Decision("toolu_02", approve=True)])
        refused, approved = await review
    assert refused.status is Status.REFUSED and not refused.approved
    assert "ALREADY_EXISTS" in refused.reason or "code 6" in refused.reason
    assert refused.tool_result.startswith("The approval broker refused this tool call; the tool was not run.")
    assert approved.status is Status.APPROVED


async def test_wait_and_cancel_and_lookups(broker_process: BrokerProcess) -> None:
    session = new_session()
    async with Broker(broker_process.target) as broker:
        submitted = await broker.submit(session, TURN)
        assert await broker.outcomes(session, ["toolu_01"]) == [None]
        waiting = asyncio.create_task(broker.wait(session, ["toolu_03", "toolu_01"], timeout=30))
        cancelled = await broker.cancel(session, call_ids=["toolu_01"], reason="the user moved on")
        assert [o.status for o in cancelled] == [Status.CANCELLED]
        await broker.cancel(session, batch_id=submitted.batch_id)
        outcomes = await waiting
        assert [(o.call_id, o.status) for o in outcomes] == [("toolu_03", Status.CANCELLED), ("toolu_01", Status.CANCELLED)]
        assert "the user moved on" in outcomes[1].tool_result
        with pytest.raises(BrokerError, match="holds no call"):
            await broker.wait(session, ["nope"], timeout=5)
        with pytest.raises(BrokerError, match="holds no call"):
            await broker.outcomes(session, ["nope"])


async def test_a_bad_batch_is_refused_as_a_whole_and_the_stream_goes_on(broker_process: BrokerProcess) -> None:
    async with Broker(broker_process.target) as broker:
        with pytest.raises(RequestRefused) as refused:
            await broker.review("", TURN[:1], timeout=5)
        assert "session_id" in refused.value.message
        with pytest.raises(ReviewTimeout) as timed_out:
            await broker.review(new_session(), TURN[:1], timeout=0.5)
        assert timed_out.value.pending == ["toolu_01"]
        assert broker.connects == 1


async def test_an_unreachable_broker_fails_closed_with_broker_unavailable() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    async with Broker(nobody, unavailable_timeout=1.5) as broker:
        with pytest.raises(BrokerUnavailable, match="no outcome was decided, run nothing"):
            await broker.review(new_session(), TURN, timeout=30)
        with pytest.raises(BrokerUnavailable):
            await broker.outcomes(new_session(), ["toolu_01"])
    assert 1.4 < time.monotonic() - started < 10
    with SyncBroker(nobody, unavailable_timeout=0.5) as sync:
        with pytest.raises(BrokerUnavailable):
            sync.review(new_session(), TURN[:1])


async def test_a_broker_that_dies_mid_wait_and_stays_down_fails_the_review_closed(
    broker_process: BrokerProcess,
) -> None:
    session = new_session()
    async with Broker(broker_process.target, unavailable_timeout=2) as broker:
        review = asyncio.create_task(broker.review(session, TURN[:1], timeout=60))
        await wait_until_pending(broker_process.target, session, ["toolu_01"])
        broker_process.stop(signal.SIGKILL)
        with pytest.raises(BrokerUnavailable, match="unreachable for 2s"):
            await review
    # The call was acknowledged: it is still there, pending, when the broker comes back.
    broker_process.start()
    async with Broker(broker_process.target) as again:
        assert await again.outcomes(session, ["toolu_01"]) == [None]


def test_tool_call_inputs_are_sent_as_json_objects() -> None:
    spec = ToolCall("c1", "t", {"b": 1, "a": [1, 2]}).to_proto()
    assert json.loads(spec.input_json) == {"a": [1, 2], "b": 1}
    assert ToolCall("c1", "t", '{"x": 1}').to_proto().input_json == '{"x": 1}'


async def test_an_outcome_decided_while_the_network_was_down_arrives_by_resume(broker_process: BrokerProcess) -> None:
    proxy = CuttableProxy(broker_process.port)
    await proxy.start()
    session = new_session()
    try:
        async with Broker(proxy.target, unavailable_timeout=60) as broker:
            review = asyncio.create_task(broker.review(session, TURN[:2], timeout=60))
            await wait_until_pending(broker_process.target, session, ["toolu_01", "toolu_02"])
            proxy.cut()
            # Decided while the agent cannot hear it: the live push is lost with the connection.
            await decide(broker_process.target, session, [Decision("toolu_01", approve=True), Decision("toolu_02", approve=True)])
            await asyncio.sleep(1)
            assert not review.done()
            proxy.restore()
            outcomes = await asyncio.wait_for(review, 30)
            assert broker.connects >= 2
    finally:
        await proxy.close()
    assert [o.status for o in outcomes] == [Status.APPROVED, Status.APPROVED]
