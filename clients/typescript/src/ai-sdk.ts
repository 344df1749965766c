/**
 * The Vercel AI SDK (`ai` 7): the broker decides the SDK's tool approvals, one batch per step.
 *
 *     const approval = brokerApproval(broker, sessionId);
 *     const result = await generateText({
 *       model: wrapLanguageModel({ model, middleware: approval.middleware }),
 *       tools: approval.tools(tools),
 *       toolApproval: approval.toolApproval,
 *       stopWhen: isStepCount(5),
 *       prompt,
 *     });
 *
 * Three pieces, because the SDK asks for approval one tool call at a time and runs a tool with
 * the input the model wrote:
 * - `middleware` sees each model response whole (or each stream to its end) and submits the
 *   step's tool calls to the broker as one batch, in the model's order;
 * - `toolApproval` answers each call with that batch's outcome: APPROVED is `approved`; every
 *   other outcome (denied, skipped, expired, superseded, cancelled, refused, unverified, the
 *   broker out of reach) is `denied` with the broker's text as the reason, which the SDK puts in
 *   the call's tool result, so the next step's prompt holds one result per call;
 * - `tools(...)` wraps each tool's `execute` to run the input the broker approved (an approver's
 *   edit included, checked against its signed receipt) and to refuse, as a tool error, any call
 *   the broker did not approve.
 * Without the middleware each call is its own batch. For the SDK's user-approval flow (a tool's
 * `needsApproval`, or `toolApproval` answering `user-approval`), `approvalResponses` turns the
 * `tool-approval-request` parts into the `tool-approval-response` message the next call takes.
 * @module
 */
import type { LanguageModelMiddleware, ModelMessage, ToolApprovalStatus } from "ai";
import type { Broker } from "./client.js";
import { Outcome, Status } from "./models.js";
import { reviewTurn, type TurnCall, type TurnOptions } from "./turns.js";

/** A tool call as the SDK hands it over (`toolCallId`, `toolName`, `input`). */
export interface SdkToolCall {
  toolCallId: string;
  toolName: string;
  input: unknown;
  providerExecuted?: boolean;
}

/** A `tool-approval-request` part of a result's content or a step. */
export interface SdkApprovalRequest {
  type: "tool-approval-request";
  approvalId: string;
  toolCall: SdkToolCall;
  isAutomatic?: boolean;
}

export interface BrokerApprovalOptions extends TurnOptions {
  /** Only these tools go to the broker (the others are `not-applicable`). Default: every tool. */
  tools?: readonly string[];
}

interface Batch {
  outcome: Promise<Outcome>;
}

/** The broker as the SDK's tool approver, for one session (conversation); see the module. */
export class BrokerApproval {
  private readonly calls = new Map<string, Batch>();
  private readonly settled = new Map<string, Outcome>();
  private queued: TurnCall[] = [];

  constructor(
    readonly broker: Broker,
    readonly sessionId: string,
    readonly options: BrokerApprovalOptions = {},
  ) {}

  /** Submits each model response's tool calls as one batch (`wrapLanguageModel`). */
  readonly middleware: LanguageModelMiddleware = {
    specificationVersion: "v4",
    wrapGenerate: async ({ doGenerate }) => {
      const result = await doGenerate();
      this.submit(result.content.flatMap((part) => (part.type === "tool-call" ? [part] : [])));
      return result;
    },
    wrapStream: async ({ doStream }) => {
      const { stream, ...rest } = await doStream();
      // Read the model's stream eagerly: the SDK awaits each call's approval while it reads, so
      // the batch must not wait for the SDK to read on.
      const reader = stream.getReader();
      const seen: SdkToolCall[] = [];
      let submitted = false;
      const submitOnce = () => {
        if (!submitted) this.submit(seen);
        submitted = true;
      };
      const eager = new ReadableStream<(typeof stream extends ReadableStream<infer P> ? P : never)>({
        start: (controller) => {
          void (async () => {
            try {
              for (;;) {
                const { done, value } = await reader.read();
                if (done) break;
                if (value.type === "tool-call") seen.push(value);
                if (value.type === "finish") submitOnce();
                controller.enqueue(value);
              }
              submitOnce();
              controller.close();
            } catch (error) {
              submitOnce();
              controller.error(error);
            }
          })();
        },
        cancel: (reason) => reader.cancel(reason),
      });
      return { stream: eager, ...rest };
    },
  };

  /** The SDK's `toolApproval`: each call answered with its outcome from the broker. */
  readonly toolApproval = async ({ toolCall }: { toolCall: SdkToolCall }): Promise<ToolApprovalStatus> => {
    if (!this.governs(toolCall)) return "not-applicable";
    const outcome = await this.outcomeOf(toolCall);
    if (outcome.approved) return { type: "approved", reason: `approved by ${outcome.decidedBy}` };
    return { type: "denied", reason: outcome.toolResult };
  };

  /** The tools, each `execute` running only a call the broker approved, with the approved
   * input (an approver's edit included). A call it did not approve fails as a tool error. */
  tools<T extends Record<string, unknown>>(tools: T): T {
    const wrapped: Record<string, unknown> = {};
    for (const [name, tool] of Object.entries(tools)) {
      const execute = (tool as { execute?: (input: unknown, options: { toolCallId: string }) => unknown }).execute;
      if (execute === undefined || !this.governsName(name)) {
        wrapped[name] = tool;
        continue;
      }
      wrapped[name] = {
        ...(tool as object),
        execute: async (input: unknown, options: { toolCallId: string }) => {
          const outcome = await this.outcomeOf({ toolCallId: options.toolCallId, toolName: name, input });
          if (!outcome.approved) throw new Error(outcome.toolResult);
          return execute.call(tool, outcome.input, options);
        },
      };
    }
    return wrapped as T;
  }

  /**
   * The SDK's user-approval flow: the `tool-approval-request` parts (from `result.content`,
   * or a step's) reviewed as one batch, answered as the `role: "tool"` message of
   * `tool-approval-response` parts to add to the messages of the next call. Automatic requests
   * (already answered) are left out.
   */
  async approvalResponses(parts: readonly unknown[]): Promise<ModelMessage> {
    const requests = parts.filter(
      (p): p is SdkApprovalRequest => (p as SdkApprovalRequest).type === "tool-approval-request" && !(p as SdkApprovalRequest).isAutomatic,
    );
    this.submit(requests.map((r) => r.toolCall));
    const content = [];
    for (const request of requests) {
      const outcome = await this.outcomeOf(request.toolCall);
      content.push({
        type: "tool-approval-response" as const,
        approvalId: request.approvalId,
        approved: outcome.approved,
        reason: outcome.approved ? `approved by ${outcome.decidedBy}` : outcome.toolResult,
      });
    }
    return { role: "tool", content };
  }

  /** The broker's outcome of a call this approver asked about (once decided). */
  outcome(toolCallId: string): Outcome | undefined {
    return this.settled.get(toolCallId);
  }

  private governsName(name: string): boolean {
    return this.options.tools === undefined || this.options.tools.includes(name);
  }

  private governs(call: SdkToolCall): boolean {
    return call.providerExecuted !== true && this.governsName(call.toolName);
  }

  /** Submits the calls (those not asked about yet) as one batch. */
  private submit(calls: readonly SdkToolCall[]): void {
    const fresh = calls.filter((c) => this.governs(c) && !this.calls.has(c.toolCallId));
    if (fresh.length === 0) return;
    const turn: TurnCall[] = fresh.map((c) => ({ callId: c.toolCallId, name: c.toolName, input: c.input }));
    const outcomes = reviewTurn(this.broker, this.sessionId, turn, this.options);
    turn.forEach((call, i) => {
      const outcome = outcomes.then((all) => all[i] ?? notRun(this.sessionId, call.callId));
      outcome.then((o) => this.settled.set(call.callId, o), () => undefined);
      this.calls.set(call.callId, { outcome });
    });
  }

  /** The call's outcome: from its step's batch, or (no middleware) a batch of the calls asked
   * about in the same turn of the event loop. */
  private outcomeOf(call: SdkToolCall): Promise<Outcome> {
    const known = this.calls.get(call.toolCallId);
    if (known !== undefined) return known.outcome;
    const batch = this.queued;
    batch.push({ callId: call.toolCallId, name: call.toolName, input: call.input });
    if (batch.length === 1) {
      setTimeout(() => {
        this.queued = [];
        this.submit(batch.map((c) => ({ toolCallId: c.callId, toolName: c.name, input: c.input })));
      }, 0);
    }
    return new Promise((resolve, reject) => {
      setTimeout(() => {
        const batched = this.calls.get(call.toolCallId);
        if (batched === undefined) reject(new Error(`no batch for ${call.toolCallId}`));
        else batched.outcome.then(resolve, reject);
      }, 0);
    });
  }
}

function notRun(sessionId: string, callId: string): Outcome {
  return new Outcome({ sessionId, callId, status: Status.NOT_ASKED, toolResult: "The approval broker gave no outcome for this tool call; it was not run." });
}

/** The broker as the SDK's tool approver for one session; see the module. */
export function brokerApproval(broker: Broker, sessionId: string, options: BrokerApprovalOptions = {}): BrokerApproval {
  return new BrokerApproval(broker, sessionId, options);
}
