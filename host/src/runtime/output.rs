//! Guest stdout and stderr, turned into `tracing` lines tagged with the handler name
//! (stdout at info, stderr at warn). Partial lines are flushed when the instance ends.

use std::sync::Arc;

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Longest line kept before it is emitted anyway.
const MAX_LINE: usize = 16 * 1024;

/// Which guest stream.
#[derive(Debug, Clone, Copy)]
pub enum Channel {
    /// Guest stdout: info.
    Stdout,
    /// Guest stderr: warn.
    Stderr,
}

/// A `StdoutStream` that logs each line the guest writes.
#[derive(Clone)]
pub struct LogStream {
    handler: Arc<str>,
    channel: Channel,
    /// The call's `handle` span, which gets each line as an event.
    trace: Option<super::invoke::CallTrace>,
}

impl LogStream {
    /// A stream for one handler's stdout or stderr.
    pub fn new(
        handler: Arc<str>,
        channel: Channel,
        trace: Option<super::invoke::CallTrace>,
    ) -> Self {
        LogStream {
            handler,
            channel,
            trace,
        }
    }
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LineWriter {
            stream: self.clone(),
            buf: Vec::new(),
        })
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LineWriter {
            stream: self.clone(),
            buf: Vec::new(),
        })
    }
}

struct LineWriter {
    stream: LogStream,
    buf: Vec<u8>,
}

impl LineWriter {
    fn emit(&self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches('\r');
        let handler = &*self.stream.handler;
        let cx = self.stream.trace.as_ref().and_then(|t| t.get());
        if let Some(cx) = cx {
            let level = match self.stream.channel {
                Channel::Stdout => "INFO",
                Channel::Stderr => "WARN",
            };
            crate::telemetry::log_event(cx, level, text);
        }
        // Written only for a line that is logged.
        let trace_id = cx.map(|cx| tracing::field::display(crate::telemetry::TraceId(cx)));
        let span_id = cx.map(|cx| tracing::field::display(crate::telemetry::SpanId(cx)));
        match self.stream.channel {
            Channel::Stdout => {
                tracing::info!(target: "wharf::guest", handler, stream = "stdout", trace_id, span_id, "{text}")
            }
            Channel::Stderr => {
                tracing::warn!(target: "wharf::guest", handler, stream = "stderr", trace_id, span_id, "{text}")
            }
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            self.emit(&line[..line.len() - 1]);
        }
        if self.buf.len() > MAX_LINE {
            let line = std::mem::take(&mut self.buf);
            self.emit(&line);
        }
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            self.emit(&line);
        }
    }
}

impl OutputStream for LineWriter {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(MAX_LINE)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LineWriter {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for LineWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.push(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
