/**
 * What the format helpers share: a model turn's tool calls reviewed as one batch, each with its
 * outcome, and the running of the approved ones. A broker that fails the review (unreachable,
 * credentials refused, the batch refused, a timeout) fails closed here: each call gets a
 * not-run outcome (`NOT_ASKED`) whose text tells the model so, so the turn still gets one tool
 * result per call. Only an abort (the caller's own signal) rejects.
 * @module
 */
import type { Broker, ReviewOptions } from "./client.js";
import { BrokerError, ReviewTimeout } from "./errors.js";
import { inputText, notAskedOutcomes, type Outcome } from "./models.js";

/** Runs one approved tool: (tool name, approved input) → its output (text, or JSON-able). */
export type RunTool = (name: string, input: Record<string, unknown>) => unknown;

/** A tool call as the helpers read it from the model's message. */
export interface TurnCall {
  callId: string;
  name: string;
  /** A JSON object, or its JSON text (OpenAI's `arguments`). */
  input: unknown;
}

/** Options of the format helpers: those of `review`, and the workspace shown to approvers. */
export interface TurnOptions extends ReviewOptions {
  workspace?: string;
}

/**
 * One tool call of the model's turn and its outcome. `approved`: run `name` with `input` (the
 * input the approver let through, possibly edited). Otherwise `outcome.toolResult` is the text
 * the model reads, and the tool must not run.
 */
export class ReviewedCall {
  constructor(
    readonly callId: string,
    readonly name: string,
    readonly outcome: Outcome,
  ) {}

  get approved(): boolean {
    return this.outcome.approved;
  }

  /** The input to run with (APPROVED only; throws otherwise). */
  get input(): Record<string, unknown> {
    if (!this.approved) throw new Error(`${this.callId} was not approved (${this.outcome.status}); do not run it`);
    return this.outcome.input;
  }
}

/** Submits the calls as one batch; one outcome per call, in order (an empty turn asks nothing). */
export async function reviewTurn(broker: Broker, sessionId: string, calls: readonly TurnCall[], options: TurnOptions = {}): Promise<Outcome[]> {
  if (calls.length === 0) return [];
  const { workspace = "", ...review } = options;
  const ids = calls.map((c) => c.callId);
  try {
    return await broker.review(
      sessionId,
      calls.map((c) => ({ callId: c.callId, tool: c.name, input: typeof c.input === "string" ? c.input : inputText(c.input as Record<string, unknown>), workspace })),
      review,
    );
  } catch (error) {
    if (!(error instanceof BrokerError)) throw error;
    const notAsked = notAskedOutcomes(sessionId, ids, error);
    if (error instanceof ReviewTimeout) {
      // Those decided in time stand (checked); the others were not run.
      return notAsked.map((o) => error.decided.get(o.callId) ?? o);
    }
    return notAsked;
  }
}

/** The calls paired with their outcomes (`reviewTurn` answers every call, in order). */
export function paired<C>(calls: readonly C[], outcomes: readonly Outcome[]): [C, Outcome][] {
  if (outcomes.length !== calls.length) throw new Error(`${calls.length} calls but ${outcomes.length} outcomes`);
  return calls.map((call, i) => [call, outcomes[i] as Outcome]);
}

/** Runs an approved tool; returns its output as text and whether it failed. A tool that throws
 * still gets a result (the error, flagged), so the history stays complete. */
export async function runApproved(run: RunTool, name: string, input: Record<string, unknown>): Promise<{ text: string; failed: boolean }> {
  try {
    const output = await run(name, input);
    return { text: typeof output === "string" ? output : JSON.stringify(output ?? null), failed: false };
  } catch (e) {
    const error = e instanceof Error ? e : new Error(String(e));
    return { text: `The tool failed: ${error.name}: ${error.message}`, failed: true };
  }
}
