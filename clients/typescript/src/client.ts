/**
 * `Broker`: the agent's side of the approval broker, on one `AgentService.Connect` stream.
 *
 * One stream per `Broker` carries every `review` of every session, concurrently. Each request
 * has a request id; the broker answers after commit. When the stream breaks (the broker
 * restarts, a replica drains, the network drops), the client reconnects with backoff, sends again
 * every submit and cancel that had no answer (safe: calls are idempotent by session and call
 * id), and sends `resume` for every session with calls still waiting, so outcomes decided
 * meanwhile still arrive. If the broker stays unreachable for `unavailableTimeoutMs`, everything
 * waiting fails with `BrokerUnavailable`: the client never invents an outcome.
 *
 * Before an APPROVED outcome reaches the caller, the client checks the signed receipt it carries
 * (`verifyApproval`) with a key it trusts: the `trustedReceiptKeys` option, or else the keys
 * `ListReceiptKeys` serves, read once. An outcome whose receipt does not prove it becomes
 * `UNVERIFIED`: not approved, with a tool result saying why.
 *
 * The transport is given (see `./node.js` for gRPC over HTTP/2, `./web.js` for gRPC-Web in
 * browsers, which cannot stream both ways: there each review is a `Submit` and a
 * `WatchOutcomes`).
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client, type Transport } from "@connectrpc/connect";
import {
  AgentRequestSchema,
  AgentService,
  ResumeRequestSchema,
  type AgentRequest,
  type AgentResponse,
  type SubmitResponse,
} from "./gen/approvals/v1/agent_pb.js";
import {
  BatchSpecSchema,
  CancelTargetSchema,
  type GetReceiptResponse,
  type ListReceiptKeysResponse,
  type Outcome as ProtoOutcome,
} from "./gen/approvals/v1/types_pb.js";
import { AuthenticationError, BrokerError, BrokerUnavailable, PermissionDenied, RequestRefused, ReviewTimeout } from "./errors.js";
import { ackFromProto, callSpec, OnDeny, onDenyProto, Outcome, type Ack, type ToolCall } from "./models.js";
import { tokenFailure } from "./tokens.js";
import { chainSequence, ReceiptRejected, trustedKey, trustedKeys, verifyApproval, type KeySource, type TrustedKey } from "./receipts.js";

/** Where the client writes what an operator should know (a lost broker, a refused receipt). */
export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
}

const quiet: Logger = { debug() {}, info() {}, warn: (m) => console.warn(`approval-broker: ${m}`) };

/** How a `Broker` is made; `./node.js` and `./web.js` fill in the transport. */
export interface BrokerOptions {
  /** The Connect transport to the broker (with credentials already attached). */
  transport: Transport;
  /** What the transport can do: `"bidi"` (HTTP/2 gRPC: one `Connect` stream) or `"server"`
   * (gRPC-Web: `Submit` plus `WatchOutcomes`). Default `"bidi"`. */
  streaming?: "bidi" | "server";
  /** Named in messages. */
  target?: string;
  /** How long the client keeps trying to reach the broker (at the first connect and after the
   * stream breaks) before whatever waits fails with `BrokerUnavailable`. Default 30 000 ms. */
  unavailableTimeoutMs?: number;
  /** Bounds each unary call (`outcomes`, `listReceiptKeys`). Default 10 000 ms. */
  rpcTimeoutMs?: number;
  /** The broker's public keys an APPROVED outcome's receipt must verify with (base64 of the raw
   * 32 bytes, as the broker logs it, or a `PUBLIC KEY` PEM). Without them the client reads the
   * broker's keys once, from `ListReceiptKeys`. */
  trustedReceiptKeys?: Iterable<KeySource | TrustedKey>;
  /** `false` turns the receipt check off: only for a broker running `--receipts off`. */
  verifyReceipts?: boolean;
  logger?: Logger;
  /** Called when the broker refused the transport's token on the stream, which is then opened
   * once more: the transport's token provider gives a new token (`Bearer.refused`). */
  tokenRefused?: () => void;
}

/** Per-review options. */
export interface ReviewOptions {
  /** What a denial does to the rest of the batch. Default `SKIP_REST`. */
  onDeny?: OnDeny;
  /** Supersede every pending call of the session's earlier batches. */
  supersedePending?: boolean;
  /** Give up waiting after this many ms (`ReviewTimeout`; the calls stay pending). */
  timeoutMs?: number;
  /** Aborting rejects the review with the signal's reason and cancels its calls that are still
   * pending at the broker (unless `cancelOnAbort` is false). */
  signal?: AbortSignal;
  /** Default true. */
  cancelOnAbort?: boolean;
}

/** The broker's answer to a submit: one `Ack` per call, and the outcomes already decided. */
export interface Submitted {
  sessionId: string;
  batchId: string;
  acks: Ack[];
  outcomes: Outcome[];
}

type Key = string;
const keyOf = (sessionId: string, callId: string): Key => `${sessionId}\u0000${callId}`;

/** A promise with its settle functions, whose rejection never goes unhandled. */
class Deferred<T> {
  readonly promise: Promise<T>;
  resolve!: (value: T) => void;
  reject!: (error: unknown) => void;
  done = false;
  value: T | undefined;

  constructor() {
    this.promise = new Promise<T>((resolve, reject) => {
      this.resolve = (value) => {
        if (this.done) return;
        this.done = true;
        this.value = value;
        resolve(value);
      };
      this.reject = (error) => {
        if (this.done) return;
        this.done = true;
        reject(error);
      };
    });
    this.promise.catch(() => undefined);
  }
}

/** The requests of one stream, as the async iterable Connect reads them from. */
class RequestQueue implements AsyncIterable<AgentRequest> {
  private items: AgentRequest[] = [];
  private wake: (() => void) | undefined;
  private closed = false;

  push(request: AgentRequest): void {
    if (this.closed) return;
    this.items.push(request);
    this.wake?.();
  }

  close(): void {
    this.closed = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<AgentRequest> {
    for (;;) {
      const next = this.items.shift();
      if (next !== undefined) {
        yield next;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}

interface Pending {
  request: AgentRequest;
  deferred: Deferred<AgentResponse>;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * An async client of the approval broker, for one agent. Make one with `connectBroker` (Node)
 * or `connectBrokerWeb` (browsers); `close()` it (or `await using`) when done.
 */
export class Broker {
  readonly target: string;
  readonly unavailableTimeoutMs: number;
  readonly rpcTimeoutMs: number;
  readonly verifyReceipts: boolean;
  /** How many times the stream was (re)opened and answered; tests and logs read it. */
  connects = 0;

  private readonly agent: Client<typeof AgentService>;
  private readonly streaming: "bidi" | "server";
  private readonly log: Logger;
  private readonly pending = new Map<string, Pending>();
  private readonly waiters = new Map<Key, Set<Deferred<Outcome>>>();
  private readonly configuredKeys: Map<string, TrustedKey> | undefined;
  private brokerKeys: Promise<Map<string, TrustedKey>> | undefined;
  private stream: RequestQueue | undefined;
  private streamRunning = false;
  private streamAbort: AbortController | undefined;
  private closed = false;
  private readonly tokenRefused: (() => void) | undefined;

  constructor(options: BrokerOptions) {
    this.tokenRefused = options.tokenRefused;
    this.agent = createClient(AgentService, options.transport);
    this.streaming = options.streaming ?? "bidi";
    this.target = options.target ?? "the broker";
    this.unavailableTimeoutMs = options.unavailableTimeoutMs ?? 30_000;
    this.rpcTimeoutMs = options.rpcTimeoutMs ?? 10_000;
    this.log = options.logger ?? quiet;
    this.verifyReceipts = options.verifyReceipts ?? true;
    const configured = options.trustedReceiptKeys === undefined ? undefined : trustedKeys(options.trustedReceiptKeys);
    if (!this.verifyReceipts) {
      if (configured?.size) throw new Error("trustedReceiptKeys were given, but verifyReceipts: false turns the check off");
      this.log.warn(
        "receipt verification is off (verifyReceipts: false): APPROVED outcomes are run on the broker's word alone, unsigned; only for a broker running `--receipts off`",
      );
    } else if (configured !== undefined && configured.size === 0) {
      throw new Error("trustedReceiptKeys is empty: give at least one key, or leave it out to read the broker's");
    }
    this.configuredKeys = configured;
  }

  /** Closes the stream. Calls still waiting stay pending at the broker. */
  async close(): Promise<void> {
    this.closed = true;
    this.streamAbort?.abort();
    this.stream?.close();
    this.failEverything(new BrokerError("the client was closed"));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  // --- the agent's operations --------------------------------------------------------------

  /**
   * Submits one model turn's calls as a batch and waits for every outcome: one `Outcome` per
   * call, in the calls' order. Submitting calls that were submitted before (same session and
   * call ids, same tool and input) is safe: the broker returns the stored calls and, once
   * decided, their outcomes. A call the broker refuses on its own gets `REFUSED`; an APPROVED
   * outcome whose signed receipt does not prove it, `UNVERIFIED`.
   *
   * Rejects with `ReviewTimeout` when `timeoutMs` passes first, `BrokerUnavailable` when the
   * broker cannot be reached, `RequestRefused` when the whole batch is refused, and the signal's
   * reason when `signal` aborts. Whichever: run nothing (`notAskedOutcomes` gives the model a
   * result for each call).
   */
  async review(sessionId: string, calls: readonly ToolCall[], options: ReviewOptions = {}): Promise<Outcome[]> {
    const { signal } = options;
    signal?.throwIfAborted();
    const keys = calls.map((call) => keyOf(sessionId, call.callId));
    const tools = new Map(calls.map((call) => [call.callId, call.tool]));
    const waiters = keys.map((key) => this.waitFor(key));
    const watch = this.streaming === "server" ? new AbortController() : undefined;
    try {
      const submitted = await this.abortable(this.submitBatch(sessionId, calls, options, waiters), signal);
      submitted.acks.forEach((ack, i) => {
        if (ack.kind === "error") waiters[i]?.resolve(Outcome.refused(sessionId, ack.callId, ack.errorCode, ack.errorMessage));
      });
      if (watch !== undefined) this.watch(sessionId, calls.map((c) => c.callId), waiters, watch.signal);
      const outcomes = await this.gather(keys, waiters, options.timeoutMs, signal, tools);
      return await this.checked(outcomes, tools);
    } catch (error) {
      if (signal?.aborted && (options.cancelOnAbort ?? true)) {
        const open = calls.filter((_, i) => !waiters[i]?.done).map((c) => c.callId);
        if (open.length > 0) {
          this.cancel(sessionId, { callIds: open, reason: "the agent abandoned the turn" }).catch((e: unknown) =>
            this.log.warn(`could not cancel the abandoned calls ${open.join(", ")}: ${String(e)}`),
          );
        }
      }
      throw error;
    } finally {
      watch?.abort();
      this.forget(keys, waiters);
    }
  }

  /** Submits a batch and returns the acknowledgements without waiting for decisions; `wait`
   * gets the outcomes later (also from another process). */
  async submit(sessionId: string, calls: readonly ToolCall[], options: ReviewOptions = {}): Promise<Submitted> {
    const submitted = await this.submitBatch(sessionId, calls, options, []);
    return { ...submitted, outcomes: await this.checked(submitted.outcomes, new Map(calls.map((c) => [c.callId, c.tool]))) };
  }

  /** Waits for the outcomes of calls submitted earlier (by this or another client), in the
   * given order. Rejects naming call ids the session does not hold. */
  async wait(sessionId: string, callIds: readonly string[], options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<Outcome[]> {
    const keys = callIds.map((callId) => keyOf(sessionId, callId));
    const waiters = keys.map((key) => this.waitFor(key));
    const watch = this.streaming === "server" ? new AbortController() : undefined;
    try {
      if (watch !== undefined) {
        this.watch(sessionId, callIds, waiters, watch.signal);
      } else {
        const reply = await this.abortable(
          this.request(create(AgentRequestSchema, { request: { case: "resume", value: create(ResumeRequestSchema, { sessionId, callIds: [...callIds] }) } })),
          options.signal,
        );
        const unknown = reply.response.case === "resumed" ? reply.response.value.unknownCallIds : [];
        if (unknown.length > 0) throw new BrokerError(`session ${JSON.stringify(sessionId)} holds no call ${unknown.join(", ")}`);
      }
      return await this.checked(await this.gather(keys, waiters, options.timeoutMs, options.signal, undefined), undefined);
    } finally {
      watch?.abort();
      this.forget(keys, waiters);
    }
  }

  /** Cancels the named calls, or a batch, or (neither given) every pending call of the
   * session. Returns the outcome that stands for each call touched: CANCELLED, or the earlier
   * outcome of calls already decided. */
  async cancel(sessionId: string, options: { callIds?: readonly string[]; batchId?: string; reason?: string } = {}): Promise<Outcome[]> {
    const target = create(CancelTargetSchema, {
      sessionId,
      reason: options.reason ?? "",
      target: options.callIds?.length
        ? { case: "calls", value: { callIds: [...options.callIds] } }
        : options.batchId
          ? { case: "batchId", value: options.batchId }
          : { case: "wholeSession", value: true },
    });
    let cancelled: ProtoOutcome[];
    let decided: ProtoOutcome[];
    if (this.streaming === "server") {
      const reply = await this.unaryRetried(() => this.agent.cancel({ target }, { timeoutMs: this.rpcTimeoutMs }));
      cancelled = reply.result?.cancelled ?? [];
      decided = reply.result?.alreadyDecided ?? [];
    } else {
      const reply = await this.request(create(AgentRequestSchema, { request: { case: "cancel", value: target } }));
      const result = reply.response.case === "cancelled" ? reply.response.value : undefined;
      cancelled = result?.cancelled ?? [];
      decided = result?.alreadyDecided ?? [];
    }
    return this.checked([...cancelled, ...decided].map(Outcome.fromProto), undefined);
  }

  /** Looks the calls up now (`GetOutcomes`): each one's outcome, or `undefined` while it is
   * pending. Rejects naming call ids the session does not hold. */
  async outcomes(sessionId: string, callIds: readonly string[]): Promise<(Outcome | undefined)[]> {
    const reply = await this.unary(() => this.agent.getOutcomes({ sessionId, callIds: [...callIds] }, { timeoutMs: this.rpcTimeoutMs }));
    const unknown = reply.calls.filter((c) => c.state.case === "unknown").map((c) => c.callId);
    if (unknown.length > 0) throw new BrokerError(`session ${JSON.stringify(sessionId)} holds no call ${unknown.join(", ")}`);
    const found = reply.calls.flatMap((c) => (c.state.case === "outcome" ? [Outcome.fromProto(c.state.value)] : []));
    const checked = (await this.checked(found, undefined))[Symbol.iterator]();
    return reply.calls.map((c) => (c.state.case === "outcome" ? checked.next().value : undefined));
  }

  // --- receipts ----------------------------------------------------------------------------

  /** The keys receipts must verify with, by key id: the configured ones, or the broker's
   * (`ListReceiptKeys`), read once (a failed read is tried again at the next approval).
   * Rejects with `ReceiptRejected` when there are none. */
  async receiptKeys(): Promise<Map<string, TrustedKey>> {
    if (this.configuredKeys !== undefined) return this.configuredKeys;
    if (this.brokerKeys === undefined) {
      this.brokerKeys = this.readBrokerKeys();
      this.brokerKeys.catch(() => (this.brokerKeys = undefined));
    }
    return this.brokerKeys;
  }

  private async readBrokerKeys(): Promise<Map<string, TrustedKey>> {
    let reply: ListReceiptKeysResponse;
    try {
      reply = await this.agent.listReceiptKeys({}, { timeoutMs: this.rpcTimeoutMs });
    } catch (e) {
      const error = ConnectError.from(e);
      throw new ReceiptRejected(`the broker's receipt keys could not be read (${Code[error.code]}: ${error.rawMessage})`);
    }
    const keys: TrustedKey[] = [];
    for (const k of reply.keys) {
      try {
        keys.push(
          trustedKey(k.key?.publicKey ?? "", {
            ...(k.validFrom ? { validFromNanos: BigInt(k.validFrom.seconds) * 1_000_000_000n + BigInt(k.validFrom.nanos) } : {}),
            ...(k.validUntil ? { validUntilNanos: BigInt(k.validUntil.seconds) * 1_000_000_000n + BigInt(k.validUntil.nanos) } : {}),
          }),
        );
      } catch (e) {
        this.log.warn(`the broker serves a receipt key this client cannot read (${String(e)}); ignored`);
      }
    }
    if (keys.length === 0) {
      throw new ReceiptRejected("the broker signs no receipts (`--receipts off`?) and this client was given no key to trust");
    }
    const byId = trustedKeys(keys);
    this.log.info(`verifying receipts with the broker's keys ${[...byId.keys()].map((k) => k.slice(0, 16)).join(", ")} (read once from ListReceiptKeys)`);
    return byId;
  }

  /** Each APPROVED outcome checked against its signed receipt (or made `UNVERIFIED`). */
  private async checked(outcomes: Outcome[], tools: Map<string, string> | undefined): Promise<Outcome[]> {
    if (!this.verifyReceipts || !outcomes.some((o) => o.approved)) return outcomes;
    return Promise.all(outcomes.map((o) => (o.approved ? this.check(o, tools?.get(o.callId)) : o)));
  }

  private async check(outcome: Outcome, tool: string | undefined): Promise<Outcome> {
    try {
      const keys = await this.receiptKeys();
      const envelope = outcome.receipt || (await this.fetchReceipt(outcome));
      const toRun = await verifyApproval(envelope, keys, {
        sessionId: outcome.sessionId,
        callId: outcome.callId,
        inputJson: outcome.inputJson,
        tool,
        batchId: outcome.batchId,
      });
      return outcome.with({ inputJson: toRun, receiptSequence: chainSequence(envelope), receipt: envelope });
    } catch (e) {
      if (!(e instanceof ReceiptRejected)) throw e;
      this.log.warn(`not running call ${outcome.sessionId}/${outcome.callId}: the broker said APPROVED, but ${e.reason}`);
      return outcome.unverified(e.reason);
    }
  }

  /** The receipt of an outcome that came without one (`GetReceipt`); the reply's own key and
   * `verified` are the broker's word: not used. */
  private async fetchReceipt(outcome: Outcome): Promise<string> {
    let reply: GetReceiptResponse;
    try {
      reply = await this.agent.getReceipt({ sessionId: outcome.sessionId, callId: outcome.callId }, { timeoutMs: this.rpcTimeoutMs });
    } catch (e) {
      throw new ReceiptRejected(receiptError(ConnectError.from(e)));
    }
    if (!reply.receipt?.envelope) throw new ReceiptRejected("the broker sent no receipt for it");
    return reply.receipt.envelope;
  }

  // --- requests and waiters ----------------------------------------------------------------

  private async submitBatch(sessionId: string, calls: readonly ToolCall[], options: ReviewOptions, waiters: Deferred<Outcome>[]): Promise<Submitted> {
    const batch = create(BatchSpecSchema, {
      sessionId,
      calls: calls.map(callSpec),
      onDeny: onDenyProto(options.onDeny ?? OnDeny.SKIP_REST),
      supersedePending: options.supersedePending ?? false,
    });
    let reply: SubmitResponse;
    if (this.streaming === "server") {
      reply = await this.unaryRetried(() => this.agent.submit({ batch }, { timeoutMs: this.rpcTimeoutMs }));
    } else {
      const response = await this.request(create(AgentRequestSchema, { request: { case: "submit", value: batch } }));
      if (response.response.case !== "submitted") throw new BrokerError(`the broker answered a submit with ${response.response.case}`);
      reply = response.response.value;
    }
    const outcomes = reply.outcomes.map(Outcome.fromProto);
    if (waiters.length > 0) for (const o of [...reply.outcomes, ...reply.superseded]) this.resolve(o);
    return { sessionId: reply.sessionId, batchId: reply.batchId, acks: reply.acks.map(ackFromProto), outcomes };
  }

  /** Sends a request on the stream and waits for its answer. Every request is sent again
   * after a reconnect until answered (submits and cancels are idempotent; resumes too). */
  private request(request: AgentRequest): Promise<AgentResponse> {
    if (this.closed) return Promise.reject(new BrokerError("the client is closed"));
    request.requestId = crypto.randomUUID().replaceAll("-", "");
    const deferred = new Deferred<AgentResponse>();
    this.pending.set(request.requestId, { request, deferred });
    if (!this.ensureStream()) this.stream?.push(request);
    return deferred.promise.finally(() => this.pending.delete(request.requestId));
  }

  private async unary<T>(call: () => Promise<T>): Promise<T> {
    if (this.closed) throw new BrokerError("the client is closed");
    try {
      return await call();
    } catch (e) {
      throw errorFromStatus(ConnectError.from(e), this.target);
    }
  }

  /** A unary call that is safe to repeat (a submit or a cancel, idempotent by call id), tried
   * again with backoff while the broker is out of reach, for up to `unavailableTimeoutMs`: what
   * the stream's resend does on `Connect`. */
  private async unaryRetried<T>(call: () => Promise<T>): Promise<T> {
    const since = Date.now();
    let backoff = 50;
    for (;;) {
      if (this.closed) throw new BrokerError("the client is closed");
      try {
        return await call();
      } catch (e) {
        const error = ConnectError.from(e);
        const elapsed = Date.now() - since;
        if (!unreachable(error) || elapsed >= this.unavailableTimeoutMs) {
          if (unreachable(error)) {
            throw new BrokerUnavailable(
              `the approval broker at ${this.target} was unreachable for ${this.unavailableTimeoutMs / 1000}s (${Code[error.code]}: ${error.rawMessage}); no outcome was decided, run nothing`,
            );
          }
          throw errorFromStatus(error, this.target);
        }
        await sleep(Math.min(backoff, this.unavailableTimeoutMs - elapsed));
        backoff = Math.min(backoff * 2, 2_000);
      }
    }
  }

  private waitFor(key: Key): Deferred<Outcome> {
    const deferred = new Deferred<Outcome>();
    let set = this.waiters.get(key);
    if (set === undefined) {
      set = new Set();
      this.waiters.set(key, set);
    }
    set.add(deferred);
    return deferred;
  }

  private forget(keys: Key[], waiters: Deferred<Outcome>[]): void {
    keys.forEach((key, i) => {
      const set = this.waiters.get(key);
      const waiter = waiters[i];
      if (set === undefined || waiter === undefined) return;
      set.delete(waiter);
      if (set.size === 0) this.waiters.delete(key);
    });
  }

  /** Every waiter's outcome, in order; or the first error, the timeout, or the abort. */
  private async gather(
    keys: Key[],
    waiters: Deferred<Outcome>[],
    timeoutMs: number | undefined,
    signal: AbortSignal | undefined,
    tools: Map<string, string> | undefined,
  ): Promise<Outcome[]> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<"timeout">((resolve) => {
      if (timeoutMs !== undefined) timer = setTimeout(() => resolve("timeout"), timeoutMs);
    });
    try {
      const all = await this.abortable(Promise.race([Promise.all(waiters.map((w) => w.promise)), timedOut]), signal);
      if (all !== "timeout") return all;
    } finally {
      clearTimeout(timer);
    }
    const decided = waiters.flatMap((w) => (w.done && w.value ? [w.value] : []));
    const checked = await this.checked(decided, tools);
    throw new ReviewTimeout(
      keys.flatMap((key, i) => (waiters[i]?.done ? [] : [key.split("\u0000")[1] ?? key])),
      new Map(checked.map((o) => [o.callId, o])),
    );
  }

  /** `promise`, or the signal's reason as soon as it aborts. */
  private abortable<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
    if (signal === undefined) return promise;
    signal.throwIfAborted();
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
      promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
    });
  }

  private resolve(outcome: ProtoOutcome): void {
    const set = this.waiters.get(keyOf(outcome.sessionId, outcome.callId));
    if (set === undefined || set.size === 0) return;
    const value = Outcome.fromProto(outcome);
    for (const waiter of set) waiter.resolve(value);
  }

  private failEverything(error: BrokerError): void {
    for (const pending of this.pending.values()) pending.deferred.reject(error);
    for (const set of this.waiters.values()) for (const waiter of set) waiter.reject(error);
  }

  private hasDemand(): boolean {
    if (this.pending.size > 0) return true;
    for (const set of this.waiters.values()) for (const waiter of set) if (!waiter.done) return true;
    return false;
  }

  // --- the Connect stream ------------------------------------------------------------------

  /** Starts the stream loop unless it runs; true when it started (and so sent every pending
   * request already). */
  private ensureStream(): boolean {
    if (this.streamRunning) return false;
    this.streamRunning = true;
    void this.keepStream();
    return true;
  }

  /** Keeps one Connect stream open while anything waits; reconnects and resumes. Clears
   * `streamRunning` in the same turn it decides to stop, so a request made just then starts a
   * new loop. */
  private async keepStream(): Promise<void> {
    let downSince: number | undefined;
    let backoff = 50;
    let lastError = "not connected yet";
    // Whether the last refusal of the token was already answered with a renewed one.
    let renewed = false;
    try {
      while (!this.closed) {
        const queue = new RequestQueue();
        const abort = new AbortController();
        this.stream = queue;
        this.streamAbort = abort;
        this.sendAfterConnect(queue);
        let answered = false;
        try {
          for await (const response of this.agent.connect(queue, { signal: abort.signal })) {
            renewed = false;
            if (!answered) {
              answered = true;
              this.connects += 1;
              if (downSince !== undefined) this.log.info(`reconnected to the approval broker at ${this.target}`);
              downSince = undefined;
              backoff = 50;
            }
            this.dispatch(response);
          }
          lastError = "the broker ended the stream";
        } catch (e) {
          const error = ConnectError.from(e);
          lastError = `${Code[error.code]}: ${error.rawMessage}`;
          if (error.code === Code.Unauthenticated && !renewed && !tokenFailure(error) && this.tokenRefused) {
            renewed = true;
            this.tokenRefused();
            continue;
          }
          if (error.code === Code.Unauthenticated || error.code === Code.PermissionDenied) {
            this.failEverything(errorFromStatus(error, this.target));
            return;
          }
        } finally {
          if (this.stream === queue) this.stream = undefined;
          queue.close();
          abort.abort();
        }
        if (!this.hasDemand() || this.closed) return;
        const now = Date.now();
        if (downSince === undefined) {
          downSince = now;
          this.log.warn(`lost the approval broker at ${this.target} (${lastError}); reconnecting`);
        }
        if (now - downSince >= this.unavailableTimeoutMs) {
          this.failEverything(
            new BrokerUnavailable(
              `the approval broker at ${this.target} was unreachable for ${this.unavailableTimeoutMs / 1000}s (${lastError}); no outcome was decided, run nothing`,
            ),
          );
          return;
        }
        await sleep(Math.min(backoff, Math.max(0, downSince + this.unavailableTimeoutMs - now)));
        backoff = Math.min(backoff * 2, 2_000);
        if (!this.hasDemand()) return;
      }
    } finally {
      this.streamRunning = false;
      this.stream = undefined;
    }
  }

  /** After a (re)connect: the unanswered requests again, then a resume of each session whose
   * other calls are still waiting. */
  private sendAfterConnect(queue: RequestQueue): void {
    const inSubmits = new Set<Key>();
    for (const { request } of this.pending.values()) {
      if (request.request.case === "submit") {
        const batch = request.request.value;
        for (const call of batch.calls) inSubmits.add(keyOf(batch.sessionId, call.callId));
      }
      queue.push(request);
    }
    const sessions = new Map<string, string[]>();
    for (const [key, set] of this.waiters) {
      if (inSubmits.has(key) || ![...set].some((w) => !w.done)) continue;
      const [sessionId = "", callId = ""] = key.split("\u0000");
      sessions.set(sessionId, [...(sessions.get(sessionId) ?? []), callId]);
    }
    for (const [sessionId, callIds] of sessions) {
      queue.push(
        create(AgentRequestSchema, {
          requestId: `resume-${crypto.randomUUID()}`,
          request: { case: "resume", value: create(ResumeRequestSchema, { sessionId, callIds }) },
        }),
      );
    }
  }

  private dispatch(response: AgentResponse): void {
    const r = response.response;
    switch (r.case) {
      case "outcome":
        this.resolve(r.value);
        return;
      case "batchComplete":
        for (const o of r.value.outcomes) this.resolve(o);
        return;
      case "submitted":
        for (const o of [...r.value.outcomes, ...r.value.superseded]) this.resolve(o);
        break;
      case "cancelled":
        for (const o of [...r.value.cancelled, ...r.value.alreadyDecided]) this.resolve(o);
        break;
      case "resumed":
        if (response.requestId.startsWith("resume-")) this.failUnknown(r.value.sessionId, r.value.unknownCallIds);
        break;
    }
    const pending = this.pending.get(response.requestId);
    if (pending === undefined) return;
    if (r.case === "error") pending.deferred.reject(new RequestRefused(r.value.code, r.value.message));
    else pending.deferred.resolve(response);
  }

  /** A resume after a reconnect found calls the broker does not hold (never the case for an
   * acknowledged call): their waiters fail rather than wait forever. */
  private failUnknown(sessionId: string, callIds: string[]): void {
    for (const callId of callIds) {
      for (const waiter of this.waiters.get(keyOf(sessionId, callId)) ?? []) {
        waiter.reject(new BrokerError(`the broker does not hold call ${sessionId}/${callId}`));
      }
    }
  }

  // --- gRPC-Web: WatchOutcomes instead of the stream ---------------------------------------

  /** Follows the calls' outcomes with `WatchOutcomes` (for transports without client
   * streaming), re-watching after a break, until every waiter is settled or `signal` aborts. */
  private watch(sessionId: string, callIds: readonly string[], waiters: Deferred<Outcome>[], signal: AbortSignal): void {
    const run = async () => {
      let downSince: number | undefined;
      let backoff = 50;
      let renewed = false;
      while (!signal.aborted && waiters.some((w) => !w.done)) {
        const open = callIds.filter((_, i) => !waiters[i]?.done);
        try {
          for await (const event of this.agent.watchOutcomes({ sessionId, callIds: open }, { signal })) {
            downSince = undefined;
            backoff = 50;
            renewed = false;
            if (event.event.case === "outcome") this.resolve(event.event.value);
            else if (event.event.case === "batchComplete") for (const o of event.event.value.outcomes) this.resolve(o);
          }
        } catch (e) {
          if (signal.aborted) return;
          const error = ConnectError.from(e);
          if (error.code === Code.Unauthenticated && !renewed && !tokenFailure(error) && this.tokenRefused) {
            renewed = true;
            this.tokenRefused();
            continue;
          }
          if (error.code === Code.Unauthenticated || error.code === Code.PermissionDenied || error.code === Code.InvalidArgument) {
            for (const w of waiters) w.reject(errorFromStatus(error, this.target));
            return;
          }
          const now = Date.now();
          downSince ??= now;
          if (now - downSince >= this.unavailableTimeoutMs) {
            const failure = new BrokerUnavailable(
              `the approval broker at ${this.target} was unreachable for ${this.unavailableTimeoutMs / 1000}s (${Code[error.code]}: ${error.rawMessage}); no outcome was decided, run nothing`,
            );
            for (const w of waiters) w.reject(failure);
            return;
          }
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 2_000);
        }
      }
    };
    void run();
  }
}

function receiptError(error: ConnectError): string {
  switch (error.code) {
    case Code.FailedPrecondition:
      return `the broker has no receipt for it: ${error.rawMessage}`;
    case Code.NotFound:
      return `the broker has no receipt for it (NOT_FOUND: ${error.rawMessage})`;
    case Code.Unimplemented:
      return "the broker does not serve receipts to agents (AgentService.GetReceipt): upgrade it";
    case Code.Unavailable:
    case Code.DeadlineExceeded:
      return `the broker could not be reached for its receipt (${Code[error.code]})`;
    default:
      return `its receipt could not be read (${Code[error.code]}: ${error.rawMessage})`;
  }
}

/** The broker could not be reached: UNAVAILABLE, or (gRPC-Web) a `fetch` that failed on the
 * network, which Connect reports as UNKNOWN caused by a `TypeError`. */
function unreachable(error: ConnectError): boolean {
  return error.code === Code.Unavailable || (error.code === Code.Unknown && error.cause instanceof TypeError);
}

function errorFromStatus(error: ConnectError, target: string): BrokerError {
  const noToken = tokenFailure(error);
  if (noToken) return noToken;
  if (unreachable(error)) {
    return new BrokerUnavailable(`the approval broker at ${target} is unreachable (${Code[error.code]}: ${error.rawMessage}); run nothing`);
  }
  switch (error.code) {
    case Code.Unauthenticated:
      return new AuthenticationError(`the broker refused the credentials: ${error.rawMessage}`);
    case Code.PermissionDenied:
      return new PermissionDenied(`the token may not call AgentService: ${error.rawMessage}`);
    case Code.Unavailable:
    case Code.DeadlineExceeded:
      return new BrokerUnavailable(`the approval broker at ${target} is unreachable (${Code[error.code]}: ${error.rawMessage}); run nothing`);
    default:
      return new RequestRefused(error.code, error.rawMessage);
  }
}
