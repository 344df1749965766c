// The page's one way to the broker: gRPC-Web on the page's own origin, with the approver's
// bearer token on every call (the same token and services as any gRPC client). Never sends the
// token anywhere else; never keeps it beyond this tab (sessionStorage).
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { AdminService } from "./gen/approvals/v1/admin_pb";
import { ApproverService } from "./gen/approvals/v1/approver_pb";

const TOKEN_KEY = "approvals.token";
const NAME_KEY = "approvals.approver";

export interface Session {
  token: string;
  approverName: string;
}

export function savedSession(): Session | undefined {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token === null) return undefined;
  return { token, approverName: sessionStorage.getItem(NAME_KEY) ?? "" };
}

export function saveSession(session: Session): void {
  sessionStorage.setItem(TOKEN_KEY, session.token);
  sessionStorage.setItem(NAME_KEY, session.approverName);
}

export function forgetSession(): void {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(NAME_KEY);
}

export interface Api {
  approver: Client<typeof ApproverService>;
  admin: Client<typeof AdminService>;
  /** Who decides when the broker runs without tokens (with tokens, the token's identity). */
  approverName: string;
}

export function connect(session: Session): Api {
  const bearer: Interceptor = (next) => (request) => {
    if (session.token !== "") request.header.set("authorization", `Bearer ${session.token}`);
    return next(request);
  };
  const transport = createGrpcWebTransport({
    baseUrl: location.origin,
    interceptors: [bearer],
  });
  return {
    approver: createClient(ApproverService, transport),
    admin: createClient(AdminService, transport),
    approverName: session.approverName || "inbox",
  };
}

/** Whether the broker wants a token: it refuses a call made without one. When it cannot be
 * asked (it is down), the page asks for one, which works either way. */
export async function tokensRequired(): Promise<boolean> {
  try {
    await connect({ token: "", approverName: "" }).approver.listPending({ pageSize: 1 });
    return false;
  } catch {
    return true;
  }
}

/** The broker refused the token itself (not a call made with it). */
export function isAuthFailure(error: unknown): boolean {
  return error instanceof ConnectError && error.code === Code.Unauthenticated;
}

export function isPermissionDenied(error: unknown): boolean {
  return error instanceof ConnectError && error.code === Code.PermissionDenied;
}

/** The status a call ended with, for people: `FAILED_PRECONDITION: ...`. */
export function describeError(error: unknown): string {
  if (error instanceof ConnectError) {
    const name = Code[error.code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
    return `${name}: ${error.rawMessage}`;
  }
  return String(error);
}

export { Code, ConnectError };
