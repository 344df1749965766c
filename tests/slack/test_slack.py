"""Slack app mode checked with Slack's own SDK (`slack_sdk`, PyPI), run by `.ci/slack`.

A stand-in for Slack's Web API on loopback takes the broker's calls, checks their shape as Slack
documents it (POST, bot token, JSON body, channel / ts) and parses every Block Kit block with
`slack_sdk.models.blocks`, whose validators carry Block Kit's published limits. Clicks are signed
by `slack_sdk.signature.SignatureVerifier` (the SDK's own signer, not the broker's code) and
POSTed to the broker's interactivity endpoint: a genuine one decides the call, forged, stale and
replayed ones are refused. Talks to the broker with grpcurl, which `.ci/slack` puts on PATH.
"""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from slack_sdk.models.blocks import Block
from slack_sdk.signature import SignatureVerifier

BROKER = os.environ["BROKER_ADDRESS"]
SLACK_PORT = int(os.environ["SLACK_PORT"])
BOT_TOKEN = os.environ["SLACK_BOT_TOKEN"]
SECRET = os.environ["SLACK_SIGNING_SECRET"]
CHANNEL = "C0APPROVALS"
PATIENCE = 15.0

received = []
problems = []
lock = threading.Lock()


def check_blocks(where, body):
    """Parses each block with slack_sdk and runs its validators (Block Kit's limits)."""
    blocks = body.get("blocks")
    if blocks is None:
        return
    if not 1 <= len(blocks) <= 50:
        problems.append(f"{where}: {len(blocks)} blocks")
    for raw in blocks:
        block = Block.parse(raw)
        if block is None or type(block) is Block:
            problems.append(f"{where}: slack_sdk does not know the block {raw}")
            continue
        try:
            block.validate_json()
            # What slack_sdk reads back is what was sent (no field it dropped).
            for key in raw:
                if key not in block.to_dict():
                    problems.append(f"{where}: slack_sdk dropped `{key}` of {raw}")
        except Exception as error:  # slack_sdk raises SlackObjectFormationError
            problems.append(f"{where}: {raw.get('type')} block refused by slack_sdk: {error}")


class FakeSlack(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        raw = self.rfile.read(length)
        path = self.path
        ctype = self.headers.get("content-type", "")
        auth = self.headers.get("authorization", "")
        body = json.loads(raw) if raw and "json" in ctype else {}
        reply = {"ok": True}
        with lock:
            if path.startswith("/api/"):
                if auth != f"Bearer {BOT_TOKEN}":
                    problems.append(f"{path}: authorization {auth!r}")
                if ctype != "application/json; charset=utf-8":
                    problems.append(f"{path}: content-type {ctype!r}")
                if path in ("/api/chat.postMessage", "/api/chat.update"):
                    if not isinstance(body.get("channel"), str):
                        problems.append(f"{path}: no channel")
                    if not (body.get("text") or body.get("blocks")):
                        problems.append(f"{path}: neither text nor blocks")
                    if path == "/api/chat.update" and not isinstance(body.get("ts"), str):
                        problems.append(f"{path}: no ts")
                    check_blocks(path, body)
                    ts = body.get("ts") or f"1765000000.{len(received) + 1:06d}"
                    reply = {"ok": True, "channel": body.get("channel"), "ts": ts}
                else:
                    problems.append(f"unexpected method {path}")
                    reply = {"ok": False, "error": "unknown_method"}
            elif auth:
                problems.append(f"{path}: the bot token sent to a response_url")
            received.append((path, body))
        out = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json; charset=utf-8")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def wait_for(path, accept):
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        with lock:
            for p, body in received:
                if p == path and accept(body):
                    return body
        time.sleep(0.05)
    sys.exit(f"FAILED: nothing to {path} as expected; got {received}")


def grpcurl(method, request):
    out = subprocess.run(
        ["grpcurl", "-plaintext", "-d", json.dumps(request), BROKER, method],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout or "{}")


def post_click(body, timestamp, signature):
    request = urllib.request.Request(
        f"http://{BROKER}/slack/interactivity",
        data=body.encode(),
        method="POST",
        headers={
            "content-type": "application/x-www-form-urlencoded",
            "x-slack-request-timestamp": timestamp,
            "x-slack-signature": signature,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def click_body(message, user, action):
    actions = next(b for b in message["blocks"] if b["type"] == "actions")
    button = next(e for e in actions["elements"] if e["action_id"] == action)
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "team_id": "T0TEAM"},
        "api_app_id": "A0APP",
        "team": {"id": "T0TEAM", "domain": "example"},
        "channel": {"id": CHANNEL, "name": "approvals"},
        "message": {"ts": "1765000000.000001", "blocks": message["blocks"]},
        "response_url": f"http://127.0.0.1:{SLACK_PORT}/actions/T0TEAM/1/respond",
        "actions": [{"type": "button", "action_id": action, "block_id": "decide",
                     "value": button["value"], "action_ts": "1765000001.0"}],
    }
    return urllib.parse.urlencode({"payload": json.dumps(payload)})


def main():
    server = ThreadingHTTPServer(("127.0.0.1", SLACK_PORT), FakeSlack)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    grpcurl("approvals.v1.AgentService/Submit", {"batch": {"session_id": "s1", "calls": [{
        "call_id": "c1", "tool": "Bash",
        "input_json": json.dumps({"command": "echo <!channel> <@U0ALICE> <https://evil.example|x>"}),
    }]}})
    message = wait_for("/api/chat.postMessage", lambda b: "c1" in json.dumps(b))
    shown = json.dumps(message)
    for markup in ("<!channel>", "<@U0ALICE>", "<https://evil.example"):
        if markup in shown:
            problems.append(f"{markup} reached Slack as markup")
    print("posted:", message["text"])

    verifier = SignatureVerifier(SECRET)
    body = click_body(message, "U0ALICE", "approve")
    now = str(int(time.time()))

    forged = SignatureVerifier("not-the-secret").generate_signature(timestamp=now, body=body)
    assert post_click(body, now, forged) == 401, "a forged click was taken"
    old = str(int(time.time()) - 400)
    stale = verifier.generate_signature(timestamp=old, body=body)
    assert post_click(body, old, stale) == 401, "a stale click was taken"
    print("forged and stale clicks refused")

    signature = verifier.generate_signature(timestamp=now, body=body)
    assert verifier.is_valid(body=body, timestamp=now, signature=signature)
    assert post_click(body, now, signature) == 200, "a genuine click was refused"
    assert post_click(body, now, signature) == 401, "a replayed click was taken"
    print("the click signed by slack_sdk taken, its replay refused")

    updated = wait_for("/api/chat.update", lambda b: "APPROVED" in json.dumps(b))
    print("updated:", updated["text"])
    outcomes = grpcurl("approvals.v1.AgentService/GetOutcomes", {"session_id": "s1", "call_ids": ["c1"]})
    status = outcomes["calls"][0]["outcome"]["status"]
    assert status == "CALL_STATUS_APPROVED", outcomes

    # A call whose requirement asks for a passkey: no Approve button, its first button opens the
    # call in the inbox (where the passkey signs the approval), and Deny stays.
    grpcurl("approvals.v1.AdminService/CreateRule", {"rule": {
        "id": "signed-deploys", "tool": "deploy", "effect": "EFFECT_ASK",
        "approvers": {"groups": ["ops"], "quorum": 1, "stepUp": "STEP_UP_PASSKEY"},
    }})
    grpcurl("approvals.v1.AgentService/Submit", {"batch": {"session_id": "s1", "calls": [{
        "call_id": "c2", "tool": "deploy", "input_json": json.dumps({"target": "prod"}),
    }]}})
    signed = wait_for("/api/chat.postMessage", lambda b: "c2" in json.dumps(b))
    buttons = [e for b in signed["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert [b["action_id"] for b in buttons] == ["open", "deny"], buttons
    assert buttons[0]["text"]["text"] == "Approve in the inbox", buttons[0]
    assert "/#call/" in buttons[0]["url"], buttons[0]
    print("a call that needs a passkey: Approve in the inbox and Deny, no Approve button")

    if problems:
        sys.exit("FAILED: requests Slack would refuse:\n" + "\n".join(problems))
    print(f"ok: {len(received)} requests to the stand-in, every block valid for slack_sdk")
    server.shutdown()


if __name__ == "__main__":
    main()
