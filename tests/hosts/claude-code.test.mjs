// Claude Code (`@anthropic-ai/claude-code`, its real binary) with its `PreToolUse` hook running
// `approval-broker hook claude-code`, driven by a scripted Anthropic Messages server on
// 127.0.0.1: the model asks for a `Bash` command that writes a file, an approver decides it
// through the broker, and the file on disk says whether, and with which input, it ran.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Broker, freePort } from "./lib/broker.mjs";
import { claudeCode } from "./lib/hosts.mjs";
import { anthropicModel } from "./lib/models/anthropic.mjs";
import { Script } from "./lib/models/server.mjs";
import { newCallId, testDirectories } from "./lib/run.mjs";

let broker;
before(async () => {
  broker = await Broker.started();
});
after(async () => {
  await broker?.dispose();
});

/** One scripted turn: the model asks for `command` in Bash; `approver(call)` decides it. */
async function scenario({ command, brokerUrl = broker.url, approver }) {
  const dirs = testDirectories("claude-code");
  const script = new Script({
    tool: "Bash",
    input: { command, description: "Write ran.txt" },
    callId: newCallId("toolu_01"),
    text: "Finished.",
  });
  const model = await anthropicModel(script);
  try {
    const host = claudeCode(dirs, { model: model.url, broker: brokerUrl });
    const decided = approver ? broker.waitForPending(script.callId).then(approver) : Promise.resolve();
    const [run, decision] = await Promise.all([host, decided]);
    const ranFile = join(dirs.workspace, "ran.txt");
    return {
      run,
      script,
      decision,
      ran: existsSync(ranFile) ? readFileSync(ranFile, "utf8") : undefined,
      workspace: dirs.workspace,
    };
  } finally {
    await model.close();
    dirs.remove();
  }
}

test("approved: the command runs exactly as approved, and the call records the host and its workspace", async () => {
  let pendingCall;
  const { script, ran, workspace } = await scenario({
    command: "echo approved > ran.txt",
    approver: (call) => {
      pendingCall = call;
      return broker.decide(call, { approve: true });
    },
  });
  assert.equal(ran, "approved\n");
  assert.equal(pendingCall.tool, "Bash");
  assert.equal(JSON.parse(pendingCall.inputJson).command, "echo approved > ran.txt");
  assert.equal(pendingCall.workspace, workspace);
  assert.equal(script.toolCallsSent, 1);
  const stored = await broker.getCall(pendingCall.sessionId, script.callId);
  assert.equal(stored.status, "CALL_STATUS_APPROVED");
  assert.equal(stored.outcome.decidedBy, "approver:alice@example.com");
});

test("approved with an edit: the approver's input runs, not the model's", async () => {
  const { ran, script } = await scenario({
    command: "echo model > ran.txt",
    approver: (call) =>
      broker.decide(call, { approve: true, editedInput: { command: "echo edited > ran.txt", description: "Write ran.txt" } }),
  });
  assert.equal(ran, "edited\n");
  assert.equal(script.toolResults.length, 1);
});

test("denied: the command does not run and the model reads the denial with its reason", async (t) => {
  const { ran, script } = await scenario({
    command: "echo denied > ran.txt",
    approver: (call) => broker.decide(call, { approve: false, reason: "Not on the release branch." }),
  });
  assert.equal(ran, undefined);
  assert.match(script.toolResult, /Not on the release branch\./);
  t.diagnostic(`the model read: ${script.toolResult}`);
});

test("broker down: the command does not run and the model reads that the broker could not be reached", async (t) => {
  const nobody = `http://127.0.0.1:${await freePort()}`;
  const { ran, script } = await scenario({ command: "echo unreachable > ran.txt", brokerUrl: nobody });
  assert.equal(ran, undefined);
  assert.match(script.toolResult, /could not be reached/);
  assert.match(script.toolResult, /not run/);
  t.diagnostic(`the model read: ${script.toolResult}`);
});
