/**
 * Anthropic Messages: a response's `tool_use` blocks in, the `tool_result` blocks out.
 *
 *     const reply = await client.messages.create({ model, messages, tools });
 *     messages.push({ role: "assistant", content: reply.content });
 *     messages.push(await toolResults(broker, sessionId, reply.content, { run: runTool }));
 *
 * `toolResults` submits the turn's tool calls as one batch, runs the approved ones with their
 * approved input through `run(name, input)`, and returns the user message that answers the turn:
 * one `tool_result` per `tool_use`, in order. A call that did not run (denied, skipped, expired,
 * superseded, cancelled, refused, unverified, or the broker out of reach) gets the broker's text
 * with `is_error: true`. `reviewToolUses` gives the per-call decisions when the agent runs tools
 * itself. The types are structural: the `@anthropic-ai/sdk` package is not needed.
 * @module
 */
import type { Broker } from "./client.js";
import { paired, ReviewedCall, reviewTurn, runApproved, type RunTool, type TurnCall, type TurnOptions } from "./turns.js";

/** A content block as the API returns it (only `tool_use` blocks are read). */
export interface ContentBlock {
  type: string;
  id?: string;
  name?: string;
  input?: unknown;
  [key: string]: unknown;
}

/** The `tool_result` block the API takes. */
export interface ToolResultBlockParam {
  type: "tool_result";
  tool_use_id: string;
  content: string;
  is_error?: boolean;
}

/** The user message answering a turn's tool uses. */
export interface ToolResultsMessage {
  role: "user";
  content: ToolResultBlockParam[];
}

export class ReviewedToolUse extends ReviewedCall {
  /** The `tool_result` block for this `tool_use`: for a call that did not run, the broker's
   * text (`is_error`); for an approved one, `content`, the tool's output. */
  result(content?: string, isError = false): ToolResultBlockParam {
    if (!this.approved) return { type: "tool_result", tool_use_id: this.callId, content: this.outcome.toolResult, is_error: true };
    if (content === undefined) throw new Error(`${this.callId} was approved: run it and pass its output`);
    return { type: "tool_result", tool_use_id: this.callId, content, ...(isError ? { is_error: true } : {}) };
  }
}

/** The (id, name, input) of each `tool_use` block of a content list, or of a `Message`. */
export function toolUses(content: readonly ContentBlock[] | { content: readonly ContentBlock[] }): TurnCall[] {
  const blocks = Array.isArray(content) ? content : (content as { content: readonly ContentBlock[] }).content;
  return blocks.filter((b) => b.type === "tool_use").map((b) => ({ callId: String(b.id), name: String(b.name), input: b.input ?? {} }));
}

/** Submits the `tool_use` blocks as one batch; one `ReviewedToolUse` per block, in order. */
export async function reviewToolUses(
  broker: Broker,
  sessionId: string,
  content: readonly ContentBlock[] | { content: readonly ContentBlock[] },
  options: TurnOptions = {},
): Promise<ReviewedToolUse[]> {
  const calls = toolUses(content);
  const outcomes = await reviewTurn(broker, sessionId, calls, options);
  return paired(calls, outcomes).map(([c, outcome]) => new ReviewedToolUse(c.callId, c.name, outcome));
}

/** The user message answering every `tool_use` of the turn; see the module. */
export async function toolResults(
  broker: Broker,
  sessionId: string,
  content: readonly ContentBlock[] | { content: readonly ContentBlock[] },
  options: TurnOptions & { run: RunTool },
): Promise<ToolResultsMessage> {
  const { run, ...rest } = options;
  const blocks: ToolResultBlockParam[] = [];
  for (const item of await reviewToolUses(broker, sessionId, content, rest)) {
    if (item.approved) {
      const { text, failed } = await runApproved(run, item.name, item.input);
      blocks.push(item.result(text, failed));
    } else {
      blocks.push(item.result());
    }
  }
  return { role: "user", content: blocks };
}
