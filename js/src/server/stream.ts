/** A stream's events as they come (§6.4): kept for the listeners and for a byte-identical
 * retry, which gets the recorded events again and then the live ones. */
import { dumps, type Json, type JsonObject } from "../encoding.js";

export interface StreamItem {
  final: boolean;
  status: "success" | "error";
  result?: Json;
  code?: number;
  message?: string;
}

export type WireEvent = JsonObject & { final: boolean };

export const KEEPALIVE_MS = 15_000;

export class StreamRecord<T extends { final: boolean }> {
  readonly items: T[] = [];
  private waiters: (() => void)[] = [];
  private listeners: ((item: T, index: number) => void)[] = [];
  private resolveFinished!: () => void;
  readonly finished = new Promise<void>((r) => (this.resolveFinished = r));

  get done(): boolean {
    return this.items.length > 0 && this.items[this.items.length - 1]!.final;
  }

  push(item: T): void {
    if (this.done) return;
    this.items.push(item);
    for (const l of this.listeners) l(item, this.items.length - 1);
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
    if (item.final) this.resolveFinished();
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
