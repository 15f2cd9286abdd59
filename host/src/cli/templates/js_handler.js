// {{name}}: a Wharf message handler. `handle` runs once per message, on a fresh instance.
// Conventions: records are camelCase, u64 is a Number, variants are {tag, val}, and an
// error result is thrown as a plain {tag, val} value (throwing an Error traps).
import { enqueue, log } from 'wharf:handler/host@0.1.0';

export function handle(message) {
  let payload;
  try {
    payload = JSON.parse(message.payload);
  } catch (e) {
    // Bad data never succeeds: fail the message at once, kept for inspection.
    throw { tag: 'permanent', val: `not the expected payload: ${e}` };
  }
  if (payload === null || typeof payload !== 'object' || Array.isArray(payload)) {
    throw { tag: 'permanent', val: 'not the expected payload: expected a JSON object' };
  }
  const name = payload.name ?? 'world';
  log('info', `hello, ${name} (attempt ${message.attempt})`);
  const replyTo = message.headers.find(([k]) => k === 'reply-to');
  if (replyTo) {
    try {
      enqueue(replyTo[1], JSON.stringify({ greeting: `hello, ${name}` }), { headers: [] });
    } catch (e) {
      // A refused enqueue is worth another attempt.
      throw { tag: 'transient', val: `enqueue failed: ${e.payload ?? e}` };
    }
  }
  return { tag: 'completed' };
}
