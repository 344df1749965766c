// GitHub Copilot CLI (`@github/copilot`, `copilot -p` with COPILOT_OFFLINE and a custom provider)
// with the repository's hook running `approval-broker hook copilot`, driven by a scripted Chat
// Completions server on 127.0.0.1: the model calls `bash` with a command that writes a file, an
// approver decides it through the broker, and the file on disk says whether, and with which
// input, it ran. Twice: with the hook under `preToolUse` (Copilot's own payload: `bash`,
// `toolArgs`) and under `PreToolUse` (its Claude-style payload: `Bash`, `tool_input`).
import { copilot } from "./lib/hosts.mjs";
import { chatModel } from "./lib/models/chat.mjs";
import { shellSuite } from "./lib/shell-suite.mjs";

const input = (command) => ({ command, description: "Write ran.txt", mode: "sync", initial_wait: 30 });

shellSuite({
  name: "copilot",
  host: copilot,
  model: chatModel,
  tool: "bash",
  input,
  callIdPrefix: "call_",
  hostTool: "bash",
});

shellSuite({
  name: "copilot",
  label: "copilot (PreToolUse)",
  host: (dirs, options) => copilot(dirs, { ...options, event: "PreToolUse" }),
  model: chatModel,
  tool: "bash",
  input,
  callIdPrefix: "call_",
  hostTool: "Bash",
});
