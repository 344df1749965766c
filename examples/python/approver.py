#!/usr/bin/env python3
"""An approver UI, cut down to its decisions, on the stubs the `approval_broker` library ships.

It subscribes to the pending calls (a snapshot of those already waiting, then each new one as it
is submitted), and for the first batch in which it has seen the first two calls it approves the
first and denies the second, with a reason. The broker then skips the rest of that batch when the
batch is ON_DENY_SKIP_REST, as agent.py's is. Exits 0 after those two decisions, 1 otherwise.
"""

import argparse
import sys

import grpc

from approval_broker.proto import approver_pb2, approver_pb2_grpc, types_pb2


def status_name(status):
    return types_pb2.CallStatus.Name(status).removeprefix("CALL_STATUS_")


def first_two_calls_of_a_batch(stub, args, metadata):
    subscription = approver_pb2.SubscribeRequest(filter=types_pb2.CallFilter(session_id=args.session))
    events = stub.Subscribe(subscription, metadata=metadata, timeout=args.timeout)
    batches = {}  # batch id -> {position: call}, of the pending calls seen so far
    try:
        for event in events:
            kind = event.WhichOneof("event")
            if kind in ("snapshot", "requested"):
                call = getattr(event, kind)
                print(f"pending: {call.session_id}/{call.call_id} {call.tool} {call.input_json}")
                batch = batches.setdefault(call.batch_id, {})
                batch[call.position] = call
                if 0 in batch and 1 in batch:
                    return batch[0], batch[1]
        sys.exit("approver.py: FAILED: the broker ended the subscription")
    finally:
        events.cancel()


def decide(stub, call, decision, args, metadata, reason=""):
    request = approver_pb2.DecideRequest(
        agent=call.agent,  # approvers see every agent's calls, so the decision names the owner
        session_id=call.session_id, call_id=call.call_id, decision=decision, reason=reason, approver=args.approver,
    )
    reply = stub.Decide(request, metadata=metadata, timeout=10)
    print(f"{approver_pb2.Decision.Name(decision)} {call.call_id} ({call.tool}): "
          f"the outcome is {status_name(reply.outcome.status)}")
    for skipped in reply.skipped:
        print(f"  and {skipped.call_id} of the same batch became {status_name(skipped.status)}")
    return reply.outcome.status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the broker's address")
    parser.add_argument("--token", help="a bearer token of role approver, when the broker has auth on")
    parser.add_argument("--approver", default="alice@example.com",
                        help="who decides, recorded as approver:NAME (with auth on: the token's identity)")
    parser.add_argument("--session", default="", help="only calls of this session (default: every session)")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for a batch to decide")
    args = parser.parse_args()
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else None

    with grpc.insecure_channel(args.target) as channel:
        stub = approver_pb2_grpc.ApproverServiceStub(channel)
        try:
            first, second = first_two_calls_of_a_batch(stub, args, metadata)
            # First approve, then deny: a denial first would skip the call we mean to approve.
            approved = decide(stub, first, approver_pb2.DECISION_APPROVE, args, metadata)
            denied = decide(stub, second, approver_pb2.DECISION_DENY, args, metadata,
                            reason="never delete the build directory; run `make clean` instead")
        except grpc.RpcError as e:
            sys.exit(f"approver.py: FAILED: {e.code().name}: {e.details()}")
    if (approved, denied) != (types_pb2.CALL_STATUS_APPROVED, types_pb2.CALL_STATUS_DENIED):
        sys.exit("approver.py: FAILED: another decision came first; the outcomes that stand are "
                 f"{status_name(approved)} and {status_name(denied)}")


if __name__ == "__main__":
    main()
