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

/// Like [`deserialize`], for an optional duration where `"none"` means no limit.
pub fn deserialize_opt<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text == "none" {
        return Ok(None);
    }
    humantime::parse_duration(&text).map(Some).map_err(|e| {
        serde::de::Error::custom(format!(
            "`{text}` is not a duration ({e}); write e.g. `30m`, `7d`, or `none` for no limit"
        ))
    })
}
