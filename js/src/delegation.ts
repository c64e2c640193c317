/** Delegation chains (PROTOCOL.md §12.7): issue, narrow, parse, verify, check at use. */
import { randomBytes } from "node:crypto";
import { isDid, splitKeyId } from "./did.js";
import { b64uEncode, dumps, isHashString, isInt, isObject, loads, textHash, type Json } from "./encoding.js";
import { A2AError, InvalidParams, PolicyViolation } from "./errors.js";
import type { Identity } from "./identity.js";
import { parseJws, TYP, verifyParsed, type ParsedJws } from "./jws.js";

export const MAX_CHAIN_DEPTH = 5;
export const MAX_LINK_CHARS = 4096;
export const MAX_CHAIN_CHARS = 16384;
export const MAX_TTL = 2592000;
export const CHAIN_UNKNOWN = "is unknown on this session; send it in full";
const REQUIRED = ["iss", "aud", "sub", "jti", "nbf", "exp", "goals", "max_priority"];
const OPTIONAL = ["targets", "parent"];
const JTI_RE = /^[A-Za-z0-9_-]{22,64}$/;

export interface Link {
  token: string;
  hash: string;
  kid: string;
  iss: string;
  aud: string;
  sub: string;
  jti: string;
  nbf: number;
  exp: number;
  goals: string[];
  maxPriority: number;
  targets: string[] | undefined;
  parent: string | undefined;
  parsed: ParsedJws;
}

export class DelegationRefused extends PolicyViolation {}

function refuse(message: string, at?: number): DelegationRefused {
  const where = at === undefined ? "" : ` link ${at}:`;
  return new DelegationRefused(`delegation refused:${where} ${message}`.slice(0, 400));
}

function strList(v: Json | undefined, limit: number, dids = false): string[] | null {
  if (!Array.isArray(v) || v.length < 1 || v.length > limit) return null;
  for (const s of v) if (typeof s !== "string" || (dids ? !isDid(s) : [...s].length < 1 || [...s].length > 128)) return null;
  if (new Set(v).size !== v.length) return null;
  return v as string[];
}

/** The member `delegation`'s shape (§12.7): a non-empty array of strings, or a hash string. */
export function checkDelegationMember(v: Json | undefined): string[] | string {
  if (typeof v === "string" && isHashString(v)) return v;
  if (Array.isArray(v) && v.length > 0 && v.every((t) => typeof t === "string")) return v as string[];
  throw new InvalidParams("delegation must be an array of tokens or a sha256 hash string");
}

function parseLink(token: string, at: number): Link {
  let parsed: ParsedJws;
  try {
    parsed = parseJws(token);
  } catch (e) {
    throw refuse(`not a compact JWS (${(e as Error).message})`, at);
  }
  if (parsed.header.typ !== TYP.delegation) throw refuse(`JWS typ must be ${TYP.delegation}`, at);
  const p = parsed.payload;
  const keys = Object.keys(p);
  const extra = keys.filter((k) => !REQUIRED.includes(k) && !OPTIONAL.includes(k)).sort();
  if (extra.length) throw refuse(`unexpected member '${extra[0]!.slice(0, 64)}'`, at);
  if (!REQUIRED.every((k) => keys.includes(k))) throw refuse("missing a required member", at);
  for (const k of ["iss", "aud", "sub"]) if (!isDid(p[k])) throw refuse(`${k} must be a DID`, at);
  if (typeof p.jti !== "string" || !JTI_RE.test(p.jti)) throw refuse("jti must be 22-64 base64url characters", at);
  if (!isInt(p.nbf)) throw refuse("nbf must be an integer", at);
  if (!isInt(p.exp)) throw refuse("exp must be an integer", at);
  const goals = strList(p.goals, 64);
  if (!goals) throw refuse("goals must be an array of 1 to 64 strings", at);
  if (!isInt(p.max_priority, 1, 5)) throw refuse("max_priority must be an integer in 1..5", at);
  let targets: string[] | undefined;
  if ("targets" in p) {
    const t = strList(p.targets, 16, true);
    if (!t) throw refuse("targets must be an array of 1 to 16 strings", at);
    targets = t;
  }
  if ("parent" in p && !isHashString(p.parent)) throw refuse("parent must be a sha256 hash string", at);
  const kid = parsed.header.kid;
  if (typeof kid !== "string") throw refuse("JWS kid must be a string", at);
  let kidDid: string;
  try {
    kidDid = splitKeyId(kid)[0];
  } catch {
    throw refuse("JWS kid is not a key id", at);
  }
  const iss = p.iss as string, aud = p.aud as string, nbf = p.nbf as number, exp = p.exp as number;
  if (kidDid !== iss) throw refuse("JWS kid does not belong to the issuer's DID", at);
  if (!(nbf < exp) || exp - nbf > MAX_TTL) throw refuse(`the window must have nbf < exp and last at most ${MAX_TTL} s`, at);
  if (iss === aud) throw refuse("a link may not delegate to its own issuer", at);
  return {
    token, hash: textHash(token), kid, iss, aud, sub: p.sub as string, jti: p.jti, nbf, exp, goals,
    maxPriority: p.max_priority as number, targets, parent: p.parent as string | undefined, parsed,
  };
}

function checkNarrower(link: Link, parent: Link, at: number): void {
  if (link.parent === undefined || link.parent !== parent.hash) throw refuse("parent is not the hash of the previous link (a spliced chain)", at);
  if (link.iss !== parent.aud) throw refuse("issuer is not the previous link's audience", at);
  if (link.sub !== parent.sub) throw refuse("sub differs from the chain's principal", at);
  if (!parent.goals.includes("*") && !link.goals.every((g) => parent.goals.includes(g))) throw refuse("goals widen the previous link's", at);
  if (link.maxPriority > parent.maxPriority) throw refuse("max_priority widens the previous link's", at);
  if (link.nbf < parent.nbf || link.exp > parent.exp) throw refuse("the window is not inside the previous link's", at);
  if (parent.targets && (!link.targets || !link.targets.every((t) => parent.targets!.includes(t)))) throw refuse("targets widen the previous link's", at);
}

export class Chain {
  constructor(readonly links: Link[]) {}
  get tokens(): string[] {
    return this.links.map((l) => l.token);
  }
  get leaf(): Link {
    return this.links[this.links.length - 1]!;
  }
  get principal(): string {
    return this.links[0]!.sub;
  }
  get audience(): string {
    return this.leaf.aud;
  }
  /** The chain's name: the hash of its last link. */
  get name(): string {
    return this.leaf.hash;
  }
  dumps(): string {
    return dumps(this.tokens);
  }

  /** Checks 6 to 8 at a use (§12.7); the refusal, or null. */
  refusal(opts: { clientDid: string; serverDid: string; goal: string; priority: number; now: number }): DelegationRefused | null {
    if (this.leaf.aud !== opts.clientDid) return refuse("the chain is delegated to another DID than this session's client");
    for (const [at, l] of this.links.entries()) {
      if (!(opts.now < l.exp)) return refuse(`expired at ${l.exp}`, at);
      if (opts.now < l.nbf - 300) return refuse(`not valid before ${l.nbf}`, at);
      if (l.targets && !l.targets.includes(opts.serverDid)) return refuse("this agent is not among the link's targets", at);
    }
    const leaf = this.leaf;
    if (!leaf.goals.includes("*") && !leaf.goals.includes(opts.goal)) return refuse(`goal '${opts.goal.slice(0, 64)}' is outside the delegated goals`);
    if (opts.priority > leaf.maxPriority) return refuse(`priority ${opts.priority} is above the delegated ${leaf.maxPriority}`);
    return null;
  }

  /** This chain with one more link by `identity` (the leaf's audience) to `to`. */
  further(identity: Identity, opts: { to: string; goals?: string[]; now?: number; ttl?: number; targets?: string[]; maxPriority?: number }): Chain {
    if (identity.did !== this.audience) throw new InvalidParams("only the chain's audience may delegate it further");
    const leaf = this.leaf;
    const now = Math.floor(opts.now ?? Date.now() / 1000);
    const exp = opts.ttl === undefined ? leaf.exp : Math.min(leaf.exp, now + opts.ttl);
    const token = signLink(identity, {
      aud: opts.to, sub: this.principal, goals: opts.goals ?? leaf.goals, nbf: Math.max(leaf.nbf, now), exp,
      targets: opts.targets ?? leaf.targets, maxPriority: opts.maxPriority ?? leaf.maxPriority, parent: leaf.hash,
    });
    return checked([...this.tokens, token]);
  }
}

/** Checks 1 to 4 (bounds, each link's form, narrowing, loops): no signature yet. */
export function parseChain(tokens: string[]): Chain {
  if (tokens.length < 1 || tokens.length > MAX_CHAIN_DEPTH) throw refuse(`a chain has 1 to ${MAX_CHAIN_DEPTH} links`);
  let total = 0;
  for (const t of tokens) {
    if (t.length > MAX_LINK_CHARS) throw refuse(`a link is at most ${MAX_LINK_CHARS} characters`);
    total += t.length;
  }
  if (total > MAX_CHAIN_CHARS) throw refuse(`a chain is at most ${MAX_CHAIN_CHARS} characters`);
  const links: Link[] = [];
  const seen = new Set<string>();
  tokens.forEach((token, at) => {
    const link = parseLink(token, at);
    if (at === 0) {
      if (link.parent !== undefined) throw refuse("the root link has no parent", at);
      if (link.sub !== link.iss) throw refuse("the root link's sub must be its issuer (the principal)", at);
    } else checkNarrower(link, links[links.length - 1]!, at);
    if (seen.has(link.iss) || seen.has(link.jti)) throw refuse("a DID or token id appears twice in the chain (a loop)", at);
    seen.add(link.iss).add(link.jti);
    links.push(link);
  });
  if (seen.has(links[links.length - 1]!.aud)) throw refuse("a DID appears twice in the chain (a loop)", links.length - 1);
  return new Chain(links);
}

/** Check 5: each link's signature with the key resolved from its issuer. */
export async function verifyChainSignatures(chain: Chain, keyFor: (did: string, kid: string) => Promise<Uint8Array | undefined>): Promise<void> {
  for (const [at, link] of chain.links.entries()) {
    let key: Uint8Array | undefined;
    try {
      key = await keyFor(link.iss, link.kid);
    } catch (e) {
      throw refuse((e as A2AError).message ?? "issuer cannot be resolved", at);
    }
    if (!key) throw refuse("the issuer's DID does not list the JWS kid", at);
    try {
      verifyParsed(link.parsed, key, TYP.delegation, link.kid);
    } catch (e) {
      throw refuse((e as Error).message, at);
    }
  }
}

function checked(tokens: string[]): Chain {
  try {
    return parseChain(tokens);
  } catch (e) {
    throw new InvalidParams((e as Error).message);
  }
}

function signLink(identity: Identity, o: { aud: string; sub: string; goals: string[]; nbf: number; exp: number; targets?: string[] | undefined; maxPriority: number; parent?: string }): string {
  const payload: Record<string, Json> = {
    iss: identity.did, aud: o.aud, sub: o.sub, jti: b64uEncode(randomBytes(16)), nbf: o.nbf, exp: o.exp, goals: o.goals, max_priority: o.maxPriority,
  };
  if (o.targets !== undefined) payload.targets = o.targets;
  if (o.parent !== undefined) payload.parent = o.parent;
  return identity.sign(TYP.delegation, payload);
}

/** A one-link chain: `identity` (the principal) grants `to` its goals for `ttl` seconds. */
export function issue(identity: Identity, opts: { to: string; goals: string[]; ttl: number; now?: number; targets?: string[]; maxPriority?: number }): Chain {
  const now = Math.floor(opts.now ?? Date.now() / 1000);
  return checked([signLink(identity, { aud: opts.to, sub: identity.did, goals: opts.goals, nbf: now, exp: now + opts.ttl, targets: opts.targets, maxPriority: opts.maxPriority ?? 5 })]);
}

/** A chain from its file form (a JSON array of tokens). */
export function loadChain(text: string | Uint8Array): Chain {
  const v = loads(text, { error: InvalidParams });
  const form = checkDelegationMember(v);
  if (typeof form === "string") throw new InvalidParams("a delegation file holds the chain's tokens, not its hash");
  return checked(form);
}

/** Goal -> principals a goal runs only on behalf of; `{}` accepts chains, reserves nothing. */
export class DelegationRules {
  constructor(readonly required: Map<string, Set<string>> = new Map()) {}
  static fromObject(o: Json): DelegationRules {
    if (!isObject(o)) throw new InvalidParams("delegation must be an object {goal: [principal DIDs]}");
    const m = new Map<string, Set<string>>();
    for (const [goal, dids] of Object.entries(o)) {
      if (!Array.isArray(dids) || !dids.every(isDid)) throw new InvalidParams(`delegation.${goal} must be an array of DIDs`);
      m.set(goal, new Set(dids as string[]));
    }
    return new DelegationRules(m);
  }
  refusal(goal: string, chain: Chain | null): DelegationRefused | null {
    const allowed = this.required.get(goal);
    if (!allowed) return null;
    if (!chain) return refuse(`intent '${goal.slice(0, 64)}' runs only on behalf of a principal: send a delegation chain`);
    if (!allowed.has(chain.principal)) return refuse(`intent '${goal.slice(0, 64)}' may not run on behalf of ${chain.principal.slice(0, 128)}`);
    return null;
  }
}

export function chainUnknown(ref: string): DelegationRefused {
  const e = new DelegationRefused(`delegation refused: chain ${ref} ${CHAIN_UNKNOWN}`);
  e.data = { chain_unknown: ref };
  return e;
}
