/** The client over Node's fetch: handshake, intents, streams, close (PROTOCOL.md §5-§6, §12). */
import { randomBytes } from "node:crypto";
import type { AuditLog } from "../audit.js";
import { Chain } from "../delegation.js";
import { CHAIN_UNKNOWN } from "../delegation.js";
import { x25519Pair, x25519Shared } from "../ed25519.js";
import { b64uEncode, dumps, hashOf, isObject, loads, nowSeconds, textHash, type Json, type JsonObject } from "../encoding.js";
import { A2AError, AuthenticationFailed, InvalidParams, SessionUnknown, Unavailable } from "../errors.js";
import type { Identity } from "../identity.js";
import { TYP } from "../jws.js";
import { policyAllows, type Policy } from "../policy.js";
import { DIDResolver, type Resolver } from "../resolver.js";
import { deriveAnswerKey, deriveKeys, Sealer, sealedDigest } from "../sealing.js";
import { checkChallenge, checkClosed, checkRefusal, checkEvent, checkPolicy, checkResult, checkSession, commitmentOf, readError, type Sent } from "./checks.js";
import type { ResolvedDID } from "../did.js";

const MAX_REPLY = 4 << 20;
const INTENT_ID_RE = /^[A-Za-z0-9_-]{22,64}$/;

export interface ClientOptions {
  /** null (default): seal when the server declares it; true: refuse a server that does not. */
  sealed?: boolean | null;
  /** null (default): an intent_id with every intent to a server that declares it. */
  exactlyOnce?: boolean | null;
  resolver?: Resolver;
  timeoutMs?: number;
  resendOnUnknownSession?: boolean;
  audit?: AuditLog;
  /** Test hook: rewrite each reply body before it is checked (an attacker on the path). */
  tamper?: (body: string) => string;
}

export interface RequestOptions {
  domain?: string;
  constraints?: JsonObject;
  priority?: number;
  intentId?: string;
  onBehalfOf?: Chain;
}

export interface IntentResult {
  result: Json;
  intentId: string | null;
  sealed: boolean;
}

const cardCache = new Map<string, string[]>();

/** One open session with one server. */
export class ClientSession {
  sequence = 0;
  closed = false;
  readonly chainsSent = new Set<string>();
  constructor(
    readonly client: Client,
    readonly serverDid: string,
    readonly endpoint: string,
    readonly server: ResolvedDID,
    readonly id: string,
    readonly commitment: string,
    readonly policy: Policy,
    readonly expiresAt: number,
    readonly extensions: string[],
    readonly sealer: Sealer | null,
  ) {}
  get sealed(): boolean {
    return this.sealer !== null;
  }
}

export class Client {
  readonly resolver: Resolver;
  readonly timeoutMs: number;
  constructor(
    readonly identity: Identity,
    readonly opts: ClientOptions = {},
  ) {
    this.resolver = opts.resolver ?? new DIDResolver();
    this.timeoutMs = Math.min(opts.timeoutMs ?? 30_000, 30_000);
  }

  get manifestHash(): string {
    return hashOf({ agent_id: this.identity.agentId, did: this.identity.did });
  }

  private async post(url: string, body: JsonObject): Promise<Response> {
    try {
      return await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json", "accept-encoding": "identity" },
        body: dumps(body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e) {
      const err = new Unavailable(`the agent did not answer at ${url}: ${(e as Error).message}`);
      err.code = -32048;
      throw err;
    }
  }

  private async readJson(res: Response): Promise<JsonObject> {
    // Read whole up to 4 MiB, counted while read (§9), whatever Content-Length says.
    const chunks: Uint8Array[] = [];
    let size = 0;
    for await (const c of (res.body ?? []) as AsyncIterable<Uint8Array>) {
      size += c.length;
      if (size > MAX_REPLY) {
        await res.body?.cancel().catch(() => undefined);
        throw new Unavailable("the reply is larger than 4 MiB");
      }
      chunks.push(c);
    }
    const body = Buffer.concat(chunks);
    const v = loads(this.opts.tamper ? this.opts.tamper(body.toString("utf8")) : body, { error: AuthenticationFailed });
    if (!isObject(v) || v.jsonrpc !== "2.0") throw new AuthenticationFailed("not a JSON-RPC response");
    return v;
  }

  private async rpc(url: string, method: string, params: JsonObject, id: Json): Promise<JsonObject> {
    const res = await this.post(url, { jsonrpc: "2.0", method, params, id });
    const v = await this.readJson(res);
    if ("error" in v) throw readError(v.error ?? null, null, nowSeconds());
    if (!isObject(v.result)) throw new AuthenticationFailed("reply without a result");
    return v.result;
  }

  /** The extensions the server declares, read from a card whose hash_of is the CHALLENGE's
   * manifest_hash (§12.5 "Discovery"); none when it cannot be fetched or hashes otherwise. */
  async extensionsOf(endpoint: string, manifest: string): Promise<string[]> {
    const hit = cardCache.get(manifest);
    if (hit) return hit;
    try {
      const res = await fetch(new URL("/.well-known/agent-card.json", endpoint), { signal: AbortSignal.timeout(this.timeoutMs) });
      const card = loads(Buffer.from(await res.arrayBuffer()));
      if (hashOf(card) !== manifest || !isObject(card)) return [];
      const ext = Array.isArray(card.a2a_secure_extensions) ? card.a2a_secure_extensions.filter((x): x is string => typeof x === "string") : [];
      cardCache.set(manifest, ext);
      return ext;
    } catch {
      return [];
    }
  }

  /** Run the handshake (§5) with `serverDid` at base URL `endpoint`. */
  async connect(serverDid: string, endpoint: string): Promise<ClientSession> {
    if (serverDid === this.identity.did) throw new InvalidParams("refusing a handshake with this agent's own DID");
    const base = endpoint.replace(/\/$/, "");
    const server = await this.resolver.resolve(serverDid);
    const nonceA = b64uEncode(randomBytes(32));
    const hello: JsonObject = {
      type: "hello", protocol_version: "1.0", agent_did: this.identity.did, agent_id: this.identity.agentId, manifest_hash: this.manifestHash,
      nonce: nonceA, public_keys: [this.identity.publicKeyEntry as unknown as JsonObject], timestamp: nowSeconds(),
    };
    const hs = `${base}/a2a/handshake`;
    const challenge = await this.rpc(hs, "hello", hello, 1);
    const ch = checkChallenge(challenge, { hello, clientDid: this.identity.did, serverDid, nonceA, manifest: this.manifestHash }, server, nowSeconds());
    const extensions = await this.extensionsOf(base, ch.serverManifest);
    const seal = this.opts.sealed === false ? false : extensions.includes("sealed");
    if (this.opts.sealed === true && !seal) throw new InvalidParams(`${serverDid} does not declare sealed intents; refusing to send in the clear`);
    const proofPayload = {
      nonce_a: nonceA, nonce_b: ch.nonceB, client_did: this.identity.did, server_did: serverDid, client_manifest_hash: this.manifestHash,
      server_manifest_hash: ch.serverManifest, challenge_hash: ch.challengeHash, timestamp: nowSeconds(),
    };
    const policyMsg = await this.rpc(hs, "proof", { type: "proof", nonce_b: ch.nonceB, proof_jws: this.identity.sign(TYP.proof, proofPayload) }, 2);
    const policy = checkPolicy(policyMsg, ch);
    const commitment = commitmentOf(nonceA, ch.nonceB, ch.policyHash);
    const pair = seal ? x25519Pair() : null;
    const accept: JsonObject = {
      policy_hash: ch.policyHash, session_commitment: commitment, nonce_a: nonceA, nonce_b: ch.nonceB, client_did: this.identity.did,
      server_did: serverDid, timestamp: nowSeconds(),
    };
    if (pair) accept.seal_key = b64uEncode(pair.pub);
    const acceptJws = this.identity.sign(TYP.accept, accept);
    let sess: JsonObject;
    try {
      sess = await this.rpc(hs, "accept_policy", { type: "accept_policy", nonce_b: ch.nonceB, accept_jws: acceptJws }, 3);
    } catch (e) {
      if (!(e instanceof A2AError)) throw e;
      throw checkRefusal(e, acceptJws, server, { nonceA, nonceB: ch.nonceB, clientDid: this.identity.did, serverDid }, nowSeconds());
    }
    const info = checkSession(sess, server, { clientDid: this.identity.did, serverDid, commitment, policy, sentSealKey: pair !== null, now: nowSeconds() });
    let sealer: Sealer | null = null;
    if (pair) {
      const shared = x25519Shared(pair.priv, Buffer.from(info.serverSealKey!, "base64url"));
      if (!shared) throw new AuthenticationFailed("server seal_key gives an all-zero shared secret");
      sealer = new Sealer(deriveKeys(shared, {
        client_did: this.identity.did, server_did: serverDid, nonce_a: nonceA, nonce_b: ch.nonceB, session_id: info.sessionId,
        session_commitment: commitment, client_seal_key: accept.seal_key as string, server_seal_key: info.serverSealKey!,
      }), info.sessionId);
    }
    this.opts.audit?.record({ event: "accept_policy", status: "success", verified: true, session_id: info.sessionId, client_did: this.identity.did, server_did: serverDid });
    return new ClientSession(this, serverDid, base, server, info.sessionId, commitment, policy, info.expiresAt, extensions, sealer);
  }

  /** Build the intent a caller asked for, refusing (-32602, nothing sent) what the server does
   * not declare or the chain does not cover. */
  private buildIntent(s: ClientSession, goal: string, inputs: JsonObject, o: RequestOptions, stream: boolean): { intent: JsonObject; intentId: string | null; chain: Chain | null } {
    const ext = s.extensions;
    if (!policyAllows(s.policy, goal)) throw new InvalidParams(`the session policy does not allow '${goal.slice(0, 64)}'`);
    const intent: JsonObject = { goal };
    if (o.domain !== undefined) intent.domain = o.domain;
    intent.inputs = inputs;
    const constraints: JsonObject = { ...(o.constraints ?? {}) };
    if (stream) constraints.stream = true;
    if (Object.keys(constraints).length) intent.constraints = constraints;
    if (o.priority !== undefined) {
      if (!Number.isInteger(o.priority) || o.priority < 1 || o.priority > 5) throw new InvalidParams("priority must be an integer from 1 to 5");
      if (!ext.includes("priority")) throw new InvalidParams(`${s.serverDid} does not declare priority`);
      if (o.priority !== 3) intent.priority = o.priority;
    }
    let intentId: string | null = null;
    if (o.intentId !== undefined) {
      if (!INTENT_ID_RE.test(o.intentId)) throw new InvalidParams("intent_id must be 22 to 64 base64url characters");
      if (!ext.includes("intent_id")) throw new InvalidParams(`${s.serverDid} does not declare intent_id`);
      intentId = o.intentId;
    } else if (this.opts.exactlyOnce === true && !ext.includes("intent_id")) throw new InvalidParams(`${s.serverDid} does not declare intent_id`);
    else if (this.opts.exactlyOnce !== false && ext.includes("intent_id")) intentId = b64uEncode(randomBytes(16));
    if (intentId) intent.intent_id = intentId;
    const chain = o.onBehalfOf ?? null;
    if (chain) {
      if (!ext.includes("delegation")) throw new InvalidParams(`${s.serverDid} does not declare delegation`);
      const why = chain.refusal({ clientDid: this.identity.did, serverDid: s.serverDid, goal, priority: o.priority ?? 3, now: nowSeconds() });
      if (why) throw new InvalidParams(why.message);
    }
    return { intent, intentId, chain };
  }

  /** The params of one request on `s` (sealing what §12.6 seals), and what its answers are checked against. */
  private prepare(s: ClientSession, base: JsonObject, chain: Chain | null, fullChain: boolean): { params: JsonObject; sent: Sent } {
    const seq = ++s.sequence;
    const intent: JsonObject = { ...base };
    if (chain) {
      const value: Json = fullChain || !s.chainsSent.has(chain.name) ? chain.tokens : chain.name;
      if (s.sealer) intent.sealed_delegation = s.sealer.sealJson("delegation", seq, 0, intent.goal as string, value);
      else intent.delegation = value;
    }
    const signed: JsonObject = { ...intent };
    if (s.sealer) {
      const sealedInputs = s.sealer.sealJson("inputs", seq, 0, intent.goal as string, intent.inputs ?? {});
      intent.inputs = {};
      intent.sealed = sealedInputs;
      signed.inputs = {};
      signed.sealed = sealedDigest(sealedInputs);
      if (typeof intent.intent_id === "string") {
        const key = deriveAnswerKey(this.identity.seedForDerivation(), s.serverDid, intent.intent_id);
        intent.sealed_key = s.sealer.sealRaw("answer_key", seq, 0, `${intent.goal}|${intent.intent_id}`, key);
        signed.sealed_key = intent.sealed_key;
      }
      if (typeof intent.sealed_delegation === "string") signed.sealed_delegation = sealedDigest(intent.sealed_delegation);
    }
    const ts = nowSeconds();
    const requestJws = this.identity.sign(TYP.request, { session_id: s.id, session_commitment: s.commitment, sequence: seq, timestamp: ts, intent: signed });
    const params: JsonObject = { session_id: s.id, session_commitment: s.commitment, sequence: seq, intent, request_jws: requestJws };
    if (chain) s.chainsSent.add(chain.name);
    return { params, sent: { sessionId: s.id, sequence: seq, requestHash: textHash(requestJws), timestamp: ts, server: s.server, sealer: s.sealer } };
  }

  /** Send one intent and return its verified result. */
  async request(s: ClientSession, goal: string, inputs: JsonObject = {}, o: RequestOptions = {}): Promise<IntentResult> {
    const { intent, intentId, chain } = this.buildIntent(s, goal, inputs, o, false);
    let full = false;
    for (let attempt = 0; ; attempt++) {
      const { params, sent } = this.prepare(s, intent, chain, full);
      const res = await this.post(`${s.endpoint}/a2a/intent`, { jsonrpc: "2.0", method: "intent", params, id: `req-${sent.sequence}` });
      const v = await this.readJson(res);
      if ("error" in v) {
        const e = readError(v.error ?? null, sent, nowSeconds());
        this.opts.audit?.record({ event: "intent", status: "error", verified: e.signed, error_code: e.code, session_id: s.id, client_did: this.identity.did, server_did: s.serverDid, intent_goal: goal, sequence: sent.sequence });
        if (chain && attempt === 0 && isChainUnknown(e)) {
          s.chainsSent.delete(chain.name);
          full = true;
          continue;
        }
        throw e;
      }
      const result = checkResult(v.result ?? null, sent, nowSeconds());
      this.opts.audit?.record({ event: "intent", status: "success", verified: true, session_id: s.id, client_did: this.identity.did, server_did: s.serverDid, intent_goal: goal, sequence: sent.sequence });
      return { result, intentId, sealed: s.sealed };
    }
  }

  /** Send one intent as a stream (§6.4) and yield its verified partial results. */
  async *stream(s: ClientSession, goal: string, inputs: JsonObject = {}, o: RequestOptions = {}): AsyncGenerator<Json> {
    const { intent, chain } = this.buildIntent(s, goal, inputs, o, true);
    let full = false;
    for (let attempt = 0; ; attempt++) {
      const { params, sent } = this.prepare(s, intent, chain, full);
      const res = await this.post(`${s.endpoint}/a2a/intent`, { jsonrpc: "2.0", method: "intent", params, id: `req-${sent.sequence}` });
      const ct = res.headers.get("content-type") ?? "";
      if (!/^text\/event-stream\s*(;\s*charset=utf-8\s*)?$/i.test(ct)) {
        const v = await this.readJson(res);
        if ("error" in v) {
          const e = readError(v.error ?? null, sent, nowSeconds());
          if (chain && attempt === 0 && isChainUnknown(e)) {
            s.chainsSent.delete(chain.name);
            full = true;
            continue;
          }
          throw e;
        }
        throw new AuthenticationFailed("a stream was asked and a single result came");
      }
      let index = 0;
      let ended = false;
      for await (const data of sseEvents(res, this.opts.tamper)) {
        if (ended) throw new AuthenticationFailed("an event after the final one");
        const ev = checkEvent(loads(data, { error: AuthenticationFailed }), sent, index++, nowSeconds());
        if (ev.error) throw ev.error;
        if (ev.final) {
          ended = true;
          if (ev.result !== null) yield ev.result;
          continue;
        }
        yield ev.result;
      }
      if (!ended) throw new AuthenticationFailed("the stream was cut before its final event");
      return;
    }
  }

  async close(s: ClientSession): Promise<void> {
    if (s.closed) return;
    const seq = ++s.sequence;
    const ts = nowSeconds();
    const requestJws = this.identity.sign(TYP.close, { session_id: s.id, session_commitment: s.commitment, sequence: seq, timestamp: ts, close: true });
    const sent: Sent = { sessionId: s.id, sequence: seq, requestHash: textHash(requestJws), timestamp: ts, server: s.server, sealer: s.sealer };
    s.closed = true;
    const res = await this.post(`${s.endpoint}/a2a/intent`, {
      jsonrpc: "2.0", method: "close", params: { session_id: s.id, session_commitment: s.commitment, sequence: seq, request_jws: requestJws }, id: `req-${seq}`,
    });
    const v = await this.readJson(res);
    if ("error" in v) throw readError(v.error ?? null, sent, nowSeconds());
    checkClosed(v.result ?? null, sent, nowSeconds());
  }
}

function isChainUnknown(e: A2AError): boolean {
  return e.signed && e.code === -32042 && (typeof e.data?.chain_unknown === "string" || e.message.endsWith(CHAIN_UNKNOWN));
}

/** The `data` of each SSE event of a response (comments and stray empty lines ignored). */
async function* sseEvents(res: Response, tamper?: (s: string) => string): AsyncGenerator<string> {
  if (!res.body) return;
  const decoder = new TextDecoder("utf-8", { fatal: true });
  let buf = "";
  let id: string | null = null;
  let data: string | null = null;
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.startsWith(":")) continue;
      if (line === "") {
        if (data !== null) {
          if (id === null) throw new AuthenticationFailed("stream event without id");
          yield tamper ? tamper(data) : data;
        }
        id = data = null;
        continue;
      }
      if (line.length > 1 << 20) throw new AuthenticationFailed("stream event too large");
      if (line.startsWith("id: ") && id === null && data === null) id = line.slice(4);
      else if (line.startsWith("data: ") && id !== null && data === null) data = line.slice(6);
      else throw new AuthenticationFailed("malformed stream framing");
    }
  }
}

/** An agent: a client with a book of peers, one session per peer, re-handshaking once when a
 * peer forgets its session (§6.1, "This implementation"). */
export class Agent {
  readonly client: Client;
  private readonly peers = new Map<string, string>();
  private readonly sessions = new Map<string, ClientSession>();
  constructor(
    readonly identity: Identity,
    opts: ClientOptions & { peers?: Record<string, string>; onBehalfOf?: Chain } = {},
  ) {
    this.client = new Client(identity, opts);
    for (const [did, url] of Object.entries(opts.peers ?? {})) this.peers.set(did, url);
    this.onBehalfOf = opts.onBehalfOf;
  }
  readonly onBehalfOf: Chain | undefined;

  addPeer(did: string, endpoint: string): this {
    this.peers.set(did, endpoint);
    return this;
  }

  async session(did: string, fresh = false): Promise<ClientSession> {
    const hit = this.sessions.get(did);
    if (hit && !fresh && !hit.closed && hit.expiresAt > nowSeconds() + 5) return hit;
    const endpoint = this.peers.get(did);
    if (!endpoint) throw new InvalidParams(`no endpoint known for ${did}`);
    const s = await this.client.connect(did, endpoint);
    this.sessions.set(did, s);
    return s;
  }

  /** The verified result of `goal` at `did`. */
  async request(did: string, goal: string, inputs: JsonObject = {}, o: RequestOptions = {}): Promise<Json> {
    return (await this.requestVerified(did, goal, inputs, o)).result;
  }

  async requestVerified(did: string, goal: string, inputs: JsonObject = {}, o: RequestOptions = {}): Promise<IntentResult> {
    const opts = { onBehalfOf: this.onBehalfOf, ...o };
    const s = await this.session(did);
    // The id is chosen here, so that the resend after a re-handshake carries the same one (§12.5).
    if (opts.intentId === undefined && this.client.opts.exactlyOnce !== false && s.extensions.includes("intent_id"))
      opts.intentId = b64uEncode(randomBytes(16));
    try {
      return await this.client.request(s, goal, inputs, opts);
    } catch (e) {
      if (!(e instanceof SessionUnknown) || e.signed || this.client.opts.resendOnUnknownSession === false) throw e;
      // The server forgot the session: one new handshake; the same intent_id, so it runs once.
      const again = await this.session(did, true);
      return this.client.request(again, goal, inputs, opts);
    }
  }

  async *stream(did: string, goal: string, inputs: JsonObject = {}, o: RequestOptions = {}): AsyncGenerator<Json> {
    const opts = { onBehalfOf: this.onBehalfOf, ...o };
    const s = await this.session(did);
    if (opts.intentId === undefined && this.client.opts.exactlyOnce !== false && s.extensions.includes("intent_id"))
      opts.intentId = b64uEncode(randomBytes(16));
    let started = false;
    try {
      for await (const item of this.client.stream(s, goal, inputs, opts)) {
        started = true;
        yield item;
      }
    } catch (e) {
      // Resent once on a new session only before the first event, with the same intent_id.
      if (started || !(e instanceof SessionUnknown) || e.signed || this.client.opts.resendOnUnknownSession === false) throw e;
      const again = await this.session(did, true);
      yield* this.client.stream(again, goal, inputs, opts);
    }
  }

  /** Let `to` act on this agent's behalf (a new one-link chain), or narrow `parent` by one hop. */
  delegate(to: string, goals: string[], o: { ttl?: number; targets?: string[]; maxPriority?: number; parent?: Chain } = {}): Chain {
    if (o.parent) return o.parent.further(this.identity, { to, goals, ttl: o.ttl, targets: o.targets, maxPriority: o.maxPriority });
    return issueChain(this.identity, to, goals, o);
  }

  async close(): Promise<void> {
    for (const s of this.sessions.values()) await this.client.close(s).catch(() => undefined);
    this.sessions.clear();
  }
}

import { issue } from "../delegation.js";
function issueChain(identity: Identity, to: string, goals: string[], o: { ttl?: number; targets?: string[]; maxPriority?: number }): Chain {
  return issue(identity, { to, goals, ttl: o.ttl ?? 3600, targets: o.targets, maxPriority: o.maxPriority });
}
