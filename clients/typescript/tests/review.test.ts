/**
 * `review` against a real broker: one outcome per call in the model's order (approve, deny,
 * edit, a denial skipping the rest), idempotent retries by the model's call ids, cancellation
 * with an AbortSignal, deadlines, a restart mid-review, and failing closed when the broker
 * cannot be reached.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { BrokerUnavailable, notAskedOutcomes, OnDeny, ReviewTimeout, Status, type Broker, type ToolCall } from "../src/index.js";
import { connectBroker } from "../src/node.js";
import { connectBrokerWeb } from "../src/web.js";
import { approveWhenPending, BrokerProcess, decide, freePort, newSession, waitUntilPending } from "./broker.js";

const SHELL: ToolCall = { callId: "toolu_01", tool: "run_shell", input: { command: "ls -la", cwd: "/srv" }, title: "List files" };
const READ: ToolCall = { callId: "toolu_02", tool: "read_file", input: { path: "notes.txt" } };
const WRITE: ToolCall = { callId: "toolu_03", tool: "write_file", input: { path: "out.txt", text: "hi" } };

describe("review against a real broker", () => {
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

  test("an approved call comes back with the canonical input its receipt signed", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [{ callId: "toolu_01", approve: true }]);
    const [outcome] = await broker.review(session, [SHELL], { timeoutMs: 30_000 });
    await approving;
    assert.ok(outcome);
    assert.equal(outcome.status, Status.APPROVED);
    assert.ok(outcome.approved);
    assert.equal(outcome.inputJson, '{"command":"ls -la","cwd":"/srv"}');
    assert.deepEqual(outcome.input, { command: "ls -la", cwd: "/srv" });
    assert.equal(outcome.decidedBy, "approver:alice@example.com");
    assert.ok(outcome.receiptSequence !== undefined && outcome.receiptSequence >= 1);
  });

  test("a denied call comes back with its reason and a tool result for the model, and nothing to run", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [{ callId: "toolu_01", approve: false, reason: "not on prod" }]);
    const [outcome] = await broker.review(session, [SHELL], { timeoutMs: 30_000 });
    await approving;
    assert.ok(outcome);
    assert.equal(outcome.status, Status.DENIED);
    assert.equal(outcome.approved, false);
    assert.equal(outcome.reason, "not on prod");
    assert.equal(outcome.responded, false);
    assert.match(outcome.toolResult, /denied/i);
    assert.match(outcome.toolResult, /not on prod/);
    assert.equal(outcome.inputJson, "");
    assert.deepEqual(outcome.input, {});
  });

  test("a response comes back denied, marked, with the person's words for the model", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [
      { callId: "toolu_01", approve: false, response: "Use ls -l; the cwd is /srv already" },
    ]);
    const [outcome] = await broker.review(session, [SHELL], { timeoutMs: 30_000 });
    await approving;
    assert.ok(outcome);
    assert.equal(outcome.status, Status.DENIED);
    assert.equal(outcome.approved, false);
    assert.equal(outcome.responded, true);
    assert.equal(outcome.reason, "Use ls -l; the cwd is /srv already");
    assert.equal(
      outcome.toolResult,
      'The user did not run this tool call and answered instead: "Use ls -l; the cwd is /srv already"',
    );
    assert.equal(outcome.inputJson, "");
  });

  test("an edited approval runs the approver's input", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [
      { callId: "toolu_02", approve: true, editedInputJson: '{"path": "README.md"}' },
    ]);
    const [outcome] = await broker.review(session, [READ], { timeoutMs: 30_000 });
    await approving;
    assert.ok(outcome);
    assert.equal(outcome.status, Status.APPROVED);
    assert.ok(outcome.inputEdited);
    assert.deepEqual(outcome.input, { path: "README.md" });
    assert.equal(outcome.inputJson, '{"path":"README.md"}');
  });

  test("three calls with the middle one denied: one outcome each, in order, the rest skipped", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [
      { callId: "toolu_01", approve: true },
      { callId: "toolu_02", approve: false, reason: "private" },
    ]);
    const outcomes = await broker.review(session, [SHELL, READ, WRITE], { timeoutMs: 30_000 });
    await approving;
    assert.deepEqual(
      outcomes.map((o) => [o.callId, o.status, o.position]),
      [
        ["toolu_01", Status.APPROVED, 0],
        ["toolu_02", Status.DENIED, 1],
        ["toolu_03", Status.SKIPPED, 2],
      ],
    );
    assert.equal(outcomes[2]?.decidedBy, "broker");
    assert.ok(outcomes[2]?.toolResult);
    // With INDEPENDENT, a denial leaves the siblings to their own decisions.
    const independent = newSession();
    const deciding = approveWhenPending(process_.target, independent, [
      { callId: "toolu_02", approve: false },
      { callId: "toolu_01", approve: true },
      { callId: "toolu_03", approve: true },
    ]);
    const each = await broker.review(independent, [SHELL, READ, WRITE], { onDeny: OnDeny.INDEPENDENT, timeoutMs: 30_000 });
    await deciding;
    assert.deepEqual(each.map((o) => o.status), [Status.APPROVED, Status.DENIED, Status.APPROVED]);
  });

  test("reviewing the same calls again is idempotent: the same outcomes, no new call", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [
      { callId: "toolu_01", approve: true },
      { callId: "toolu_02", approve: false, reason: "no" },
    ]);
    const first = await broker.review(session, [SHELL, READ], { onDeny: OnDeny.INDEPENDENT, timeoutMs: 30_000 });
    await approving;
    // A retry, as after a crash of the agent: a new client, the same ids.
    const again = connectBroker(process_.target);
    try {
      const second = await again.review(session, [SHELL, READ], { onDeny: OnDeny.INDEPENDENT, timeoutMs: 10_000 });
      assert.deepEqual(
        second.map((o) => [o.callId, o.status, o.inputJson, o.reason, o.receiptSequence, o.batchId]),
        first.map((o) => [o.callId, o.status, o.inputJson, o.reason, o.receiptSequence, o.batchId]),
      );
      const submitted = await again.submit(session, [SHELL, READ]);
      assert.deepEqual(submitted.acks.map((a) => a.kind), ["duplicate", "duplicate"]);
    } finally {
      await again.close();
    }
    assert.equal(process_.query(`SELECT count(*) FROM calls WHERE session_id = '${session}'`), "2");
    // The same id with another input is refused for that call alone.
    const changed = await broker.review(session, [{ ...READ, input: { path: "/etc/shadow" } }], { timeoutMs: 10_000 });
    assert.equal(changed[0]?.status, Status.REFUSED);
    assert.match(changed[0]?.toolResult ?? "", /refused this tool call; the tool was not run/);
  });

  test("aborting a review rejects it with the signal's reason and cancels its pending calls", async () => {
    const session = newSession();
    const controller = new AbortController();
    const review = broker.review(session, [SHELL, READ], { signal: controller.signal });
    await waitUntilPending(process_.target, session, ["toolu_01", "toolu_02"]);
    controller.abort(new Error("the user pressed stop"));
    await assert.rejects(review, /the user pressed stop/);
    let outcomes: (unknown)[] = [];
    for (let i = 0; i < 100; i++) {
      outcomes = await broker.outcomes(session, ["toolu_01", "toolu_02"]);
      if (outcomes.every((o) => o !== undefined)) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const statuses = (await broker.outcomes(session, ["toolu_01", "toolu_02"])).map((o) => o?.status);
    assert.deepEqual(statuses, [Status.CANCELLED, Status.CANCELLED]);
    // An aborted signal refuses at once, before anything is sent.
    await assert.rejects(broker.review(newSession(), [SHELL], { signal: AbortSignal.abort(new Error("already")) }), /already/);
  });

  test("a review that times out says which calls are still pending, and they stay pending", async () => {
    const session = newSession();
    const approving = approveWhenPending(process_.target, session, [{ callId: "toolu_01", approve: true }]);
    const error = await broker.review(session, [SHELL, READ], { onDeny: OnDeny.INDEPENDENT, timeoutMs: 1_500 }).then(
      () => assert.fail("no timeout"),
      (e: unknown) => e,
    );
    await approving;
    assert.ok(error instanceof ReviewTimeout);
    assert.deepEqual(error.pending, ["toolu_02"]);
    // What did arrive in time came checked, like any outcome.
    const decided = error.decided.get("toolu_01");
    assert.equal(decided?.status, Status.APPROVED);
    assert.ok(decided?.receiptSequence !== undefined);
    const [pendingOutcome] = await broker.outcomes(session, ["toolu_02"]);
    assert.equal(pendingOutcome, undefined);
    // A call's own deadline expires it at the broker: EXPIRED, not a denial.
    const expiring = newSession();
    const [expired] = await broker.review(expiring, [{ ...WRITE, deadline: new Date(Date.now() + 1_000) }], { timeoutMs: 30_000 });
    assert.equal(expired?.status, Status.EXPIRED);
    assert.equal(expired?.decidedBy, "deadline");
  });

  test("a later turn superseding the pending calls: the earlier review ends SUPERSEDED, with a text to ask again", async () => {
    const session = newSession();
    const earlier = broker.review(session, [SHELL], { timeoutMs: 30_000 });
    await waitUntilPending(process_.target, session, ["toolu_01"]);
    const approving = approveWhenPending(process_.target, session, [{ callId: "toolu_02", approve: true }]);
    const [later] = await broker.review(session, [READ], { supersedePending: true, timeoutMs: 30_000 });
    await approving;
    const [superseded] = await earlier;
    assert.equal(superseded?.status, Status.SUPERSEDED);
    assert.equal(superseded?.approved, false);
    assert.ok(superseded?.toolResult);
    assert.equal(later?.status, Status.APPROVED);
    // And cancel(): the calls still pending end CANCELLED; the decided keep their outcome.
    const other = newSession();
    const pending = broker.review(other, [WRITE], { timeoutMs: 30_000 });
    await waitUntilPending(process_.target, other, ["toolu_03"]);
    const cancelled = await broker.cancel(other, { reason: "the user left" });
    assert.deepEqual(cancelled.map((o) => [o.callId, o.status]), [["toolu_03", Status.CANCELLED]]);
    assert.equal((await pending)[0]?.status, Status.CANCELLED);
  });

  test("one client carries many sessions' reviews at once on one stream", async () => {
    const fresh = connectBroker(process_.target);
    try {
      const sessions = Array.from({ length: 12 }, () => newSession());
      const approvals = sessions.map((session, i) =>
        approveWhenPending(process_.target, session, [{ callId: "toolu_01", approve: i % 3 !== 0, reason: "every third" }]),
      );
      const results = await Promise.all(sessions.map((session) => fresh.review(session, [SHELL], { timeoutMs: 30_000 })));
      await Promise.all(approvals);
      assert.deepEqual(
        results.map(([o]) => o?.status),
        sessions.map((_, i) => (i % 3 !== 0 ? Status.APPROVED : Status.DENIED)),
      );
      assert.equal(fresh.connects, 1);
      // Calls a session does not hold are named, not waited for.
      await assert.rejects(fresh.outcomes(sessions[0] ?? "", ["nope"]), /holds no call nope/);
      await assert.rejects(fresh.wait(sessions[0] ?? "", ["toolu_01", "nope"], { timeoutMs: 5_000 }), /holds no call nope/);
    } finally {
      await fresh.close();
    }
  });

  test("gRPC-Web (the browser transport): Submit and WatchOutcomes give the same outcomes", async () => {
    const web = connectBrokerWeb(process_.url);
    try {
      const session = newSession();
      const approving = approveWhenPending(process_.target, session, [
        { callId: "toolu_01", approve: true },
        { callId: "toolu_02", approve: false, reason: "private" },
      ]);
      const outcomes = await web.review(session, [SHELL, READ, WRITE], { timeoutMs: 30_000 });
      await approving;
      assert.deepEqual(outcomes.map((o) => o.status), [Status.APPROVED, Status.DENIED, Status.SKIPPED]);
      assert.equal(outcomes[0]?.inputJson, '{"command":"ls -la","cwd":"/srv"}');
      const waited = await web.wait(session, ["toolu_03", "toolu_01"], { timeoutMs: 10_000 });
      assert.deepEqual(waited.map((o) => o.status), [Status.SKIPPED, Status.APPROVED]);
    } finally {
      await web.close();
    }
  });
});

describe("when the broker breaks", () => {
  test("a broker restarted mid-review: the client reconnects, resumes, and gets the outcomes", async () => {
    const process_ = await BrokerProcess.started();
    const broker = connectBroker(process_.target);
    try {
      const session = newSession();
      const review = broker.review(session, [SHELL, READ], { onDeny: OnDeny.INDEPENDENT, timeoutMs: 60_000 });
      await waitUntilPending(process_.target, session, ["toolu_01", "toolu_02"]);
      await process_.restart("SIGKILL");
      await decide(process_.target, session, [
        { callId: "toolu_01", approve: true },
        { callId: "toolu_02", approve: false },
      ]);
      const outcomes = await review;
      assert.deepEqual(outcomes.map((o) => o.status), [Status.APPROVED, Status.DENIED]);
      assert.ok(broker.connects >= 2, `connects: ${broker.connects}`);
    } finally {
      await broker.close();
      await process_.dispose();
    }
  });

  test("gRPC-Web: a broker restarted mid-review is watched again; one out of reach fails closed", async () => {
    const process_ = await BrokerProcess.started();
    const web = connectBrokerWeb(process_.url, { logger: { debug() {}, info() {}, warn() {} } });
    try {
      const session = newSession();
      const review = web.review(session, [SHELL, READ], { onDeny: OnDeny.INDEPENDENT, timeoutMs: 60_000 });
      await waitUntilPending(process_.target, session, ["toolu_01", "toolu_02"]);
      await process_.restart("SIGKILL");
      await decide(process_.target, session, [
        { callId: "toolu_01", approve: true },
        { callId: "toolu_02", approve: false },
      ]);
      assert.deepEqual((await review).map((o) => o.status), [Status.APPROVED, Status.DENIED]);
    } finally {
      await web.close();
      await process_.dispose();
    }
    const gone = connectBrokerWeb(`http://127.0.0.1:${await freePort()}`, { unavailableTimeoutMs: 1_000 });
    const started = Date.now();
    await assert.rejects(gone.review("s1", [SHELL]), BrokerUnavailable);
    assert.ok(Date.now() - started >= 900, "the submit was not tried again");
    await gone.close();
  });

  test("a broker out of reach fails closed: BrokerUnavailable, and a not-run result per call", async () => {
    const port = await freePort();
    const broker = connectBroker(`127.0.0.1:${port}`, { unavailableTimeoutMs: 1_000 });
    const started = Date.now();
    try {
      const error = await broker.review("s1", [SHELL, READ]).then(
        () => assert.fail("an unreachable broker approved something"),
        (e: unknown) => e,
      );
      assert.ok(error instanceof BrokerUnavailable, String(error));
      assert.match(error.message, /unreachable for 1s .*run nothing/);
      assert.ok(Date.now() - started < 10_000);
      const results = notAskedOutcomes("s1", ["toolu_01", "toolu_02"], error);
      assert.deepEqual(results.map((o) => [o.callId, o.status, o.approved]), [
        ["toolu_01", Status.NOT_ASKED, false],
        ["toolu_02", Status.NOT_ASKED, false],
      ]);
      assert.match(results[0]?.toolResult ?? "", /^The approval broker could not be asked, so this tool call was not run\. \(the approval broker at/);
    } finally {
      await broker.close();
    }
  });
});
