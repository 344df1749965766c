// Regenerates the inbox screenshots in docs/ (desktop and phone) from a real broker with a few
// example calls: `npm run screenshots` in web/ (after `cargo build`). Not a test: it asserts
// nothing; the browser tests prove the behaviour.
import { resolve } from "node:path";
import { signIn, type Started, startBrokerAndChromium, stopBrokerAndChromium, TOKENS } from "./harness";

const DOCS = resolve(process.cwd(), "../docs");

async function main(): Promise<void> {
  const started = await startBrokerAndChromium();
  try {
    await screenshots(started);
  } finally {
    await stopBrokerAndChromium(started);
  }
}

async function screenshots({ broker, clients: { agent }, browser }: Started): Promise<void> {
  const submit = (sessionId: string, calls: { callId: string; tool: string; inputJson: string; title?: string; message?: string; workspace?: string }[]) =>
    agent.submit({ batch: { sessionId, calls: calls.map((c) => ({ title: "", message: "", workspace: "", ...c })) } });
  await submit("refactor-auth", [
    { callId: "toolu_01", tool: "read_file", inputJson: '{"path":"src/auth.rs"}', title: "Read a file", workspace: "approval-broker" },
  ]);
  await submit("refactor-auth", [
    { callId: "toolu_02", tool: "shell", inputJson: '{"command":"cargo test --lib auth::","timeout_s":600}', title: "Run the auth tests", message: "Checks the refactor before committing.", workspace: "approval-broker" },
    { callId: "toolu_03", tool: "write_file", inputJson: JSON.stringify({ path: "src/auth.rs", content: "//! Who may call what.\n".repeat(30) }), title: "Rewrite src/auth.rs", workspace: "approval-broker" },
  ]);
  await submit("triage", [
    { callId: "call_7", tool: "mcp__github__create_issue", inputJson: '{"repo":"acme/site","title":"Fix login\u202Egnp.exe"}', title: "Open an issue", message: "The title holds a right-to-left override: the inbox shows it." },
  ]);
  for (const [name, viewport] of [
    ["desktop", { width: 1100, height: 820 }],
    ["phone", { width: 360, height: 780 }],
  ] as const) {
    const context = await browser.newContext({ viewport, deviceScaleFactor: name === "phone" ? 2 : 1 });
    const page = await context.newPage();
    await signIn(page, `${broker.url}/`, TOKENS.alice);
    await page.locator('article[data-call="call_7"]').waitFor();
    await page.getByLabel("Remember the decision on shell call toolu_02").selectOption({ label: "This session" });
    const path = `${DOCS}/inbox-${name}.png`;
    await page.screenshot({ path, fullPage: name === "desktop" });
    console.log(`wrote ${path}`);
    await context.close();
  }
}

await main();
