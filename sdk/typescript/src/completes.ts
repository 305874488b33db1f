/**
 * Completes sent together: what consume() uses to settle its deliveries with fewer requests.
 *
 * Group commit: while no batch complete is in flight, a complete goes out at once (so one handler
 * at a time pays no wait); the completes asked for while one is in flight wait for it and then go
 * out together in the next one (`POST /messages/complete`). Nothing waits on a timer to fill a
 * batch. Each delivery still gets its own answer or its own error, exactly what its single
 * complete would have thrown (a lease lost is LeaseLostError for that delivery only).
 *
 * A server without the batch call (404 for the route) gets single completes from then on; so does
 * a result too large to share a request, which the server then refuses as it would alone.
 */

import { NotFoundError, RunstateError, errorFromItem } from './errors.js';
import { type Json, type Transport, encodeBody } from './transport.js';

// The server's bound on the items of one batch complete.
const COMPLETE_BATCH_MAX = 100;
// Bytes of one batch's items, well under the server's 256 KiB request body; an item over
// COMPLETE_ITEM_BYTES_MAX (a result near the 64 KiB bound, or over it) goes alone.
const COMPLETE_BATCH_BYTES_MAX = 160 * 1024;
const COMPLETE_ITEM_BYTES_MAX = 16 * 1024;
// Completes waiting for the next batch; past this, a complete goes alone (consume() holds at most
// its concurrency, 1000, deliveries).
const COMPLETES_WAITING_MAX = 2_000;

interface Waiting {
  item: string; // the encoded {id, token, result}
  resolve: (answer: Json) => void;
  reject: (error: unknown) => void;
}

/** Thrown to a waiting complete when the server has no batch call: it is sent alone. */
class NoBatchCall extends Error {}

export class Completes {
  private readonly waiting: Waiting[] = [];
  private sending = false;
  private batchCall = true;

  constructor(private readonly transport: Transport) {}

  /**
   * The answer of complete `body` ({token, result}) of a delivery of `taskId`, sent with others
   * when some are waiting; `single` sends it alone. Throws what the single complete throws.
   */
  async complete(taskId: string, body: Json, single: () => Promise<Json>): Promise<Json> {
    const item = encodeBody({ id: taskId, ...body }); // ConfigError before any request
    if (!this.batchCall || Buffer.byteLength(item) > COMPLETE_ITEM_BYTES_MAX || this.waiting.length >= COMPLETES_WAITING_MAX) {
      return single();
    }
    const answer = new Promise<Json>((resolve, reject) => {
      this.waiting.push({ item, resolve, reject });
    });
    if (!this.sending) void this.sendWhileWaiting();
    try {
      return await answer;
    } catch (error) {
      if (error instanceof NoBatchCall) return single();
      throw error;
    }
  }

  private async sendWhileWaiting(): Promise<void> {
    this.sending = true;
    try {
      while (this.waiting.length > 0) await this.send(this.take());
    } finally {
      this.sending = false;
    }
  }

  /** The oldest waiting completes, up to a batch's bounds. */
  private take(): Waiting[] {
    const batch: Waiting[] = [];
    let size = 0;
    while (this.waiting.length > 0 && batch.length < COMPLETE_BATCH_MAX) {
      const next = this.waiting[0] as Waiting;
      const length = Buffer.byteLength(next.item) + 1;
      if (batch.length > 0 && size + length > COMPLETE_BATCH_BYTES_MAX) break;
      this.waiting.shift();
      batch.push(next);
      size += length;
    }
    return batch;
  }

  private async send(batch: Waiting[]): Promise<void> {
    const body = `{"items":[${batch.map((waiting) => waiting.item).join(',')}]}`;
    let answer: Json;
    try {
      answer = await this.transport.request('POST', '/messages/complete', { encodedBody: body, safe: true });
    } catch (error) {
      if (error instanceof NotFoundError && error.message.startsWith('no route')) {
        // A server without the batch call: these and every later complete go alone.
        this.batchCall = false;
        for (const waiting of batch) waiting.reject(new NoBatchCall());
        return;
      }
      for (const waiting of batch) waiting.reject(error);
      return;
    }
    const items = answer.items;
    if (!Array.isArray(items) || items.length !== batch.length) {
      const error = new RunstateError("the batch complete's answer does not list every item", { code: 'INVALID_RESPONSE', status: null });
      for (const waiting of batch) waiting.reject(error);
      return;
    }
    batch.forEach((waiting, index) => {
      const item: unknown = items[index];
      const refusal = item && typeof item === 'object' ? (item as Json).error : undefined;
      if (refusal && typeof refusal === 'object') waiting.reject(errorFromItem(refusal as { code?: string; message?: string }));
      else if (item && typeof item === 'object') waiting.resolve(item as Json);
      else waiting.reject(new RunstateError("an item of the batch complete's answer is not an object", { code: 'INVALID_RESPONSE', status: null }));
    });
  }
}
