/**
 * Plain values for what the agent sends (`ToolCall`) and gets back (`Outcome`, `Ack`).
 *
 * The generated protobuf types stay inside the library; these are what an agent handles.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import {
  CallSpecSchema,
  CallStatus,
  OnDeny as ProtoOnDeny,
  type CallAck,
  type CallSpec,
  type Outcome as ProtoOutcome,
} from "./gen/approvals/v1/types_pb.js";
import { unverifiedText } from "./receipts.js";

/**
 * The terminal state of a call: the broker's six outcomes, plus three the client gives a call
 * that did not run for a reason of its own:
 * - `REFUSED`: the broker would not store the call (a bad field, its id reused with another
 *   tool or input);
 * - `UNVERIFIED`: the broker said APPROVED but its signed receipt did not prove it (no receipt,
 *   an untrusted key, a bad signature, another outcome or input in the receipt...);
 * - `NOT_ASKED`: no outcome could be obtained at all (the broker unreachable, the credentials
 *   refused, the batch refused, the wait timed out): see `notAskedOutcomes`.
 * Only `APPROVED` runs; every other status carries a `toolResult` for the model.
 */
export const Status = {
  APPROVED: "APPROVED",
  DENIED: "DENIED",
  SUPERSEDED: "SUPERSEDED",
  SKIPPED: "SKIPPED",
  EXPIRED: "EXPIRED",
  CANCELLED: "CANCELLED",
  REFUSED: "REFUSED",
  UNVERIFIED: "UNVERIFIED",
  NOT_ASKED: "NOT_ASKED",
} as const;
export type Status = (typeof Status)[keyof typeof Status];

/** What a denial does to the rest of a batch. */
export const OnDeny = {
  /** The default: when one call is denied, the still-pending calls of the batch are SKIPPED. */
  SKIP_REST: "SKIP_REST",
  /** Each call of the batch is decided on its own. */
  INDEPENDENT: "INDEPENDENT",
} as const;
export type OnDeny = (typeof OnDeny)[keyof typeof OnDeny];

export function onDenyProto(onDeny: OnDeny): ProtoOnDeny {
  return onDeny === OnDeny.INDEPENDENT ? ProtoOnDeny.INDEPENDENT : ProtoOnDeny.SKIP_REST;
}

/** One tool call the model asked for. */
export interface ToolCall {
  /** The model's own id (`toolu_...`, `call_...`): the call's identity within the session. */
  callId: string;
  tool: string;
  /** A JSON object, or its JSON text. */
  input?: Record<string, unknown> | string;
  /** Shown to the approver. */
  title?: string;
  message?: string;
  workspace?: string;
  /** A later call with the same key supersedes this one while it is pending. */
  supersedeKey?: string;
  /** When the broker expires the call (EXPIRED) if nobody decided it. */
  deadline?: Date;
}

export function inputText(input: ToolCall["input"]): string {
  if (input === undefined) return "{}";
  return typeof input === "string" ? input : JSON.stringify(input);
}

export function callSpec(call: ToolCall): CallSpec {
  return create(CallSpecSchema, {
    callId: call.callId,
    tool: call.tool,
    inputJson: inputText(call.input),
    title: call.title ?? "",
    message: call.message ?? "",
    workspace: call.workspace ?? "",
    supersedeKey: call.supersedeKey ?? "",
    ...(call.deadline ? { deadline: timestampFromDate(call.deadline) } : {}),
  });
}

/** The text handed to the model for a call the broker refused to store; its reason follows. */
export const REFUSED_TEXT = "The approval broker refused this tool call; the tool was not run.";

/** The text handed to the model when no outcome could be obtained; the error follows. */
export const NOT_ASKED_TEXT = "The approval broker could not be asked, so this tool call was not run.";

/** The fields of an outcome, as `new Outcome(...)` takes them. */
export interface OutcomeFields {
  sessionId: string;
  callId: string;
  status: Status;
  decidedBy?: string;
  decidedByApprovers?: string[];
  reason?: string;
  toolResult?: string;
  inputJson?: string;
  inputEdited?: boolean;
  responded?: boolean;
  batchId?: string;
  position?: number;
  decidedAt?: Date | undefined;
  receiptSequence?: number | undefined;
  receipt?: string;
}

/**
 * How one call ended. `approved` is true only for APPROVED: run the tool with `input` (the
 * approver's edit when `inputEdited`). For every other status, hand the model `toolResult` and
 * do not run it.
 */
export class Outcome {
  readonly sessionId: string;
  readonly callId: string;
  readonly status: Status;
  /** `approver:<identity>`, `grant:<id>`, `policy:<rule>`, `agent`, `deadline` or `broker`. */
  readonly decidedBy: string;
  readonly decidedByApprovers: readonly string[];
  readonly reason: string;
  /** For every status but APPROVED: the text to hand the model as the tool's result. */
  readonly toolResult: string;
  /** For APPROVED: the canonical JSON text of the input to run (the one its receipt signed). */
  readonly inputJson: string;
  readonly inputEdited: boolean;
  /**
   * True when a person answered the model instead of running the call (status DENIED):
   * `reason` is their message, and `toolResult` carries it marked as their words.
   */
  readonly responded: boolean;
  readonly batchId: string;
  readonly position: number;
  readonly decidedAt: Date | undefined;
  /** For an APPROVED outcome the client checked: the sequence of the receipt that proved it. */
  readonly receiptSequence: number | undefined;
  /** The signed receipt (DSSE envelope, JSON text) the broker sent with the outcome. */
  readonly receipt: string;

  constructor(fields: OutcomeFields) {
    this.sessionId = fields.sessionId;
    this.callId = fields.callId;
    this.status = fields.status;
    this.decidedBy = fields.decidedBy ?? "";
    this.decidedByApprovers = fields.decidedByApprovers ?? [];
    this.reason = fields.reason ?? "";
    this.toolResult = fields.toolResult ?? "";
    this.inputJson = fields.inputJson ?? "";
    this.inputEdited = fields.inputEdited ?? false;
    this.responded = fields.responded ?? false;
    this.batchId = fields.batchId ?? "";
    this.position = fields.position ?? 0;
    this.decidedAt = fields.decidedAt;
    this.receiptSequence = fields.receiptSequence;
    this.receipt = fields.receipt ?? "";
  }

  /** True only for APPROVED: run the tool with `input`. */
  get approved(): boolean {
    return this.status === Status.APPROVED;
  }

  /** The input to run, parsed (APPROVED only; an empty object otherwise). */
  get input(): Record<string, unknown> {
    return this.inputJson ? (JSON.parse(this.inputJson) as Record<string, unknown>) : {};
  }

  /** This outcome with some fields changed. */
  with(changes: Partial<OutcomeFields>): Outcome {
    return new Outcome({ ...this.fields(), ...changes });
  }

  fields(): OutcomeFields {
    return { ...this, decidedByApprovers: [...this.decidedByApprovers] };
  }

  static fromProto(outcome: ProtoOutcome): Outcome {
    const name = CallStatus[outcome.status] as string;
    const status = (Object.values(Status) as string[]).includes(name) ? (name as Status) : Status.NOT_ASKED;
    return new Outcome({
      sessionId: outcome.sessionId,
      callId: outcome.callId,
      status,
      decidedBy: outcome.decidedBy,
      decidedByApprovers: [...outcome.decidedByApprovers],
      reason: outcome.reason,
      toolResult: outcome.toolResult,
      inputJson: outcome.inputJson,
      inputEdited: outcome.inputEdited,
      responded: outcome.responded,
      batchId: outcome.batchId,
      position: outcome.position,
      decidedAt: outcome.decidedAt ? timestampDate(outcome.decidedAt) : undefined,
      receipt: outcome.receipt,
    });
  }

  /** A call the broker refused to store. */
  static refused(sessionId: string, callId: string, code: number, message: string): Outcome {
    return new Outcome({
      sessionId,
      callId,
      status: Status.REFUSED,
      decidedBy: "broker",
      reason: `code ${code}: ${message}`,
      toolResult: `${REFUSED_TEXT} Reason: ${message}`,
    });
  }

  /** This outcome, not approved: its receipt did not prove it (`reason` says why). */
  unverified(reason: string): Outcome {
    return new Outcome({
      sessionId: this.sessionId,
      callId: this.callId,
      status: Status.UNVERIFIED,
      decidedBy: this.decidedBy,
      reason,
      toolResult: unverifiedText(reason),
      batchId: this.batchId,
      position: this.position,
      decidedAt: this.decidedAt,
    });
  }
}

/**
 * One not-run outcome per call, for when `review` threw (the broker unreachable, the
 * credentials or the batch refused, a timeout): the model reads that the tool was not run and
 * why. What the format helpers and the SDK adapters answer with when the broker fails them.
 */
export function notAskedOutcomes(sessionId: string, callIds: readonly string[], error: unknown): Outcome[] {
  const why = error instanceof Error ? error.message : String(error);
  return callIds.map(
    (callId) =>
      new Outcome({ sessionId, callId, status: Status.NOT_ASKED, reason: why, toolResult: `${NOT_ASKED_TEXT} (${why})` }),
  );
}

/** The broker's acknowledgement of one submitted call, sent after commit. */
export interface Ack {
  callId: string;
  /** "accepted" (stored now), "duplicate" (stored before: nothing new) or "error" (refused). */
  kind: "accepted" | "duplicate" | "error";
  batchId: string;
  position: number;
  errorCode: number;
  errorMessage: string;
}

export function ackFromProto(ack: CallAck): Ack {
  const result = ack.result;
  if (result.case === "accepted" || result.case === "duplicate") {
    return { callId: ack.callId, kind: result.case, batchId: result.value.batchId, position: result.value.position, errorCode: 0, errorMessage: "" };
  }
  const error = result.case === "error" ? result.value : undefined;
  return { callId: ack.callId, kind: "error", batchId: "", position: 0, errorCode: error?.code ?? 2, errorMessage: error?.message ?? "no answer for this call" };
}
