//! A TCP proxy a test controls, in front of a broker or server on loopback: `stop` cuts
//! every connection and refuses new ones (the service is gone for its clients while it
//! keeps its state), `start_again` lets clients back in; `close_all` closes the connections
//! of the moment and accepts new ones (a server that killed its clients); `hold` stops all
//! traffic without closing anything until released (a network cut: packets vanish, then flow
//! on once it heals); `delay_answers` makes what the server sends arrive late (an answer
//! still on its way).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

/// A proxy forwarding to `127.0.0.1:{target}`; stopped on drop.
pub struct TcpProxy {
    port: u16,
    target: Arc<AtomicU16>,
    up: Arc<AtomicBool>,
    cut: Arc<tokio::sync::Notify>,
    held: tokio::sync::watch::Sender<bool>,
    answer_delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Listen on a free loopback port and forward to `target`.
    pub async fn start(target: u16) -> TcpProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a proxy port");
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let up = Arc::new(AtomicBool::new(true));
        let cut = Arc::new(tokio::sync::Notify::new());
        let (held, watch_held) = tokio::sync::watch::channel(false);
        let answer_delay_ms = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(forward(
            listener,
            target.clone(),
            up.clone(),
            cut.clone(),
            watch_held,
            answer_delay_ms.clone(),
        ));
        TcpProxy {
            port,
            target,
            up,
            cut,
            held,
            answer_delay_ms,
            task,
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Forward new connections to `target` from now on (for a server started after its
    /// proxy, on a port of its own).
    pub fn set_target(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
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

    /// Close every connection open now; new ones are accepted.
    pub fn close_all(&self) {
        self.cut.notify_waiters();
    }

    /// Hold all traffic (`true`) until released (`false`); connections stay open.
    pub fn hold(&self, held: bool) {
        let _ = self.held.send(held);
    }

    /// Deliver each chunk the server sends `delay` after it was sent (requests go through at
    /// once): the server acts on a request before its client hears the answer.
    pub fn delay_answers(&self, delay: Duration) {
        self.answer_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }
}

/// Forward connections to the target while `up`; cut them all when `cut` is notified.
async fn forward(
    listener: tokio::net::TcpListener,
    target: Arc<AtomicU16>,
    up: Arc<AtomicBool>,
    cut: Arc<tokio::sync::Notify>,
    held: tokio::sync::watch::Receiver<bool>,
    answer_delay_ms: Arc<AtomicU64>,
) {
    while let Ok((client, _)) = listener.accept().await {
        if !up.load(Ordering::SeqCst) {
            drop(client); // refused: closed at once
            continue;
        }
        let cut = cut.clone();
        let held = held.clone();
        let target = target.load(Ordering::SeqCst);
        let answer_delay_ms = answer_delay_ms.clone();
        tokio::spawn(async move {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::select! {
                _ = pump(client_read, server_write, held.clone(), None) => {}
                _ = pump(server_read, client_write, held, Some(answer_delay_ms)) => {}
                _ = cut.notified() => {}
            }
        });
    }
}

/// Copy bytes one way, waiting while traffic is held (and by `delay_ms` after each chunk).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: tokio::sync::watch::Receiver<bool>,
    delay_ms: Option<Arc<AtomicU64>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = delay_ms.as_ref().map_or(0, |d| d.load(Ordering::SeqCst));
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if held.wait_for(|h| !h).await.is_err() || to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut.notify_waiters();
    }
}
