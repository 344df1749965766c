// An Agent Client Protocol agent (`@agentclientprotocol/claude-agent-acp`: Claude Code through
// the Claude Agent SDK) started behind `approval-broker acp-proxy`, driven by an editor played
// with `@agentclientprotocol/sdk`'s client and by a scripted Anthropic Messages server on
// 127.0.0.1: the model asks for a `Bash` command that writes a file, the agent asks for
// permission, the proxy asks the broker, an approver decides, and the file on disk says whether
// it ran. The editor never sees the permission request; when it cancels the turn, the waiting
// call is cancelled at the broker.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { acpTurn, toolCallState } from "./lib/acp.mjs";
import { Broker } from "./lib/broker.mjs";
import { acpEnvironment, acpProxyCommand } from "./lib/hosts.mjs";
import { anthropicModel } from "./lib/models/anthropic.mjs";
import { Script } from "./lib/models/server.mjs";
import { newCallId, testDirectories } from "./lib/run.mjs";
import { shellSuite } from "./lib/shell-suite.mjs";

/** One prompt turn through the proxy, reported as a host run. */
async function acpHost(dirs, { model, broker, wait }) {
  const [command, args] = acpProxyCommand(broker, wait);
  const turn = await acpTurn({ command, args, cwd: dirs.workspace, env: acpEnvironment(dirs, model), prompt: "Do the task." });
  assert.deepEqual(turn.permissionRequests, [], "a permission request reached the editor: the proxy must answer it");
  return { code: 0, stdout: JSON.stringify(turn.updates), stderr: turn.stderr, turn };
}

shellSuite({
  name: "acp",
  host: acpHost,
  model: anthropicModel,
  tool: "Bash",
  input: (command) => ({ command, description: "Write ran.txt" }),
  callIdPrefix: "toolu_01",
  hostTool: "Bash",
  // An ACP permission answer is an option id: it cannot carry an edited input or a reason.
  edits: false,
  deniedText: /refused permission/,
  unreachableText: /refused permission/,
  timeoutText: /refused permission/,
  check: (result) => {
    const state = toolCallState(JSON.parse(result.run.stdout), result.script.callId);
    assert.equal(state.status, "completed");
    assert.equal(state.kind, "execute");
  },
});

test("acp: the editor cancels the turn while the call waits, the call is cancelled at the broker and nothing runs", async () => {
  const broker = await Broker.started();
  const dirs = testDirectories("acp-cancel");
  const script = new Script({ tool: "Bash", input: { command: "echo cancelled > ran.txt" }, callId: newCallId("toolu_01") });
  const model = await anthropicModel(script);
  try {
    const [command, args] = acpProxyCommand(broker.url);
    let pending;
    const turn = await acpTurn({
      command,
      args,
      cwd: dirs.workspace,
      env: acpEnvironment(dirs, model.url),
      prompt: "Do the task.",
      // The editor's user gives up while the approver has not decided.
      during: async ({ agent, sessionId }) => {
        pending = await broker.waitForPending(script.callId);
        await agent.notify("session/cancel", { sessionId });
      },
    });
    assert.equal(turn.stopReason, "cancelled");
    assert.deepEqual(turn.permissionRequests, []);
    assert.equal(existsSync(join(dirs.workspace, "ran.txt")), false);
    const stored = await broker.getCall(pending.sessionId, pending.callId);
    assert.equal(stored.status, "CALL_STATUS_CANCELLED");
    assert.equal(stored.outcome.decidedBy, "agent");
  } finally {
    await model.close();
    dirs.remove();
    await broker.dispose();
  }
});
