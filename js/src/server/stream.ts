/** A stream's events as they come (§6.4): kept for the listeners and for a byte-identical
 * retry, which gets the recorded events again and then the live ones. */
import { dumps, type Json, type JsonObject } from "../encoding.js";
import { SessionUnknown, type A2AError } from "../errors.js";
import { checkResult, handlerError, withTimeout } from "./common.js";

export interface StreamItem {
  final: boolean;
  status: "success" | "error";
  result?: Json;
  code?: number;
  message?: string;
}

export type WireEvent = JsonObject & { final: boolean };

export const KEEPALIVE_MS = 15_000;
export const MAX_KEPT = 256;
export const MAX_KEPT_BYTES = 1 << 20;

/** The weight of an item for the replay bound: the UTF-8 length of its result's JSON. */
export const resultBytes = (item: StreamItem): number => (item.status === "success" ? Buffer.byteLength(dumps(item.result ?? null)) : 0);

export class StreamRecord<T extends { final: boolean }> {
  readonly items: T[] = [];
  private waiters: (() => void)[] = [];
  private listeners: ((item: T, index: number) => void)[] = [];
  private resolveFinished!: () => void;
  readonly finished = new Promise<void>((r) => (this.resolveFinished = r));
  /** How many leading items a replay may send again (§6.4): at most MAX_KEPT, whose results'
   * JSON adds up to at most MAX_KEPT_BYTES; the first item that does not fit stops the count. */
  kept = 0;
  private keptBytes = 0;
  private cut = false;

  constructor(private readonly weigh?: (item: T) => number) {}

  get done(): boolean {
    return this.items.length > 0 && this.items[this.items.length - 1]!.final;
  }

  push(item: T): void {
    if (this.done) return;
    this.items.push(item);
    if (!this.cut) {
      const w = this.weigh ? this.weigh(item) : 0;
      if (this.kept < MAX_KEPT && this.keptBytes + w <= MAX_KEPT_BYTES) {
        this.kept++;
        this.keptBytes += w;
      } else this.cut = true;
    }
    for (const l of this.listeners) l(item, this.items.length - 1);
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
    if (item.final) this.resolveFinished();
  }

  /** Call `fn` with each item pushed from now on. */
  listen(fn: (item: T, index: number) => void): void {
    this.listeners.push(fn);
  }

  /** A record that follows this one, each item mapped once, in order. */
  map<U extends { final: boolean }>(fn: (item: T, index: number) => U): StreamRecord<U> {
    const out = new StreamRecord<U>();
    this.items.forEach((item, i) => out.push(fn(item, i)));
    this.listeners.push((item, i) => out.push(fn(item, i)));
    return out;
  }

  private next(): Promise<boolean> {
    return new Promise((r) => {
      const t = setTimeout(() => r(false), KEEPALIVE_MS);
      this.waiters.push(() => {
        clearTimeout(t);
        r(true);
      });
    });
  }

  /** The SSE text of this record under a JSON-RPC id, keep-alives between events. */
  async *sse(this: StreamRecord<WireEvent>, id: Json): AsyncGenerator<string> {
    let i = 0;
    for (;;) {
      while (i < this.items.length) {
        const item = this.items[i]!;
        yield `id: ${i}\ndata: ${dumps({ jsonrpc: "2.0", id, result: item })}\n\n`;
        i++;
        if (item.final) return;
      }
      if (!(await this.next())) yield ": keep-alive\n\n";
    }
  }
}

/** Run a stream's source into `record` in the background; resolve with the error to
 * answer as JSON when it fails before its first event, else null once it has one. */
export function pump(source: AsyncIterable<Json>, record: StreamRecord<StreamItem>, timeoutMs: number, single: boolean, sessionAlive: () => boolean): Promise<A2AError | null> {
  const it = source[Symbol.asyncIterator]();
  return new Promise((resolveFirst) => {
    let first = true;
    const put = (item: StreamItem): void => {
      record.push(item);
      if (first) {
        first = false;
        resolveFirst(null);
      }
    };
    void (async () => {
      for (;;) {
        let n: IteratorResult<Json>;
        try {
          n = await withTimeout(it.next(), timeoutMs);
          if (!n.done) checkResult(n.value);
        } catch (e) {
          const err = handlerError(e);
          if (first) return resolveFirst(err);
          put({ final: true, status: "error", code: err.code, message: err.message });
          return;
        }
        if (!sessionAlive()) {
          if (first) return resolveFirst(new SessionUnknown());
          put({ final: true, status: "error", code: -32043, message: "unknown, expired or closed session" });
          return;
        }
        if (n.done) return put({ final: true, status: "success", result: null });
        if (single) return put({ final: true, status: "success", result: n.value });
        put({ final: false, status: "success", result: n.value });
      }
    })();
  });
}
