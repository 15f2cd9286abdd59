//! `wharf run`: start the host and stop it gracefully on SIGINT/SIGTERM (a second signal
//! exits at once).

use crate::config::{Config, HandlersSource};

/// Problems that do not stop start-up but deserve a line (e.g. a handler not deployed yet).
pub fn deployment_warnings(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if config.host.handlers_source == HandlersSource::Store {
        // The store's versions are known once the host has read them.
        return out;
    }
    for (queue, q) in &config.queues {
        let Some(handler) = q.handler() else {
            continue;
        };
        let file = config.host.handlers_dir.join(format!("{handler}.wasm"));
        if !file.exists() {
            out.push(format!(
                "queues.{queue}.handler: {} does not exist yet; the queue waits until it is deployed",
                file.display()
            ));
        }
    }
    out
}

/// Run until a shutdown signal.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let tracing = crate::telemetry::start_if(config.traces.as_ref())?;
    let host = crate::host::start(config).await?;
    let token = host.shutdown_token();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(
            "shutdown requested: finishing in-flight messages (send the signal again to exit now)"
        );
        token.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting now; leases of unfinished messages will expire");
        std::process::exit(130);
    });
    host.wait().await;
    if let Some(tracing) = tracing {
        tracing.finish().await;
    }
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
