//! Receiving notifications on a channel (`wharf_ready`: a queue has a ready message;
//! `wharf_handlers`: a handler's current version changed) and passing their payloads on.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::queue::WakeFn;

/// Forward the notifications of `channel` to `wake` (`None`: some may have been missed, after
/// a reconnect) until shutdown, reconnecting after connection loss (logged once per outage).
pub(in crate::queue) async fn listen_on(
    pool: PgPool,
    channel: &'static str,
    wake: WakeFn,
    shutdown: CancellationToken,
) {
    let mut failing = false;
    while !shutdown.is_cancelled() {
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(l) => l,
            Err(e) => {
                if !failing {
                    tracing::error!(
                        "cannot listen for notifications on `{channel}` (falling back to polling, retrying): {e}"
                    );
                    failing = true;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        if std::mem::take(&mut failing) {
            tracing::info!("listening for notifications on `{channel}` again");
        }
        // Notifications may have been missed while disconnected: wake everyone once.
        wake(None);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                received = listener.try_recv() => match received {
                    Ok(Some(note)) => wake(Some(note.payload())),
                    Ok(None) => { wake(None); }
                    Err(e) => {
                        tracing::error!("notifications on `{channel}` interrupted, reconnecting: {e}");
                        failing = true;
                        break;
                    }
                }
            }
        }
    }
}
