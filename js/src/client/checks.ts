/**
 * The client's decisions (PROTOCOL.md §5, §6.2, §6.4, §12.6): each takes what was received
 * and what the client holds, and returns the verified value or throws. No I/O.
 */
import { checkPublicKeys, type ResolvedDID } from "../did.js";
import { b64uDecodeOrNull, exactMembers, hashOf, isFresh, isInt, isObject, jsonEqual, sha256Hex, textHash, type Json, type JsonObject } from "../encoding.js";
import { A2AError, AuthenticationFailed, errorFromWire, InvalidParams, StaleTimestamp, UnsupportedVersion } from "../errors.js";
import { parseJws, TYP, verifyParsed } from "../jws.js";
import { policyFromWire, type Policy } from "../policy.js";
import { sealedDigest, type Sealer } from "../sealing.js";

function fail(msg: string): never {
  throw new AuthenticationFailed(msg);
}

function verifyBy(token: Json | undefined, server: ResolvedDID, typ: string): [JsonObject, string] {
  let jws;
  try {
    jws = parseJws(token);
  } catch {
    fail(`malformed ${typ} token`);
  }
  const kid = jws.header.kid;
  const key = typeof kid === "string" ? server.keys.get(kid) : undefined;
  if (!key) fail("token kid is not a key of the server's DID");
  return [verifyParsed(jws, key, typ, kid as string), kid as string];
}

function exactPayload(payload: JsonObject, expect: JsonObject, free: string[], what: string): void {
  if (!exactMembers(payload, [...Object.keys(expect), ...free])) fail(`${what}: payload has other members than expected`);
  for (const [k, v] of Object.entries(expect)) if (!jsonEqual(payload[k], v)) fail(`${what}: signed ${k} does not match`);
}

export interface HelloState {
  hello: JsonObject;
  clientDid: string;
  serverDid: string;
  nonceA: string;
  manifest: string;
}

export interface ChallengeInfo {
  nonceB: string;
  serverManifest: string;
  policyHash: string;
  policySignature: string;
  challengeHash: string;
  serverKid: string;
}

export function checkChallenge(c: Json, h: HelloState, server: ResolvedDID, now: number): ChallengeInfo {
  if (!isObject(c) || c.type !== "challenge") fail("not a challenge");
  if (c.protocol_version !== "1.0") throw new UnsupportedVersion("the server answered another protocol version");
  if (!exactMembers(c, ["type", "protocol_version", "nonce_b", "server_did", "manifest_hash", "public_keys", "policy_hash", "policy_signature", "timestamp"]))
    fail("challenge has other members than expected");
  if (c.server_did !== h.serverDid) fail("challenge from another DID than the one asked");
  if (b64uDecodeOrNull(c.nonce_b)?.length !== 32) fail("challenge nonce_b is not 32 bytes");
  try {
    checkPublicKeys(c.public_keys ?? null, server);
  } catch (e) {
    fail(`challenge public_keys: ${(e as Error).message}`);
  }
  const [p, kid] = verifyBy(c.policy_signature, server, TYP.policy);
  if (!(c.public_keys as JsonObject[]).some((e) => e.kid === kid)) fail("challenge public_keys lack the signing key");
  exactPayload(p, {
    protocol_version: "1.0", hello_hash: hashOf(h.hello), client_did: h.clientDid, server_did: h.serverDid, nonce_a: h.nonceA,
    nonce_b: c.nonce_b as string, client_manifest_hash: h.manifest, server_manifest_hash: c.manifest_hash as string,
    policy_hash: c.policy_hash as string, timestamp: c.timestamp as number,
  }, [], "challenge");
  if (!isInt(c.timestamp)) fail("challenge timestamp must be an integer");
  if (!isFresh(c.timestamp, now)) throw new StaleTimestamp("challenge timestamp is not fresh");
  return {
    nonceB: c.nonce_b as string, serverManifest: c.manifest_hash as string, policyHash: c.policy_hash as string,
    policySignature: c.policy_signature as string, challengeHash: hashOf(c), serverKid: kid,
  };
}

export function checkPolicy(r: Json, ch: ChallengeInfo): Policy {
  if (!isObject(r) || r.type !== "policy" || !exactMembers(r, ["type", "policy", "policy_hash", "policy_signature"])) fail("not a policy message");
  const policy = policyFromWire(r.policy ?? null, AuthenticationFailed);
  if (r.policy_hash !== hashOf(policy) || r.policy_hash !== ch.policyHash) fail("policy_hash does not match the policy or the challenge");
  if (r.policy_signature !== ch.policySignature) fail("policy_signature is not the challenge's");
  return policy;
}

export interface SessionInfo {
  sessionId: string;
  commitment: string;
  createdAt: number;
  expiresAt: number;
  serverSealKey: string | null;
}

export function checkSession(
  r: Json, server: ResolvedDID, o: { clientDid: string; serverDid: string; commitment: string; policy: Policy; sentSealKey: boolean; now: number },
): SessionInfo {
  if (!isObject(r) || r.type !== "session") fail("not a session message");
  if (!exactMembers(r, ["type", "session_id", "server_did", "client_did", "session_commitment", "created_at", "expires_at", "public_keys", "session_jws"]))
    fail("session has other members than expected");
  if (b64uDecodeOrNull(r.session_id)?.length !== 32) fail("session_id is not 32 bytes");
  const [p] = verifyBy(r.session_jws, server, TYP.session);
  exactPayload(p, {
    session_id: r.session_id as string, session_commitment: o.commitment, client_did: o.clientDid, server_did: o.serverDid,
    created_at: r.created_at as number, expires_at: r.expires_at as number,
  }, o.sentSealKey ? ["seal_key"] : [], "session");
  if (r.server_did !== o.serverDid || r.client_did !== o.clientDid || r.session_commitment !== o.commitment) fail("session members do not match");
  if (!isInt(r.created_at) || !isInt(r.expires_at)) fail("session times must be integers");
  if (!isFresh(r.created_at, o.now)) throw new StaleTimestamp("session created_at is not fresh");
  if (r.expires_at !== r.created_at + o.policy.session_timeout) fail("expires_at is not created_at + session_timeout");
  let seal: string | null = null;
  if (o.sentSealKey) {
    if (b64uDecodeOrNull(p.seal_key)?.length !== 32) fail("server seal_key is not 32 bytes");
    seal = p.seal_key as string;
  }
  return { sessionId: r.session_id as string, commitment: o.commitment, createdAt: r.created_at, expiresAt: r.expires_at, serverSealKey: seal };
}

export const commitmentOf = (nonceA: string, nonceB: string, policyHash: string): string =>
  "sha256:" + sha256Hex(`${nonceA}|${nonceB}|${policyHash}`);

/** What a request's answers are checked against. */
export interface Sent {
  sessionId: string;
  sequence: number;
  requestHash: string;
  timestamp: number;
  server: ResolvedDID;
  sealer: Sealer | null;
}

function checkResponseJws(token: Json | undefined, sent: Sent, typ: string, body: JsonObject, now: number, freshFrom?: number): JsonObject {
  const [p] = verifyBy(token, sent.server, typ);
  exactPayload(p, { session_id: sent.sessionId, sequence: sent.sequence, request_hash: sent.requestHash, ...body }, ["timestamp"], "answer");
  if (!isInt(p.timestamp)) fail("answer timestamp must be an integer");
  const fresh = freshFrom === undefined ? isFresh(p.timestamp, now) : p.timestamp >= freshFrom - 300 && p.timestamp <= now + 300;
  if (!fresh) throw new StaleTimestamp("answer timestamp is not fresh");
  return p;
}

function signedValue(outer: Json | undefined, sent: Sent): Json {
  if (!sent.sealer || outer === null) return outer ?? null;
  if (typeof outer !== "string") fail("a sealed session's result must be sealed");
  return sealedDigest(outer);
}

/** A result (§6.2): the verified, opened result. */
export function checkResult(r: Json, sent: Sent, now: number): Json {
  if (!isObject(r) || !exactMembers(r, ["status", "sequence", "result", "response_jws"])) fail("result has other members than expected");
  if (r.status !== "success" || r.sequence !== sent.sequence) fail("result status or sequence does not match");
  checkResponseJws(r.response_jws, sent, TYP.response, { status: "success", result: signedValue(r.result, sent) }, now);
  if (!sent.sealer) return r.result ?? null;
  const v = sent.sealer.openJson("result", sent.sequence, 0, sent.requestHash, r.result);
  if (v === undefined) fail("sealed result does not open");
  return v;
}

/** A closed result (§6.3). */
export function checkClosed(r: Json, sent: Sent, now: number): void {
  if (!isObject(r) || !exactMembers(r, ["type", "session_id", "response_jws"]) || r.type !== "closed" || r.session_id !== sent.sessionId) fail("not a closed result");
  checkResponseJws(r.response_jws, sent, TYP.response, { status: "success", result: { type: "closed", session_id: sent.sessionId } }, now);
}

/** An error answer: signed (verified, its sealed data opened) or not; never throws. */
export function readError(err: Json, sent: Sent | null, now: number): A2AError {
  if (!isObject(err) || typeof err.code !== "number" || typeof err.message !== "string") return new InvalidParams("malformed error answer");
  const data = isObject(err.data) ? err.data : undefined;
  const out = errorFromWire(err.code, err.message, data ? { ...data } : undefined);
  if (data && typeof data.retry_after === "number") out.retryAfter = data.retry_after;
  const poolOf = (e: A2AError): A2AError => {
    if (e.code === -32048 && (e.data?.pool === "own" || e.data?.pool === "shared")) e.pool = e.data.pool;
    return e;
  };
  if (!sent || !data || typeof data.response_jws !== "string") {
    if (out.data) delete out.data.sealed;
    return poolOf(out);
  }
  try {
    checkResponseJws(data.response_jws, sent, TYP.response, { status: "error", error: { code: err.code, message: err.message } }, now);
  } catch {
    if (out.data) delete out.data.sealed;
    return poolOf(out);
  }
  out.signed = true;
  if (sent.sealer) {
    // On a sealed session the data's members come only from what data.sealed opens to (a
    // member beside it is unsigned); one that does not open leaves the signed error as it is.
    const opened = "sealed" in data ? sent.sealer.openJson("error_data", sent.sequence, 0, sent.requestHash, data.sealed) : undefined;
    const kept: Record<string, unknown> = {};
    if (typeof data.retry_after === "number") kept.retry_after = data.retry_after;
    out.data = isObject(opened) ? { ...opened, ...kept } : kept;
  }
  return poolOf(out);
}

export interface Event {
  index: number;
  final: boolean;
  status: "success" | "error";
  result: Json;
  error?: A2AError;
}

/** One event of a stream (§6.4), at the index expected. */
export function checkEvent(msg: Json, sent: Sent, index: number, now: number): Event {
  if (!isObject(msg) || msg.jsonrpc !== "2.0" || !isObject(msg.result)) fail("malformed stream event");
  const r = msg.result;
  const isError = r.status === "error";
  const keys = ["status", "sequence", "index", "final", isError ? "error" : "result", "response_jws"];
  if (!exactMembers(r, keys)) fail("event has other members than expected");
  if (r.sequence !== sent.sequence || r.index !== index || typeof r.final !== "boolean") fail("event sequence, index or final does not match");
  if (isError && !r.final) fail("a non-final error event");
  const body: JsonObject = { index, final: r.final, status: r.status as string };
  if (isError) {
    const e = r.error;
    if (!isObject(e) || !exactMembers(e, ["code", "message"])) fail("event error has other members");
    body.error = e;
  } else {
    if (r.status !== "success") fail("event status must be success or error");
    body.result = signedValue(r.result, sent);
  }
  checkResponseJws(r.response_jws, sent, TYP.event, body, now, sent.timestamp);
  if (isError) {
    const e = r.error as JsonObject;
    const err = errorFromWire(e.code as number, e.message as string);
    err.signed = true;
    return { index, final: true, status: "error", result: null, error: err };
  }
  let value: Json = r.result ?? null;
  if (sent.sealer && value !== null) {
    const opened = sent.sealer.openJson("event", sent.sequence, index, `${sent.requestHash}|${r.final ? "final" : "partial"}`, value);
    if (opened === undefined) fail("sealed event does not open");
    value = opened;
  }
  return { index, final: r.final, status: "success", result: value };
}

/** A refusal at ACCEPT_POLICY carrying `data.refusal_jws` (§12.6, "Sealing required"):
 * marked signed when it verifies, else left unsigned. */
export function checkRefusal(err: A2AError, acceptJws: string, server: ResolvedDID, h: { nonceA: string; nonceB: string; clientDid: string; serverDid: string }, now: number): A2AError {
  const tok = err.data?.refusal_jws;
  if (typeof tok !== "string") return err;
  try {
    const [p] = verifyBy(tok, server, TYP.refusal);
    exactPayload(p, {
      nonce_a: h.nonceA, nonce_b: h.nonceB, client_did: h.clientDid, server_did: h.serverDid, accept_hash: textHash(acceptJws),
      error: { code: err.code, message: err.message },
    }, ["timestamp"], "refusal");
    if (isInt(p.timestamp) && isFresh(p.timestamp, now)) err.signed = true;
  } catch {
    /* unsigned */
  }
  return err;
}
