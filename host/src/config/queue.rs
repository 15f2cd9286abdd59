//! `[queues.NAME]`: one queue's keys and their defaults.

use std::path::Path;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

use super::{ConfigError, QueueInboxConfig, QueueStorage, duration};
use crate::rate_limit::{Limit, Rate};

/// A rate-limited queue's `burst` when it sets none: messages are evenly spaced.
pub const DEFAULT_BURST: u32 = 1;

/// The most a queue without a `concurrency` setting processes at once.
pub const AUTO_CONCURRENCY: u32 = 64;

/// `[queues.NAME]`: one queue and the handler that processes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// Name of the handler component (`handlers_dir/NAME.wasm`); `None` for a queue that
    /// only holds what is enqueued into it (read with the CLI or the API, or by another
    /// system), which runs nothing.
    #[serde(default)]
    pub handler: Option<String>,
    /// `concurrency` as set in the file; unset means automatic (see `concurrency`).
    #[serde(default, rename = "concurrency")]
    pub concurrency_setting: Option<u32>,
    /// Most messages of this queue processed at once: the setting, or when it is unset an
    /// equal share of the instances `host.max_instances` leaves to the queues that do not
    /// set it, at most [`AUTO_CONCURRENCY`]; 0 for a queue without a handler. Resolved when
    /// the configuration is loaded.
    #[serde(skip)]
    pub concurrency: u32,
    /// Attempts before a message is failed (the first delivery counts).
    #[serde(default = "QueueConfig::default_max_attempts")]
    pub max_attempts: u32,
    /// How long a lease lasts; an expired lease makes the message available again.
    #[serde(
        default = "QueueConfig::default_lease",
        deserialize_with = "duration::deserialize"
    )]
    pub lease: Duration,
    /// Longest a single `handle` call may run before it is interrupted.
    #[serde(
        default = "QueueConfig::default_timeout",
        deserialize_with = "duration::deserialize"
    )]
    pub timeout: Duration,
    /// First retry delay; doubled on each later attempt, with jitter.
    #[serde(
        default = "QueueConfig::default_backoff",
        deserialize_with = "duration::deserialize"
    )]
    pub backoff: Duration,
    /// Longest retry delay.
    #[serde(
        default = "QueueConfig::default_max_backoff",
        deserialize_with = "duration::deserialize"
    )]
    pub max_backoff: Duration,
    /// Most messages leased per round trip to the store: at most the free concurrency, but up
    /// to this many ahead of it while the handlers are fast.
    #[serde(default = "QueueConfig::default_batch")]
    pub batch: u32,
    /// The largest payload an enqueue may carry (default 1 MiB); larger ones are refused,
    /// and a larger broker message is moved into the SQL queue as failed.
    #[serde(default = "QueueConfig::default_max_payload")]
    pub max_payload: ByteSize,
    /// Discard an enqueue whose payload equals (as JSON values) the latest version of the
    /// message with the same id.
    #[serde(default)]
    pub idempotent: bool,
    /// When a lease expires: `true` makes the message available again (failed once it used
    /// its last attempt); `false` fails it.
    #[serde(default = "super::yes")]
    pub retry_abandoned: bool,
    /// How long processed messages and previous versions are kept.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// The endpoint name the consumer inbox keys on (default: the queue name).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The consumer inbox (opt-in).
    #[serde(default)]
    pub inbox: Option<QueueInboxConfig>,
    /// Where pending messages live: `sql` (default) or `external`.
    #[serde(default)]
    pub storage: QueueStorage,
    /// With `storage = "external"`: the `[providers.NAME]` holding the pending messages.
    #[serde(default)]
    pub provider: Option<String>,
    /// External queues: whether an enqueue with a MessageId replaces the pending message
    /// with that id. Default: what the provider can do; `true` with a provider that cannot
    /// is a configuration error.
    #[serde(default)]
    pub replace_by_id: Option<bool>,
    /// Ordered sessions: messages that share a session key run one at a time, in enqueue
    /// order, and a failure blocks only its session (see docs/sessions.md). SQL queues only.
    #[serde(default)]
    pub sessions: bool,
    /// The most messages leased per second, minute or hour (`"200/s"`, `"30/min"`,
    /// `"1000/h"`), across every host sharing the SQL store (per host on an external queue).
    #[serde(default)]
    pub rate_limit: Option<String>,
    /// With `rate_limit`: how many messages may start at once after a quiet spell (default
    /// 1: evenly spaced).
    #[serde(default)]
    pub burst: Option<u32>,
}

/// `[queues.NAME.retention]`: how long processed messages and history are kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Delete processed messages older than this (`"0s"`: keep no age limit... use `count`).
    #[serde(deserialize_with = "duration::deserialize_opt")]
    pub age: Option<Duration>,
    /// Keep at most this many processed messages; `0` deletes them on completion (an
    /// identified message's processed version is still recorded in its history).
    pub count: Option<u64>,
    /// Previous versions kept per identified message.
    pub history_versions: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            age: Some(Duration::from_secs(7 * 24 * 3600)),
            count: None,
            history_versions: 10,
        }
    }
}

impl QueueConfig {
    fn default_max_attempts() -> u32 {
        5
    }
    fn default_lease() -> Duration {
        Duration::from_secs(30)
    }
    fn default_timeout() -> Duration {
        Duration::from_secs(10)
    }
    fn default_backoff() -> Duration {
        Duration::from_secs(1)
    }
    fn default_max_backoff() -> Duration {
        Duration::from_secs(300)
    }
    fn default_batch() -> u32 {
        256
    }

    fn default_max_payload() -> ByteSize {
        ByteSize::b(crate::queue::limits::DEFAULT_MAX_PAYLOAD)
    }

    /// The handler that processes this queue, if it has one.
    pub fn handler(&self) -> Option<&str> {
        self.handler.as_deref()
    }

    /// A queue bound to `handler` with every other key at its default.
    pub fn for_handler(handler: impl Into<String>) -> Self {
        QueueConfig {
            handler: Some(handler.into()),
            concurrency_setting: None,
            concurrency: AUTO_CONCURRENCY,
            max_attempts: Self::default_max_attempts(),
            lease: Self::default_lease(),
            timeout: Self::default_timeout(),
            backoff: Self::default_backoff(),
            max_backoff: Self::default_max_backoff(),
            batch: Self::default_batch(),
            max_payload: Self::default_max_payload(),
            idempotent: false,
            retry_abandoned: true,
            retention: RetentionConfig::default(),
            endpoint: None,
            inbox: None,
            storage: QueueStorage::Sql,
            provider: None,
            replace_by_id: None,
            sessions: false,
            rate_limit: None,
            burst: None,
        }
    }

    /// `rate_limit` parses and `burst` goes with it.
    pub(super) fn check_rate_limit(&self, file: &Path, name: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("queues.{name}.{k}");
        if let Some(text) = &self.rate_limit {
            Rate::parse(text)
                .map_err(|e| ConfigError::key(file, key("rate_limit"), e.to_string()))?;
        }
        match self.burst {
            Some(_) if self.rate_limit.is_none() => Err(ConfigError::key(
                file,
                key("burst"),
                format!(
                    "goes with a rate limit: add rate_limit = \"200/s\" to [queues.{name}], or remove burst"
                ),
            )),
            Some(0) => Err(ConfigError::key(
                file,
                key("burst"),
                "must be at least 1 (1 spaces messages evenly)",
            )),
            _ => Ok(()),
        }
    }

    /// The queue's rate limit as budget arithmetic, if it has one (checked when the
    /// configuration was loaded).
    pub fn limit(&self) -> Option<Limit> {
        let rate = Rate::parse(self.rate_limit.as_deref()?).expect("checked when loaded");
        Some(rate.limit(self.burst.unwrap_or(DEFAULT_BURST)))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn parse(keys: &str) -> Result<Config, ConfigError> {
        let text = format!("[queues.calls]\nhandler = \"calls\"\n{keys}");
        Config::parse(Path::new("/etc/wharf/wharf.toml"), &text, &|_| None)
    }

    #[test]
    fn a_rate_limit_gives_its_budget_with_the_default_burst() {
        let config = parse("rate_limit = \"200/s\"").unwrap();
        let limit = config.queues["calls"].limit().unwrap();
        assert_eq!(limit, Rate::parse("200/s").unwrap().limit(DEFAULT_BURST));
        assert_eq!(limit.tolerance_us, 0, "the default burst spaces evenly");
        let config = parse("rate_limit = \"30/min\"\nburst = 5").unwrap();
        assert_eq!(
            config.queues["calls"].limit().unwrap().tolerance_us,
            8_000_000
        );
        assert!(parse("").unwrap().queues["calls"].limit().is_none());
    }

    #[test]
    fn bad_rate_limits_name_the_key() {
        let error = |keys: &str| parse(keys).unwrap_err().to_string();
        let e = error("rate_limit = \"0/s\"");
        assert!(
            e.contains("`queues.calls.rate_limit`") && e.contains("a limit of 0"),
            "{e}"
        );
        let e = error("rate_limit = \"200 per second\"");
        assert!(
            e.contains("`queues.calls.rate_limit`") && e.contains("COUNT/UNIT"),
            "{e}"
        );
        let e = error("rate_limit = \"200/day\"");
        assert!(e.contains("not a unit"), "{e}");
        let e = error("burst = 10");
        assert!(
            e.contains("`queues.calls.burst`") && e.contains("add rate_limit"),
            "{e}"
        );
        let e = error("rate_limit = \"5/s\"\nburst = 0");
        assert!(e.contains("`queues.calls.burst`"), "{e}");
    }
}
