//! Sample handler, version 2: like `order-export`, and also tags the notification with the
//! customer, so the hot deploy in the demo is visible in the follow-up messages.

use serde::{Deserialize, Serialize};
use wharf_guest::{EnqueueOptions, Handler, HandlerError, Message, Outcome, export_handler, log};

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
        log::info(&format!(
            "v2 exporting order {} for {} ({} cents)",
            order.order_id, order.customer, order.total_cents
        ));
        let note = Notification {
            order_id: &order.order_id,
            text: format!("order {} for {} exported", order.order_id, order.customer),
            exported_by: "order-export v2",
        };
        let options = EnqueueOptions {
            id: Some(format!("notify-{}", order.order_id)),
            ..EnqueueOptions::default()
        };
        wharf_guest::enqueue_with("notifications", &note, options)
            .map_err(HandlerError::transient)?;
        Ok(Outcome::Completed)
    }
}

export_handler!(OrderExport);
