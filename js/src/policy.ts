/** The session policy (PROTOCOL.md §5.4) and the server members of a policy file. */
import { readFileSync } from "node:fs";
import { DelegationRules } from "./delegation.js";
import { isDid } from "./did.js";
import { hashOf, isInt, isObject, loads, type Json, type JsonObject } from "./encoding.js";
import { InvalidParams } from "./errors.js";

export interface Policy {
  rate_limit: number;
  rate_period: number;
  allowed_intents: string[];
  blocked_intents: string[];
  session_timeout: number;
}

export const DEFAULT_POLICY: Policy = { rate_limit: 1000, rate_period: 3600, allowed_intents: ["*"], blocked_intents: [], session_timeout: 3600 };
const MEMBERS = ["rate_limit", "rate_period", "allowed_intents", "blocked_intents", "session_timeout"];

function goalList(v: Json | undefined, what: string): string[] {
  if (!Array.isArray(v) || v.length > 1024 || !v.every((g) => typeof g === "string" && [...g].length >= 1 && [...g].length <= 128))
    throw new InvalidParams(`policy ${what} must be an array of strings`);
  if (new Set(v).size !== v.length) throw new InvalidParams(`policy ${what} must hold distinct strings`);
  return v as string[];
}

/** The exact five-member policy object (the client reads a server's with this). */
export function policyFromWire(o: Json, Err = InvalidParams): Policy {
  if (!isObject(o) || Object.keys(o).length !== 5 || !MEMBERS.every((m) => m in o)) throw new Err("policy must have exactly five members");
  for (const m of ["rate_limit", "rate_period", "session_timeout"]) if (!isInt(o[m], 1)) throw new Err(`policy ${m} must be an integer >= 1`);
  return {
    rate_limit: o.rate_limit as number, rate_period: o.rate_period as number,
    allowed_intents: goalList(o.allowed_intents, "allowed_intents"), blocked_intents: goalList(o.blocked_intents, "blocked_intents"),
    session_timeout: o.session_timeout as number,
  };
}

export function policyAllows(p: Policy, goal: string): boolean {
  if (p.blocked_intents.includes("*") || p.blocked_intents.includes(goal)) return false;
  return p.allowed_intents.includes("*") || p.allowed_intents.includes(goal);
}

export const policyHash = (p: Policy): string => hashOf(p);

export interface PriorityRights {
  default: number;
  perDid: Map<string, number>;
}

/** What `serve --policy FILE` reads: the policy (missing members take defaults) and the
 * members that configure the server, never sent to peers. */
export interface ServeSettings {
  policy: Policy;
  sealed: boolean;
  requireSealed: boolean;
  priorityRights: PriorityRights;
  delegation: DelegationRules | null;
}

const SERVER_MEMBERS = ["priority_rights", "max_concurrent_intents", "max_queued_intents", "sealed_intents", "require_sealed", "delegation"];

export function settingsFromObject(data: JsonObject, where = "policy"): ServeSettings {
  const p: JsonObject = {};
  for (const [k, v] of Object.entries(data)) {
    if (SERVER_MEMBERS.includes(k)) continue;
    if (!MEMBERS.includes(k)) throw new InvalidParams(`${where}: unknown policy member '${k}'`);
    p[k] = v;
  }
  const policy = policyFromWire({ ...DEFAULT_POLICY, ...p });
  for (const b of ["sealed_intents", "require_sealed"])
    if (b in data && typeof data[b] !== "boolean") throw new InvalidParams(`${where}: ${b} must be true or false`);
  const rights: PriorityRights = { default: 3, perDid: new Map() };
  if ("priority_rights" in data) {
    const r = data.priority_rights;
    if (!isObject(r)) throw new InvalidParams(`${where}: priority_rights must be an object`);
    if ("default" in r) {
      if (!isInt(r.default, 1, 5)) throw new InvalidParams(`${where}: priority_rights.default must be 1..5`);
      rights.default = r.default;
    }
    if ("per_did" in r) {
      if (!isObject(r.per_did)) throw new InvalidParams(`${where}: priority_rights.per_did must be an object`);
      for (const [did, n] of Object.entries(r.per_did)) {
        if (!isDid(did) || !isInt(n, 1, 5)) throw new InvalidParams(`${where}: priority_rights.per_did maps DIDs to 1..5`);
        rights.perDid.set(did, n);
      }
    }
  }
  const requireSealed = data.require_sealed === true;
  if (requireSealed && data.sealed_intents === false) throw new InvalidParams(`${where}: require_sealed needs sealed intents (not "sealed_intents": false)`);
  return {
    policy,
    sealed: data.sealed_intents !== false || requireSealed,
    requireSealed,
    priorityRights: rights,
    delegation: "delegation" in data ? DelegationRules.fromObject(data.delegation as Json) : null,
  };
}

export function loadSettings(path: string | undefined): ServeSettings {
  if (!path) return settingsFromObject({});
  const data = loads(readFileSync(path), { error: InvalidParams });
  if (!isObject(data)) throw new InvalidParams(`${path}: a policy file holds one JSON object`);
  return settingsFromObject(data, path);
}
