// Gemini CLI (`@google/gemini-cli`, headless `gemini -p`, `--approval-mode yolo` so the hook is
// the only gate) with its `BeforeTool` hook running `approval-broker hook gemini-cli`, driven by
// a scripted Gemini API server on 127.0.0.1: the model calls `run_shell_command` with a command
// that writes a file, an approver decides it through the broker, and the file on disk says
// whether, and with which input, it ran.
import { geminiCli } from "./lib/hosts.mjs";
import { geminiModel } from "./lib/models/gemini.mjs";
import { shellSuite } from "./lib/shell-suite.mjs";

shellSuite({
  name: "gemini-cli",
  host: geminiCli,
  model: geminiModel,
  tool: "run_shell_command",
  input: (command) => ({ command, description: "Write ran.txt" }),
  callIdPrefix: "gemini-call-",
  hostTool: "run_shell_command",
});
