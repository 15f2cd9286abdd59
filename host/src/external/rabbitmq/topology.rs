//! Declaring a queue's topology: the durable fan-out exchange and, bound to it, the durable
//! processing and readiness queues, with the queue type and priority arguments of the
//! settings. Idempotent; a conflicting existing declaration is a protocol error that quotes
//! the broker (and closes the channel it was made on).

use lapin::Channel;
use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

use super::{QueueType, RabbitSettings, error};
use crate::external::ProviderError;

/// Declare `queue`'s exchange and queues on `channel`.
pub(super) async fn declare(
    channel: &Channel,
    settings: &RabbitSettings,
    queue: &str,
) -> Result<(), ProviderError> {
    let names = settings.names(queue);
    let declared = |what: &str, name: &str| {
        let what = format!("declaring the {what} `{name}` of queue `{queue}`");
        move |e: lapin::Error| {
            let mut e = error(e);
            e.message = format!(
                "{what}: {} (an existing declaration with other arguments must be deleted or migrated first)",
                e.message
            );
            e
        }
    };
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .exchange_declare(
            &names.exchange,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(declared("exchange", &names.exchange))?;
    for (name, processing) in [(&names.processing, true), (&names.readiness, false)] {
        channel
            .queue_declare(name, durable, arguments(settings, processing))
            .await
            .map_err(declared("queue", name))?;
        channel
            .queue_bind(
                name,
                &names.exchange,
                "",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(declared("binding of queue", name))?;
    }
    Ok(())
}

/// The arguments of a processing (or readiness) queue.
fn arguments(settings: &RabbitSettings, processing: bool) -> FieldTable {
    let mut args = FieldTable::default();
    match settings.queue_type {
        QueueType::Quorum => {
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
        }
        QueueType::Classic => {
            if let (true, Some(max)) = (processing, settings.max_priority) {
                args.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(max));
            }
        }
    }
    if processing && settings.single_active_consumer {
        args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    }
    args
}
