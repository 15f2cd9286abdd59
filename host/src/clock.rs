//! The clock every stored timestamp is read from: milliseconds since the Unix epoch.

/// Milliseconds since the Unix epoch, the time unit of every stored timestamp.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
