/**
 * The Vercel AI SDK (`ai` 7): the broker decides the SDK's tool approvals, one batch per step.
 *
 *     const approval = brokerApproval(broker, sessionId);
 *     const result = await generateText({
 *       model: wrapLanguageModel({ model, middleware: approval.middleware }),
 *       tools: approval.tools(tools),
 *       toolApproval: approval.toolApproval,
 *       experimental_refineToolInput: approval.refineToolInput,
 *       stopWhen: isStepCount(5),
 *       prompt,
 *     });
 *
 * Four pieces, because the SDK asks for approval one tool call at a time and runs a tool with
 * the input the model wrote:
 * - `middleware` sees each model response whole (or each stream to its end) and submits the
 *   step's tool calls to the broker as one batch, in the model's order: only the calls the SDK
 *   will find valid (a tool it has, input its schema accepts), checked as the SDK checks them,
 *   so a call the SDK answers with a tool error is never left pending at the broker;
 * - `toolApproval` answers each call with that batch's outcome: APPROVED is `approved`; every
 *   other outcome (denied, skipped, expired, superseded, cancelled, refused, unverified, the
 *   broker out of reach) is `denied` with the broker's text as the reason, which the SDK puts in
 *   the call's tool result, so the next step's prompt holds one result per call;
 * - `tools(...)` wraps each tool's `execute` to run the input the broker approved (an approver's
 *   edit included, checked against its signed receipt) and to refuse, as a tool error, any call
 *   the broker did not approve;
 * - `refineToolInput` (the SDK's `experimental_refineToolInput`) makes an approver's edit the
 *   input the SDK records: in the step's content, the response messages, the UI message and the
 *   next step's prompt, the call then shows the input that ran, not the one the model wrote.
 * Without the middleware each call is its own batch. For the SDK's user-approval flow (a tool's
 * `needsApproval`, or `toolApproval` answering `user-approval`), `approvalResponses` turns the
 * `tool-approval-request` parts into the `tool-approval-response` message the next call takes.
 * @module
 */
import { asSchema, type LanguageModelMiddleware, type ModelMessage, type ToolApprovalStatus } from "ai";
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
  /** The input schema of each tool passed through `tools(...)`, to check calls as the SDK will. */
  private readonly schemas = new Map<string, unknown>();
  /** The calls of the middleware's batches whose input the SDK has not refined yet, by tool
   * name and input (as the SDK parses it), in the model's order. */
  private readonly unrefined = new Map<string, string[]>();
  /** Settles once the current model response's batch is submitted (a stream's, at its end). */
  private stepSubmitted: Promise<void> = Promise.resolve();

  /**
   * The SDK's `experimental_refineToolInput`: for each tool passed through `tools(...)`, the
   * input the broker approved (an approver's edit) replaces the model's in what the SDK records
   * and runs. The SDK calls it with the parsed input only (no call id), so a call is found by
   * its tool and input among the calls of the middleware's batches, in order; a call the
   * middleware did not submit keeps its input. Denied calls keep the model's input.
   */
  readonly refineToolInput: Record<string, <T>(input: T) => Promise<T>> = {};

  constructor(
    readonly broker: Broker,
    readonly sessionId: string,
    readonly options: BrokerApprovalOptions = {},
  ) {}

  /** Submits each model response's tool calls as one batch (`wrapLanguageModel`). */
  readonly middleware: LanguageModelMiddleware = {
    specificationVersion: "v4",
    wrapGenerate: async ({ doGenerate, params }) => {
      const result = await doGenerate();
      const submitting = this.submitStep(
        result.content.flatMap((part) => (part.type === "tool-call" ? [part] : [])),
        params,
      );
      this.stepSubmitted = submitting;
      await submitting;
      return result;
    },
    wrapStream: async ({ doStream, params }) => {
      const { stream, ...rest } = await doStream();
      // Read the model's stream eagerly: the SDK awaits each call's approval while it reads, so
      // the batch must not wait for the SDK to read on. Until the stream ends, a call the SDK
      // asks about waits for the batch (a model may stream its calls one by one).
      const reader = stream.getReader();
      const seen: ModelToolCall[] = [];
      let submitted = false;
      let markSubmitted: () => void = () => undefined;
      this.stepSubmitted = new Promise<void>((resolve) => {
        markSubmitted = resolve;
      });
      const submitOnce = () => {
        // (A batch that cannot be formed leaves each call to be submitted when the SDK asks.)
        if (!submitted) void this.submitStep(seen, params).catch(() => undefined).finally(markSubmitted);
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
   * input (an approver's edit included). A call it did not approve fails as a tool error. Each
   * tool's input schema is kept, for the middleware to check calls as the SDK will, and each
   * gets its entry in `refineToolInput`. */
  tools<T extends Record<string, unknown>>(tools: T): T {
    const wrapped: Record<string, unknown> = {};
    for (const [name, tool] of Object.entries(tools)) {
      const execute = (tool as { execute?: (input: unknown, options: { toolCallId: string }) => unknown }).execute;
      if (this.governsName(name)) {
        this.schemas.set(name, (tool as { inputSchema?: unknown }).inputSchema);
        // (defined, not assigned: a tool may be called anything, `__proto__` included)
        Object.defineProperty(this.refineToolInput, name, { value: <T>(input: T) => this.refined(name, input), enumerable: true, configurable: true, writable: true });
      }
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

  /**
   * The middleware's batch: the model response's tool calls that the SDK will find valid,
   * checked as the SDK's `parseToolCall` checks them (a tool of the step, by own name; input
   * that parses as JSON, an empty input as `{}`, and passes the tool's schema), each with the
   * input as the SDK parses it. The SDK answers the others with a tool error and never asks
   * about them: submitted, they would stay pending at the broker, and hold up their batch. A
   * call of a tool not passed through `tools(...)` cannot be checked here (its schema is not
   * known): it is submitted when the SDK asks about it, on its own.
   */
  private async submitStep(calls: readonly ModelToolCall[], params: StepParams): Promise<void> {
    if (params.toolChoice?.type === "none") return;
    const stepTools = new Set((params.tools ?? []).map((t) => t.name));
    const parsed = await Promise.all(
      calls.map(async (call): Promise<SdkToolCall | undefined> => {
        if (!stepTools.has(call.toolName) || !this.schemas.has(call.toolName)) return undefined;
        const input = await parseAsTheSdk(call.input, this.schemas.get(call.toolName));
        return input === INVALID ? undefined : { ...call, input };
      }),
    );
    const valid = parsed.filter((c): c is SdkToolCall => c !== undefined);
    const fresh = valid.filter((c) => this.governs(c) && !this.calls.has(c.toolCallId));
    this.submit(fresh);
    for (const call of fresh) {
      const key = refineKey(call.toolName, call.input);
      if (key === undefined) continue;
      const ids = this.unrefined.get(key) ?? [];
      ids.push(call.toolCallId);
      this.unrefined.set(key, ids);
    }
  }

  /** `refineToolInput` of one tool: the approved input of the call the SDK is parsing. */
  private async refined<T>(name: string, input: T): Promise<T> {
    await this.stepSubmitted;
    const key = refineKey(name, input);
    const ids = key === undefined ? undefined : this.unrefined.get(key);
    const callId = ids?.shift();
    if (key !== undefined && ids?.length === 0) this.unrefined.delete(key);
    const batch = callId === undefined ? undefined : this.calls.get(callId);
    if (batch === undefined) return input;
    const outcome = await batch.outcome;
    return outcome.approved ? (outcome.input as T) : input;
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
  private async outcomeOf(call: SdkToolCall): Promise<Outcome> {
    await this.stepSubmitted;
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

/** A tool call as the model sent it (its input the JSON text). */
type ModelToolCall = SdkToolCall & { input: string };

/** What the middleware reads of a step's call options. */
interface StepParams {
  tools?: readonly { name: string }[] | undefined;
  toolChoice?: { type: string } | undefined;
}

const INVALID = Symbol("invalid");

/** The input as the SDK's `parseToolCall` parses it (secure JSON, then the tool's schema), or
 * `INVALID` where the SDK would answer the call with a tool error. */
async function parseAsTheSdk(text: string, inputSchema: unknown): Promise<unknown> {
  let value: unknown;
  try {
    value =
      text.trim() === ""
        ? {}
        : JSON.parse(text, (key, v: unknown) => {
            // secure-json-parse, as the SDK parses: no prototype keys.
            if (key === "__proto__" || (key === "constructor" && typeof v === "object" && v !== null && "prototype" in v)) throw new Error("prototype key");
            return v;
          });
  } catch {
    return INVALID;
  }
  if (inputSchema == null) return value;
  const schema = asSchema(inputSchema as Parameters<typeof asSchema>[0]);
  if (schema.validate === undefined) return value;
  try {
    const result = await schema.validate(value);
    return result.success ? result.value : INVALID;
  } catch {
    return INVALID;
  }
}

/** A call's identity for `refineToolInput`, which gets no call id: its tool and input. */
function refineKey(name: string, input: unknown): string | undefined {
  try {
    return `${name}\u0000${JSON.stringify(input)}`;
  } catch {
    return undefined;
  }
}

function notRun(sessionId: string, callId: string): Outcome {
  return new Outcome({ sessionId, callId, status: Status.NOT_ASKED, toolResult: "The approval broker gave no outcome for this tool call; it was not run." });
}

/** The broker as the SDK's tool approver for one session; see the module. */
export function brokerApproval(broker: Broker, sessionId: string, options: BrokerApprovalOptions = {}): BrokerApproval {
  return new BrokerApproval(broker, sessionId, options);
}
