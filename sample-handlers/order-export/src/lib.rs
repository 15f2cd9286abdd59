//! Sample handler: parses an order, logs it, and enqueues a follow-up notification; an
//! order with a zero total fails permanently. The same handler exists in JavaScript
//! (`sample-handlers/js/order-export.js`) and Python (`sample-handlers/python/order-export`).

use serde::{Deserialize, Serialize};
use wharf_guest::{Handler, HandlerError, Message, Outcome, export_handler, log};

/// The order payload this handler expects.
#[derive(Deserialize)]
struct Order {
    order_id: String,
    customer: String,
    total_cents: u64,
}

/// The follow-up message this handler sends.
#[derive(Serialize)]
struct Notification<'a> {
    order_id: &'a str,
    text: String,
    exported_by: &'a str,
}

struct OrderExport;

impl Handler for OrderExport {
    type Payload = Order;

    fn handle(message: Message<Order>) -> Result<Outcome, HandlerError> {
        let order = &message.payload;
        if order.total_cents == 0 {
            return Err(HandlerError::permanent(format!(
                "order {} has a zero total",
                order.order_id
            )));
        }
        log::info(&format!(
            "v1 exporting order {} for {} ({}.{:02})",
            order.order_id,
            order.customer,
            order.total_cents / 100,
            order.total_cents % 100
        ));
        let note = Notification {
            order_id: &order.order_id,
            text: format!("order {} exported", order.order_id),
            exported_by: "order-export v1",
        };
        wharf_guest::enqueue("notifications", &note).map_err(HandlerError::transient)?;
        Ok(Outcome::Completed)
    }
}

export_handler!(OrderExport);
