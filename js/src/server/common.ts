/** What the server's core and its handshake share: types, limits, checks (no I/O). */
import type { Chain } from "../delegation.js";
import type { ResolvedDID } from "../did.js";
import { b64uDecodeOrNull, depthOf, dumps, exactMembers, isInt, isObject, isStr, jsonEqual, loads, type Json, type JsonObject } from "../encoding.js";
import { A2AError, AuthenticationFailed, InternalError, IntentTimeout, InvalidParams, Unavailable } from "../errors.js";
import { checkDelegationMember } from "../delegation.js";
import type { AuditLog } from "../audit.js";
import type { Identity } from "../identity.js";
import type { Policy, PriorityRights } from "../policy.js";
import type { Resolver } from "../resolver.js";
import { sealedDigest, type Sealer } from "../sealing.js";
import type { DelegationRules } from "../delegation.js";
import type { StreamItem, StreamRecord, WireEvent } from "./stream.js";

export const PROTOCOL = "a2a-secure/1.0";
export const ENDPOINTS = { handshake: "/a2a/handshake", intent: "/a2a/intent" } as const;
export const HANDSHAKE_TTL = 60;
export const MAX_HANDLER_MS = 30_000;
export const RETRY_WAIT_MS = 5_000;
export const INTENT_ID_RE = /^[A-Za-z0-9_-]{22,64}$/;

export interface IntentContext {
  clientDid: string;
  sessionId: string;
  sequence: number;
  priority: number;
  sealed: boolean;
  principal: string | null;
  delegation: Chain | null;
  intentId: string | null;
}
export type UnaryHandler = (inputs: JsonObject, ctx: IntentContext) => Promise<Json> | Json;
export type StreamHandler = (inputs: JsonObject, ctx: IntentContext) => AsyncIterable<Json>;

/** A reply: a JSON body with its status, or a stream of SSE text. */
export type Reply =
  | { status: number; headers: Record<string, string>; body: string }
  | { status: 200; headers: Record<string, string>; stream: AsyncIterable<string> };

export interface ServerOptions {
  identity: Identity;
  name?: string;
  description?: string;
  version?: string;
  url?: string;
  policy?: Policy;
  /** §12.6, declared by default (coordination item 3); `false` turns it off. */
  sealed?: boolean;
  requireSealed?: boolean;
  intentId?: boolean;
  priorityRights?: PriorityRights;
  delegation?: DelegationRules | null;
  resolver?: Resolver;
  audit?: AuditLog;
  /** Seconds, wall clock. */
  clock?: () => number;
  revoked?: Set<string>;
  /** Monotonic seconds (the failed-step budget refills on it); never compared with `clock`. */
  monotonic?: () => number;
  /** A CSPRNG (default node:crypto randomBytes); nonces and session ids are drawn from it. */
  random?: (n: number) => Buffer;
}

export interface Pending {
  nonceB: string;
  nonceA: string;
  clientDid: string;
  resolved: ResolvedDID;
  helloHash: string;
  challengeHash: string;
  clientManifest: string;
  policy: Policy;
  policyHash: string;
  policySignature: string;
  expires: number;
  proven: boolean;
  kid?: string;
}

export interface Stored {
  sequence: number;
  requestJws: string;
  answer: Promise<StoredAnswer>;
  settled: StoredAnswer | null;
}
export type StoredAnswer = { kind: "json"; status: number; headers: Record<string, string>; payload: JsonObject } | { kind: "stream"; record: StreamRecord<WireEvent>; source: StreamRecord<StreamItem>; sign: Signing };

export interface Session {
  id: string;
  commitment: string;
  clientDid: string;
  clientKid: string;
  clientKey: Buffer;
  policy: Policy;
  expiresAt: number;
  sealer: Sealer | null;
  nonceA: string;
  nonceB: string;
  lastSequence: number;
  stored: Stored | null;
  chains: Map<string, Chain>;
  closed: boolean;
}

export type ClaimAnswer =
  | { kind: "json"; ok: true; result: Json }
  | { kind: "json"; ok: false; code: number; message: string; data?: JsonObject; status: number }
  | { kind: "stream"; record: StreamRecord<StreamItem> };
export interface Claim {
  hash: string;
  answer: ClaimAnswer | null;
  done: Promise<void>;
  resolve: () => void;
  expires: number;
}

/** A signed-error builder bound to one request (§6.2). */
export interface Signing {
  session: Session;
  sequence: number;
  requestHash: string;
}

export function unavailable(message: string, retryAfter: number, pool?: "own" | "shared"): A2AError {
  const data: Record<string, unknown> = { retry_after: retryAfter };
  if (pool) data.pool = pool;
  return new Unavailable(message, data);
}

export async function* oneShot(h: UnaryHandler, inputs: JsonObject, ctx: IntentContext): AsyncIterable<Json> {
  yield await h(inputs, ctx);
}

/** The signed form of an intent: sealed values by their digest (§12.6). */
export function digestForm(intent: JsonObject): JsonObject {
  const out: JsonObject = { ...intent };
  for (const k of ["sealed", "sealed_delegation"]) if (typeof out[k] === "string") out[k] = sealedDigest(out[k] as string);
  return out;
}

/** The intent as an intent_id claim hashes it: a chain by its name, sealed or not. */
export function claimFormOf(intent: JsonObject, chain: Chain | null): JsonObject {
  const out: JsonObject = { ...intent };
  delete out.sealed_delegation;
  if (chain) out.delegation = chain.name;
  return out;
}

/** Exact members and equal values; `free` members must be present, compared by the caller. */
export function checkPayload(payload: JsonObject, expect: JsonObject, free: string[], optional: string[] = []): void {
  const required = [...Object.keys(expect), ...free];
  if (!exactMembers(payload, required, optional)) throw new AuthenticationFailed("signed payload has other members than expected");
  for (const [k, v] of Object.entries(expect)) if (!jsonEqual(payload[k], v)) throw new AuthenticationFailed(`signed ${k} does not match`);
}

export function checkResult(v: unknown): void {
  try {
    loads(dumps(v));
  } catch {
    throw new InternalError("handler result is not I-JSON");
  }
  if (depthOf(v) > 30) throw new InternalError("handler result nests too deep");
}

export function handlerError(e: unknown): A2AError {
  if (e instanceof A2AError && [-32602, -32049, -32603, -32042, -32048].includes(e.code)) return e;
  if (e instanceof A2AError && e.code <= -32001 && e.code >= -32009) return e;
  if (e instanceof A2AError && e.code === -32601) return e;
  return new InternalError("internal error");
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms).unref?.());
}

export function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let t: NodeJS.Timeout;
  return Promise.race([
    p.finally(() => clearTimeout(t)),
    new Promise<T>((_, rej) => {
      t = setTimeout(() => rej(new IntentTimeout("the handler did not finish in time")), ms);
    }),
  ]);
}

/** §6.1 step 1 for `intent`, with the members of the extensions the server declares (§12). */
export function checkIntentShape(intent: Json, ext: string[]): JsonObject {
  if (!isObject(intent)) throw new InvalidParams("intent must be an object");
  const optional = ["domain", "constraints"];
  if (ext.includes("priority")) optional.push("priority");
  if (ext.includes("intent_id")) optional.push("intent_id");
  if (ext.includes("sealed")) optional.push("sealed", "sealed_key");
  if (ext.includes("delegation")) optional.push("delegation");
  if (ext.includes("sealed") && ext.includes("delegation")) optional.push("sealed_delegation");
  if (!exactMembers(intent, ["goal", "inputs"], optional)) {
    const extra = Object.keys(intent).filter((k) => k !== "goal" && k !== "inputs" && !optional.includes(k));
    throw new InvalidParams(extra.length ? `unknown intent member '${extra[0]!.slice(0, 64)}'` : "intent needs goal and inputs");
  }
  if (!isStr(intent.goal, 1, 128)) throw new InvalidParams("goal must be 1 to 128 characters");
  if (!isObject(intent.inputs)) throw new InvalidParams("inputs must be an object");
  if ("domain" in intent && !isStr(intent.domain, 0, 128)) throw new InvalidParams("domain must be a string of at most 128 characters");
  if ("constraints" in intent) {
    const c = intent.constraints;
    if (!isObject(c) || !exactMembers(c, [], ["timeout_ms", "max_tokens", "stream"])) throw new InvalidParams("constraints may hold timeout_ms, max_tokens and stream");
    for (const k of ["timeout_ms", "max_tokens"]) if (k in c && !isInt(c[k], 1)) throw new InvalidParams(`constraints.${k} must be a positive integer`);
    if ("stream" in c && typeof c.stream !== "boolean") throw new InvalidParams("constraints.stream must be a boolean");
  }
  if ("priority" in intent && !isInt(intent.priority, 1, 5)) throw new InvalidParams("priority must be an integer from 1 to 5");
  if ("intent_id" in intent && !(typeof intent.intent_id === "string" && INTENT_ID_RE.test(intent.intent_id)))
    throw new InvalidParams("intent_id must be 22 to 64 base64url characters");
  if ("sealed" in intent) {
    if ((b64uDecodeOrNull(intent.sealed)?.length ?? 0) < 18) throw new InvalidParams("sealed must be canonical base64url of at least 18 bytes");
    if (Object.keys(intent.inputs).length) throw new InvalidParams("inputs must be {} next to sealed");
  }
  if ("sealed_key" in intent && (b64uDecodeOrNull(intent.sealed_key)?.length !== 48 || !("sealed" in intent)))
    throw new InvalidParams("sealed_key must be canonical base64url of 48 bytes, next to sealed");
  if ("delegation" in intent) checkDelegationMember(intent.delegation);
  if ("sealed_delegation" in intent && ((b64uDecodeOrNull(intent.sealed_delegation)?.length ?? 0) < 18 || !("sealed" in intent)))
    throw new InvalidParams("sealed_delegation must be canonical base64url of at least 18 bytes, next to sealed");
  if ("sealed_delegation" in intent && "delegation" in intent) throw new InvalidParams("an intent has delegation or sealed_delegation, not both");
  return intent;
}
