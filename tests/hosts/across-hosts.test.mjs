// One decision, every host: an approver allows Claude Code's `git status` for the workspace
// (ApproverService Decide with scope WORKSPACE); Codex's, the ACP agent's, Gemini CLI's and
// Copilot CLI's identical `git status` in the same workspace are then APPROVED at once, with
// nobody asked, their outcomes naming that grant as the decider, and AdminService Explain on
// them names it too.
// Each host is its real binary with its own scripted model server; they share one broker and
// one git repository as their workspace.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { acpTurn } from "./lib/acp.mjs";
import { Broker, binDirectory } from "./lib/broker.mjs";
import { acpEnvironment, acpProxyCommand, claudeCode, codex, copilot, geminiCli } from "./lib/hosts.mjs";
import { anthropicModel } from "./lib/models/anthropic.mjs";
import { chatModel } from "./lib/models/chat.mjs";
import { geminiModel } from "./lib/models/gemini.mjs";
import { responsesModel } from "./lib/models/responses.mjs";
import { Script } from "./lib/models/server.mjs";
import { assertExitedCleanly, newCallId } from "./lib/run.mjs";

const COMMAND = "git status";
let broker;
let root;
let workspace;
let bin;
let grant;

before(async () => {
  broker = await Broker.started();
  root = mkdtempSync(join(tmpdir(), "hosts-across-"));
  workspace = join(root, "repository");
  mkdirSync(workspace);
  execFileSync("git", ["init", "--quiet", "--initial-branch=main", workspace]);
  bin = binDirectory(root);
});
after(async () => {
  await broker?.dispose();
  if (root) rmSync(root, { recursive: true, force: true });
});

/** Directories for one host: its own HOME, the shared workspace. */
function hostDirectories(name) {
  const home = join(root, `home-${name}`);
  mkdirSync(home, { recursive: true });
  return { root, home, workspace, bin };
}

/** The stored call of this host asking for `git status`. */
async function storedCall(host) {
  const calls = (await broker.listCalls()).filter((call) => call.host === host && call.inputJson.includes(COMMAND));
  assert.equal(calls.length, 1, `expected one ${host} call of ${COMMAND}, got ${JSON.stringify(calls)}`);
  return calls[0];
}

/** The grant decided this call: its outcome and Explain both name it. */
async function assertDecidedByGrant(call) {
  assert.equal(call.status, "CALL_STATUS_APPROVED");
  assert.equal(call.outcome.decidedBy, `grant:${grant.id}`);
  assert.deepEqual(call.outcome.decidedByApprovers, []);
  const explained = await broker.explain(call.sessionId, call.callId);
  assert.equal(explained.decidedBy, `grant:${grant.id}`);
  assert.equal(explained.grant?.id, grant.id);
  assert.equal(explained.verdict, "CALL_STATUS_APPROVED");
  return explained;
}

test("Claude Code: an approver allows `git status` for the workspace, and it runs", async (t) => {
  const dirs = hostDirectories("claude-code");
  const script = new Script({ tool: "Bash", input: { command: COMMAND, description: "Show the status" }, callId: newCallId("toolu_01") });
  const model = await anthropicModel(script);
  try {
    const decided = broker.waitForPending(script.callId).then((call) => broker.decide(call, { approve: true, scope: "SCOPE_WORKSPACE" }));
    const [run, decision] = await Promise.all([claudeCode(dirs, { model: model.url, broker: broker.url }), decided]);
    assertExitedCleanly(run, "claude");
    grant = decision.grant;
    assert.ok(grant?.id, `Decide created no grant: ${JSON.stringify(decision)}`);
    assert.equal(grant.scope, "SCOPE_WORKSPACE");
    assert.equal(grant.workspace, workspace);
    assert.equal(grant.kind, "shell");
    assert.match(script.toolResult, /No commits yet/);
    t.diagnostic(`grant ${grant.id}: ${grant.kind} ${JSON.stringify(grant.matcher)} in ${grant.workspace}`);
  } finally {
    await model.close();
  }
});

test("Codex: the same `git status` is approved at once by that grant, and Explain names it", async (t) => {
  assert.ok(grant, "the Claude Code step made no grant");
  const dirs = hostDirectories("codex");
  const script = new Script({ tool: "exec_command", input: { cmd: COMMAND }, callId: newCallId("call_") });
  const model = await responsesModel(script);
  try {
    const run = await codex(dirs, { model: model.url, broker: broker.url });
    assertExitedCleanly(run, "codex");
    assert.match(script.toolResult, /No commits yet/);
    const explained = await assertDecidedByGrant(await storedCall("codex"));
    t.diagnostic(`Explain: ${explained.reason}`);
  } finally {
    await model.close();
  }
});

test("ACP agent: the same `git status` is approved at once by that grant, and Explain names it", async (t) => {
  assert.ok(grant, "the Claude Code step made no grant");
  const dirs = hostDirectories("acp");
  const script = new Script({ tool: "Bash", input: { command: COMMAND, description: "Show the status" }, callId: newCallId("toolu_01") });
  const model = await anthropicModel(script);
  try {
    const [command, args] = acpProxyCommand(broker.url);
    const env = acpEnvironment(dirs, model.url);
    const turn = await acpTurn({ command, args, cwd: workspace, env, prompt: "Show the status." });
    assert.deepEqual(turn.permissionRequests, []);
    assert.match(script.toolResult, /No commits yet/);
    const explained = await assertDecidedByGrant(await storedCall("acp"));
    t.diagnostic(`Explain: ${explained.reason}`);
  } finally {
    await model.close();
  }
});

/** A hook host's run of the scripted `git status`: approved by the grant, nobody asked. */
async function hookHostRuns(t, { name, host, model, script }) {
  assert.ok(grant, "the Claude Code step made no grant");
  const server = await model(script);
  try {
    const run = await host(hostDirectories(name), { model: server.url, broker: broker.url });
    assertExitedCleanly(run, name);
    assert.match(script.toolResult, /No commits yet/);
    const explained = await assertDecidedByGrant(await storedCall(name));
    t.diagnostic(`Explain: ${explained.reason}`);
  } finally {
    await server.close();
  }
}

test("Gemini CLI: the same `git status` is approved at once by that grant, and Explain names it", (t) =>
  hookHostRuns(t, {
    name: "gemini-cli",
    host: geminiCli,
    model: geminiModel,
    script: new Script({ tool: "run_shell_command", input: { command: COMMAND, description: "Show the status" }, callId: newCallId("gemini-") }),
  }));

test("Copilot CLI: the same `git status` is approved at once by that grant, and Explain names it", (t) =>
  hookHostRuns(t, {
    name: "copilot",
    host: copilot,
    model: chatModel,
    script: new Script({ tool: "bash", input: { command: COMMAND, description: "Show the status", mode: "sync", initial_wait: 30 }, callId: newCallId("call_") }),
  }));
