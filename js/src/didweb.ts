/**
 * did:web (PROTOCOL.md §2, §12.4) with the address rules of a2a_secure/identity/addresses.py:
 * names that point inside the network are refused before any lookup, IP literals always,
 * resolved addresses must be public unless allow-listed, and the fetch connects to the very
 * address it checked. HTTPS with certificate checks; plain HTTP only to loopback, in
 * development; no redirect; at most 64 KiB after decompression within 5 s.
 */
import { lookup } from "node:dns/promises";
import { request as httpRequest, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import { BlockList, isIP } from "node:net";
import { gunzipSync } from "node:zlib";
import { checkDidSyntax, publicKeyFromMultibase, splitKeyId, type ResolvedDID } from "./did.js";
import { checkPublicKey } from "./ed25519.js";
import { b64uDecodeOrNull, isObject, loads, type Json, type JsonObject } from "./encoding.js";
import { DIDResolutionError } from "./errors.js";

const LABEL_RE = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const SEGMENT_RE = /^[A-Za-z0-9._-]+$/;
const BLOCKED_NAMES = new Set(["localhost", "metadata", "metadata.goog", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"]);
const BLOCKED_SUFFIXES = [".localhost", ".localdomain", ".internal", ".local", ".home.arpa", ".lan", ".home", ".corp", ".intranet", ".metadata.goog"];
const MAX_DOC = 64 * 1024;

const BLOCKED = new BlockList();
for (const [net, bits] of [
  ["0.0.0.0", 8], ["10.0.0.0", 8], ["100.64.0.0", 10], ["127.0.0.0", 8], ["169.254.0.0", 16], ["172.16.0.0", 12], ["192.0.0.0", 24],
  ["192.0.2.0", 24], ["192.88.99.0", 24], ["192.168.0.0", 16], ["198.18.0.0", 15], ["198.51.100.0", 24], ["203.0.113.0", 24],
  ["224.0.0.0", 4], ["240.0.0.0", 4],
] as const) BLOCKED.addSubnet(net, bits, "ipv4");
for (const [net, bits] of [
  ["::", 127], ["64:ff9b:1::", 48], ["100::", 64], ["2001::", 23], ["2001:db8::", 32], ["fc00::", 7], ["fe80::", 10],
  ["fec0::", 10], ["ff00::", 8], ["2002::", 16], ["64:ff9b::", 96],
] as const) BLOCKED.addSubnet(net, bits, "ipv6");
// (IPv4-mapped ::ffff:0:0/96 is not listed: BlockList would match every IPv4 address against
// it; a mapped address is judged by the IPv4 address it carries, in isPublicAddress.)
const LOOPBACK = new BlockList();
LOOPBACK.addSubnet("127.0.0.0", 8, "ipv4");
LOOPBACK.addAddress("::1", "ipv6");

/** Forms that resolvers turn into addresses: 2130706433, 0x7f000001, 127.1, 0177.0.0.1. */
function isIpLiteral(host: string): boolean {
  return isIP(host) !== 0 || /^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$/.test(host);
}

export function hostNameBlocked(host: string): boolean {
  return BLOCKED_NAMES.has(host) || !host.includes(".") || BLOCKED_SUFFIXES.some((s) => host.endsWith(s));
}

/** The embedded IPv4 of an IPv6 form a dual-stack socket may reach (mapped, 6to4, NAT64). */
function embeddedV4(addr: string): string | null {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(addr);
  if (m) return m[1]!;
  return null;
}

export function isPublicAddress(addr: string): boolean {
  const v = isIP(addr);
  if (v === 0) return false;
  const inner = embeddedV4(addr);
  if (inner) return !BLOCKED.check(inner, "ipv4");
  return !BLOCKED.check(addr, v === 4 ? "ipv4" : "ipv6");
}

export interface AddressPolicy {
  allowHosts?: string[];
  /** CIDR networks that may be dialled although not public ("10.1.0.0/16"). */
  allowAddresses?: string[];
  /** Development only: localhost and loopback, over plain HTTP. */
  devAllowLoopback?: boolean;
}

/** host, port and path segments of a did:web, refusing unsafe forms (DIDResolutionError). */
export function didWebHostPort(did: string): { host: string; port: number | null; segments: string[] } {
  checkDidSyntax(did);
  if (!did.startsWith("did:web:")) throw new DIDResolutionError("not a did:web DID");
  const parts = did.slice("did:web:".length).split(":");
  const authority = parts[0]!;
  const segments = parts.slice(1);
  let host = authority;
  let port: number | null = null;
  const idx = authority.toLowerCase().indexOf("%3a");
  if (idx >= 0) {
    host = authority.slice(0, idx);
    const text = authority.slice(idx + 3);
    if (!/^[1-9][0-9]{0,4}$/.test(text) || Number(text) > 65535) throw new DIDResolutionError("did:web port is not a number in 1-65535");
    port = Number(text);
  }
  if (host.includes("%")) throw new DIDResolutionError("did:web host may not be percent-encoded");
  if (!host || host.length > 253 || host.endsWith(".")) throw new DIDResolutionError("did:web host is not a DNS name");
  if (isIpLiteral(host)) throw new DIDResolutionError("did:web may not name an IP address");
  if (!host.split(".").every((l) => LABEL_RE.test(l))) throw new DIDResolutionError("did:web host is not a lower-case DNS name");
  for (const s of segments) if (!SEGMENT_RE.test(s) || s === "." || s === "..") throw new DIDResolutionError("did:web path segment is empty, a dot segment or encoded");
  return { host, port, segments };
}

export function didWebToUrl(did: string): string {
  const { host, port, segments } = didWebHostPort(did);
  const netloc = port === null ? host : `${host}:${port}`;
  return `https://${netloc}/${segments.length ? segments.join("/") + "/did.json" : ".well-known/did.json"}`;
}

function inAllowed(addr: string, nets: string[]): boolean {
  const list = new BlockList();
  for (const n of nets) {
    const [net, bits] = n.split("/");
    const fam = isIP(net!) === 6 ? "ipv6" : "ipv4";
    list.addSubnet(net!, Number(bits ?? (fam === "ipv6" ? 128 : 32)), fam);
  }
  return list.check(addr, isIP(addr) === 6 ? "ipv6" : "ipv4");
}

/** The verification methods of a document usable for authentication, by key id (§2). */
export function keysOfDocument(did: string, doc: Json, now: number): Map<string, Buffer> {
  if (!isObject(doc) || doc.id !== did) throw new DIDResolutionError("the DID document's id is not the DID");
  const methods = new Map<string, JsonObject>();
  const abs = (id: unknown): string | null => (typeof id !== "string" ? null : id.startsWith("#") ? did + id : id);
  for (const m of Array.isArray(doc.verificationMethod) ? doc.verificationMethod : []) if (isObject(m) && abs(m.id)) methods.set(abs(m.id)!, m);
  const keys = new Map<string, Buffer>();
  for (const ref of Array.isArray(doc.authentication) ? doc.authentication : []) {
    const m = isObject(ref) ? ref : methods.get(abs(ref) ?? "");
    const kid = m ? abs(m.id) : null;
    if (!m || !kid || m.controller !== did) continue;
    try {
      if (splitKeyId(kid)[0] !== did) continue;
    } catch {
      continue;
    }
    if ("expires" in m) {
      const t = typeof m.expires === "string" && /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/.test(m.expires) ? Date.parse(m.expires) : NaN;
      if (Number.isNaN(t)) throw new DIDResolutionError("malformed expires in the DID document");
      if (now * 1000 >= t) continue;
    }
    let raw: Buffer | null = null;
    if (m.type === "Multikey" || m.type === "Ed25519VerificationKey2020") raw = publicKeyFromMultibase(m.publicKeyMultibase);
    else if (m.type === "JsonWebKey2020") {
      const j = m.publicKeyJwk;
      if (isObject(j) && j.kty === "OKP" && j.crv === "Ed25519" && !("d" in j)) raw = b64uDecodeOrNull(j.x);
    }
    if (!raw || raw.length !== 32) continue;
    checkPublicKey(raw);
    keys.set(kid, raw);
  }
  if (!keys.size) throw new DIDResolutionError("the DID document lists no usable authentication key");
  return keys;
}

/** A did:web resolver for DIDResolver: `new DIDResolver({ web: didWebResolver(policy) })`. */
export function didWebResolver(policy: AddressPolicy = {}, opts: { timeoutMs?: number; cacheSeconds?: number; ca?: string | Buffer } = {}): (did: string) => Promise<ResolvedDID> {
  const cache = new Map<string, { until: number; value: ResolvedDID }>();
  const timeoutMs = opts.timeoutMs ?? 5000;
  return async (did) => {
    const hit = cache.get(did);
    if (hit && hit.until > Date.now()) return hit.value;
    const { host, port } = didWebHostPort(did);
    const allowHost = policy.allowHosts?.includes(host) ?? false;
    const loopbackName = host === "localhost" || host.endsWith(".localhost");
    if (!allowHost && !(policy.devAllowLoopback && loopbackName) && hostNameBlocked(host)) throw new DIDResolutionError(`did:web host ${host} names no public host`);
    let addrs;
    try {
      addrs = await lookup(host, { all: true, verbatim: true });
    } catch {
      throw new DIDResolutionError(`did:web host ${host} does not resolve`);
    }
    const ok = (a: string): boolean => isPublicAddress(a) || inAllowed(a, policy.allowAddresses ?? []) || (policy.devAllowLoopback === true && LOOPBACK.check(a, isIP(a) === 6 ? "ipv6" : "ipv4"));
    if (!addrs.length || !addrs.every((a) => ok(a.address))) throw new DIDResolutionError(`did:web host ${host} resolves to an address that is not public`);
    const target = addrs[0]!;
    const plainHttp = policy.devAllowLoopback === true && LOOPBACK.check(target.address, target.family === 6 ? "ipv6" : "ipv4");
    const url = new URL(didWebToUrl(did));
    const body = await new Promise<Buffer>((resolve, reject) => {
      const req = (plainHttp ? httpRequest : httpsRequest)({
        host: target.address, family: target.family, port: port ?? (plainHttp ? 80 : 443), path: url.pathname, method: "GET", servername: plainHttp ? undefined : host,
        headers: { host: url.host, accept: "application/did+json, application/json", "accept-encoding": "gzip" }, timeout: timeoutMs, ca: opts.ca,
      } as import("node:https").RequestOptions, (res: IncomingMessage) => {
        if (res.statusCode !== 200) return reject(new DIDResolutionError(`did:web document fetch answered ${res.statusCode}`));
        const type = (res.headers["content-type"] ?? "").split(";")[0]!.trim().toLowerCase();
        if (!/^application\/([a-z.+-]*\+)?json$/.test(type)) return reject(new DIDResolutionError("did:web document is not JSON"));
        const enc = (res.headers["content-encoding"] ?? "identity").toLowerCase();
        if (enc !== "identity" && enc !== "gzip") return reject(new DIDResolutionError("did:web document has an unsupported encoding"));
        const chunks: Buffer[] = [];
        let size = 0;
        res.on("data", (c: Buffer) => {
          size += c.length;
          if (size > MAX_DOC) {
            req.destroy();
            reject(new DIDResolutionError("did:web document too large"));
          } else chunks.push(c);
        });
        res.on("end", () => {
          try {
            const raw = Buffer.concat(chunks);
            resolve(enc === "gzip" ? gunzipSync(raw, { maxOutputLength: MAX_DOC }) : raw);
          } catch {
            reject(new DIDResolutionError("did:web document too large or not gzip"));
          }
        });
      });
      const timer = setTimeout(() => req.destroy(new DIDResolutionError("did:web fetch timed out")), timeoutMs);
      req.on("close", () => clearTimeout(timer));
      req.on("error", (e) => reject(e instanceof DIDResolutionError ? e : new DIDResolutionError(`did:web fetch failed: ${e.message}`)));
      req.end();
    });
    let doc: Json;
    try {
      doc = loads(body);
    } catch {
      throw new DIDResolutionError("did:web document is not I-JSON");
    }
    const value = { did, keys: keysOfDocument(did, doc, Date.now() / 1000) };
    cache.set(did, { until: Date.now() + (opts.cacheSeconds ?? 300) * 1000, value });
    return value;
  };
}
