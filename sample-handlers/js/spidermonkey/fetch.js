// Fixture: sends `method` (default POST, with a body) to the `url` of the message payload
// with `fetch` and completes with the response logged, after enqueueing the payload's `then`
// (`{queue, payload}`) as a follow-up if it has one; a refused or failed request is a
// transient error carrying the reason. Built with the SpiderMonkey engine and its `http` feature (outbound `fetch`),
// which the host links only for handlers with `allowed_outbound_hosts`.
import { enqueue, log } from 'wharf:handler/host@0.1.0';

export async function handle(message) {
  const { url, method = 'POST', then } = JSON.parse(message.payload);
  let response;
  try {
    const body = method === 'POST' ? `from ${message.id}` : undefined;
    response = await fetch(url, { method, body });
  } catch (e) {
    throw { tag: 'transient', val: `fetch ${url} failed: ${e}` };
  }
  const body = await response.text();
  log('info', `fetched ${url}: ${response.status} ${body}`);
  if (!response.ok) {
    throw { tag: 'transient', val: `fetch ${url} answered ${response.status}` };
  }
  if (then) {
    enqueue(then.queue, JSON.stringify(then.payload), { headers: [] });
  }
  return { tag: 'completed' };
}
