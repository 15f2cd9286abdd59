//! Receiving `wharf_ready` notifications and waking the processors of that queue.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::queue::WakeFn;
use crate::queue::notify::READY_CHANNEL;

/// Forward `wharf_ready` notifications to `wake` until shutdown, reconnecting after
/// connection loss (logged once per outage).
pub(in crate::queue) async fn listen_for_ready(
    pool: PgPool,
    wake: WakeFn,
    shutdown: CancellationToken,
) {
    let mut failing = false;
    while !shutdown.is_cancelled() {
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(READY_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(l) => l,
            Err(e) => {
                if !failing {
                    tracing::error!(
                        "cannot listen for enqueue notifications (falling back to polling, retrying): {e}"
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
            tracing::info!("listening for enqueue notifications again");
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
                        tracing::error!("enqueue notifications interrupted, reconnecting: {e}");
                        failing = true;
                        break;
                    }
                }
            }
        }
    }
}
