/** The server's side of the handshake (PROTOCOL.md §5): HELLO, PROOF, ACCEPT_POLICY. */
import { checkPublicKeys, isDid } from "../did.js";
import { x25519Pair, x25519Shared } from "../ed25519.js";
import { b64uDecodeOrNull, b64uEncode, exactMembers, hashOf, isFresh, isHashString, isInt, isStr, sha256Hex, textHash, type JsonObject } from "../encoding.js";
import { AuthenticationFailed, HandshakeUnknown, InvalidParams, PolicyViolation, StaleTimestamp, UnsupportedVersion } from "../errors.js";
import { parseJws, TYP, verifyParsed, type ParsedJws } from "../jws.js";
import { policyHash } from "../policy.js";
import { deriveKeys, Sealer } from "../sealing.js";
import { checkPayload, HANDSHAKE_TTL, unavailable, type Pending } from "./common.js";
import type { ServerCore } from "./core.js";

export const FAILED_STEPS = 100;
export const FAILED_STEPS_REFILL = 50;
export const REQUIRE_SEALED = "sealed intents required: accept_policy carries no seal_key";

export class Handshakes {
  private readonly pending = new Map<string, Pending>();
  /** Failed PROOF/ACCEPT_POLICY steps left per source address (a token bucket). */
  private readonly budgets = new Map<string, { tokens: number; at: number }>();
  private spending: { tokens: number } | null = null;
  constructor(private readonly core: ServerCore) {}

  async hello(p: JsonObject, source: string): Promise<JsonObject> {
    if (typeof p.type !== "string" || typeof p.protocol_version !== "string") throw new InvalidParams("type and protocol_version must be strings");
    if (p.protocol_version !== "1.0") throw new UnsupportedVersion(`protocol version ${p.protocol_version.slice(0, 16)} is not supported`, { supported: ["1.0"] });
    if (p.type !== "hello" || !exactMembers(p, ["type", "protocol_version", "agent_did", "agent_id", "manifest_hash", "nonce", "public_keys", "timestamp"]))
      throw new InvalidParams("hello must have exactly its members");
    if (typeof p.agent_did !== "string" || p.agent_did.length > 2048) throw new InvalidParams("agent_did must be a string of at most 2048 characters");
    if (!isStr(p.agent_id, 1, 128)) throw new InvalidParams("agent_id must be 1 to 128 characters");
    if (!isHashString(p.manifest_hash)) throw new InvalidParams("manifest_hash must be a hash string");
    const nonce = b64uDecodeOrNull(p.nonce);
    if (!nonce || nonce.length !== 32) throw new InvalidParams("nonce must be 32 bytes in canonical base64url");
    if (nonce.every((b) => b === 0)) throw new InvalidParams("nonce of zero bytes: broken random source");
    if (!Array.isArray(p.public_keys) || p.public_keys.length < 1 || p.public_keys.length > 8) throw new InvalidParams("public_keys must hold 1 to 8 entries");
    if (!isInt(p.timestamp)) throw new InvalidParams("timestamp must be an integer");
    const now = this.core.clock();
    if (!isFresh(p.timestamp, Math.floor(now))) throw new StaleTimestamp("hello timestamp is not fresh");
    if (!isDid(p.agent_did)) throw new InvalidParams("agent_did is not a DID");
    const clientDid = p.agent_did;
    const resolved = await this.core.resolver.resolve(clientDid);
    if (clientDid === this.core.identity.did) throw new AuthenticationFailed("a HELLO from this server's own DID");
    if (this.core.revoked.has(clientDid)) throw new AuthenticationFailed(`DID revoked: ${clientDid}`);
    checkPublicKeys(p.public_keys, resolved);
    for (const e of p.public_keys as JsonObject[]) if (this.core.revoked.has(e.kid as string)) throw new AuthenticationFailed(`key id revoked: ${e.kid}`);
    this.expirePending(now);
    const fromSource = [...this.pending.values()].filter((x) => (x as Pending & { source?: string }).source === source).length;
    if (fromSource >= this.core.limits.pendingPerSource)
      throw unavailable("too many pending handshakes from this address", 5, "own");
    if (this.pending.size >= this.core.limits.pendingTotal) throw unavailable("too many pending handshakes", 5, "shared");
    const nonceB = b64uEncode(this.core.random(32));
    const ts = Math.floor(now);
    const helloHash = hashOf(p);
    const { hash: manifest } = this.core.card();
    const ph = policyHash(this.core.policy);
    const policySignature = this.core.identity.sign(TYP.policy, {
      protocol_version: "1.0", hello_hash: helloHash, client_did: clientDid, server_did: this.core.identity.did, nonce_a: p.nonce as string,
      nonce_b: nonceB, client_manifest_hash: p.manifest_hash, server_manifest_hash: manifest, policy_hash: ph, timestamp: ts,
    });
    const challenge: JsonObject = {
      type: "challenge", protocol_version: "1.0", nonce_b: nonceB, server_did: this.core.identity.did, manifest_hash: manifest,
      public_keys: [this.core.identity.publicKeyEntry as unknown as JsonObject], policy_hash: ph, policy_signature: policySignature, timestamp: ts,
    };
    const pend: Pending & { source: string } = {
      nonceB, nonceA: p.nonce as string, clientDid, resolved, helloHash, challengeHash: hashOf(challenge), clientManifest: p.manifest_hash,
      policy: this.core.policy, policyHash: ph, policySignature, expires: now + HANDSHAKE_TTL, proven: false, source,
    };
    this.pending.set(nonceB, pend);
    this.core.record({ event: "hello", status: "success", client_did: clientDid, verified: false });
    return challenge;
  }


  private expirePending(now: number): void {
    for (const [k, v] of this.pending) if (v.expires <= now) this.pending.delete(k);
  }

  private findPending(p: JsonObject, type: string, tokenMember: string): [Pending, ParsedJws] {
    if (p.type !== type || !exactMembers(p, ["type", "nonce_b", tokenMember])) throw new InvalidParams(`${type} must have exactly its members`);
    if (b64uDecodeOrNull(p.nonce_b)?.length !== 32) throw new InvalidParams("nonce_b must be 32 bytes in canonical base64url");
    const jws = parseJws(p[tokenMember]);
    const pend = this.pending.get(p.nonce_b as string);
    if (!pend || pend.expires <= this.core.clock()) throw new HandshakeUnknown("unknown, expired or used handshake");
    return [pend, jws];
  }

  /** The step's key (a wrong `kid` costs nothing), and a budget check before the signature:
   * a source address that spent its failed steps gets 503 before any signature check. */
  private verifyClient(jws: ParsedJws, pend: Pending, typ: string, source: string): [JsonObject, string] {
    const kid = jws.header.kid;
    const key = typeof kid === "string" ? pend.resolved.keys.get(kid) : undefined;
    if (!key || (pend.kid !== undefined && kid !== pend.kid)) throw new AuthenticationFailed("JWS kid is not a key of the client's DID");
    const now = this.core.monotonic();
    const b = this.budgets.get(source) ?? { tokens: FAILED_STEPS, at: now };
    b.tokens = Math.min(FAILED_STEPS, b.tokens + (now - b.at) * FAILED_STEPS_REFILL);
    b.at = now;
    if (this.budgets.size > 10_000) for (const [k, v] of this.budgets) if (v.tokens >= FAILED_STEPS) this.budgets.delete(k);
    this.budgets.set(source, b);
    if (b.tokens < 1) throw unavailable("too many failed handshake steps from this address", 1);
    this.spending = b;
    return [verifyParsed(jws, key, typ, kid as string), kid as string];
  }

  /** Run a PROOF or ACCEPT_POLICY step; a failure after its signature check spends budget. */
  private spend<T>(step: () => T): T {
    this.spending = null;
    try {
      return step();
    } catch (e) {
      const b = this.spending as { tokens: number } | null;
      if (b && !(e instanceof PolicyViolation)) b.tokens -= 1;
      throw e;
    }
  }

  proof(p: JsonObject, source = "unknown"): JsonObject {
    return this.spend(() => this.proofStep(p, source));
  }

  acceptPolicy(p: JsonObject, source = "unknown"): JsonObject {
    return this.spend(() => this.acceptStep(p, source));
  }

  private proofStep(p: JsonObject, source: string): JsonObject {
    const [pend, jws] = this.findPending(p, "proof", "proof_jws");
    if (pend.proven) throw new HandshakeUnknown("handshake already proven");
    const [payload, kid] = this.verifyClient(jws, pend, TYP.proof, source);
    const expect: JsonObject = {
      nonce_a: pend.nonceA, nonce_b: pend.nonceB, client_did: pend.clientDid, server_did: this.core.identity.did,
      client_manifest_hash: pend.clientManifest, server_manifest_hash: this.core.card().hash, challenge_hash: pend.challengeHash,
    };
    checkPayload(payload, expect, ["timestamp"]);
    if (!isInt(payload.timestamp)) throw new AuthenticationFailed("timestamp must be an integer");
    if (!isFresh(payload.timestamp, Math.floor(this.core.clock()))) throw new StaleTimestamp("proof timestamp is not fresh");
    pend.proven = true;
    pend.kid = kid;
    this.core.record({ event: "proof", status: "success", client_did: pend.clientDid, verified: true });
    return { type: "policy", policy: pend.policy as unknown as JsonObject, policy_hash: pend.policyHash, policy_signature: pend.policySignature };
  }

  private acceptStep(p: JsonObject, source: string): JsonObject {
    const [pend, jws] = this.findPending(p, "accept_policy", "accept_jws");
    if (!pend.proven) throw new HandshakeUnknown("handshake not proven");
    const [payload, kid] = this.verifyClient(jws, pend, TYP.accept, source);
    const commitment = "sha256:" + sha256Hex(`${pend.nonceA}|${pend.nonceB}|${pend.policyHash}`);
    const expect: JsonObject = {
      policy_hash: pend.policyHash, session_commitment: commitment, nonce_a: pend.nonceA, nonce_b: pend.nonceB,
      client_did: pend.clientDid, server_did: this.core.identity.did,
    };
    checkPayload(payload, expect, ["timestamp"], this.core.sealed ? ["seal_key"] : []);
    if (!isInt(payload.timestamp)) throw new AuthenticationFailed("timestamp must be an integer");
    let peerSeal: Buffer | null = null;
    if ("seal_key" in payload) {
      peerSeal = b64uDecodeOrNull(payload.seal_key);
      if (!peerSeal || peerSeal.length !== 32) throw new AuthenticationFailed("seal_key must be 32 bytes in canonical base64url");
    }
    if (!isFresh(payload.timestamp, Math.floor(this.core.clock()))) throw new StaleTimestamp("accept_policy timestamp is not fresh");
    if (this.core.requireSealed && !peerSeal) {
      // The signed refusal of a session without seal keys (§12.6, "Sealing required"); the
      // pending handshake is not used up.
      const error = { code: PolicyViolation.code, message: REQUIRE_SEALED };
      const refusal = this.core.identity.sign(TYP.refusal, {
        nonce_a: pend.nonceA, nonce_b: pend.nonceB, client_did: pend.clientDid, server_did: this.core.identity.did,
        accept_hash: textHash(p.accept_jws as string), error, timestamp: Math.floor(this.core.clock()),
      });
      throw new PolicyViolation(REQUIRE_SEALED, { refusal_jws: refusal });
    }
    let sealer: Sealer | null = null;
    const sessionId = b64uEncode(this.core.random(32));
    let ourSeal: string | null = null;
    if (peerSeal) {
      const pair = x25519Pair();
      const shared = x25519Shared(pair.priv, peerSeal);
      if (!shared) throw new AuthenticationFailed("seal_key gives an all-zero shared secret");
      ourSeal = b64uEncode(pair.pub);
      sealer = new Sealer(deriveKeys(shared, {
        client_did: pend.clientDid, server_did: this.core.identity.did, nonce_a: pend.nonceA, nonce_b: pend.nonceB, session_id: sessionId,
        session_commitment: commitment, client_seal_key: payload.seal_key as string, server_seal_key: ourSeal,
      }), sessionId);
    }
    for (const [k, s] of this.core.sessions) if (s.expiresAt <= this.core.clock()) this.core.sessions.delete(k);
    if (this.core.sessions.size >= this.core.limits.sessions) throw unavailable("too many open sessions", 30, "shared");
    const created = Math.floor(this.core.clock());
    const expires = created + pend.policy.session_timeout;
    const sp: JsonObject = { session_id: sessionId, session_commitment: commitment, client_did: pend.clientDid, server_did: this.core.identity.did, created_at: created, expires_at: expires };
    if (ourSeal) sp.seal_key = ourSeal;
    const sessionJws = this.core.identity.sign(TYP.session, sp);
    this.pending.delete(pend.nonceB);
    this.core.sessions.set(sessionId, {
      id: sessionId, commitment, clientDid: pend.clientDid, clientKid: kid, clientKey: pend.resolved.keys.get(kid)!, policy: pend.policy,
      expiresAt: expires, sealer, nonceA: pend.nonceA, nonceB: pend.nonceB, lastSequence: 0, stored: null, chains: new Map(), closed: false,
    });
    this.core.record({ event: "accept_policy", status: "success", client_did: pend.clientDid, session_id: sessionId, verified: true });
    return {
      type: "session", session_id: sessionId, server_did: this.core.identity.did, client_did: pend.clientDid, session_commitment: commitment,
      created_at: created, expires_at: expires, public_keys: [this.core.identity.publicKeyEntry as unknown as JsonObject], session_jws: sessionJws,
    };
  }

}
