// The promises every hook adapter keeps, as tests one host's suite registers with its real
// binary: approved (the command runs exactly as approved), approved with an edit (the
// approver's command runs, not the model's), denied (nothing runs; the model reads the reason),
// nobody decides in time (nothing runs; the call is cancelled at the broker; the model reads
// why), broker down (nothing runs; the model reads that the broker could not be reached). Each
// host's file says how to run the host, which model API it speaks and how its model asks for a
// shell command.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Broker, freePort } from "./broker.mjs";
import { newCallId } from "./run.mjs";
import { shellScenario, withCommand } from "./scenario.mjs";

/**
 * `spec`: `name` (as in `hook <name>`), `label` (the tests' prefix; default the name),
 * `host(dirs, {model, broker, wait})`, `model(script)`,
 * `tool`, `input(command)`, `callIdPrefix`, `hostTool` (the tool name the broker is shown),
 * `edits` (false when the host cannot run an edited input; the test then proves the edit is
 * refused rather than the model's input run), `deniedText`, `timeoutText` and
 * `unreachableText` (what the model reads when denied, when nobody decides in time, or when the
 * broker is down; by default the approver's reason, "No approver decided within" and "could not
 * be reached": a host whose protocol carries no reason, as ACP's permission answer, says its own
 * words), `check(result, stored)` (the host's own checks on an approved call).
 */
export function shellSuite(spec) {
  const label = spec.label ?? spec.name;
  let broker;
  before(async () => {
    broker = await Broker.started();
  });
  after(async () => {
    await broker?.dispose();
  });

  const scenario = (options) =>
    shellScenario({
      broker,
      name: spec.name,
      host: spec.host,
      model: spec.model,
      tool: spec.tool,
      input: spec.input,
      callId: newCallId(spec.callIdPrefix),
      ...options,
    });

  test(`${label}: approved, the command runs exactly as approved, and the broker records the call's host`, async (t) => {
    const result = await scenario({
      command: "echo approved > ran.txt",
      approver: (call) => broker.decide(call, { approve: true }),
    });
    assert.equal(result.ran, "approved\n", `the command did not run:\n${result.run.stdout}\n${result.run.stderr}`);
    assert.equal(result.call.tool, spec.hostTool);
    assert.equal(JSON.parse(result.call.inputJson).command, "echo approved > ran.txt");
    const stored = await broker.getCall(result.call.sessionId, result.call.callId);
    assert.equal(stored.status, "CALL_STATUS_APPROVED");
    assert.equal(stored.outcome.decidedBy, "approver:alice@example.com");
    // The broker knows which host asked, and reads the call as the common action `shell`.
    assert.equal(stored.host, spec.name);
    assert.equal(stored.action?.kind, "shell");
    assert.equal(JSON.parse(stored.action.fieldsJson).command, "echo approved > ran.txt");
    await spec.check?.(result, stored);
    t.diagnostic(`the broker was shown: ${stored.tool} ${stored.inputJson} (workspace ${stored.workspace || "none"})`);
    t.diagnostic(`the model read: ${result.script.toolResult}`);
  });

  test(`${label}: approved with an edit, the approver's command runs and not the model's`, async (t) => {
    const result = await scenario({
      command: "echo model > ran.txt",
      approver: (call) => broker.decide(call, { approve: true, editedInput: withCommand(call, "echo edited > ran.txt") }),
    });
    if (spec.edits === false) {
      assert.equal(result.ran, undefined, "the model's command ran although the approver edited it");
      t.diagnostic(`the model read: ${result.script.toolResult}`);
    } else {
      assert.equal(result.ran, "edited\n", `the edited command did not run:\n${result.run.stdout}\n${result.run.stderr}`);
    }
  });

  test(`${label}: denied, the command does not run and the model reads the denial and its reason`, async (t) => {
    const result = await scenario({
      command: "echo denied > ran.txt",
      approver: (call) => broker.decide(call, { approve: false, reason: "Not on the release branch." }),
    });
    assert.equal(result.ran, undefined);
    assert.match(result.script.toolResult, spec.deniedText ?? /Not on the release branch\./);
    t.diagnostic(`the model read: ${result.script.toolResult}`);
  });

  test(`${label}: nobody decides in time, the command does not run, the call is cancelled and the model reads why`, async (t) => {
    let pending;
    const result = await scenario({
      command: "echo late > ran.txt",
      wait: "3s",
      // The approver only looks: the call is pending, and nobody decides.
      approver: (call) => {
        pending = call;
      },
    });
    assert.equal(result.ran, undefined);
    assert.match(result.script.toolResult, spec.timeoutText ?? /No approver decided within 3s/);
    const stored = await broker.getCall(pending.sessionId, pending.callId);
    assert.equal(stored.status, "CALL_STATUS_CANCELLED");
    t.diagnostic(`the model read: ${result.script.toolResult}`);
  });

  test(`${label}: broker down, the command does not run and the model reads that the broker could not be reached`, async (t) => {
    const nobody = `http://127.0.0.1:${await freePort()}`;
    const result = await scenario({ command: "echo unreachable > ran.txt", brokerUrl: nobody });
    assert.equal(result.ran, undefined);
    assert.match(result.script.toolResult, spec.unreachableText ?? /could not be reached/);
    t.diagnostic(`the model read: ${result.script.toolResult}`);
  });
}
