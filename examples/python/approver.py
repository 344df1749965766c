#!/usr/bin/env python3
"""An approver UI, cut down to its decisions, as a client of the approval broker.

It subscribes to the pending calls (a snapshot of those already waiting, then each new one as it
is submitted), and for the first batch in which it has seen the first two calls it approves the
first and denies the second, with a reason. The broker then skips the rest of that batch when the
batch is ON_DENY_SKIP_REST, as agent.py's is. Exits 0 after those two decisions, 1 otherwise.

Run generate.sh first (it writes the stubs imported below into gen/).
"""

import argparse
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent / "gen"))
from approvals.v1 import approver_pb2, approver_pb2_grpc, types_pb2  # noqa: E402


class Failure(Exception):
    pass


def status_name(status):
    return types_pb2.CallStatus.Name(status).removeprefix("CALL_STATUS_")


def decide(stub, call, decision, approver, metadata, reason=""):
    request = approver_pb2.DecideRequest(
        agent=call.agent,  # approvers see every agent's calls, so the decision names the owner
        session_id=call.session_id,
        call_id=call.call_id,
        decision=decision,
        reason=reason,
        approver=approver,
    )
    reply = stub.Decide(request, metadata=metadata, timeout=10)
    print(f"{approver_pb2.Decision.Name(decision)} {call.call_id} ({call.tool}): "
          f"the outcome is {status_name(reply.outcome.status)}")
    for skipped in reply.skipped:
        print(f"  and {skipped.call_id} of the same batch became {status_name(skipped.status)}")
    return reply.outcome


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
        subscription = approver_pb2.SubscribeRequest(filter=types_pb2.CallFilter(session_id=args.session))
        events = stub.Subscribe(subscription, metadata=metadata, timeout=args.timeout)
        batches = {}  # batch id -> {position: call}, of the pending calls seen so far
        try:
            for event in events:
                kind = event.WhichOneof("event")
                if kind not in ("snapshot", "requested"):
                    continue
                call = getattr(event, kind)
                print(f"pending: {call.session_id}/{call.call_id} {call.tool} {call.input_json}")
                batch = batches.setdefault(call.batch_id, {})
                batch[call.position] = call
                if 0 in batch and 1 in batch:
                    break
            else:
                raise Failure("the broker ended the subscription")
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Failure(f"no batch of two or more calls within {args.timeout:g}s") from None
            raise Failure(f"Subscribe failed: {e.code().name}: {e.details()}") from None
        finally:
            events.cancel()

        try:
            # First approve, then deny: a denial first would skip the call we mean to approve.
            approved = decide(stub, batch[0], approver_pb2.DECISION_APPROVE, args.approver, metadata)
            denied = decide(stub, batch[1], approver_pb2.DECISION_DENY, args.approver, metadata,
                            reason="never delete the build directory; run `make clean` instead")
        except grpc.RpcError as e:
            raise Failure(f"Decide failed: {e.code().name}: {e.details()}") from None
        if (approved.status, denied.status) != (types_pb2.CALL_STATUS_APPROVED, types_pb2.CALL_STATUS_DENIED):
            raise Failure("another decision came first; the outcomes that stand are "
                          f"{status_name(approved.status)} and {status_name(denied.status)}")


if __name__ == "__main__":
    try:
        main()
    except Failure as failure:
        print(f"approver.py: FAILED: {failure}", file=sys.stderr)
        sys.exit(1)
