// The live list of pending calls: Subscribe's snapshot, then live events; after any break (the
// broker restarted, the network dropped, the stream fell behind) it resubscribes after the last
// sequence number it applied, so no event is applied twice and none is missed. It must never
// drop a call it has not seen resolved, nor show one twice. A resume is live as soon as the
// broker's `approvals-latest-seq` header arrives (sent at once: the events up to it follow),
// not on the first event, which on a quiet broker may not come for minutes.
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { ApproverEvent } from "./gen/approvals/v1/approver_pb";
import type { Call, Outcome } from "./gen/approvals/v1/types_pb";
import { type Api, Code, ConnectError, isAuthFailure } from "./api";

export type LinkState = "connecting" | "live" | "reconnecting";

/** The header the broker opens every subscription with (proto/approvals/v1/approver.proto). */
const LATEST_SEQ_HEADER = "approvals-latest-seq";

export interface Decided {
  call: Call | undefined;
  outcome: Outcome;
  /** When this page learnt it (for how long to keep showing it). */
  seenAt: number;
}

export interface LiveEvents {
  changed(): void;
  state(state: LinkState, detail?: string): void;
  /** Calls decided while the page was away, counted once the stream is back. */
  away(decided: number): void;
  requested(call: Call): void;
  refused(error: unknown): void;
}

export function callKey(c: { agent: string; sessionId: string; callId: string }): string {
  return `${c.agent}\u0000${c.sessionId}\u0000${c.callId}`;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class Live {
  readonly pending = new Map<string, Call>();
  readonly decided = new Map<string, Decided>();
  private lastSeq: bigint | undefined;
  /** The calls of the snapshot being received (a fresh subscription, not a resume). */
  private snapshot = new Set<string>();
  private resumedAt = 0;
  private awayCount = 0;
  private stopped = new AbortController();

  constructor(
    private readonly api: Api,
    private readonly on: LiveEvents,
  ) {}

  stop(): void {
    this.stopped.abort();
  }

  async run(): Promise<void> {
    let delay = 200;
    let first = true;
    while (!this.stopped.signal.aborted) {
      this.on.state(first ? "connecting" : "reconnecting");
      const resuming = this.lastSeq !== undefined;
      this.snapshot.clear();
      this.resumedAt = Date.now();
      this.awayCount = 0;
      try {
        const request = resuming ? { afterSeq: this.lastSeq } : {};
        let opened = false;
        const open = () => {
          if (opened) return;
          opened = true;
          first = false;
          delay = 200;
          this.on.state("live");
        };
        const stream = this.api.approver.subscribe(request, {
          signal: this.stopped.signal,
          // A fresh subscription is live once its snapshot starts arriving; a resume, once the
          // broker says where the log is (what came after this page's cursor follows at once).
          onHeader: (header) => {
            if (resuming && header.has(LATEST_SEQ_HEADER)) open();
          },
        });
        for await (const event of stream) {
          open();
          this.apply(event, resuming);
        }
      } catch (error) {
        if (this.stopped.signal.aborted) return;
        if (isAuthFailure(error) || (error instanceof ConnectError && error.code === Code.PermissionDenied)) {
          this.on.refused(error);
          return;
        }
        // A resume point the broker cannot serve: start again from a snapshot.
        if (
          error instanceof ConnectError &&
          [Code.InvalidArgument, Code.OutOfRange, Code.FailedPrecondition, Code.NotFound].includes(error.code)
        ) {
          this.lastSeq = undefined;
        }
      }
      if (this.stopped.signal.aborted) return;
      this.on.state("reconnecting");
      await sleep(delay);
      delay = Math.min(delay * 2, 3000);
    }
  }

  private apply(event: ApproverEvent, resuming: boolean): void {
    const e = event.event;
    switch (e.case) {
      case "snapshot":
        this.snapshot.add(callKey(e.value));
        this.pending.set(callKey(e.value), e.value);
        break;
      case "snapshotComplete":
        // A new snapshot replaces what the page held: calls no longer pending have gone.
        for (const key of [...this.pending.keys()]) if (!this.snapshot.has(key)) this.pending.delete(key);
        this.snapshot.clear();
        this.lastSeq = event.seq;
        break;
      case "requested":
        if (this.lastSeq !== undefined && event.seq <= this.lastSeq) return;
        this.lastSeq = event.seq;
        if (!this.pending.has(callKey(e.value))) this.on.requested(e.value);
        this.pending.set(callKey(e.value), e.value);
        break;
      case "approvalRecorded":
        // A vote on a call that needs more: the call, still pending, with its votes so far.
        if (this.lastSeq !== undefined && event.seq <= this.lastSeq) return;
        this.lastSeq = event.seq;
        if (this.pending.has(callKey(e.value))) this.pending.set(callKey(e.value), e.value);
        break;
      case "resolved": {
        if (this.lastSeq !== undefined && event.seq <= this.lastSeq) return;
        this.lastSeq = event.seq;
        this.resolve(e.value);
        const decidedAt = e.value.decidedAt ? timestampDate(e.value.decidedAt).getTime() : Date.now();
        if (resuming && decidedAt < this.resumedAt) {
          this.awayCount += 1;
          this.on.away(this.awayCount);
        }
        break;
      }
      default:
        return;
    }
    this.on.changed();
  }

  /** Records an outcome (from the stream, or the reply to this page's own decision). */
  resolve(outcome: Outcome): void {
    const key = callKey(outcome);
    const call = this.pending.get(key) ?? this.decided.get(key)?.call;
    this.pending.delete(key);
    if (!this.decided.has(key)) this.decided.set(key, { call, outcome, seenAt: Date.now() });
  }

  /** Forgets decided calls shown for longer than `ms`. */
  prune(ms: number): boolean {
    let pruned = false;
    for (const [key, decided] of this.decided) {
      if (Date.now() - decided.seenAt > ms) {
        this.decided.delete(key);
        pruned = true;
      }
    }
    return pruned;
  }
}
