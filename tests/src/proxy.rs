//! A TCP proxy a test controls, in front of a broker or server on loopback: `stop` cuts
//! every connection and refuses new ones (the service is gone for its clients while it
//! keeps its state), `start_again` lets clients back in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A proxy forwarding to `127.0.0.1:{target}`; stopped on drop.
pub struct TcpProxy {
    port: u16,
    up: Arc<AtomicBool>,
    cut: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Listen on a free loopback port and forward to `target`.
    pub async fn start(target: u16) -> TcpProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a proxy port");
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let cut = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn(forward(listener, target, up.clone(), cut.clone()));
        TcpProxy {
            port,
            up,
            cut,
            task,
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cut every connection and refuse new ones.
    pub fn stop(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    /// Let clients in again.
    pub fn start_again(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// Forward connections to the target while `up`; cut them all when `cut` is notified.
async fn forward(
    listener: tokio::net::TcpListener,
    target: u16,
    up: Arc<AtomicBool>,
    cut: Arc<tokio::sync::Notify>,
) {
    while let Ok((mut client, _)) = listener.accept().await {
        if !up.load(Ordering::SeqCst) {
            drop(client); // refused: closed at once
            continue;
        }
        let cut = cut.clone();
        tokio::spawn(async move {
            let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = cut.notified() => {}
            }
        });
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut.notify_waiters();
    }
}
