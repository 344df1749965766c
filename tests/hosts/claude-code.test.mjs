// Claude Code (`@anthropic-ai/claude-code`, its real binary) with its `PreToolUse` hook running
// `approval-broker hook claude-code`, driven by a scripted Anthropic Messages server on
// 127.0.0.1: the model asks for a `Bash` command that writes a file, an approver decides it
// through the broker, and the file on disk says whether, and with which input, it ran.
import { claudeCode } from "./lib/hosts.mjs";
import { anthropicModel } from "./lib/models/anthropic.mjs";
import { shellSuite } from "./lib/shell-suite.mjs";

shellSuite({
  name: "claude-code",
  host: claudeCode,
  model: anthropicModel,
  tool: "Bash",
  input: (command) => ({ command, description: "Write ran.txt" }),
  callIdPrefix: "toolu_01",
  hostTool: "Bash",
});
