"""Sample handler: parses an order, logs it, and enqueues a follow-up notification; an order
with a zero total fails permanently. The same handler as the Rust `order-export` sample.

Build: `cargo xtask guests` (or, in this folder, with componentize-py installed:
`componentize-py -d ../../../wit/handler.wit -w handler componentize app -o order-export.wasm`).
"""
import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import host, types


class WitWorld(wit_world.WitWorld):
    def handle(self, message: types.Message) -> types.Outcome:
        order = json.loads(message.payload)
        if order["total_cents"] == 0:
            raise Err(types.HandlerError_Permanent(f"order {order['order_id']} has a zero total"))
        total = order["total_cents"] / 100
        host.log(
            types.Level.INFO,
            f"v1 exporting order {order['order_id']} for {order['customer']} ({total:.2f})",
        )
        note = {
            "order_id": order["order_id"],
            "text": f"order {order['order_id']} exported",
            "exported_by": "order-export v1 (Python)",
        }
        try:
            host.enqueue("notifications", json.dumps(note), types.EnqueueOptions(None, None, None, []))
        except Err as e:
            # A failed enqueue (store down) is worth another attempt.
            raise Err(types.HandlerError_Transient(f"enqueue failed: {e.value}"))
        return types.Outcome_Completed()
