#!/usr/bin/env python3
"""An agent's tool loop, cut down to one model turn, on the `approval_broker` client library.

The model asked for three tool calls in one turn. `broker.review` submits them as one batch and
returns one outcome per call, in order (it handles the Connect stream, request ids, and
reconnecting with resume). For APPROVED the agent would run the tool with the approved input; for
anything else it hands the model the broker's tool-result text.

With approver.py approving the first call and denying the second, the batch (ON_DENY_SKIP_REST by
default) gives APPROVED, DENIED, SKIPPED; this script exits 0 only on exactly that.
"""

import argparse
import asyncio
import sys
import uuid

from approval_broker import Broker, BrokerError, ToolCall

# The model's turn: its own call ids, the tools it chose and the inputs it wrote.
MODEL_TURN = [
    ToolCall("toolu_01", "read_file", {"path": "build.sh"}, title="Read the build script"),
    ToolCall("toolu_02", "run_shell", {"command": "rm -rf build", "cwd": "."}, title="Delete the build directory"),
    ToolCall("toolu_03", "write_file", {"path": "build.sh", "content": "#!/bin/sh\nset -e\ncargo build --release\n"},
             title="Rewrite the build script"),
]
EXPECTED = ["APPROVED", "DENIED", "SKIPPED"]


async def main(args):
    session = args.session or f"python-example-{uuid.uuid4().hex[:8]}"
    print(f"session {session}, target {args.target}")
    async with Broker(args.target, token=args.token) as broker:
        outcomes = await broker.review(session, MODEL_TURN, timeout=args.timeout)
    for position, (call, outcome) in enumerate(zip(MODEL_TURN, outcomes), start=1):
        # A real agent runs the tool here, with the input the approver let through (the client
        # returns APPROVED only once the broker's signed receipt for it has verified).
        handed = f"would run {call.tool} {outcome.input_json}" if outcome.approved else f"tool result: {outcome.tool_result}"
        print(f"[{position}/{len(outcomes)}] {call.call_id} {call.tool}: {outcome.status.value}: {handed}")
    kinds = [outcome.status.value for outcome in outcomes]
    if kinds != EXPECTED:
        sys.exit(f"agent.py: FAILED: the outcomes are {kinds}, expected {EXPECTED}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the broker's address")
    parser.add_argument("--token", help="a bearer token of role agent, when the broker has auth on")
    parser.add_argument("--session", help="the session id (default: a new one per run)")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for all outcomes")
    try:
        asyncio.run(main(parser.parse_args()))
    except BrokerError as e:  # unreachable, refused, timed out: nothing runs
        sys.exit(f"agent.py: FAILED: {type(e).__name__}: {e}")
