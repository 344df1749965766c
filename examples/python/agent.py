#!/usr/bin/env python3
"""An agent's tool loop, cut down to one model turn, as a client of the approval broker.

The model asked for three tool calls in one turn. The agent submits them as one batch on its
`Connect` stream, waits until every call has its outcome, and prints what it would hand back to
the model for each: for APPROVED, the tool it runs with the approved input; for anything else,
the broker's tool-result text.

The batch is ON_DENY_SKIP_REST: once a call is denied, the broker skips the calls of the batch
still pending. With approver.py approving the first call and denying the second, the outcomes are
APPROVED, DENIED, SKIPPED; this script exits 0 only when it gets exactly that, one outcome per
call, and 1 otherwise.

Run generate.sh first (it writes the stubs imported below into gen/).
"""

import argparse
import json
import queue
import sys
import uuid
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent / "gen"))
from approvals.v1 import agent_pb2, agent_pb2_grpc, types_pb2  # noqa: E402

# The model's turn: its own call ids, the tools it chose and the inputs it wrote.
MODEL_TURN = [
    ("toolu_01", "read_file", "Read the build script", {"path": "build.sh"}),
    ("toolu_02", "run_shell", "Delete the build directory", {"command": "rm -rf build", "cwd": "."}),
    ("toolu_03", "write_file", "Rewrite the build script",
     {"path": "build.sh", "content": "#!/bin/sh\nset -e\ncargo build --release\n"}),
]
EXPECTED = ["APPROVED", "DENIED", "SKIPPED"]


class Failure(Exception):
    pass


def status_name(outcome):
    return types_pb2.CallStatus.Name(outcome.status).removeprefix("CALL_STATUS_")


def the_batch(session_id):
    calls = [
        types_pb2.CallSpec(call_id=call_id, tool=tool, title=title, input_json=json.dumps(tool_input))
        for call_id, tool, title, tool_input in MODEL_TURN
    ]
    return types_pb2.BatchSpec(session_id=session_id, calls=calls, on_deny=types_pb2.ON_DENY_SKIP_REST)


def wait_for_outcomes(responses, batch):
    """Reads the stream until the batch is complete; returns each call's outcome, in the batch's order."""
    call_ids = [call.call_id for call in batch.calls]
    outcomes = {}
    for response in responses:
        kind = response.WhichOneof("response")
        if kind == "submitted":
            for ack in response.submitted.acks:
                if ack.WhichOneof("result") == "error":
                    raise Failure(f"the broker refused {ack.call_id}: {ack.error.message}")
            batch_id = response.submitted.batch_id  # empty when every call was stored before
            where = f"batch {batch_id}" if batch_id else "stored before"
            print(f"submitted {len(call_ids)} calls ({where}); waiting for the approver")
        elif kind == "outcome":
            outcome = response.outcome
            if outcome.call_id in outcomes:
                raise Failure(f"a second outcome for {outcome.call_id}")
            outcomes[outcome.call_id] = outcome
        elif kind == "batch_complete":
            complete = response.batch_complete
            listed = [outcome.call_id for outcome in complete.outcomes]
            if listed != call_ids:
                raise Failure(f"batch_complete lists {listed}, not {call_ids}")
            missing = [call_id for call_id in call_ids if call_id not in outcomes]
            if missing:
                raise Failure(f"batch_complete arrived before the outcomes of {missing}")
            return [outcomes[call_id] for call_id in call_ids]
        elif kind == "error":
            raise Failure(f"request {response.request_id} refused: {response.error.message}")
    raise Failure("the broker ended the stream before the batch was complete")


def tool_result(call, outcome):
    """What the agent hands back to its model for this call."""
    if outcome.status == types_pb2.CALL_STATUS_APPROVED:
        # A real agent runs the tool here, with the input the approver let through.
        return f"would run {call.tool} {outcome.input_json}"
    return f"tool result: {outcome.tool_result}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the broker's address")
    parser.add_argument("--token", help="a bearer token of role agent, when the broker has auth on")
    parser.add_argument("--session", help="the session id (default: a new one per run)")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for all outcomes")
    args = parser.parse_args()

    batch = the_batch(args.session or f"python-example-{uuid.uuid4().hex[:8]}")
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else None

    # A real agent keeps one stream for the whole conversation and sends each turn's batch on it, so
    # the requests come from a queue; `None` ends them.
    requests = queue.Queue()
    requests.put(agent_pb2.AgentRequest(request_id="turn-1", submit=batch))

    def request_stream():
        while (request := requests.get()) is not None:
            yield request

    print(f"session {batch.session_id}, target {args.target}")
    with grpc.insecure_channel(args.target) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        responses = stub.Connect(request_stream(), metadata=metadata, timeout=args.timeout)
        try:
            outcomes = wait_for_outcomes(responses, batch)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Failure(f"not every call had an outcome within {args.timeout:g}s "
                              "(is an approver deciding?)") from None
            raise Failure(f"Connect failed: {e.code().name}: {e.details()}") from None
        finally:
            requests.put(None)
            responses.cancel()

    for position, (call, outcome) in enumerate(zip(batch.calls, outcomes), start=1):
        print(f"[{position}/{len(outcomes)}] {call.call_id} {call.tool}: {status_name(outcome)}: "
              f"{tool_result(call, outcome)}")

    kinds = [status_name(outcome) for outcome in outcomes]
    if kinds != EXPECTED:
        raise Failure(f"the outcomes are {kinds}, expected {EXPECTED}")


if __name__ == "__main__":
    try:
        main()
    except Failure as failure:
        print(f"agent.py: FAILED: {failure}", file=sys.stderr)
        sys.exit(1)
