/**
 * Encodings of PROTOCOL.md §1: strict base64url, strict I-JSON parsing, JCS (RFC 8785),
 * hash strings. Pure functions, no I/O.
 */
import { createHash } from "node:crypto";
import { InvalidParams, ParseError, type A2AErrorClass } from "./errors.js";

const B64U_RE = /^[A-Za-z0-9_-]*$/;

export function b64uEncode(data: Uint8Array): string {
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64url");
}

/** Canonical base64url without padding, or null: no `=`, no other character, no length of
 * 1 mod 4, no non-zero trailing bits (the value re-encodes to the same text). */
export function b64uDecodeOrNull(text: unknown): Buffer | null {
  if (typeof text !== "string" || !B64U_RE.test(text) || text.length % 4 === 1) return null;
  const raw = Buffer.from(text, "base64url");
  return raw.toString("base64url") === text ? raw : null;
}

export function b64uDecode(text: unknown, what = "value", error: A2AErrorClass = InvalidParams): Buffer {
  const raw = b64uDecodeOrNull(text);
  if (raw === null) throw new error(`${what} is not canonical base64url`);
  return raw;
}

/** A number written with a fraction or exponent whose value is integral (`1.0`, `1e2`): it
 * is not an integer (§1), but equals the integer in JCS. Kept apart so checks can tell. */
export class JsonFloat {
  constructor(
    readonly value: number,
    readonly raw: string,
  ) {}
}

export type Json = null | boolean | number | string | JsonFloat | Json[] | { [k: string]: Json };
export type JsonObject = { [k: string]: Json };

export const MAX_DEPTH = 32;
const MAX_SAFE = Number.MAX_SAFE_INTEGER;

/** Parse I-JSON (RFC 7493) strictly: UTF-8 without BOM, unique member names, no lone
 * surrogate, finite numbers, integers within 2^53-1, at most `maxDepth` levels.
 * Any failure is a ParseError (-32700) unless another class is given. */
export function loads(input: Uint8Array | string, opts: { maxDepth?: number; error?: A2AErrorClass } = {}): Json {
  const error = opts.error ?? ParseError;
  let text: string;
  if (typeof input === "string") text = input;
  else {
    if (input.length >= 3 && input[0] === 0xef && input[1] === 0xbb && input[2] === 0xbf)
      throw new error("JSON text starts with a byte order mark");
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(input);
    } catch {
      throw new error("JSON text is not UTF-8");
    }
  }
  return new Parser(text, opts.maxDepth ?? MAX_DEPTH, error).parseDocument();
}

class Parser {
  private i = 0;
  constructor(
    private readonly s: string,
    private readonly maxDepth: number,
    private readonly error: A2AErrorClass,
  ) {}
  fail(why: string): never {
    throw new this.error(`invalid JSON: ${why}`);
  }
  ws(): void {
    const s = this.s;
    while (this.i < s.length) {
      const c = s.charCodeAt(this.i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) this.i++;
      else break;
    }
  }
  parseDocument(): Json {
    this.ws();
    const v = this.value(1);
    this.ws();
    if (this.i !== this.s.length) this.fail("trailing data");
    return v;
  }
  value(depth: number): Json {
    const c = this.s[this.i];
    if (c === "{" || c === "[") {
      if (depth > this.maxDepth) this.fail(`nested deeper than ${this.maxDepth} levels`);
      return c === "{" ? this.object(depth) : this.array(depth);
    }
    if (c === '"') return this.string();
    if (c === "t" && this.s.startsWith("true", this.i)) return (this.i += 4), true;
    if (c === "f" && this.s.startsWith("false", this.i)) return (this.i += 5), false;
    if (c === "n" && this.s.startsWith("null", this.i)) return (this.i += 4), null;
    return this.number();
  }
  object(depth: number): JsonObject {
    this.i++;
    const out: JsonObject = Object.create(null) as JsonObject;
    const seen = new Set<string>();
    this.ws();
    if (this.s[this.i] === "}") return this.i++, toPlain(out);
    for (;;) {
      this.ws();
      if (this.s[this.i] !== '"') this.fail("expected a member name");
      const key = this.string();
      if (seen.has(key)) this.fail(`duplicate member name ${JSON.stringify(key.slice(0, 64))}`);
      seen.add(key);
      this.ws();
      if (this.s[this.i] !== ":") this.fail("expected ':'");
      this.i++;
      this.ws();
      out[key] = this.value(depth + 1);
      this.ws();
      const c = this.s[this.i++];
      if (c === "}") return toPlain(out);
      if (c !== ",") this.fail("expected ',' or '}'");
    }
  }
  array(depth: number): Json[] {
    this.i++;
    const out: Json[] = [];
    this.ws();
    if (this.s[this.i] === "]") return this.i++, out;
    for (;;) {
      this.ws();
      out.push(this.value(depth + 1));
      this.ws();
      const c = this.s[this.i++];
      if (c === "]") return out;
      if (c !== ",") this.fail("expected ',' or ']'");
    }
  }
  string(): string {
    const s = this.s;
    let i = this.i + 1;
    let out = "";
    let start = i;
    for (;;) {
      if (i >= s.length) this.fail("unterminated string");
      const c = s.charCodeAt(i);
      if (c === 0x22) break;
      if (c < 0x20) this.fail("control character in string");
      if (c === 0x5c) {
        out += s.slice(start, i);
        const e = s[i + 1];
        i += 2;
        switch (e) {
          case '"': out += '"'; break;
          case "\\": out += "\\"; break;
          case "/": out += "/"; break;
          case "b": out += "\b"; break;
          case "f": out += "\f"; break;
          case "n": out += "\n"; break;
          case "r": out += "\r"; break;
          case "t": out += "\t"; break;
          case "u": {
            const hex = s.slice(i, i + 4);
            if (!/^[0-9A-Fa-f]{4}$/.test(hex)) this.fail("bad \\u escape");
            out += String.fromCharCode(parseInt(hex, 16));
            i += 4;
            break;
          }
          default:
            this.fail("bad escape");
        }
        start = i;
      } else i++;
    }
    out += s.slice(start, i);
    this.i = i + 1;
    if (!out.isWellFormed()) this.fail("lone surrogate in string");
    return out;
  }
  number(): number | JsonFloat {
    const m = /^-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(this.s.slice(this.i, this.i + 400));
    if (!m || m[0].length === 0) this.fail("unexpected character");
    const raw = m[0];
    this.i += raw.length;
    const v = Number(raw);
    if (!Number.isFinite(v)) this.fail("number out of range");
    if (m[1] === undefined && m[2] === undefined) {
      if (!Number.isSafeInteger(v) || Math.abs(v) > MAX_SAFE) this.fail("integer beyond 2^53-1");
      return v;
    }
    return Number.isInteger(v) ? new JsonFloat(v, raw) : v;
  }
}

function toPlain(o: JsonObject): JsonObject {
  // Objects are built without a prototype (so "__proto__" is an ordinary name); give them
  // the ordinary one back, defining each member so no setter runs.
  const out: JsonObject = {};
  for (const k of Object.keys(o)) Object.defineProperty(out, k, { value: o[k], enumerable: true, writable: true, configurable: true });
  return out;
}

function numberText(v: number): string {
  if (!Number.isFinite(v)) throw new InvalidParams("JSON numbers must be finite");
  return Object.is(v, -0) ? "0" : String(v);
}

/** Compact JSON in member order as built (the form this implementation writes, §1). */
export function dumps(value: unknown): string {
  if (value === null) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (typeof value === "number") return numberText(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (value instanceof JsonFloat) return value.raw;
  if (Array.isArray(value)) return "[" + value.map((v) => dumps(v === undefined ? null : v)).join(",") + "]";
  if (typeof value === "object") {
    const parts: string[] = [];
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
      if (v === undefined) continue;
      parts.push(JSON.stringify(k) + ":" + dumps(v));
    }
    return "{" + parts.join(",") + "}";
  }
  throw new InvalidParams("value is not JSON");
}

/** RFC 8785 JSON Canonicalization Scheme. */
export function jcs(value: unknown): string {
  if (value === null || typeof value === "boolean") return String(value);
  if (typeof value === "number") return numberText(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (value instanceof JsonFloat) return numberText(value.value);
  if (Array.isArray(value)) return "[" + value.map((v) => jcs(v)).join(",") + "]";
  if (typeof value === "object") {
    const o = value as Record<string, unknown>;
    const keys = Object.keys(o).filter((k) => o[k] !== undefined).sort();
    return "{" + keys.map((k) => JSON.stringify(k) + ":" + jcs(o[k])).join(",") + "}";
  }
  throw new InvalidParams("value is not JSON");
}

export function sha256(data: Uint8Array | string): Buffer {
  return createHash("sha256").update(data).digest();
}

export function sha256Hex(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}

/** `"sha256:" + hex(SHA-256(JCS(value)))`. */
export function hashOf(value: unknown): string {
  return "sha256:" + sha256Hex(jcs(value));
}

/** `"sha256:" + hex(SHA-256(ASCII(text)))`: request_hash, chain names, sealed digests. */
export function textHash(text: string): string {
  return "sha256:" + sha256Hex(Buffer.from(text, "utf8"));
}

const HASH_RE = /^sha256:[0-9a-f]{64}$/;
export function isHashString(v: unknown): v is string {
  return typeof v === "string" && HASH_RE.test(v);
}

/** Equality of §1: equal JCS forms. */
export function jsonEqual(a: unknown, b: unknown): boolean {
  try {
    return jcs(a) === jcs(b);
  } catch {
    return false;
  }
}

/** A JSON integer 0..2^53-1 (a boolean, a fraction or an exponent is not one). */
export function isInt(v: unknown, min = 0, max = MAX_SAFE): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= min && v <= max;
}

export function isObject(v: unknown): v is JsonObject {
  return typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof JsonFloat);
}

/** Length in Unicode code points (§9). */
export function cpLen(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

export function isStr(v: unknown, min = 0, max = Infinity): v is string {
  if (typeof v !== "string") return false;
  if (v.length > max * 2 + 2 && max !== Infinity) return false;
  const n = cpLen(v);
  return n >= min && n <= max;
}

/** `obj` has exactly `required` members plus any of `optional`. */
export function exactMembers(obj: JsonObject, required: readonly string[], optional: readonly string[] = []): boolean {
  const keys = Object.keys(obj);
  for (const r of required) if (!Object.prototype.hasOwnProperty.call(obj, r)) return false;
  for (const k of keys) if (!required.includes(k) && !optional.includes(k)) return false;
  return true;
}

export function depthOf(v: unknown): number {
  if (Array.isArray(v)) return 1 + Math.max(0, ...v.map(depthOf));
  if (isObject(v)) return 1 + Math.max(0, ...Object.values(v).map(depthOf));
  return 0;
}

export const nowSeconds = (): number => Math.floor(Date.now() / 1000);
export const FRESHNESS = 300;
export function isFresh(ts: number, now: number): boolean {
  return Math.abs(now - ts) <= FRESHNESS;
}
