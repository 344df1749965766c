// Codex (`@openai/codex`, its real binary, `codex exec`) with its `PreToolUse` and
// `PermissionRequest` hooks running `approval-broker hook codex`, driven by a scripted Responses
// API server on 127.0.0.1: the model calls `exec_command` with a command that writes a file, an
// approver decides it through the broker, and the file on disk says whether, and with which
// input, it ran. Then the same through Codex's app server, where a command outside the sandbox
// asks for approval: `PermissionRequest` answers it from the broker.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Broker, sleep } from "./lib/broker.mjs";
import { codexAppServerTurn } from "./lib/codex-app-server.mjs";
import { CODEX, codex, codexEnvironment } from "./lib/hosts.mjs";
import { responsesModel } from "./lib/models/responses.mjs";
import { Script } from "./lib/models/server.mjs";
import { newCallId, testDirectories } from "./lib/run.mjs";
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

// Codex asking for approval: a command the model wants run outside the sandbox
// (`sandbox_permissions: "require_escalated"`), under the app server an IDE drives
// (`approvalPolicy: "on-request"`; `codex exec` never asks). Codex runs `PreToolUse` for the call,
// then `PermissionRequest` for the escalation: both reach the broker, and the client is never
// asked.
describe("codex app server: a command outside the sandbox", () => {
  let broker;
  before(async () => {
    broker = await Broker.started();
  });
  after(async () => {
    await broker?.dispose();
  });

  /** Runs one turn; `approveEscalation` decides the PermissionRequest call (the PreToolUse call is approved). */
  async function escalated(approveEscalation) {
    const dirs = testDirectories("codex-app-server");
    const script = new Script({
      tool: "exec_command",
      input: { cmd: "echo escalated > ran.txt", sandbox_permissions: "require_escalated", justification: "Write ran.txt outside the sandbox" },
      callId: newCallId("call_"),
    });
    const model = await responsesModel(script);
    const asked = [];
    let finished = false;
    try {
      const approver = (async () => {
        while (!finished && asked.length < 2) {
          for (const call of await broker.pending()) {
            if (asked.some((seen) => seen.callId === call.callId)) continue;
            asked.push(call);
            const permission = call.message.includes("PermissionRequest");
            await broker.decide(call, { approve: !permission || approveEscalation, reason: "Stay in the sandbox." });
          }
          await sleep(100);
        }
      })();
      const env = codexEnvironment(dirs, { model: model.url, broker: broker.url });
      const turn = await codexAppServerTurn({ command: CODEX, cwd: dirs.workspace, env, prompt: "Do the task." }).finally(() => {
        finished = true;
      });
      await approver;
      const ranFile = join(dirs.workspace, "ran.txt");
      return { turn, asked, script, ran: existsSync(ranFile) ? readFileSync(ranFile, "utf8") : undefined };
    } finally {
      await model.close();
      dirs.remove();
    }
  }

  test("codex app server: approved at PreToolUse and at PermissionRequest, it runs, and the client is never asked", async () => {
    const { turn, asked, ran } = await escalated(true);
    assert.equal(turn.trusted, 2, "the two hooks were not trusted");
    assert.equal(ran, "escalated\n");
    assert.deepEqual(turn.approvalRequests, []);
    assert.equal(asked.length, 2);
    assert.match(asked[0].message, /PreToolUse/);
    assert.match(asked[1].message, /PermissionRequest/);
    assert.equal(JSON.parse(asked[1].inputJson).command, "echo escalated > ran.txt");
  });

  test("codex app server: denied at PermissionRequest, it does not run, the model reads the reason, and the client is never asked", async (t) => {
    const { turn, asked, ran, script } = await escalated(false);
    assert.equal(ran, undefined);
    assert.deepEqual(turn.approvalRequests, []);
    assert.equal(asked.length, 2);
    assert.match(script.toolResult, /Stay in the sandbox\./);
    t.diagnostic(`the model read: ${script.toolResult}`);
  });
});
