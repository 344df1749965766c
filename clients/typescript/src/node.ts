/**
 * The client in Node: gRPC over HTTP/2 (`@connectrpc/connect-node`), one `Connect` stream.
 *
 *     import { connectBroker } from "approval-broker/node";
 *     const broker = connectBroker("127.0.0.1:50051", { token: process.env.APPROVALS_TOKEN });
 * @module
 */
import type { SecureClientSessionOptions } from "node:http2";
import type { Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Broker, type BrokerOptions } from "./client.js";
import { Bearer, type TokenOption } from "./tokens.js";

export * from "./index.js";
export { ClientCredentials, readSecretFile, type ClientCredentialsOptions } from "./client-credentials.js";

/** How `connectBroker` reaches the broker; the rest is as `BrokerOptions`. */
export interface NodeBrokerOptions extends Omit<BrokerOptions, "transport" | "streaming" | "target"> {
  /** Sent as `authorization: Bearer <token>` (a token of role `agent`): a fixed token, or a
   * provider asked before each request (`ClientCredentials`, or any function returning the
   * token); see `./tokens.js`. */
  token?: TokenOption;
  /** TLS on (also with an `https://` target or any certificate option). */
  tls?: boolean;
  /** PEM of the CA that signed the broker's certificate (the system roots when absent). */
  ca?: string | Buffer;
  /** PEM certificate chain and private key, for mutual TLS. */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** More options for Node's `http2.connect` (e.g. `servername`). */
  nodeOptions?: SecureClientSessionOptions;
}

/** The Node default: the broker on this machine. */
export const DEFAULT_TARGET = "127.0.0.1:50051";

/**
 * A `Broker` speaking gRPC over HTTP/2 to `target`: `host:port` (plaintext unless a TLS option
 * is given), `http://host:port`, or `https://host:port` (TLS).
 */
export function connectBroker(target: string = DEFAULT_TARGET, options: NodeBrokerOptions = {}): Broker {
  const { token, tls, ca, cert, key, nodeOptions, ...rest } = options;
  const scheme = /^(https?):\/\//.exec(target)?.[1];
  const address = target.replace(/^https?:\/\//, "").replace(/\/+$/, "");
  const useTls = tls ?? (scheme === "https" || ca !== undefined || cert !== undefined || key !== undefined);
  if (scheme === "http" && useTls) throw new Error(`target ${target} says plaintext (http://) but TLS options were given`);
  const bearer = token ? new Bearer(token) : undefined;
  const interceptors: Interceptor[] = bearer ? [bearer.interceptor()] : [];
  const tokenRefused = bearer?.renews ? () => bearer.refused() : undefined;
  const transport = createGrpcTransport({
    baseUrl: `${useTls ? "https" : "http"}://${address}`,
    interceptors,
    pingIntervalMs: 20_000,
    pingTimeoutMs: 10_000,
    nodeOptions: {
      ...(ca !== undefined ? { ca } : {}),
      ...(cert !== undefined ? { cert } : {}),
      ...(key !== undefined ? { key } : {}),
      ...nodeOptions,
    },
  });
  return new Broker({ ...rest, transport, streaming: "bidi", target: address, ...(tokenRefused ? { tokenRefused } : {}) });
}
