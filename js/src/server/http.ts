/** Thin adapters of the server core: Node's `http` and any Fetch-API framework (§4). */
import type { IncomingMessage, ServerResponse } from "node:http";
import { dumps } from "../encoding.js";
import { A2AError, HTTPMethodNotAllowed, MethodNotFound, PayloadTooLarge, UnsupportedMediaType } from "../errors.js";
import { ENDPOINTS, type Reply, type ServerCore } from "./core.js";

export const MAX_BODY = 1 << 20;
const CARD_PATH = "/.well-known/agent-card.json";

/** RFC 9110 §8.3.1: `application/json`, optionally the one parameter `charset=utf-8`. */
export function contentTypeOk(value: string | null | undefined): boolean {
  if (!value) return false;
  const parts = value.split(";");
  if (parts[0]!.trim().toLowerCase() !== "application/json") return false;
  let charset = 0;
  for (const raw of parts.slice(1)) {
    const p = raw.trim();
    if (p === "") continue;
    const m = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+)=("utf-8"|utf-8)$/i.exec(p);
    if (!m || m[1]!.toLowerCase() !== "charset") return false;
    if (++charset > 1) return false;
  }
  return true;
}

function errorReply(e: A2AError, headers: Record<string, string> = {}): Reply {
  return {
    status: e.http,
    headers: { "content-type": "application/json", ...headers },
    body: dumps({ jsonrpc: "2.0", id: null, error: { code: e.code, message: e.message } }),
  };
}

/** The routing every adapter shares: `readBody(limit)` returns the body or null when it
 * crossed the limit (counted while read, whatever Content-Length says). */
export async function route(
  core: ServerCore, method: string, path: string, contentType: string | null | undefined,
  readBody: (limit: number) => Promise<Uint8Array | null>, source: string,
): Promise<Reply> {
  if (path === CARD_PATH) {
    if (method !== "GET" && method !== "HEAD") return errorReply(new HTTPMethodNotAllowed(), { allow: "GET" });
    return { status: 200, headers: { "content-type": "application/json" }, body: dumps(core.card().card) };
  }
  if (path !== ENDPOINTS.handshake && path !== ENDPOINTS.intent) return errorReply(new MethodNotFound(`no such endpoint: ${path.slice(0, 128)}`));
  if (method !== "POST") return errorReply(new HTTPMethodNotAllowed(), { allow: "POST" });
  if (!contentTypeOk(contentType)) return errorReply(new UnsupportedMediaType());
  const body = await readBody(MAX_BODY);
  if (body === null) return errorReply(new PayloadTooLarge(), { connection: "close" });
  return core.handle(path, body, source);
}

/** A `(req, res)` listener for `http.createServer`. */
export function nodeHandler(core: ServerCore): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const path = (req.url ?? "/").split("?")[0]!;
    const readBody = (limit: number): Promise<Uint8Array | null> =>
      new Promise((resolve, reject) => {
        const chunks: Buffer[] = [];
        let size = 0;
        let over = false;
        req.on("data", (c: Buffer) => {
          size += c.length;
          if (size > limit) {
            if (!over) {
              over = true;
              resolve(null);
            }
            return;
          }
          chunks.push(c);
        });
        req.on("end", () => over || resolve(Buffer.concat(chunks)));
        req.on("error", reject);
      });
    route(core, req.method ?? "GET", path, req.headers["content-type"], readBody, req.socket.remoteAddress ?? "unknown")
      .then(async (reply) => {
        res.writeHead(reply.status, reply.headers);
        if ("body" in reply) return void res.end(reply.body);
        res.flushHeaders();
        for await (const chunk of reply.stream) {
          if (res.destroyed) break; // the handler still runs to its end (§6.4)
          res.write(chunk);
        }
        res.end();
      })
      .catch((e: unknown) => {
        console.error("a2a-secure: adapter error:", (e as Error)?.message);
        if (!res.headersSent) {
          res.writeHead(500, { "content-type": "application/json" });
          res.end(dumps({ jsonrpc: "2.0", id: null, error: { code: -32603, message: "internal error" } }));
        } else res.destroy();
      });
  };
}

/** One handler for Fetch-API frameworks (Hono, Workers, Deno, Bun): `(Request) => Promise<Response>`.
 * A Request carries no peer address: `sourceOf` names the source address the per-source bounds
 * count (§5), as the framework knows it (`c.env.incoming.socket.remoteAddress`, Workers'
 * `CF-Connecting-IP`). Without it every request counts as one source "unknown", which bounds
 * all peers together; never pass a header a client can set itself unless a proxy you run
 * overwrites it. */
export function fetchHandler(core: ServerCore, opts: { sourceOf?: (request: Request) => string } = {}): (request: Request) => Promise<Response> {
  return async (request) => {
    const url = new URL(request.url);
    const readBody = async (limit: number): Promise<Uint8Array | null> => {
      if (!request.body) return new Uint8Array();
      const reader = request.body.getReader();
      const chunks: Uint8Array[] = [];
      let size = 0;
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        size += value.length;
        if (size > limit) {
          await reader.cancel().catch(() => undefined);
          return null;
        }
        chunks.push(value);
      }
      return Buffer.concat(chunks);
    };
    const reply = await route(core, request.method, url.pathname, request.headers.get("content-type"), readBody, opts.sourceOf?.(request) ?? "unknown");
    if ("body" in reply) return new Response(reply.body, { status: reply.status, headers: reply.headers });
    const it = reply.stream[Symbol.asyncIterator]();
    const enc = new TextEncoder();
    const body = new ReadableStream<Uint8Array>({
      async pull(ctrl) {
        const n = await it.next();
        if (n.done) ctrl.close();
        else ctrl.enqueue(enc.encode(n.value));
      },
      async cancel() {
        await it.return?.(undefined);
      },
    });
    return new Response(body, { status: 200, headers: reply.headers });
  };
}
