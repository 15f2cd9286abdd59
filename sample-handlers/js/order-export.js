// Sample handler: parses an order, logs it, and enqueues a follow-up notification; an order
// with a zero total fails permanently. The same handler as the Rust `order-export` sample.
//
// Build: `cargo xtask guests` (or, in this folder after `npm ci`:
//   npx jco componentize order-export.js --wit ../../wit/handler.wit --world-name handler \
//     --backend qjs --backend-qjs-disable-async -o order-export.wasm)
import { enqueue, log } from 'wharf:handler/host@0.1.0';

export function handle(message) {
  const order = JSON.parse(message.payload);
  if (order.total_cents === 0) {
    // An error result is thrown as a plain {tag, val} value.
    throw { tag: 'permanent', val: `order ${order.order_id} has a zero total` };
  }
  const total = (order.total_cents / 100).toFixed(2);
  log('info', `v1 exporting order ${order.order_id} for ${order.customer} (${total})`);
  const note = {
    order_id: order.order_id,
    text: `order ${order.order_id} exported`,
    exported_by: 'order-export v1 (JavaScript)',
  };
  try {
    enqueue('notifications', JSON.stringify(note), { headers: [] });
  } catch (e) {
    // A failed enqueue (store down) is worth another attempt.
    throw { tag: 'transient', val: `enqueue failed: ${e.payload ?? e}` };
  }
  return { tag: 'completed' };
}
