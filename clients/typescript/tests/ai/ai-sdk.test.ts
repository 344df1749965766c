/**
 * The Vercel AI SDK (the real `ai` 7 package, its `ai/test` mock models) with the broker as its
 * tool approver, against a real broker. Each test reads the prompt the mock model received on
 * the step after the tool calls and asserts the promise the SDK itself broke: exactly one tool
 * result per tool call, in the model's order, whatever mix of approvals, denials, skips,
 * timeouts, a restart or an unreachable broker decided them; only approved calls ran, with the
 * approved input, and the history records that input; a call the SDK finds invalid is never
 * left pending at the broker. Runs on Node 22 (`ai` 7 needs it): `node_modules/.bin/node`.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  convertToModelMessages,
  generateText,
  isStepCount,
  jsonSchema,
  readUIMessageStream,
  simulateReadableStream,
  streamText,
  tool,
  wrapLanguageModel,
  type ModelMessage,
  type UIMessage,
} from "ai";
import { MockLanguageModelV4 } from "ai/test";
import type { LanguageModelV4StreamPart } from "@ai-sdk/provider";
import { z } from "zod";
import { brokerApproval } from "../../src/ai-sdk.js";
import { Status, type Broker } from "../../src/index.js";
import { connectBroker } from "../../src/node.js";
import { approveWhenPending, BrokerProcess, decide, freePort, newSession, pendingCalls, Scope, waitUntilPending, type Decision } from "../broker.js";

type Usage = { inputTokens: { total: number; noCache: number; cacheRead: undefined; cacheWrite: undefined }; outputTokens: { total: number; text: number; reasoning: undefined } };
const USAGE: Usage = { inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined }, outputTokens: { total: 5, text: 5, reasoning: undefined } };

interface ModelCall {
  id: string;
  name: string;
  input: Record<string, unknown>;
}

const READ_A: ModelCall = { id: "call_1", name: "read_file", input: { path: "a.txt" } };
const READ_B: ModelCall = { id: "call_4", name: "read_file", input: { path: "d.txt" } };
const THREE: ModelCall[] = [
  READ_A,
  { id: "call_2", name: "run_shell", input: { command: "rm -rf /" } },
  { id: "call_3", name: "read_file", input: { path: "b.txt" } },
];

/** A mock model: the first step asks for `calls` (in one response), the second answers text. */
function generatingModel(calls: ModelCall[]) {
  return new MockLanguageModelV4({
    doGenerate: [
      {
        content: calls.map((c) => ({ type: "tool-call" as const, toolCallId: c.id, toolName: c.name, input: JSON.stringify(c.input) })),
        finishReason: { unified: "tool-calls" as const, raw: "tool_calls" },
        usage: USAGE,
        warnings: [],
      },
      { content: [{ type: "text" as const, text: "Done." }], finishReason: { unified: "stop" as const, raw: "stop" }, usage: USAGE, warnings: [] },
    ],
  });
}

/** The same, streaming, a part every 20 ms (so the SDK reads each call before the next comes). */
function streamingModel(calls: ModelCall[]) {
  let step = 0;
  return new MockLanguageModelV4({
    doStream: async () => {
      step += 1;
      const parts: LanguageModelV4StreamPart[] =
        step === 1
          ? [
              { type: "stream-start" as const, warnings: [] },
              ...calls.map((c) => ({ type: "tool-call" as const, toolCallId: c.id, toolName: c.name, input: JSON.stringify(c.input) })),
              { type: "finish" as const, finishReason: { unified: "tool-calls" as const, raw: "tool_calls" }, usage: USAGE },
            ]
          : [
              { type: "stream-start" as const, warnings: [] },
              { type: "text-start" as const, id: "t1" },
              { type: "text-delta" as const, id: "t1", delta: "Done." },
              { type: "text-end" as const, id: "t1" },
              { type: "finish" as const, finishReason: { unified: "stop" as const, raw: "stop" }, usage: USAGE },
            ];
      return { stream: simulateReadableStream({ chunks: parts, chunkDelayInMs: 20 }) };
    },
  });
}

/** The tools, recording what ran with which input (`read_file`'s input checked by zod). */
function recordingTools() {
  const ran: [string, unknown][] = [];
  const schema = jsonSchema<Record<string, unknown>>({ type: "object" });
  const tools = {
    read_file: tool({
      inputSchema: z.object({ path: z.string() }),
      execute: async (input: { path: string }) => {
        ran.push(["read_file", input]);
        return `contents of ${input.path}`;
      },
    }),
    run_shell: tool({
      inputSchema: schema,
      execute: async (input: Record<string, unknown>) => {
        ran.push(["run_shell", input]);
        return "ran";
      },
    }),
    explode: tool({
      inputSchema: schema,
      execute: async (input: Record<string, unknown>): Promise<string> => {
        ran.push(["explode", input]);
        throw new Error("disk full");
      },
    }),
  };
  return { ran, tools };
}

/** The tool results of the prompt's tool messages, in order: [id, kind, value or reason]. */
function toolResultsIn(prompt: readonly { role: string; content: unknown }[]): [string, string, string][] {
  const results: [string, string, string][] = [];
  for (const message of prompt) {
    if (message.role !== "tool") continue;
    for (const part of message.content as { type: string; toolCallId: string; output: { type: string; value?: unknown; reason?: string } }[]) {
      if (part.type !== "tool-result") continue;
      const output = part.output;
      results.push([part.toolCallId, output.type, output.type === "execution-denied" ? (output.reason ?? "") : String(output.value)]);
    }
  }
  return results;
}

/** The tool calls of the prompt's assistant messages, in order. */
function toolCallsIn(prompt: readonly { role: string; content: unknown }[]): string[] {
  return toolCallInputsIn(prompt).map(([id]) => id);
}

/** The tool calls of the messages' assistant messages with the input each records, in order. */
function toolCallInputsIn(prompt: readonly { role: string; content: unknown }[]): [string, unknown][] {
  return prompt
    .filter((m) => m.role === "assistant" && Array.isArray(m.content))
    .flatMap((m) => (m.content as { type: string; toolCallId: string; input: unknown }[]).filter((p) => p.type === "tool-call").map((p): [string, unknown] => [p.toolCallId, p.input]));
}

const MODES = ["generateText", "streamText", "UI message stream"] as const;
type Mode = (typeof MODES)[number];

/**
 * One agent turn through the SDK in `mode`, with the broker deciding: the model asks for `calls`
 * in its first step and answers text in the second. Returns what ran, the prompt of the second
 * step, and (UI mode) the last UI message.
 */
async function runTurn(mode: Mode, broker: Broker, session: string, calls: ModelCall[], options: Parameters<typeof brokerApproval>[2] = {}) {
  const approval = brokerApproval(broker, session, { timeoutMs: 30_000, ...options });
  const { ran, tools } = recordingTools();
  if (mode === "generateText") {
    const model = generatingModel(calls);
    const result = await generateText({
      model: wrapLanguageModel({ model, middleware: approval.middleware }),
      tools: approval.tools(tools),
      toolApproval: approval.toolApproval,
      experimental_refineToolInput: approval.refineToolInput,
      stopWhen: isStepCount(3),
      prompt: "Tidy up.",
    });
    assert.equal(result.text, "Done.");
    return { ran, approval, prompt: model.doGenerateCalls[1]?.prompt ?? [], ui: undefined, history: result.responseMessages };
  }
  const model = streamingModel(calls);
  const result = streamText({
    model: wrapLanguageModel({ model, middleware: approval.middleware }),
    tools: approval.tools(tools),
    toolApproval: approval.toolApproval,
    experimental_refineToolInput: approval.refineToolInput,
    stopWhen: isStepCount(3),
    prompt: "Tidy up.",
  });
  let ui: UIMessage | undefined;
  if (mode === "UI message stream") {
    for await (const message of readUIMessageStream({ stream: result.toUIMessageStream() })) ui = message;
  }
  assert.equal(await result.text, "Done.");
  return { ran, approval, prompt: model.doStreamCalls[1]?.prompt ?? [], ui, history: await result.responseMessages };
}

type ToolPart = { type: string; toolCallId: string; state: string; input?: unknown; approval?: { approved?: boolean; reason?: string }; errorText?: string };

/** The UI message's tool parts: [id, state, approved]. */
function uiToolParts(ui: UIMessage | undefined): ToolPart[] {
  assert.ok(ui, "no UI message");
  return ui.parts.filter((p) => p.type.startsWith("tool-")) as unknown as ToolPart[];
}

/** In UI mode, the history converts back to model messages answering every call once. */
async function assertUiHistoryComplete(ui: UIMessage | undefined, ids: string[]): Promise<void> {
  assert.ok(ui);
  const history: ModelMessage[] = await convertToModelMessages([{ id: "u1", role: "user", parts: [{ type: "text", text: "Tidy up." }] }, ui]);
  assert.deepEqual(toolCallsIn(history), ids);
  assert.deepEqual(
    toolResultsIn(history).map(([id]) => id),
    ids,
  );
}

for (const mode of MODES) {
  describe(`${mode}, the broker deciding every tool call`, () => {
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

    async function turn(calls: ModelCall[], decisions: Decision[], options: Parameters<typeof brokerApproval>[2] = {}) {
      const session = newSession("ai");
      const approving = decisions.length ? approveWhenPending(process_.target, session, decisions) : Promise.resolve([]);
      const out = await runTurn(mode, broker, session, calls, options);
      await approving;
      return { ...out, session };
    }

    test("three calls, the middle one denied: one batch, three results in order, only the first ran", async () => {
      const { ran, prompt, approval, ui } = await turn(THREE, [
        { callId: "call_1", approve: true },
        { callId: "call_2", approve: false, reason: "never on prod" },
      ]);
      assert.deepEqual(toolCallsIn(prompt), ["call_1", "call_2", "call_3"]);
      const results = toolResultsIn(prompt);
      assert.deepEqual(results.map(([id, kind]) => [id, kind]), [
        ["call_1", "text"],
        ["call_2", "execution-denied"],
        ["call_3", "execution-denied"],
      ]);
      assert.equal(results[0]?.[2], "contents of a.txt");
      assert.match(results[1]?.[2] ?? "", /never on prod/);
      assert.equal(results[2]?.[2], approval.outcome("call_3")?.toolResult);
      assert.equal(approval.outcome("call_3")?.status, Status.SKIPPED);
      assert.deepEqual(ran, [["read_file", { path: "a.txt" }]]);
      // One batch, in the model's order.
      assert.equal(new Set(["call_1", "call_2", "call_3"].map((id) => approval.outcome(id)?.batchId)).size, 1);
      assert.deepEqual(["call_1", "call_2", "call_3"].map((id) => approval.outcome(id)?.position), [0, 1, 2]);
      if (mode === "UI message stream") {
        const parts = uiToolParts(ui);
        assert.deepEqual(parts.map((p) => [p.toolCallId, p.state, p.approval?.approved]), [
          ["call_1", "output-available", true],
          ["call_2", "output-denied", false],
          ["call_3", "output-denied", false],
        ]);
        assert.match(parts[1]?.approval?.reason ?? "", /never on prod/);
        await assertUiHistoryComplete(ui, ["call_1", "call_2", "call_3"]);
      }
    });

    test("a person's response reaches the model as the call's result, in their words, and nothing runs", async () => {
      const { ran, prompt, approval } = await turn([READ_A], [{ callId: "call_1", approve: false, response: "Read b.txt instead" }]);
      assert.deepEqual(ran, []);
      const [result] = toolResultsIn(prompt);
      assert.equal(result?.[0], "call_1");
      assert.equal(result?.[1], "execution-denied");
      assert.equal(result?.[2], 'The user did not run this tool call and answered instead: "Read b.txt instead"');
      assert.equal(approval.outcome("call_1")?.responded, true);
      assert.equal(approval.outcome("call_1")?.status, Status.DENIED);
    });

    test("an approver's edit is what runs, and what the history records as the call's input", async () => {
      const { ran, prompt, ui, history } = await turn([READ_A, READ_B], [
        { callId: "call_1", approve: true, editedInputJson: '{"path":"safe.txt"}' },
        { callId: "call_4", approve: false, reason: "not that one" },
      ]);
      assert.deepEqual(ran, [["read_file", { path: "safe.txt" }]]);
      assert.deepEqual(toolResultsIn(prompt).map(([id, kind, value]) => [id, kind, kind === "text" ? value : ""]), [
        ["call_1", "text", "contents of safe.txt"],
        ["call_4", "execution-denied", ""],
      ]);
      // experimental_refineToolInput: the next step's prompt and the response messages show the
      // input that ran; a denied call keeps the model's.
      const recorded = [
        ["call_1", { path: "safe.txt" }],
        ["call_4", { path: "d.txt" }],
      ];
      assert.deepEqual(toolCallInputsIn(prompt), recorded);
      assert.deepEqual(toolCallInputsIn(history), recorded);
      if (ui) {
        assert.deepEqual(uiToolParts(ui).map((p) => [p.toolCallId, p.state, p.input]), [
          ["call_1", "output-available", { path: "safe.txt" }],
          ["call_4", "output-denied", { path: "d.txt" }],
        ]);
        const converted = await convertToModelMessages([{ id: "u1", role: "user", parts: [{ type: "text", text: "Tidy up." }] }, ui]);
        assert.deepEqual(toolCallInputsIn(converted), recorded);
      }
    });

    test("calls the SDK finds invalid (an unknown tool, input failing the schema) are never left pending at the broker", async () => {
      const { ran, prompt, approval, session } = await turn(
        [READ_A, { id: "call_2", name: "launch_missiles", input: {} }, { id: "call_3", name: "read_file", input: { path: 42 } }],
        [{ callId: "call_1", approve: true }],
        { timeoutMs: 10_000 },
      );
      const results = toolResultsIn(prompt);
      assert.deepEqual(results.map(([id, kind]) => [id, kind.startsWith("error") ? "error" : kind]), [
        ["call_1", "text"],
        ["call_2", "error"],
        ["call_3", "error"],
      ]);
      assert.equal(results[0]?.[2], "contents of a.txt");
      assert.deepEqual(ran, [["read_file", { path: "a.txt" }]]);
      // The valid call went alone; the broker holds nothing pending for the session.
      assert.equal(approval.outcome("call_2"), undefined);
      assert.equal(approval.outcome("call_3"), undefined);
      assert.deepEqual(await pendingCalls(process_, session), []);
      assert.equal(process_.query(`SELECT count(*) FROM calls WHERE session_id = '${session}'`), "1");
    });

    test("a timeout: the calls nobody decided in time are denied with a text saying they were not run", async () => {
      const { ran, prompt, ui } = await turn(THREE, [{ callId: "call_1", approve: true }], { timeoutMs: 1_500, onDeny: "INDEPENDENT" });
      const results = toolResultsIn(prompt);
      assert.deepEqual(results.map(([id, kind]) => [id, kind]), [
        ["call_1", "text"],
        ["call_2", "execution-denied"],
        ["call_3", "execution-denied"],
      ]);
      assert.match(results[1]?.[2] ?? "", /^The approval broker could not be asked, so this tool call was not run\. \(no outcome yet/);
      assert.deepEqual(ran, [["read_file", { path: "a.txt" }]]);
      if (ui) await assertUiHistoryComplete(ui, ["call_1", "call_2", "call_3"]);
    });

    test("a remembered grant decides a later step's calls at once", async () => {
      const { session } = await turn([READ_A], [{ callId: "call_1", approve: true, scope: Scope.SESSION, anyInput: true }]);
      // The next turn of the same session: no approver is asked; the grant approves at submit.
      const { ran, prompt, approval } = await runTurn(mode, broker, session, [{ id: "call_9", name: "read_file", input: { path: "c.txt" } }], { timeoutMs: 10_000 });
      assert.deepEqual(toolResultsIn(prompt), [["call_9", "text", "contents of c.txt"]]);
      assert.match(approval.outcome("call_9")?.decidedBy ?? "", /^grant:/);
      assert.deepEqual(ran, [["read_file", { path: "c.txt" }]]);
    });

    test("an approved tool that throws still answers its call (no orphaned tool call)", async () => {
      const { ran, prompt, ui } = await turn(
        [{ id: "call_1", name: "explode", input: {} }, READ_B],
        [
          { callId: "call_1", approve: true },
          { callId: "call_4", approve: true },
        ],
      );
      const results = toolResultsIn(prompt);
      assert.deepEqual(results.map(([id, kind]) => [id, kind]), [
        ["call_1", "error-text"],
        ["call_4", "text"],
      ]);
      assert.match(results[0]?.[2] ?? "", /disk full/);
      assert.deepEqual(ran.map(([name]) => name), ["explode", "read_file"]);
      if (ui) await assertUiHistoryComplete(ui, ["call_1", "call_4"]);
    });
  });
}

describe("the user-approval flow", () => {
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

  const ways = [
    ["toolApproval answering user-approval", true],
    ["each tool's needsApproval (the ai 6 API, deprecated in 7)", false],
  ] as const;
  for (const [way, viaToolApproval] of ways) {
    test(`${way}: approvalResponses answers the step's requests as one batch`, async () => {
      const session = newSession("ai");
      const approval = brokerApproval(broker, session);
      const model = generatingModel(THREE);
      const recorded = recordingTools();
      const tools = viaToolApproval
        ? approval.tools(recorded.tools)
        : approval.tools(Object.fromEntries(Object.entries(recorded.tools).map(([name, t]) => [name, { ...t, needsApproval: true }])));
      const asking = viaToolApproval ? { toolApproval: () => "user-approval" as const } : {};
      const first = await generateText({ model, tools, ...asking, prompt: "Tidy up." });
      const requests = first.content.filter((p) => p.type === "tool-approval-request");
      assert.equal(requests.length, 3);
      const approving = approveWhenPending(process_.target, session, [
        { callId: "call_1", approve: true, editedInputJson: '{"path":"safe.txt"}' },
        { callId: "call_2", approve: false, reason: "never" },
      ]);
      const answer = await approval.approvalResponses(first.content);
      await approving;
      assert.deepEqual((answer.content as { approved: boolean }[]).map((p) => p.approved), [true, false, false]);
      assert.equal(new Set(["call_1", "call_2", "call_3"].map((id) => approval.outcome(id)?.batchId)).size, 1);
      const second = await generateText({
        model,
        tools,
        ...asking,
        messages: [{ role: "user", content: "Tidy up." }, ...first.response.messages, answer],
      });
      assert.equal(second.text, "Done.");
      assert.deepEqual(toolResultsIn(model.doGenerateCalls[1]?.prompt ?? []).map(([id, kind]) => [id, kind]), [
        ["call_1", "text"],
        ["call_2", "execution-denied"],
        ["call_3", "execution-denied"],
      ]);
      assert.deepEqual(recorded.ran, [["read_file", { path: "safe.txt" }]]);
    });
  }
});

for (const mode of MODES) {
  describe(`${mode}, when the broker breaks`, () => {
    test("a broker restarted mid-step: the step's calls still get their outcomes", async () => {
      const process_ = await BrokerProcess.started();
      const broker = connectBroker(process_.target, { logger: { debug() {}, info() {}, warn() {} } });
      try {
        const session = newSession("ai");
        const restartThenDecide = (async () => {
          await waitUntilPending(process_.target, session, ["call_1", "call_2", "call_3"]);
          await process_.restart("SIGKILL");
          await decide(process_.target, session, [
            { callId: "call_1", approve: true },
            { callId: "call_2", approve: false },
            { callId: "call_3", approve: true },
          ]);
        })();
        const { ran, prompt, ui } = await runTurn(mode, broker, session, THREE, { onDeny: "INDEPENDENT" });
        await restartThenDecide;
        assert.deepEqual(toolResultsIn(prompt).map(([id, kind]) => [id, kind]), [
          ["call_1", "text"],
          ["call_2", "execution-denied"],
          ["call_3", "text"],
        ]);
        assert.deepEqual(ran.map(([name]) => name), ["read_file", "read_file"]);
        assert.ok(broker.connects >= 2);
        if (ui) await assertUiHistoryComplete(ui, ["call_1", "call_2", "call_3"]);
      } finally {
        await broker.close();
        await process_.dispose();
      }
    });

    test("the broker unreachable: every call denied with a not-run text, nothing runs", async () => {
      const broker = connectBroker(`127.0.0.1:${await freePort()}`, { unavailableTimeoutMs: 500, logger: { debug() {}, info() {}, warn() {} } });
      try {
        const { ran, prompt, ui } = await runTurn(mode, broker, "s", THREE);
        const results = toolResultsIn(prompt);
        assert.deepEqual(results.map(([id, kind]) => [id, kind]), [
          ["call_1", "execution-denied"],
          ["call_2", "execution-denied"],
          ["call_3", "execution-denied"],
        ]);
        for (const [, , reason] of results) assert.match(reason, /^The approval broker could not be asked, so this tool call was not run\./);
        assert.deepEqual(ran, []);
        if (ui) {
          assert.deepEqual(uiToolParts(ui).map((p) => p.state), ["output-denied", "output-denied", "output-denied"]);
          await assertUiHistoryComplete(ui, ["call_1", "call_2", "call_3"]);
        }
      } finally {
        await broker.close();
      }
    });
  });
}
