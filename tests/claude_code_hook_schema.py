"""Checks the Claude Code hook fixtures against the `claude-agent-sdk` package's own types.

The hook inputs in tests/fixtures/claude_code/*.json must be valid `PreToolUseHookInput` /
`PermissionRequestHookInput`, and the expected outputs in tests/fixtures/claude_code/outputs/
(which tests/api/claude_code_hook.rs holds the real binary's answers equal to) valid
`SyncHookJSONOutput`s with the event's hook-specific output. Strict: no key the types do not
declare, every required key present, every Literal respected.

    python3 -m venv /tmp/v && /tmp/v/bin/pip install claude-agent-sdk
    /tmp/v/bin/python tests/claude_code_hook_schema.py
"""

import json
import pathlib
import sys
import typing

from claude_agent_sdk import types as sdk

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "claude_code"
# The SDK spells Python keywords with a trailing underscore; the wire does not.
WIRE_NAMES = {"continue_": "continue", "async_": "async"}


def check(value, hint, path):
    """Raises AssertionError when `value` does not fit the type `hint`."""
    origin = typing.get_origin(hint)
    if hint is typing.Any:
        return
    if typing.is_typeddict(hint):
        check_typeddict(value, hint, path)
    elif origin is typing.Literal:
        assert value in typing.get_args(hint), f"{path}: {value!r} not in {typing.get_args(hint)}"
    elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        errors = []
        for option in typing.get_args(hint):
            try:
                check(value, option, path)
                return
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{path}: fits no option: {errors}")
    elif origin is dict:
        assert isinstance(value, dict), f"{path}: not an object"
    elif origin is list:
        assert isinstance(value, list), f"{path}: not a list"
    elif hint is type(None):
        assert value is None, f"{path}: not null"
    else:
        assert isinstance(value, hint), f"{path}: {value!r} is not {hint}"


def check_typeddict(value, hint, path):
    assert isinstance(value, dict), f"{path}: not an object"
    hints = typing.get_type_hints(hint)
    wire = {WIRE_NAMES.get(k, k): k for k in hints}
    for key in value:
        assert key in wire, f"{path}: `{key}` is not a key of {hint.__name__}"
    for key in hint.__required_keys__:
        assert WIRE_NAMES.get(key, key) in value, f"{path}: {hint.__name__} requires `{key}`"
    for key, item in value.items():
        check(item, strip_required(hints[wire[key]]), f"{path}.{key}")


def strip_required(hint):
    if typing.get_origin(hint) in (typing.Required, typing.NotRequired):
        return typing.get_args(hint)[0]
    return hint


INPUTS = {
    "PreToolUse": sdk.PreToolUseHookInput,
    "PermissionRequest": sdk.PermissionRequestHookInput,
}
SPECIFIC = {
    "PreToolUse": sdk.PreToolUseHookSpecificOutput,
    "PermissionRequest": sdk.PermissionRequestHookSpecificOutput,
}


def main():
    checked = 0
    for path in sorted(FIXTURES.glob("*.json")):
        value = json.loads(path.read_text())
        check(value, INPUTS[value["hook_event_name"]], path.name)
        checked += 1
    for path in sorted((FIXTURES / "outputs").glob("*.json")):
        value = json.loads(path.read_text())
        event = "PermissionRequest" if path.name.startswith("permission_request") else "PreToolUse"
        check(value, sdk.SyncHookJSONOutput, path.name)
        if "hookSpecificOutput" in value:
            check(value["hookSpecificOutput"], SPECIFIC[event], path.name + ".hookSpecificOutput")
            decision = value["hookSpecificOutput"].get("decision")
            if decision is not None:
                # The SDK types `decision` as a dict; the CLI's schema: behavior allow
                # (updatedInput, updatedPermissions) or deny (message, interrupt).
                allowed = {"allow": {"behavior", "updatedInput", "updatedPermissions"},
                           "deny": {"behavior", "message", "interrupt"}}[decision["behavior"]]
                assert set(decision) <= allowed, f"{path.name}: {decision}"
        checked += 1
    print(f"{checked} passed, 0 failed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
