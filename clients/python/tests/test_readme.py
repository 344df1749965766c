"""The README's Python snippets run as written (only the broker's address changed), against a
broker whose policy file decides, so no human is needed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, BrokerProcess


def python_blocks(markdown: Path, section: str) -> list[str]:
    text = markdown.read_text()
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    return re.findall(r"```python\n(.*?)```", text[start : end if end != -1 else None], flags=re.S)


def test_the_readme_snippet_reviews_a_call(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"rules": [
        {"id": "no-rm-rf", "tool": "run_shell", "effect": "deny",
         "match": {"fields": [{"field": "command", "prefix": "rm -rf"}]},
         "description": "never delete recursively"},
    ]}))
    process = BrokerProcess(tmp_path, ["--policy-file", str(policy)])
    process.start()
    try:
        [snippet] = python_blocks(REPO / "README.md", "## Python client")
        assert "127.0.0.1:50051" in snippet
        run = subprocess.run(
            [sys.executable, "-c", snippet.replace("127.0.0.1:50051", process.target)],
            capture_output=True, text=True, timeout=60,
        )
    finally:
        process.stop()
    assert run.returncode == 0, run.stderr
    assert run.stdout == "DENIED A policy rule denied this tool call. Reason: never delete recursively\n"
