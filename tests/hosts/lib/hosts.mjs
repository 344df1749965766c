// Each host's real binary, configured as docs/hosts.md tells a user to (its hook running
// `approval-broker hook <host> --broker URL`) and pointed at a scripted model server on
// 127.0.0.1, with what it would send elsewhere at start (updates, telemetry, error reports)
// turned off. Each function writes the host's settings into the test's HOME or workspace and
// resolves with the finished run (see run.mjs).
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { hostEnvironment, runHost } from "./run.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
export const NODE_MODULES = resolve(HERE, "../node_modules");
const bin = (name) => join(NODE_MODULES, ".bin", name);

/** How long a hook waits for a decision in these tests, below each host's hook timeout. */
export const HOOK_WAIT = "60s";

function writeJson(path, value) {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `${JSON.stringify(value, null, 2)}\n`);
}

// --- Claude Code ---------------------------------------------------------------------------

/** The environment Claude Code runs with: the scripted model, nothing sent anywhere else. */
export function claudeEnvironment(dirs, modelUrl, extra = {}) {
  return hostEnvironment(dirs, {
    ANTHROPIC_BASE_URL: modelUrl,
    ANTHROPIC_API_KEY: "sk-ant-scripted",
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    DISABLE_AUTOUPDATER: "1",
    DISABLE_TELEMETRY: "1",
    DISABLE_ERROR_REPORTING: "1",
    ...extra,
  });
}

/** `~/.claude/settings.json`'s hook entry, as docs/hosts.md gives it. */
export function claudeSettings(brokerUrl, wait = HOOK_WAIT) {
  return {
    hooks: {
      PreToolUse: [
        {
          matcher: "Bash|Edit|Write|NotebookEdit|WebFetch|mcp__.*",
          hooks: [
            {
              type: "command",
              command: `approval-broker hook claude-code --broker ${brokerUrl} --timeout ${wait}`,
              timeout: 90,
              onFailure: "block",
            },
          ],
        },
      ],
    },
  };
}

/** `claude -p` in the workspace, its hook set in HOME's settings. */
export function claudeCode(dirs, { model, broker, wait, prompt = "Do the task." }) {
  writeJson(join(dirs.home, ".claude", "settings.json"), claudeSettings(broker, wait));
  return runHost(bin("claude"), ["-p", prompt, "--output-format", "json"], {
    cwd: dirs.workspace,
    env: claudeEnvironment(dirs, model),
  });
}

// --- Codex ---------------------------------------------------------------------------------

/** `$CODEX_HOME/config.toml`: the scripted provider, and the hook entries docs/hosts.md gives. */
export function codexConfig(modelUrl, brokerUrl, wait = HOOK_WAIT) {
  const hook = `approval-broker hook codex --broker ${brokerUrl} --timeout ${wait}`;
  return `# The scripted model on loopback (a Responses API provider); gpt-5.5 is in Codex's catalog,
# so it offers its usual tools.
model = "gpt-5.5"
model_provider = "scripted"
check_for_update_on_startup = false

[model_providers.scripted]
name = "scripted"
base_url = "${modelUrl}/v1"
wire_api = "responses"
env_key = "SCRIPTED_OPENAI_KEY"

[analytics]
enabled = false

[[hooks.PreToolUse]]
matcher = ".*"
[[hooks.PreToolUse.hooks]]
type = "command"
command = "${hook}"
timeout = 90

[[hooks.PermissionRequest]]
matcher = ".*"
[[hooks.PermissionRequest.hooks]]
type = "command"
command = "${hook}"
timeout = 90
`;
}

/** Writes `$CODEX_HOME/config.toml` in the test's HOME; returns the environment Codex runs with. */
export function codexEnvironment(dirs, { model, broker, wait }) {
  const codexHome = join(dirs.home, ".codex");
  mkdirSync(codexHome, { recursive: true });
  writeFileSync(join(codexHome, "config.toml"), codexConfig(model, broker, wait));
  return hostEnvironment(dirs, { CODEX_HOME: codexHome, SCRIPTED_OPENAI_KEY: "sk-scripted" });
}

export const CODEX = bin("codex");

/** `codex exec` in the workspace (sandbox workspace-write), hooks trusted for this run. */
export function codex(dirs, { model, broker, wait, prompt = "Do the task." }) {
  const env = codexEnvironment(dirs, { model, broker, wait });
  return runHost(
    bin("codex"),
    ["exec", "--skip-git-repo-check", "--dangerously-bypass-hook-trust", "--sandbox", "workspace-write", "--json", prompt],
    { cwd: dirs.workspace, env },
  );
}

// --- Gemini CLI ----------------------------------------------------------------------------

/** `~/.gemini/settings.json`: API-key auth (the scripted model), no telemetry or update
 * checks, and the `BeforeTool` hook docs/hosts.md gives. */
export function geminiSettings(brokerUrl, wait = HOOK_WAIT) {
  return {
    security: { auth: { selectedType: "gemini-api-key" } },
    general: { enableAutoUpdate: false, enableAutoUpdateNotification: false },
    privacy: { usageStatisticsEnabled: false },
    telemetry: { enabled: false },
    hooks: {
      BeforeTool: [
        {
          matcher: ".*",
          hooks: [
            {
              name: "approval-broker",
              type: "command",
              command: `approval-broker hook gemini-cli --broker ${brokerUrl} --timeout ${wait}`,
              timeout: 90_000,
            },
          ],
        },
      ],
    },
  };
}

/** `gemini -p` headless in the workspace, `--approval-mode yolo` (the hook is the gate). */
export function geminiCli(dirs, { model, broker, wait, prompt = "Do the task." }) {
  writeJson(join(dirs.home, ".gemini", "settings.json"), geminiSettings(broker, wait));
  return runHost(
    bin("gemini"),
    ["--skip-trust", "-m", "gemini-2.5-pro", "--approval-mode", "yolo", "-p", prompt, "-o", "json"],
    { cwd: dirs.workspace, env: hostEnvironment(dirs, { GEMINI_API_KEY: "scripted", GOOGLE_GEMINI_BASE_URL: model }) },
  );
}

// --- Copilot CLI ---------------------------------------------------------------------------

/** `.github/hooks/approval-broker.json` in the repository: the hook docs/hosts.md gives, under
 * `preToolUse` (Copilot's own dialect) or `PreToolUse` (its Claude-style one). */
export function copilotHooks(brokerUrl, wait = HOOK_WAIT, event = "preToolUse") {
  return {
    version: 1,
    hooks: {
      [event]: [{ type: "command", bash: `approval-broker hook copilot --broker ${brokerUrl} --timeout ${wait}`, timeoutSec: 90 }],
    },
  };
}

/** `copilot -p` offline against the scripted Chat Completions model, the folder trusted for
 * this prompt (so the repository's hooks load). */
export function copilot(dirs, { model, broker, wait, event, prompt = "Do the task." }) {
  writeJson(join(dirs.workspace, ".github", "hooks", "approval-broker.json"), copilotHooks(broker, wait, event));
  return runHost(bin("copilot"), ["-p", prompt, "--trust-folder", "--no-auto-update", "--log-level", "none"], {
    cwd: dirs.workspace,
    env: hostEnvironment(dirs, {
      COPILOT_OFFLINE: "true",
      COPILOT_PROVIDER_BASE_URL: `${model}/v1`,
      COPILOT_PROVIDER_API_KEY: "scripted",
      COPILOT_MODEL: "claude-sonnet-4.5",
    }),
  });
}

// --- an ACP agent behind `approval-broker acp-proxy` ---------------------------------------

/** The ACP agent: `@agentclientprotocol/claude-agent-acp` (Claude Code through the Claude Agent
 * SDK), started with the Node 22 the tests run on. */
export const ACP_AGENT = [process.execPath, join(NODE_MODULES, "@agentclientprotocol", "claude-agent-acp", "dist", "index.js")];

/** The agent's Claude settings: ask before acting (`default`; without it the agent starts in
 * `auto`, which asks nobody), and ask for every shell command, edit, write and fetch (without
 * the `ask` rules, commands Claude Code deems read-only, `git status` among them, run unasked):
 * so each such call asks the editor, that is the proxy, for permission. */
export function acpAgentSettings() {
  return { permissions: { defaultMode: "default", ask: ["Bash", "Edit", "Write", "NotebookEdit", "WebFetch"] } };
}

/** The editor's agent command as docs/hosts.md gives it: the proxy in front of the agent. */
export function acpProxyCommand(brokerUrl, wait = HOOK_WAIT) {
  return ["approval-broker", ["acp-proxy", "--broker", brokerUrl, "--timeout", wait, "--", ...ACP_AGENT]];
}

/** The agent's environment: the scripted Anthropic model, nothing sent anywhere else. */
export function acpEnvironment(dirs, modelUrl) {
  writeJson(join(dirs.home, ".claude", "settings.json"), acpAgentSettings());
  // Claude Code refuses to start as root with permissions bypassed unless told it is sandboxed.
  return claudeEnvironment(dirs, modelUrl, { IS_SANDBOX: "1" });
}
