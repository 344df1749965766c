// Codex (`@openai/codex`, its real binary, `codex exec`) with its `PreToolUse` and
// `PermissionRequest` hooks running `approval-broker hook codex`, driven by a scripted Responses
// API server on 127.0.0.1: the model calls `exec_command` with a command that writes a file, an
// approver decides it through the broker, and the file on disk says whether, and with which
// input, it ran.
import { codex } from "./lib/hosts.mjs";
import { responsesModel } from "./lib/models/responses.mjs";
import { shellSuite } from "./lib/shell-suite.mjs";

shellSuite({
  name: "codex",
  host: codex,
  model: responsesModel,
  tool: "exec_command",
  input: (cmd) => ({ cmd }),
  callIdPrefix: "call_",
  // Codex's hooks show a shell command as `Bash` {command}.
  hostTool: "Bash",
});
