/**
 * The client in browsers: gRPC-Web (`@connectrpc/connect-web`), the transport the inbox uses.
 * Browsers cannot stream requests, so each review is a `Submit` and a `WatchOutcomes` stream
 * (re-watched after a break) instead of the one `Connect` stream; outcomes, receipts and
 * failures are the same, the receipt check included (WebCrypto's Ed25519, in current browsers).
 *
 *     import { connectBrokerWeb } from "approval-broker/web";
 *     const broker = connectBrokerWeb("https://broker.example.com", { token });
 * @module
 */
import type { Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { Broker, type BrokerOptions } from "./client.js";
import { Bearer, type TokenOption } from "./tokens.js";

export * from "./index.js";

export interface WebBrokerOptions extends Omit<BrokerOptions, "transport" | "streaming" | "target"> {
  /** Sent as `authorization: Bearer <token>` (a token of role `agent`): a fixed token, or a
   * provider asked before each request (`ClientCredentials`, or any function returning the
   * token); see `./tokens.js`. */
  token?: TokenOption;
  /** The `fetch` to use (the global one by default). */
  fetch?: typeof globalThis.fetch;
}

/** A `Broker` speaking gRPC-Web to `baseUrl` (the broker's own origin, e.g. `http://127.0.0.1:50051`). */
export function connectBrokerWeb(baseUrl: string, options: WebBrokerOptions = {}): Broker {
  const { token, fetch, ...rest } = options;
  const bearer = token ? new Bearer(token) : undefined;
  const interceptors: Interceptor[] = bearer ? [bearer.interceptor()] : [];
  const tokenRefused = bearer?.renews ? () => bearer.refused() : undefined;
  const transport = createGrpcWebTransport({ baseUrl, interceptors, ...(fetch ? { fetch } : {}) });
  return new Broker({ ...rest, transport, streaming: "server", target: baseUrl, ...(tokenRefused ? { tokenRefused } : {}) });
}
