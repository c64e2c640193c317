/** The error classes of PROTOCOL.md §7: code, HTTP status, message, optional data. */

export class A2AError extends Error {
  static code = -32603;
  static http = 500;
  static defaultMessage = "internal error";
  code: number;
  http: number;
  data: Record<string, unknown> | undefined;
  /** True when the error came from the peer with a verified `response_jws` (§6.2). */
  signed = false;
  /** §6.1 step 8 / coordination item 2: which bound was full ("own" or "shared"). */
  pool: string | undefined;
  retryAfter: number | undefined;

  constructor(message?: string, data?: Record<string, unknown>) {
    const cls = new.target as unknown as typeof A2AError;
    super(message ?? cls.defaultMessage);
    this.code = cls.code;
    this.http = cls.http;
    this.data = data;
    this.name = cls.name;
  }
}

export type A2AErrorClass = new (message?: string, data?: Record<string, unknown>) => A2AError;

function make(name: string, code: number, http: number, msg: string): typeof A2AError {
  const C = class extends A2AError {
    static override code = code;
    static override http = http;
    static override defaultMessage = msg;
  };
  Object.defineProperty(C, "name", { value: name });
  return C;
}

export const ParseError = make("ParseError", -32700, 400, "parse error");
export const InvalidRequest = make("InvalidRequest", -32600, 400, "invalid request");
export const PayloadTooLarge = make("PayloadTooLarge", -32600, 413, "request body too large");
export const UnsupportedMediaType = make("UnsupportedMediaType", -32600, 415, "Content-Type must be application/json");
export const HTTPMethodNotAllowed = make("HTTPMethodNotAllowed", -32600, 405, "HTTP method not allowed");
export const MethodNotFound = make("MethodNotFound", -32601, 404, "method not found");
export const InvalidParams = make("InvalidParams", -32602, 400, "invalid params");
export const InternalError = make("InternalError", -32603, 500, "internal error");
export const AuthenticationFailed = make("AuthenticationFailed", -32040, 401, "authentication failed");
export const HandshakeUnknown = make("HandshakeUnknown", -32041, 401, "unknown, expired or used handshake");
export const PolicyViolation = make("PolicyViolation", -32042, 403, "policy violation");
export const SessionUnknown = make("SessionUnknown", -32043, 401, "unknown, expired or closed session");
export const SequenceError = make("SequenceError", -32044, 409, "sequence error");
export const StaleTimestamp = make("StaleTimestamp", -32045, 401, "stale timestamp");
export const UnsupportedVersion = make("UnsupportedVersion", -32046, 400, "unsupported protocol version");
export const DIDResolutionError = make("DIDResolutionError", -32047, 401, "DID resolution failed");
export const Unavailable = make("Unavailable", -32048, 503, "unavailable");
export const IntentTimeout = make("IntentTimeout", -32049, 504, "intent timed out");

const BY_CODE: Record<number, typeof A2AError> = {};
for (const C of [
  ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError, AuthenticationFailed,
  HandshakeUnknown, PolicyViolation, SessionUnknown, SequenceError, StaleTimestamp,
  UnsupportedVersion, DIDResolutionError, Unavailable, IntentTimeout,
]) BY_CODE[C.code] = C;

/** HTTP status of a code (§7; A2A codes of §10 included). */
export function httpStatusOf(code: number): number {
  const a2a: Record<number, number> = { [-32001]: 404, [-32006]: 500 };
  if (code in a2a) return a2a[code]!;
  if (code <= -32002 && code >= -32009) return 400;
  if (code === -32050) return 409;
  return BY_CODE[code]?.http ?? 500;
}

/** An error received from a peer: its code kept (even one this side does not know),
 * its message cut to 512 characters (§7). */
export function errorFromWire(code: number, message: string, data?: Record<string, unknown>): A2AError {
  const C = BY_CODE[code] ?? A2AError;
  const e = new C(message.slice(0, 512), data);
  e.code = code;
  e.http = httpStatusOf(code);
  return e;
}
