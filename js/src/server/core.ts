/**
 * The server's protocol core (PROTOCOL.md §4-§6, §12.3, §12.5-§12.7): a request body in,
 * a reply out. No sockets here; handlers are awaited, nothing else waits.
 */
import { randomBytes } from "node:crypto";
import type { AuditLog, AuditEvent } from "../audit.js";
import { Chain, CHAIN_UNKNOWN, chainUnknown, checkDelegationMember, DelegationRefused, type DelegationRules, parseChain, verifyChainSignatures } from "../delegation.js";
import {
  b64uDecodeOrNull, cpLen, dumps, exactMembers, hashOf, isFresh, isHashString, isInt, isObject, loads, nowSeconds, textHash,
  type Json, type JsonObject,
} from "../encoding.js";
import {
  A2AError, AuthenticationFailed, DIDResolutionError, InternalError, InvalidParams, InvalidRequest, MethodNotFound, PolicyViolation,
  SequenceError, SessionUnknown, StaleTimestamp,
} from "../errors.js";
import type { Identity } from "../identity.js";
import { parseJws, TYP, verifyParsed } from "../jws.js";
import { DEFAULT_POLICY, policyAllows, type Policy, type PriorityRights } from "../policy.js";
import { DIDResolver, type Resolver } from "../resolver.js";
import { claimIntent, sealedDigest } from "../sealing.js";
import {
  checkIntentShape, checkPayload, checkResult, claimFormOf, digestForm, ENDPOINTS, handlerError, MAX_HANDLER_MS, oneShot, PROTOCOL,
  RETRY_WAIT_MS, sleep, unavailable, withTimeout, type Claim, type ClaimAnswer, type IntentContext, type Reply, type ServerOptions,
  type Session, type Signing, type Stored, type StoredAnswer, type StreamHandler, type UnaryHandler,
} from "./common.js";
import { Handshakes } from "./handshake.js";
import { pump, resultBytes, StreamRecord, type StreamItem, type WireEvent } from "./stream.js";

export { ENDPOINTS, PROTOCOL, sleep, type IntentContext, type Reply, type ServerOptions, type StreamHandler, type UnaryHandler } from "./common.js";

export class ServerCore {
  readonly identity: Identity;
  readonly policy: Policy;
  readonly sealed: boolean;
  readonly requireSealed: boolean;
  readonly intentIdOn: boolean;
  readonly rights: PriorityRights;
  readonly delegation: DelegationRules | null;
  readonly resolver: Resolver;
  readonly audit: AuditLog | undefined;
  readonly clock: () => number;
  readonly revoked: Set<string>;
  readonly random: (n: number) => Buffer;
  readonly monotonic: () => number;
  private readonly meta: { name: string; description: string; version: string; url: string };
  private readonly unary = new Map<string, UnaryHandler>();
  private readonly streaming = new Map<string, StreamHandler>();
  private readonly handshakes = new Handshakes(this);
  /** Open sessions by id (the handshake adds them). */
  readonly sessions = new Map<string, Session>();
  private readonly windows = new Map<string, { start: number; count: number }>();
  private readonly claims = new Map<string, Claim>();
  private readonly claimsPerDid = new Map<string, number>();
  private cardCache: { card: JsonObject; hash: string } | null = null;
  limits = { pendingPerSource: 256, pendingTotal: 10_000, sessions: 100_000, idsPerDid: 10_000, idsTotal: 100_000, retention: 86_400, streamsPerDid: 32, streamsTotal: 1000 };
  private streamsOpen = new Map<string, number>();

  constructor(o: ServerOptions) {
    this.identity = o.identity;
    this.policy = o.policy ?? DEFAULT_POLICY;
    this.requireSealed = o.requireSealed ?? false;
    this.sealed = (o.sealed ?? true) || this.requireSealed;
    this.intentIdOn = o.intentId ?? true;
    this.rights = o.priorityRights ?? { default: 3, perDid: new Map() };
    this.delegation = o.delegation ?? null;
    this.resolver = o.resolver ?? new DIDResolver();
    this.audit = o.audit;
    this.clock = o.clock ?? nowSeconds;
    this.revoked = o.revoked ?? new Set();
    this.random = o.random ?? randomBytes;
    this.monotonic = o.monotonic ?? (() => performance.now() / 1000);
    const url = (o.url ?? "").replace(/\/$/, "");
    if (url !== "" && !/^https:\/\/[^/?#]+(\/[^?#]*)?$/.test(url) && !/^http:\/\/(127\.[0-9.]+|localhost|\[::1\])(:[0-9]+)?(\/[^?#]*)?$/.test(url))
      throw new InvalidParams("the card's url must be an absolute https URL (http only on loopback)");
    this.meta = { name: o.name ?? o.identity.agentId, description: o.description ?? "", version: o.version ?? "1.0.0", url };
  }

  add(goal: string, h: UnaryHandler): this {
    this.unary.set(goal, h);
    this.cardCache = null;
    return this;
  }
  addStream(goal: string, h: StreamHandler): this {
    this.streaming.set(goal, h);
    this.cardCache = null;
    return this;
  }

  get extensions(): string[] {
    const out = ["priority"];
    if (this.intentIdOn) out.push("intent_id");
    if (this.sealed) out.push("sealed");
    if (this.delegation) out.push("delegation");
    return out.sort();
  }

  /** The agent card (§4) and its hash, the server's manifest_hash. */
  card(): { card: JsonObject; hash: string } {
    if (this.cardCache) return this.cardCache;
    const intents = [...new Set([...this.unary.keys(), ...this.streaming.keys()])].sort();
    const card: JsonObject = {
      name: this.meta.name, description: this.meta.description, version: this.meta.version, url: this.meta.url,
      did: this.identity.did, protocol: PROTOCOL, endpoints: { ...ENDPOINTS }, intents,
      public_keys: [this.identity.publicKeyEntry as unknown as JsonObject],
    };
    if (this.streaming.size) card.streaming_intents = [...this.streaming.keys()].sort();
    const ext = this.extensions;
    if (ext.length) card.a2a_secure_extensions = ext;
    this.cardCache = { card, hash: hashOf(card) };
    return this.cardCache;
  }

  // -- JSON-RPC envelope (§4) -------------------------------------------------------------

  /** Answer one POST body on `endpoint` (a path of ENDPOINTS). */
  async handle(endpoint: string, body: Uint8Array, source = "unknown"): Promise<Reply> {
    let id: Json = null;
    let method: string | null = null;
    const started = performance.now();
    try {
      let msg: Json;
      msg = loads(body);
      if (!isObject(msg)) throw new InvalidRequest("a request is one JSON object (batches are not served)");
      if (!("id" in msg)) throw new InvalidRequest("a request needs an id (notifications are not served)");
      const rid = msg.id;
      if (!(typeof rid === "string" && cpLen(rid) <= 128) && !(typeof rid === "number" && Number.isSafeInteger(rid)))
        throw new InvalidRequest("id must be a string of at most 128 characters or an integer");
      id = rid;
      if (msg.jsonrpc !== "2.0") throw new InvalidRequest("jsonrpc must be \"2.0\"");
      if (typeof msg.method !== "string") throw new InvalidRequest("method must be a string");
      if (!exactMembers(msg, ["jsonrpc", "method", "id"], ["params"])) throw new InvalidRequest("unexpected member in the request");
      const served = endpoint === ENDPOINTS.handshake ? ["hello", "proof", "accept_policy"] : ["intent", "close"];
      if (!served.includes(msg.method)) throw new MethodNotFound(`method '${msg.method.slice(0, 64)}' not found on ${endpoint}`);
      method = msg.method;
      if (!isObject(msg.params)) throw new InvalidParams("params must be an object");
      const params = msg.params;
      switch (method) {
        case "hello": return this.json(id, 200, await this.handshakes.hello(params, source));
        case "proof": return this.json(id, 200, this.handshakes.proof(params, source));
        case "accept_policy": return this.json(id, 200, this.handshakes.acceptPolicy(params, source));
        case "intent": return await this.intent(id, params, false);
        default: return await this.intent(id, params, true);
      }
    } catch (e) {
      const err = e instanceof A2AError ? e : new InternalError();
      if (!(e instanceof A2AError)) console.error("a2a-secure: internal error:", (e as Error)?.message);
      this.record({
        event: (method as AuditEvent["event"] | null) ?? "reject", status: "error", error_code: err.code, verified: false,
        duration_ms: performance.now() - started,
      });
      return this.errorReply(id, err);
    }
  }

  private json(id: Json, status: number, result: JsonObject, headers: Record<string, string> = {}): Reply {
    return { status, headers: { "content-type": "application/json", ...headers }, body: dumps({ jsonrpc: "2.0", id, result }) };
  }

  /** An error answer; `data` as the error carries it (signed errors put response_jws there). */
  errorReply(id: Json, e: A2AError): Reply {
    const error: JsonObject = { code: e.code, message: e.message };
    if (e.data && Object.keys(e.data).length) error.data = e.data as JsonObject;
    const headers: Record<string, string> = { "content-type": "application/json" };
    const ra = e.data?.retry_after;
    if (typeof ra === "number") headers["retry-after"] = String(ra);
    return { status: e.http, headers, body: dumps({ jsonrpc: "2.0", id, error }) };
  }

  record(e: AuditEvent): void {
    try {
      this.audit?.record({ server_did: this.identity.did, ...e });
    } catch (err) {
      console.error("a2a-secure: audit sink failed:", (err as Error).message);
    }
  }

  // -- handshake (§5) ---------------------------------------------------------------------

  private async intent(id: Json, params: JsonObject, isClose: boolean): Promise<Reply> {
    const started = performance.now();
    const method = isClose ? "close" : "intent";
    // Step 1: the shape of params, the token's form.
    const members = isClose ? ["session_id", "session_commitment", "sequence", "request_jws"] : ["session_id", "session_commitment", "sequence", "intent", "request_jws"];
    if (!exactMembers(params, members)) throw new InvalidParams(`${method} params must have exactly ${members.join(", ")}`);
    if (b64uDecodeOrNull(params.session_id)?.length !== 32) throw new InvalidParams("session_id must be 32 bytes in canonical base64url");
    if (!isHashString(params.session_commitment)) throw new InvalidParams("session_commitment must be a hash string");
    if (!isInt(params.sequence, 1)) throw new InvalidParams("sequence must be an integer from 1 to 2^53-1");
    const intent = isClose ? null : checkIntentShape(params.intent ?? null, this.extensions);
    const jws = parseJws(params.request_jws);
    const requestJws = params.request_jws as string;
    // Step 2: the session.
    const now = this.clock();
    const session = this.sessions.get(params.session_id as string);
    if (!session || session.closed || now >= session.expiresAt) {
      if (session) this.sessions.delete(session.id);
      throw new SessionUnknown();
    }
    if (this.revoked.has(session.clientDid) || this.revoked.has(session.clientKid)) {
      this.sessions.delete(session.id);
      throw new SessionUnknown("session ended: the client's DID or key was revoked");
    }
    // Step 3, 4.
    if (params.session_commitment !== session.commitment) throw new AuthenticationFailed("session_commitment does not match the session");
    const payload = verifyParsed(jws, session.clientKey, isClose ? TYP.close : TYP.request, session.clientKid);
    const sign: Signing = { session, sequence: params.sequence as number, requestHash: textHash(requestJws) };
    const audit = (status: "success" | "error", code: number | null, extra: Partial<AuditEvent> = {}): void =>
      this.record({
        event: method, status, error_code: code, verified: true, session_id: session.id, client_did: session.clientDid,
        intent_goal: intent ? (intent.goal as string) : null, sequence: sign.sequence, duration_ms: performance.now() - started, ...extra,
      });
    const fail = (e: A2AError): Reply => {
      audit("error", e.code);
      return this.signedError(id, e, sign);
    };
    // Step 5: the payload, exactly, equal to params (sealed values by digest).
    const signedIntent = intent ? digestForm(intent) : null;
    const expect: JsonObject = { session_id: session.id, session_commitment: session.commitment, sequence: sign.sequence };
    if (isClose) expect.close = true;
    else expect.intent = signedIntent!;
    try {
      checkPayload(payload, expect, ["timestamp"]);
      if (!isInt(payload.timestamp)) throw new AuthenticationFailed("timestamp must be an integer");
    } catch (e) {
      return fail(e as A2AError);
    }
    // Sealed members (§12.6, and the sealed chain of the sealed-session agreement): signed, not consuming.
    let inputs: JsonObject = intent ? (intent.inputs as JsonObject) : {};
    let answerKey: Buffer | null = null;
    let delegationValue: Json | undefined = intent?.delegation;
    if (intent) {
      try {
        const s = session.sealer;
        if (s && !("sealed" in intent)) throw new InvalidParams("this session is sealed: the inputs must be sealed");
        if (!s && ("sealed" in intent || "sealed_key" in intent || "sealed_delegation" in intent)) throw new InvalidParams("this session agreed no sealing keys");
        if (s && "delegation" in intent) throw new InvalidParams("on a sealed session the chain travels sealed (sealed_delegation)");
        if (s && ("sealed_key" in intent) !== ("intent_id" in intent)) throw new InvalidParams("on a sealed session sealed_key and intent_id go together");
        if (s) {
          const opened = s.openJson("inputs", sign.sequence, 0, intent.goal as string, intent.sealed);
          if (!isObject(opened)) throw new AuthenticationFailed("sealed inputs do not open to an object");
          inputs = opened;
          if ("sealed_key" in intent) {
            const k = s.openRaw("answer_key", sign.sequence, 0, `${intent.goal}|${intent.intent_id}`, intent.sealed_key);
            if (!k || k.length !== 32) throw new AuthenticationFailed("sealed_key does not open to 32 bytes");
            answerKey = k;
          }
          if ("sealed_delegation" in intent) {
            const d = s.openJson("delegation", sign.sequence, 0, intent.goal as string, intent.sealed_delegation);
            try {
              checkDelegationMember(d);
            } catch {
              throw new AuthenticationFailed("sealed_delegation does not open to a delegation value");
            }
            delegationValue = d;
          }
        }
      } catch (e) {
        return fail(e as A2AError);
      }
    }
    // Step 6.
    if (!isFresh(payload.timestamp as number, Math.floor(now))) return fail(new StaleTimestamp("request timestamp is not fresh"));
    // Steps 9 and 10 are decided now (an intent_id is claimed only when they pass) and given after step 8.
    let verdict: A2AError | null = null;
    let chain: Chain | null = null;
    let priority = 3;
    const goal = intent ? (intent.goal as string) : "";
    const stream = intent ? (intent.constraints as JsonObject | undefined)?.stream === true : false;
    if (intent) {
      const highest = this.rights.perDid.get(session.clientDid) ?? this.rights.default;
      priority = "priority" in intent ? (intent.priority as number) : Math.min(3, highest);
      // Step 9's refusals in their order: the session's policy, the chain (checks 1 to 9, a
      // name not held, a goal reserved to principals), the priority rights; then step 10.
      if (!policyAllows(session.policy, goal)) verdict = new PolicyViolation(`intent '${goal.slice(0, 64)}' is not allowed by the session policy`);
      if (!verdict && delegationValue !== undefined) {
        try {
          chain = await this.chainOf(session, delegationValue);
        } catch (e) {
          if (!(e instanceof A2AError)) throw e;
          verdict = e;
        }
      }
      if (!verdict && chain) verdict = chain.refusal({ clientDid: session.clientDid, serverDid: this.identity.did, goal, priority, now });
      if (!verdict && chain && chain.links.some((l) => this.revoked.has(`delegation:${l.jti}`) || this.revoked.has(l.iss) || this.revoked.has(l.kid)))
        verdict = new DelegationRefused("delegation refused: a link is revoked");
      if (!verdict && this.delegation) verdict = this.delegation.refusal(goal, chain);
      if (!verdict && priority > highest) verdict = new PolicyViolation(`priority ${priority} is above this caller's highest (${highest})`);
      if (!verdict && !this.unary.has(goal) && !this.streaming.has(goal)) verdict = new MethodNotFound(`no handler for intent '${goal.slice(0, 64)}'`);
      // On a sealed session a refusal of the chain names nothing of it in the clear (§12.7).
      if (verdict instanceof DelegationRefused && session.sealer) verdict = sealedRefusal(verdict);
      if (stream && !verdict) {
        const open = this.streamsOpen.get(session.clientDid) ?? 0;
        let total = 0;
        for (const v of this.streamsOpen.values()) total += v;
        if (open >= this.limits.streamsPerDid) return fail(unavailable("too many concurrent streams for this DID", 1));
        if (total >= this.limits.streamsTotal) return fail(unavailable("too many concurrent streams", 1));
      }
    }
    // Step 7: the sequence.
    const seq = sign.sequence;
    if (seq === session.lastSequence && session.stored && session.stored.requestJws === requestJws) {
      const stored = session.stored;
      const answer = stored.settled ?? (await Promise.race([stored.answer, sleep(RETRY_WAIT_MS).then(() => null)]));
      if (!answer) return fail(unavailable("the first request with this sequence is still running", 1));
      audit("success", null);
      return this.replay(id, answer.kind === "stream" ? { ...answer, record: this.boundedReplay(answer.record, answer.source, answer.sign) } : answer);
    }
    if (seq <= session.lastSequence) return fail(new SequenceError(`sequence ${seq} is not greater than ${session.lastSequence}`));
    // intent_id claim look-up (atomic with steps 7 and 8: nothing awaits from here to the claim).
    const intentId = intent && typeof intent.intent_id === "string" ? intent.intent_id : null;
    let claimKey: string | null = null;
    let claimHash = "";
    if (intentId && !verdict) {
      let form: JsonObject = claimFormOf(intent!, chain);
      if (answerKey) form = claimIntent(form, inputs, answerKey);
      claimHash = hashOf(form);
      claimKey = `${session.clientDid}|${intentId}`;
      this.expireClaims(now);
      if (!this.claims.has(claimKey)) {
        if ((this.claimsPerDid.get(session.clientDid) ?? 0) >= this.limits.idsPerDid)
          return fail(unavailable(`this DID already has ${this.limits.idsPerDid} intent_ids remembered`, 60, "own"));
        if (this.claims.size >= this.limits.idsTotal)
          return fail(unavailable(`this server already has ${this.limits.idsTotal} intent_ids remembered`, 60, "shared"));
      }
    }
    // Step 8: the rate limit (close is not limited).
    if (!isClose) {
      const w = this.windows.get(session.clientDid);
      const period = session.policy.rate_period;
      if (!w || now >= w.start + period) this.windows.set(session.clientDid, { start: now, count: 0 });
      const win = this.windows.get(session.clientDid)!;
      if (win.count >= session.policy.rate_limit) {
        const ra = Math.max(1, Math.ceil(win.start + period - now));
        return fail(unavailable("rate limit reached", ra));
      }
      win.count++;
    }
    session.lastSequence = seq;
    let settle!: (a: StoredAnswer) => void;
    const stored: Stored = { sequence: seq, requestJws, answer: new Promise((r) => (settle = r)), settled: null };
    session.stored = stored;
    const finish = (a: StoredAnswer): Reply => {
      stored.settled = a;
      settle(a);
      return this.replay(id, a);
    };
    const jsonAnswer = (e: A2AError): StoredAnswer => {
      const r = this.signedError(null, e, sign);
      return { kind: "json", status: r.status, headers: r.headers, payload: loads((r as { body: string }).body) as JsonObject };
    };
    if (isClose) {
      session.closed = true;
      this.sessions.delete(session.id);
      const result = { type: "closed", session_id: session.id };
      const jwsText = this.signResponse(sign, { status: "success", result });
      audit("success", null);
      return finish({ kind: "json", status: 200, headers: {}, payload: { jsonrpc: "2.0", id: null, result: { ...result, response_jws: jwsText } } });
    }
    const auditExtra: Partial<AuditEvent> = chain ? { principal: chain.principal, delegation: chain.name } : {};
    // Step 9, 10.
    if (verdict) {
      audit("error", verdict.code, auditExtra);
      return finish(jsonAnswer(verdict));
    }
    // The intent_id claim.
    let claim: Claim | null = null;
    if (claimKey) {
      const held = this.claims.get(claimKey);
      if (held) {
        if (held.hash !== claimHash) {
          const e = new SequenceError("intent_id already used for a different intent");
          audit("error", e.code, auditExtra);
          return finish(jsonAnswer(e));
        }
        let answer = held.answer;
        if (!answer) {
          await Promise.race([held.done, sleep(RETRY_WAIT_MS)]);
          answer = held.answer;
        }
        if (!answer) {
          const e = unavailable("an earlier request with this intent_id is still running", 1);
          audit("error", e.code, auditExtra);
          return finish(jsonAnswer(e));
        }
        audit("success", null, auditExtra);
        return finish(this.resend(answer, sign, stream));
      }
      let resolve!: () => void;
      claim = { hash: claimHash, answer: null, done: new Promise((r) => (resolve = r)), resolve, expires: now + this.limits.retention };
      this.claims.set(claimKey, claim);
      this.claimsPerDid.set(session.clientDid, (this.claimsPerDid.get(session.clientDid) ?? 0) + 1);
    }
    // Step 11.
    const ctx: IntentContext = {
      clientDid: session.clientDid, sessionId: session.id, sequence: seq, priority, sealed: session.sealer !== null,
      principal: chain?.principal ?? null, delegation: chain, intentId,
    };
    const c = intent!.constraints as JsonObject | undefined;
    const timeoutMs = Math.min(isInt(c?.timeout_ms) ? (c!.timeout_ms as number) : MAX_HANDLER_MS, MAX_HANDLER_MS);
    const done = (a: ClaimAnswer): void => {
      if (claim) {
        claim.answer = a;
        claim.resolve();
      }
    };
    // The one answer of a run (kept with its intent_id claim, audited, stored for retries).
    const succeed = (result: Json): Reply => {
      done({ kind: "json", ok: true, result });
      audit("success", null, auditExtra);
      return finish(this.successAnswer(sign, result));
    };
    const failed = (err: A2AError): Reply => {
      done({ kind: "json", ok: false, code: err.code, message: err.message, status: err.http });
      audit("error", err.code, auditExtra);
      return finish(jsonAnswer(err));
    };
    if (stream || this.streaming.has(goal)) {
      const source = this.streaming.has(goal) ? this.streaming.get(goal)!(inputs, ctx) : oneShot(this.unary.get(goal)!, inputs, ctx);
      if (!stream) {
        // A streaming goal asked without stream: true: one result, the array of its partial results.
        try {
          const all: Json[] = [];
          const it = source[Symbol.asyncIterator]();
          for (;;) {
            const n = await withTimeout(it.next(), timeoutMs);
            if (n.done) break;
            all.push(n.value);
          }
          checkResult(all);
          return succeed(all);
        } catch (e) {
          return failed(handlerError(e));
        }
      }
      const record = new StreamRecord<StreamItem>(resultBytes);
      const first = await pump(source, record, timeoutMs, !this.streaming.has(goal), () => this.sessions.has(session.id) && this.clock() < session.expiresAt);
      if (first) return failed(first);
      this.streamsOpen.set(session.clientDid, (this.streamsOpen.get(session.clientDid) ?? 0) + 1);
      void record.finished.then(() => {
        this.streamsOpen.set(session.clientDid, (this.streamsOpen.get(session.clientDid) ?? 1) - 1);
        const last = record.items[record.items.length - 1];
        audit(last?.status === "error" ? "error" : "success", last?.status === "error" ? (last.code ?? null) : null, auditExtra);
      });
      if (claim) done({ kind: "stream", record });
      return finish({ kind: "stream", record: this.signedStream(record, sign), source: record, sign });
    }
    try {
      const result = await withTimeout(Promise.resolve(this.unary.get(goal)!(inputs, ctx)), timeoutMs);
      checkResult(result);
      return succeed(result);
    } catch (e) {
      return failed(handlerError(e));
    }
  }

  private expireClaims(now: number): void {
    if (this.claims.size < 1024) return;
    for (const [k, c] of this.claims) {
      if (c.expires <= now && c.answer) {
        this.claims.delete(k);
        const did = k.slice(0, k.lastIndexOf("|"));
        this.claimsPerDid.set(did, (this.claimsPerDid.get(did) ?? 1) - 1);
      }
    }
  }

  /** The chain an intent acts under: verified now, or found by name on this session. */
  private async chainOf(session: Session, value: Json): Promise<Chain> {
    const form = checkDelegationMember(value);
    if (typeof form === "string") {
      const hit = session.chains.get(form);
      if (!hit) throw chainUnknown(form);
      return hit;
    }
    const chain = parseChain(form);
    const hit = session.chains.get(chain.name);
    if (hit) return hit;
    await verifyChainSignatures(chain, async (did, kid) => {
      let r;
      try {
        r = await this.resolver.resolve(did);
      } catch (e) {
        throw e instanceof DIDResolutionError ? e : new DIDResolutionError("issuer cannot be resolved");
      }
      return r.keys.get(kid);
    });
    if (session.chains.size >= 8) session.chains.delete(session.chains.keys().next().value!);
    session.chains.set(chain.name, chain);
    return chain;
  }

  private signResponse(sign: Signing, body: JsonObject, typ: string = TYP.response, extra: JsonObject = {}): string {
    return this.identity.sign(typ, {
      session_id: sign.session.id, sequence: sign.sequence, request_hash: sign.requestHash, ...extra, ...body, timestamp: Math.floor(this.clock()),
    });
  }

  private successAnswer(sign: Signing, result: Json): StoredAnswer {
    const s = sign.session.sealer;
    const outer = s ? s.sealJson("result", sign.sequence, 0, sign.requestHash, result) : result;
    const jwsText = this.signResponse(sign, { status: "success", result: s ? sealedDigest(outer as string) : result });
    return { kind: "json", status: 200, headers: {}, payload: { jsonrpc: "2.0", id: null, result: { status: "success", sequence: sign.sequence, result: outer, response_jws: jwsText } } };
  }

  /** A signed error (§6.2): data other than response_jws and retry_after sealed on a sealed session. */
  private signedError(id: Json, e: A2AError, sign: Signing): Reply {
    const jwsText = this.signResponse(sign, { status: "error", error: { code: e.code, message: e.message } });
    const data: Record<string, unknown> = { response_jws: jwsText };
    const rest: JsonObject = {};
    for (const [k, v] of Object.entries(e.data ?? {})) {
      if (k === "retry_after") data[k] = v;
      else rest[k] = v as Json;
    }
    if (Object.keys(rest).length) {
      const s = sign.session.sealer;
      if (s) data.sealed = s.sealJson("error_data", sign.sequence, 0, sign.requestHash, rest);
      else Object.assign(data, rest);
    }
    const err = new A2AError(e.message, data);
    err.code = e.code;
    err.http = e.http;
    return this.errorReply(id, err);
  }

  /** A claim's answer, signed (and sealed) again for this request (§12.5). */
  private resend(a: ClaimAnswer, sign: Signing, _stream: boolean): StoredAnswer {
    if (a.kind === "stream") {
      const signed = this.signedStream(a.record, sign);
      return { kind: "stream", record: this.boundedReplay(signed, a.record, sign), source: a.record, sign };
    }
    if (a.ok) return this.successAnswer(sign, a.result);
    const e = new A2AError(a.message, a.data);
    e.code = a.code;
    e.http = a.status;
    const r = this.signedError(null, e, sign);
    return { kind: "json", status: r.status, headers: r.headers, payload: loads((r as { body: string }).body) as JsonObject };
  }

  private replay(id: Json, a: StoredAnswer): Reply {
    if (a.kind === "json") {
      return { status: a.status, headers: { "content-type": "application/json", ...a.headers }, body: dumps({ ...a.payload, id }) };
    }
    return { status: 200, headers: { "content-type": "text/event-stream", "cache-control": "no-store" }, stream: a.record.sse(id) };
  }

  /** The record's items as this request's signed events (sealed on a sealed session). */
  private signedStream(src: StreamRecord<StreamItem>, sign: Signing): StreamRecord<WireEvent> {
    return src.map((item, index) => this.signedEvent(sign, index, item));
  }

  private signedEvent(sign: Signing, index: number, item: StreamItem): WireEvent {
    const s = sign.session.sealer;
    const body: JsonObject = { index, final: item.final, status: item.status };
    let outer: Json = null;
    if (item.status === "error") body.error = { code: item.code!, message: item.message! };
    else {
      outer = s && item.result !== null ? s.sealJson("event", sign.sequence, index, `${sign.requestHash}|${item.final ? "final" : "partial"}`, item.result!) : item.result!;
      body.result = s && item.result !== null ? sealedDigest(outer as string) : item.result!;
    }
    const jwsText = this.identity.sign(TYP.event, {
      session_id: sign.session.id, sequence: sign.sequence, request_hash: sign.requestHash, ...body, timestamp: Math.floor(this.clock()),
    });
    const result: JsonObject = { status: item.status, sequence: sign.sequence, index, final: item.final };
    if (item.status === "error") result.error = body.error!;
    else result.result = outer;
    result.response_jws = jwsText;
    return result as WireEvent;
  }

  /** A replay of a stream (§6.4): the kept events of `signed` (those of `source` within the
   * bound of 256 events and 1 MiB of results), then, when the stream went past the bound, one
   * newly signed final -32048 at the next index. */
  private boundedReplay(signed: StreamRecord<WireEvent>, source: StreamRecord<StreamItem>, sign: Signing): StreamRecord<WireEvent> {
    const out = new StreamRecord<WireEvent>();
    const take = (item: WireEvent, index: number): void => {
      if (out.done) return;
      if (index < source.kept) out.push(item);
      else out.push(this.signedEvent(sign, index, { final: true, status: "error", code: -32048, message: "this stream's later events are not kept for a replay" }));
    };
    signed.items.forEach(take);
    signed.listen(take);
    return out;
  }

}

/** A chain's refusal on a sealed session: a message that names nothing of the chain, the
 * full one as `data.reason` (sealed with the rest of the data, beside `chain_unknown`). */
function sealedRefusal(e: DelegationRefused): DelegationRefused {
  const unknown = typeof e.data?.chain_unknown === "string";
  const out = new DelegationRefused(unknown ? `delegation refused: chain ${CHAIN_UNKNOWN}` : "delegation refused", { ...(e.data ?? {}), reason: e.message });
  return out;
}
