"""{{name}}: a Wharf message handler. `handle` runs once per message, on a fresh instance.
Errors are raised as `Err(HandlerError_…)`; any other exception traps."""
import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import host, types


class WitWorld(wit_world.WitWorld):
    def handle(self, message: types.Message) -> types.Outcome:
        try:
            payload = json.loads(message.payload)
        except ValueError as e:
            # Bad data never succeeds: fail the message at once, kept for inspection.
            raise Err(types.HandlerError_Permanent(f"not the expected payload: {e}"))
        if not isinstance(payload, dict):
            raise Err(types.HandlerError_Permanent("not the expected payload: expected a JSON object"))
        name = payload.get("name", "world")
        host.log(types.Level.INFO, f"hello, {name} (attempt {message.attempt})")
        reply_to = next((v for k, v in message.headers if k == "reply-to"), None)
        if reply_to:
            try:
                host.enqueue(reply_to, json.dumps({"greeting": f"hello, {name}"}),
                             types.EnqueueOptions(None, None, None, []))
            except Err as e:
                # A refused enqueue is worth another attempt.
                raise Err(types.HandlerError_Transient(f"enqueue failed: {e.value}"))
        return types.Outcome_Completed()
