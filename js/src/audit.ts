/** The §8 audit log: hash-chained JSON Lines with signed checkpoints, and its verifier. */
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { publicKeyFromDidKey, keyIdForDidKey } from "./did.js";
import { dumps, isInt, isObject, loads, sha256Hex } from "./encoding.js";
import type { Identity } from "./identity.js";
import { TYP, verifyJws } from "./jws.js";

export const ZERO_HASH = "sha256:" + "0".repeat(64);
const EVENTS = new Set(["hello", "proof", "accept_policy", "intent", "close", "reject", "checkpoint"]);

export interface AuditEvent {
  event: "hello" | "proof" | "accept_policy" | "intent" | "close" | "reject";
  status: "success" | "error";
  verified?: boolean;
  session_id?: string | null;
  client_did?: string | null;
  server_did?: string | null;
  intent_goal?: string | null;
  sequence?: number | null;
  duration_ms?: number | null;
  error_code?: number | null;
  principal?: string | null;
  delegation?: string | null;
}

function clean(v: unknown, limit: number): string | null {
  if (typeof v !== "string") return null;
  return [...v].slice(0, limit).join("").replace(/[\ud800-\udfff]/g, "\ufffd");
}

const lineHash = (line: Buffer): string => "sha256:" + sha256Hex(line);

export class AuditLog {
  private head = ZERO_HASH;
  private lines = 0;
  private sinceCheckpoint = 0;
  private headIsCheckpoint = false;

  constructor(
    readonly path: string,
    readonly role: "client" | "server",
    private readonly identity?: Identity,
    private readonly every = 100,
  ) {
    if (existsSync(path)) {
      // Continue from the last complete line.
      const data = readFileSync(path);
      const parts = data.toString("latin1").split("\n");
      let offset = 0;
      for (let i = 0; i < parts.length - 1; i++) {
        const line = data.subarray(offset, offset + parts[i]!.length);
        offset += parts[i]!.length + 1;
        this.head = lineHash(line);
        this.lines++;
        this.headIsCheckpoint = line.includes('"event":"checkpoint"');
        this.sinceCheckpoint = this.headIsCheckpoint ? 0 : this.sinceCheckpoint + 1;
      }
      if (parts[parts.length - 1] !== "") appendFileSync(path, "\n"); // a torn line: end it
    }
  }

  private append(obj: Record<string, unknown>): void {
    const line = Buffer.from(dumps({ ...obj, prev_hash: this.head }), "utf8");
    appendFileSync(this.path, Buffer.concat([line, Buffer.from("\n")]));
    this.head = lineHash(line);
    this.lines++;
  }

  record(e: AuditEvent): void {
    const limit = e.verified ? 2048 : 256;
    const rec: Record<string, unknown> = {
      timestamp: Date.now() / 1000,
      event: e.event,
      role: this.role,
      session_id: clean(e.session_id, limit),
      client_did: clean(e.client_did, limit),
      server_did: clean(e.server_did, limit),
      intent_goal: clean(e.intent_goal, limit),
      sequence: isInt(e.sequence) ? e.sequence : null,
      status: e.status,
      duration_ms: typeof e.duration_ms === "number" ? Math.round(e.duration_ms * 1000) / 1000 : null,
      error_code: typeof e.error_code === "number" ? e.error_code : null,
      verified: e.verified === true,
    };
    if (e.principal != null) {
      rec.principal = clean(e.principal, limit);
      rec.delegation = clean(e.delegation, limit);
    }
    this.append(rec);
    this.headIsCheckpoint = false;
    if (++this.sinceCheckpoint >= this.every) this.checkpoint();
  }

  /** A signed checkpoint over the lines so far (none without an identity, or when the last
   * record already is one). Returns its token. */
  checkpoint(): string | null {
    if (!this.identity || this.lines === 0 || this.headIsCheckpoint) return null;
    const token = this.identity.sign(TYP.audit, { line: this.lines, hash: this.head, timestamp: Math.floor(Date.now() / 1000) });
    const obj: Record<string, unknown> = {
      timestamp: Date.now() / 1000, event: "checkpoint", role: null, session_id: null, client_did: null, server_did: null,
      intent_goal: null, sequence: null, status: null, duration_ms: null, error_code: null, verified: null,
    };
    this.append({ ...obj, checkpoint: token });
    this.headIsCheckpoint = true;
    this.sinceCheckpoint = 0;
    return token;
  }

  close(): void {
    this.checkpoint();
  }
}

export interface VerifyReport {
  ok: boolean;
  lines: number;
  checkpoints: number;
  problems: string[];
}

/** Re-compute the chain of `path`; with `did` (a did:key) check checkpoint signatures; with
 * `checkpoint` (a token kept elsewhere) check that no line was cut off the end. */
export function verifyAuditLog(path: string, opts: { did?: string; checkpoint?: string } = {}): VerifyReport {
  const data = readFileSync(path);
  const problems: string[] = [];
  let prev = ZERO_HASH;
  let n = 0;
  let checkpoints = 0;
  const hashes: string[] = [];
  const pub = opts.did ? publicKeyFromDidKey(opts.did) : undefined;
  const kid = opts.did ? keyIdForDidKey(opts.did) : "";
  let start = 0;
  while (start < data.length) {
    let end = data.indexOf(0x0a, start);
    if (end < 0) {
      problems.push(`line ${n + 1}: incomplete (no newline)`);
      break;
    }
    const line = data.subarray(start, end);
    start = end + 1;
    n++;
    let obj;
    try {
      obj = loads(line);
    } catch {
      problems.push(`line ${n}: not a JSON record (torn?)`);
      prev = lineHash(line);
      hashes.push(prev);
      continue;
    }
    if (!isObject(obj) || typeof obj.event !== "string" || !EVENTS.has(obj.event) && !/^[a-z_]+$/.test(obj.event)) problems.push(`line ${n}: not an audit record`);
    else if (obj.prev_hash !== prev) problems.push(`line ${n}: prev_hash breaks the chain`);
    if (isObject(obj) && obj.event === "checkpoint") {
      checkpoints++;
      if (pub) {
        try {
          const p = verifyJws(obj.checkpoint, pub, TYP.audit, kid);
          if (p.line !== n - 1 || p.hash !== prev) problems.push(`line ${n}: checkpoint does not cover the lines before it`);
        } catch (e) {
          problems.push(`line ${n}: checkpoint signature: ${(e as Error).message}`);
        }
      }
    }
    prev = lineHash(line);
    hashes.push(prev);
  }
  if (opts.checkpoint) {
    try {
      const parts = opts.checkpoint.split(".");
      const p = loads(Buffer.from(parts[1] ?? "", "base64url"));
      if (pub) verifyJws(opts.checkpoint, pub, TYP.audit, kid);
      if (!isObject(p) || !isInt(p.line) || hashes[p.line - 1] !== p.hash) problems.push("the log does not hold the lines the checkpoint covers (truncated or changed)");
    } catch (e) {
      problems.push(`checkpoint: ${(e as Error).message}`);
    }
  }
  return { ok: problems.length === 0, lines: n, checkpoints, problems };
}
