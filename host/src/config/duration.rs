//! Durations in the configuration, written as `500ms`, `30s`, `5m`, `1h 30m`, `7d`.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Deserialize a duration string with an error that says what is wrong and what fits.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "`{text}` is not a duration ({e}); write e.g. `500ms`, `30s`, `5m`, `1h`, `7d`"
        ))
    })
}
