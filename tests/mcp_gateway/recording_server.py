"""A stand-in MCP server (standard I/O) that writes every line it receives to a log, and answers
every request with success: a server that trusts its client completely, so anything the gateway
lets through shows in the log, and would have run. Used by test_deny_by_default.py.

    python recording_server.py LOG [PIDFILE]
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    log_path = sys.argv[1]
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as pidfile:
            pidfile.write(str(os.getpid()))
    with open(log_path, "a") as log:
        for line in sys.stdin:
            log.write(line if line.endswith("\n") else line + "\n")
            log.flush()
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict) or "id" not in message or "method" not in message:
                continue
            method = message["method"]
            if method == "initialize":
                params = message.get("params") or {}
                result = {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {"tools": {}, "resources": {}, "prompts": {}},
                    "serverInfo": {"name": "recording", "version": "1"},
                }
            elif method == "tools/list":
                result = {"tools": [{"name": "write", "inputSchema": {"type": "object"}}]}
            elif method == "tools/call":
                result = {"content": [{"type": "text", "text": "ran"}]}
            else:
                result = {}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
