/**
 * OpenAI: Chat Completions' `tool_calls` in, `role: "tool"` messages out; the Responses API's
 * `function_call` items in, `function_call_output` items out.
 *
 *     const message = (await client.chat.completions.create({ model, messages, tools })).choices[0].message;
 *     messages.push(message);
 *     messages.push(...(await toolMessages(broker, sessionId, message.tool_calls, { run: runTool })));
 *
 * Each helper submits the turn's calls as one batch, runs the approved ones with their approved
 * input through `run(name, input)`, and returns one answer per call, in order; a call that did
 * not run gets the broker's text. A function call's `arguments` (JSON text) is its input; a
 * custom tool call's free-form input is submitted as `{"input": "<text>"}`. Arguments that are
 * not a JSON object are refused by the broker for that call alone (`REFUSED`), which still gets
 * its answer. The types are structural: the `openai` package is not needed.
 * @module
 */
import type { Broker } from "./client.js";
import { paired, ReviewedCall, reviewTurn, runApproved, type RunTool, type TurnCall, type TurnOptions } from "./turns.js";

/** A Chat Completions tool call (function or custom). */
export interface ChatToolCall {
  id: string;
  type: string;
  function?: { name: string; arguments: string };
  custom?: { name: string; input: string };
}

export interface ChatToolMessage {
  role: "tool";
  tool_call_id: string;
  content: string;
}

/** A Responses API output item (only `function_call` items are read). */
export interface ResponseOutputItem {
  type: string;
  call_id?: string;
  name?: string;
  arguments?: string;
  [key: string]: unknown;
}

export interface FunctionCallOutput {
  type: "function_call_output";
  call_id: string;
  output: string;
}

export class ReviewedToolCall extends ReviewedCall {
  /** The `role: "tool"` message for this call: for a call that did not run, the broker's text;
   * for an approved one, `content`, the tool's output. */
  result(content?: string): ChatToolMessage {
    if (!this.approved) return { role: "tool", tool_call_id: this.callId, content: this.outcome.toolResult };
    if (content === undefined) throw new Error(`${this.callId} was approved: run it and pass its output`);
    return { role: "tool", tool_call_id: this.callId, content };
  }
}

/** The (id, name, input) of each tool call, function or custom. */
export function callsOf(toolCalls: readonly ChatToolCall[] | null | undefined): TurnCall[] {
  return (toolCalls ?? []).map((call) =>
    call.type === "custom"
      ? { callId: call.id, name: call.custom?.name ?? "", input: { input: call.custom?.input ?? "" } }
      : { callId: call.id, name: call.function?.name ?? "", input: call.function?.arguments ?? "" },
  );
}

/** Submits the tool calls as one batch; one `ReviewedToolCall` per call, in order. */
export async function reviewToolCalls(
  broker: Broker,
  sessionId: string,
  toolCalls: readonly ChatToolCall[] | null | undefined,
  options: TurnOptions = {},
): Promise<ReviewedToolCall[]> {
  const calls = callsOf(toolCalls);
  const outcomes = await reviewTurn(broker, sessionId, calls, options);
  return paired(calls, outcomes).map(([c, outcome]) => new ReviewedToolCall(c.callId, c.name, outcome));
}

/** One `role: "tool"` message per tool call of the turn, in order; see the module. */
export async function toolMessages(
  broker: Broker,
  sessionId: string,
  toolCalls: readonly ChatToolCall[] | null | undefined,
  options: TurnOptions & { run: RunTool },
): Promise<ChatToolMessage[]> {
  const { run, ...rest } = options;
  const messages: ChatToolMessage[] = [];
  for (const item of await reviewToolCalls(broker, sessionId, toolCalls, rest)) {
    messages.push(item.approved ? item.result((await runApproved(run, item.name, item.input)).text) : item.result());
  }
  return messages;
}

/** The (call_id, name, arguments) of each `function_call` item of a Responses API output. */
export function functionCallsOf(output: readonly ResponseOutputItem[]): TurnCall[] {
  return output.filter((item) => item.type === "function_call").map((item) => ({ callId: String(item.call_id), name: String(item.name), input: item.arguments ?? "" }));
}

/** Responses API: one `function_call_output` item per `function_call` of `output` (e.g.
 * `response.output`), in order: the tool's output when approved, else the broker's text. */
export async function functionCallOutputs(
  broker: Broker,
  sessionId: string,
  output: readonly ResponseOutputItem[],
  options: TurnOptions & { run: RunTool },
): Promise<FunctionCallOutput[]> {
  const { run, ...rest } = options;
  const calls = functionCallsOf(output);
  const outcomes = await reviewTurn(broker, sessionId, calls, rest);
  const items: FunctionCallOutput[] = [];
  for (const [call, outcome] of paired(calls, outcomes)) {
    const text = outcome.approved ? (await runApproved(run, call.name, outcome.input)).text : outcome.toolResult;
    items.push({ type: "function_call_output", call_id: call.callId, output: text });
  }
  return items;
}
