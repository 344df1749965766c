/**
 * The gRPC-Web client in a real browser: `approval-broker/web` bundled by esbuild as a web app's
 * bundler would (through the package's `exports`, for the browser platform: nothing Node-only may
 * be needed), loaded in Debian's headless Chromium (playwright-core), against a real broker.
 *
 * The broker answers no CORS requests (docs/inbox.md): a page may call it only from the broker's
 * own origin, as the inbox does. A web app gets that by serving its pages and the broker under
 * one origin (a reverse proxy sending `/approvals.v1.*` to the broker). Here Playwright plays
 * that proxy: it answers the page's own two files (`/app/`, the bundle) at the broker's origin,
 * and every other request of the page (the gRPC-Web calls) goes to the broker itself. A page of
 * another origin is shown refused, and failing closed.
 *
 * `CHROMIUM` names the browser (default `/usr/bin/chromium`, Debian's `chromium`).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { build } from "esbuild";
import { type Browser, type Page, chromium } from "playwright-core";
import { approveWhenPending, BrokerProcess, newSession, pendingCalls, REPO, waitUntilPending } from "./broker.js";

const PACKAGE = join(REPO, "clients", "typescript");

/** What the bundle puts on `window` (its IIFE's global name): the module `approval-broker/web`. */
type Web = typeof import("../src/web.js");
declare global {
  interface Window {
    approvalBroker: Web;
    /** WebCrypto Ed25519 verifications the page made (counted by an init script). */
    ed25519Verifications: number;
  }
}

/** What a review in the page returns to the test: plain values. */
interface PageOutcome {
  callId: string;
  status: string;
  approved: boolean;
  inputJson: string;
  inputEdited: boolean;
  toolResult: string;
  decidedBy: string;
  receiptSequence: number | undefined;
  /** `verifyApproval` of the outcome's receipt, in the page, with the broker's keys. */
  verifiedInput: string | undefined;
  /** The same receipt checked with a key the broker does not hold: why it was rejected. */
  rejectedWithOtherKey: string | undefined;
  /** The same receipt checked as in a page that is not a secure context (no `crypto.subtle`). */
  rejectedWithoutWebCrypto: string | undefined;
}

interface PageFailure {
  name: string;
  message: string;
  isBrokerError: boolean;
  notAsked: { status: string; approved: boolean; toolResult: string }[];
}

const LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"];

/** `approval-broker/web` for the browser: resolved through package.json's `exports` (the
 * package refers to itself by name), one IIFE setting `window.approvalBroker`. */
async function bundle(): Promise<string> {
  const result = await build({
    stdin: { contents: 'export * from "approval-broker/web";', resolveDir: PACKAGE, loader: "js" },
    bundle: true,
    platform: "browser",
    format: "iife",
    globalName: "approvalBroker",
    target: "es2022",
    write: false,
    logLevel: "silent",
  });
  const file = result.outputFiles[0];
  assert.ok(file, "esbuild wrote no bundle");
  return file.text;
}

describe("the gRPC-Web client in Chromium", () => {
  let broker: BrokerProcess;
  let browser: Browser;
  let script: string;

  before(async () => {
    [broker, browser, script] = await Promise.all([
      BrokerProcess.started(),
      chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", headless: true, args: LAUNCH_ARGS }),
      bundle(),
    ]);
  });

  after(async () => {
    await browser?.close();
    await broker?.dispose();
  });

  /** A page at `origin`/app/: its HTML and the bundle answered by Playwright, everything else
   * (the gRPC-Web calls) from the network. Counts the page's WebCrypto Ed25519 verifications. */
  async function openApp(origin: string): Promise<Page> {
    const context = await browser.newContext();
    await context.route(`${origin}/app/**`, (route) => {
      const path = new URL(route.request().url()).pathname;
      if (path === "/app/approval-broker.js") return route.fulfill({ contentType: "text/javascript", body: script });
      return route.fulfill({ contentType: "text/html", body: '<!doctype html><title>agent</title><script src="/app/approval-broker.js"></script>' });
    });
    await context.addInitScript(() => {
      window.ed25519Verifications = 0;
      const verify = crypto.subtle.verify.bind(crypto.subtle);
      crypto.subtle.verify = (algorithm, key, signature, data) => {
        if ((typeof algorithm === "string" ? algorithm : algorithm.name) === "Ed25519") window.ed25519Verifications += 1;
        return verify(algorithm, key, signature, data);
      };
    });
    const page = await context.newPage();
    await page.goto(`${origin}/app/`);
    assert.equal(await page.evaluate(() => typeof window.approvalBroker.connectBrokerWeb), "function");
    return page;
  }

  /** `review` in the page, with the client the package gives browsers: its outcomes (each
   * APPROVED one's receipt checked once more in the page, with a key the broker does not hold,
   * and without WebCrypto) and how many Ed25519 signatures the client itself verified. */
  function reviewInPage(page: Page, baseUrl: string, session: string, calls: { callId: string; tool: string; input: Record<string, unknown> }[]) {
    return page.evaluate(
      async ({ baseUrl, session, calls }) => {
        const { connectBrokerWeb, trustedKeys, verifyApproval } = window.approvalBroker;
        const broker = connectBrokerWeb(baseUrl, { logger: { debug() {}, info() {}, warn() {} } });
        try {
          const outcomes = await broker.review(session, calls, { timeoutMs: 30_000 });
          const clientVerifications = window.ed25519Verifications;
          const keys = await broker.receiptKeys();
          const otherKey = trustedKeys([new Uint8Array(32).fill(7)]);
          const rejected = (check: Promise<string>) => check.then(() => "accepted", (e: Error) => `${e.name}: ${e.message}`);
          /** `verifyApproval` as a page that is not a secure context runs it: no `crypto.subtle`. */
          const withoutWebCrypto = async (check: () => Promise<string>) => {
            Object.defineProperty(crypto, "subtle", { value: undefined, configurable: true });
            try {
              return await rejected(check());
            } finally {
              Reflect.deleteProperty(crypto, "subtle");
            }
          };
          const results: PageOutcome[] = [];
          for (const o of outcomes) {
            const claim = { sessionId: session, callId: o.callId, inputJson: o.inputJson, batchId: o.batchId };
            results.push({
              callId: o.callId,
              status: o.status,
              approved: o.approved,
              inputJson: o.inputJson,
              inputEdited: o.inputEdited,
              toolResult: o.toolResult,
              decidedBy: o.decidedBy,
              receiptSequence: o.receiptSequence,
              verifiedInput: o.approved ? await verifyApproval(o.receipt, keys, claim) : undefined,
              rejectedWithOtherKey: o.approved ? await rejected(verifyApproval(o.receipt, otherKey, claim)) : undefined,
              rejectedWithoutWebCrypto: o.approved ? await withoutWebCrypto(() => verifyApproval(o.receipt, keys, claim)) : undefined,
            });
          }
          return { outcomes: results, clientVerifications };
        } finally {
          await broker.close();
        }
      },
      { baseUrl, session, calls },
    );
  }

  /** A review in the page that must fail: its error, and the not-run outcomes made from it. */
  function failingReviewInPage(page: Page, baseUrl: string, session: string, unavailableTimeoutMs: number): Promise<PageFailure> {
    return page.evaluate(
      async ({ baseUrl, session, unavailableTimeoutMs }) => {
        const { connectBrokerWeb, notAskedOutcomes, BrokerError } = window.approvalBroker;
        const broker = connectBrokerWeb(baseUrl, { unavailableTimeoutMs, logger: { debug() {}, info() {}, warn() {} } });
        try {
          await broker.review(session, [{ callId: "call_1", tool: "run_shell", input: { command: "make deploy" } }], { timeoutMs: 60_000 });
          throw new Error("the review returned outcomes");
        } catch (e) {
          const error = e as Error;
          return {
            name: error.name,
            message: error.message,
            isBrokerError: error instanceof BrokerError,
            notAsked: notAskedOutcomes(session, ["call_1"], error).map((o) => ({ status: o.status, approved: o.approved, toolResult: o.toolResult })),
          };
        } finally {
          await broker.close();
        }
      },
      { baseUrl, session, unavailableTimeoutMs },
    );
  }

  test("a page at the broker's origin: one call approved (edited), one denied, the receipt verified in the page", async () => {
    const page = await openApp(broker.url);
    const session = newSession("browser");
    const approving = approveWhenPending(broker, session, [
      { callId: "call_2", approve: true, editedInputJson: '{"path":"README.md"}' },
      { callId: "call_1", approve: false, reason: "not from a browser tab" },
    ]);
    const { outcomes, clientVerifications } = await reviewInPage(page, broker.url, session, [
      { callId: "call_1", tool: "run_shell", input: { command: "rm -rf build" } },
      { callId: "call_2", tool: "read_file", input: { path: "notes.txt" } },
    ]);
    await approving;
    const [denied, approved] = outcomes;
    assert.deepEqual(
      outcomes.map((o) => [o.callId, o.status, o.approved]),
      [
        ["call_1", "DENIED", false],
        ["call_2", "APPROVED", true],
      ],
    );
    assert.equal(denied?.toolResult, "The user denied this tool call. Reason: not from a browser tab");
    assert.equal(denied?.verifiedInput, undefined);
    // The edit is what runs, and what the signed receipt approved, as checked in the page.
    assert.equal(approved?.inputJson, '{"path":"README.md"}');
    assert.equal(approved?.inputEdited, true);
    assert.equal(approved?.verifiedInput, '{"path":"README.md"}');
    assert.ok((approved?.receiptSequence ?? 0) > 0, "no receipt proved the approval");
    assert.match(approved?.rejectedWithOtherKey ?? "", /^ReceiptRejected: .*key/);
    assert.match(approved?.rejectedWithoutWebCrypto ?? "", /^ReceiptRejected: WebCrypto \(crypto\.subtle\) is not available here.*secure contexts/);
    // The client's own check of the approval ran in the page, with WebCrypto's Ed25519.
    assert.equal(clientVerifications, 1);
    assert.deepEqual(await pendingCalls(broker, session), []);
    await page.context().close();
  });

  test("a page of another origin is refused by the browser (the broker answers no CORS): it fails closed", async () => {
    // localhost and 127.0.0.1 are two origins; the page is at the first, the broker at the second.
    const page = await openApp(`http://localhost:${broker.port}`);
    const session = newSession("cross-origin");
    const failure = await failingReviewInPage(page, broker.url, session, 1_000);
    assert.equal(failure.name, "BrokerUnavailable", failure.message);
    assert.ok(failure.isBrokerError);
    assert.match(failure.message, /^the approval broker at http:\/\/127\.0\.0\.1:\d+ was unreachable for 1s \(.*\); no outcome was decided, run nothing$/);
    assert.deepEqual(failure.notAsked.map((o) => [o.status, o.approved]), [["NOT_ASKED", false]]);
    // Nothing reached the broker: the browser stopped the request at its preflight.
    assert.deepEqual(await pendingCalls(broker, session), []);
    await page.context().close();
  });

  // Last: it stops the broker.
  test("the broker gone mid-review: the page's review fails closed with a readable error", async () => {
    const page = await openApp(broker.url);
    const session = newSession("gone");
    const failing = failingReviewInPage(page, broker.url, session, 1_000);
    await waitUntilPending(broker, session, ["call_1"]);
    await broker.stop("SIGKILL");
    const failure = await failing;
    assert.equal(failure.name, "BrokerUnavailable", failure.message);
    assert.ok(failure.isBrokerError);
    assert.match(failure.message, /^the approval broker at http:\/\/127\.0\.0\.1:\d+ was unreachable for 1s \(.*\); no outcome was decided, run nothing$/);
    assert.deepEqual(failure.notAsked.map((o) => [o.status, o.approved]), [["NOT_ASKED", false]]);
    assert.match(failure.notAsked[0]?.toolResult ?? "", /^The approval broker could not be asked, so this tool call was not run\. \(the approval broker at /);
    await page.context().close();
  });
});
