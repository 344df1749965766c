/**
 * The Anthropic and OpenAI helpers against a real broker: a turn's tool calls go in as the model
 * produced them, and exactly one tool result per call comes out, in the model's order, the
 * denied, skipped, refused and not-asked ones included; only approved calls run, with their
 * approved input.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { toolResults, reviewToolUses, type ContentBlock } from "../src/anthropic.js";
import { functionCallOutputs, toolMessages, type ChatToolCall } from "../src/openai.js";
import { Status, type Broker } from "../src/index.js";
import { connectBroker } from "../src/node.js";
import { approveWhenPending, BrokerProcess, freePort, newSession } from "./broker.js";

describe("message formats against a real broker", () => {
  let process_: BrokerProcess;
  let broker: Broker;
  before(async () => {
    process_ = await BrokerProcess.started();
    broker = connectBroker(process_.target);
  });
  after(async () => {
    await broker.close();
    await process_.dispose();
  });

  /** A `run` that records what it was asked to run. */
  function recorder() {
    const ran: [string, Record<string, unknown>][] = [];
    const run = (name: string, input: Record<string, unknown>) => {
      ran.push([name, input]);
      if (name === "explode") throw new Error("disk full");
      return name === "read_file" ? `contents of ${String(input.path)}` : { ok: true };
    };
    return { ran, run };
  }

  test("Anthropic: three tool uses, the middle one denied: three tool_results in order", async () => {
    const session = newSession();
    const content: ContentBlock[] = [
      { type: "text", text: "Let me look." },
      { type: "tool_use", id: "toolu_01", name: "read_file", input: { path: "a.txt" } },
      { type: "tool_use", id: "toolu_02", name: "run_shell", input: { command: "rm -rf /" } },
      { type: "tool_use", id: "toolu_03", name: "read_file", input: { path: "b.txt" } },
    ];
    const approving = approveWhenPending(process_.target, session, [
      { callId: "toolu_01", approve: true, editedInputJson: '{"path":"safe.txt"}' },
      { callId: "toolu_02", approve: false, reason: "never" },
    ]);
    const { ran, run } = recorder();
    const message = await toolResults(broker, session, { content }, { run, timeoutMs: 30_000 });
    await approving;
    assert.equal(message.role, "user");
    assert.deepEqual(message.content.map((b) => [b.type, b.tool_use_id, b.is_error ?? false]), [
      ["tool_result", "toolu_01", false],
      ["tool_result", "toolu_02", true],
      ["tool_result", "toolu_03", true],
    ]);
    assert.equal(message.content[0]?.content, "contents of safe.txt");
    assert.match(message.content[1]?.content ?? "", /never/);
    assert.ok(message.content[2]?.content);
    assert.deepEqual(ran, [["read_file", { path: "safe.txt" }]]);
    // The per-call decisions, for an agent that runs tools itself: the same outcomes again.
    const reviewed = await reviewToolUses(broker, session, content, { timeoutMs: 10_000 });
    assert.deepEqual(reviewed.map((r) => r.outcome.status), [Status.APPROVED, Status.DENIED, Status.SKIPPED]);
    assert.throws(() => reviewed[1]?.input, /was not approved/);
    assert.throws(() => reviewed[0]?.result(), /run it and pass its output/);
  });

  test("Anthropic: a tool that throws still answers its call, flagged", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [{ callId: "toolu_01", approve: true }]);
    const { run } = recorder();
    const message = await toolResults(broker, session, [{ type: "tool_use", id: "toolu_01", name: "explode", input: {} }], { run, timeoutMs: 30_000 });
    await approving;
    assert.deepEqual(message.content, [{ type: "tool_result", tool_use_id: "toolu_01", content: "The tool failed: Error: disk full", is_error: true }]);
  });

  test("OpenAI Chat Completions: function and custom calls, bad arguments refused for that call alone", async () => {
    const session = newSession();
    const toolCalls: ChatToolCall[] = [
      { id: "call_1", type: "function", function: { name: "read_file", arguments: '{"path":"a.txt"}' } },
      { id: "call_2", type: "custom", custom: { name: "apply_patch", input: "*** Begin Patch" } },
      { id: "call_3", type: "function", function: { name: "read_file", arguments: "[1,2]" } },
    ];
    const approving = approveWhenPending(process_.target, session, [
      { callId: "call_1", approve: true },
      { callId: "call_2", approve: true },
    ]);
    const { ran, run } = recorder();
    const messages = await toolMessages(broker, session, toolCalls, { run, timeoutMs: 30_000 });
    await approving;
    assert.deepEqual(messages.map((m) => [m.role, m.tool_call_id]), [["tool", "call_1"], ["tool", "call_2"], ["tool", "call_3"]]);
    assert.equal(messages[0]?.content, "contents of a.txt");
    assert.equal(messages[1]?.content, '{"ok":true}');
    assert.match(messages[2]?.content ?? "", /^The approval broker refused this tool call; the tool was not run\. Reason: .*must be a JSON object/);
    assert.deepEqual(ran, [["read_file", { path: "a.txt" }], ["apply_patch", { input: "*** Begin Patch" }]]);
  });

  test("OpenAI Responses: one function_call_output per function_call, in order", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [
      { callId: "fc_1", approve: false, reason: "no" },
      { callId: "fc_2", approve: true },
    ]);
    const { ran, run } = recorder();
    const items = await functionCallOutputs(
      broker,
      session,
      [
        { type: "reasoning", id: "r1" },
        { type: "function_call", call_id: "fc_1", name: "run_shell", arguments: '{"command":"ls"}' },
        { type: "function_call", call_id: "fc_2", name: "read_file", arguments: '{"path":"x"}' },
      ],
      { run, onDeny: "INDEPENDENT", timeoutMs: 30_000 },
    );
    await approving;
    assert.deepEqual(items.map((i) => [i.type, i.call_id]), [["function_call_output", "fc_1"], ["function_call_output", "fc_2"]]);
    assert.match(items[0]?.output ?? "", /denied/i);
    assert.equal(items[1]?.output, "contents of x");
    assert.deepEqual(ran, [["read_file", { path: "x" }]]);
  });
});

describe("message formats when the broker is out of reach", () => {
  test("every call gets a not-run result, and nothing runs", async () => {
    const broker = connectBroker(`127.0.0.1:${await freePort()}`, { unavailableTimeoutMs: 500, logger: { debug() {}, info() {}, warn() {} } });
    try {
      const ran: unknown[] = [];
      const run = (name: string, input: Record<string, unknown>) => void ran.push([name, input]);
      const message = await toolResults(broker, "s", [
        { type: "tool_use", id: "toolu_01", name: "read_file", input: { path: "a" } },
        { type: "tool_use", id: "toolu_02", name: "run_shell", input: { command: "ls" } },
      ], { run });
      assert.deepEqual(message.content.map((b) => [b.tool_use_id, b.is_error]), [["toolu_01", true], ["toolu_02", true]]);
      assert.match(message.content[0]?.content ?? "", /^The approval broker could not be asked, so this tool call was not run\. \(/);
      const messages = await toolMessages(broker, "s", [{ id: "call_1", type: "function", function: { name: "f", arguments: "{}" } }], { run });
      assert.match(messages[0]?.content ?? "", /could not be asked/);
      assert.deepEqual(ran, []);
    } finally {
      await broker.close();
    }
  });
});
