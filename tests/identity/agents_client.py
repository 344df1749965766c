"""Why this exists: the Python client (`approval_broker`) as an agent that is a service client of a
real OpenID provider, driven by agents.test.mjs. It reviews calls with `ClientCredentials` across
its token's expiry and then with the provider stopped, printing one JSON line per step; the test
approves the calls, stops the provider when told, and checks the lines.

Settings come from the environment: BROKER, TOKEN_URL, CLIENT_ID, SECRET_FILE, SCOPE, RESOURCE,
TTL (the token lifetime in seconds the provider gives).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from approval_broker import Broker, ClientCredentials, TokenUnavailable, ToolCall


def say(**line: object) -> None:
    print(json.dumps(line), flush=True)


async def main() -> None:
    ttl = float(os.environ["TTL"])
    source = ClientCredentials(
        os.environ["TOKEN_URL"],
        client_id=os.environ["CLIENT_ID"],
        client_secret_file=os.environ["SECRET_FILE"],
        scope=os.environ["SCOPE"],
        resource=os.environ["RESOURCE"],
    )
    session = f"py-{int(time.time() * 1000)}"

    async def review(call_id: str) -> str:
        async with Broker(os.environ["BROKER"], token=source, unavailable_timeout=5) as broker:
            [outcome] = await broker.review(session, [ToolCall(call_id, "read_file", {"path": call_id})], timeout=30)
            return outcome.status.name

    say(step="first", status=await review("c1"), requests=source.requests)
    await asyncio.sleep(ttl * 0.85)  # past 80% of the token's lifetime
    say(step="renewed", status=await review("c2"), requests=source.requests)
    say(step="stop-provider")
    await asyncio.to_thread(sys.stdin.readline)
    # The provider is down; the token fetched at "renewed" has not expired yet.
    say(step="cached", status=await review("c3"), requests=source.requests)
    await asyncio.sleep(ttl * 1.1)  # now it has
    try:
        status = await review("c4")
        say(step="expired", status=status, error=None)
    except TokenUnavailable as e:
        say(step="expired", status=None, error=type(e).__name__, message=str(e))


asyncio.run(main())
