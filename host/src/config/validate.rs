//! Validating a parsed configuration: storage URL, handler and queue names, every queue's
//! numbers and references. Each error names the file and the key to blame.

use std::path::Path;

use super::{Config, ConfigError};

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let file = self.source.as_path();
        self.validate_schedules(file)?;
        if let Some(id) = &self.host.id {
            check_name(file, "host.id", id)?;
        }
        let url = &self.storage.url;
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            return Err(ConfigError::key(
                file,
                "storage.url",
                format!(
                    "`{}` is not a `sqlite://PATH` or `postgres://…` URL",
                    super::redacted_url(url)
                ),
            ));
        }
        if self.storage.max_connections == 0 {
            return Err(ConfigError::key(
                file,
                "storage.max_connections",
                "must be at least 1",
            ));
        }
        if self.host.max_instances == 0 {
            return Err(ConfigError::key(
                file,
                "host.max_instances",
                "must be at least 1",
            ));
        }
        if self.host.metrics_interval.is_zero() {
            return Err(ConfigError::key(
                file,
                "host.metrics_interval",
                "must be longer than zero",
            ));
        }
        if self.host.instance_memory > self.host.max_instance_memory {
            return Err(ConfigError::key(
                file,
                "host.instance_memory",
                format!(
                    "{} exceeds host.max_instance_memory ({})",
                    self.host.instance_memory, self.host.max_instance_memory
                ),
            ));
        }
        let table = &self.inbox.sql.table;
        if table.is_empty()
            || table.len() > 63
            || !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || table.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(ConfigError::key(
                file,
                "inbox.sql.table",
                format!("`{table}` is not a plain table name (letters, digits, `_`)"),
            ));
        }
        #[cfg(not(feature = "redis"))]
        if self.inbox.redis.is_some() {
            return Err(ConfigError::key(
                file,
                "inbox.redis",
                "the Redis inbox store is not in this build of wharf: build it with `--features redis` (or the default features), or use the SQL inbox",
            ));
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = &self.inbox.redis
            && let Err(e) = crate::redis_client::RedisTarget::parse(&redis.url)
        {
            return Err(ConfigError::key(
                file,
                "inbox.redis.url",
                format!(
                    "`{}` is not a Redis URL (expected redis://host:port or redis+cluster://host:port,host:port,…): {e}",
                    super::redacted_url(&redis.url)
                ),
            ));
        }
        let total: u64 = self.queues.values().map(|q| u64::from(q.concurrency)).sum();
        if total > u64::from(self.host.max_instances) {
            return Err(ConfigError::key(
                file,
                "host.max_instances",
                format!(
                    "{} is less than the queues' total concurrency ({total}): raise it or lower some `concurrency`",
                    self.host.max_instances
                ),
            ));
        }
        if self.external.reconcile_interval < std::time::Duration::from_millis(10) {
            return Err(ConfigError::key(
                file,
                "external.reconcile_interval",
                "must be at least 10ms (it is a periodic pass over every external queue)",
            ));
        }
        if self.external.probe_interval < std::time::Duration::from_millis(100) {
            return Err(ConfigError::key(
                file,
                "external.probe_interval",
                "must be at least 100ms (each probe is a round trip to the broker)",
            ));
        }
        for (name, handler) in &self.handlers {
            check_name(file, &format!("handlers.{name}"), name)?;
            if let Some(memory) = handler.memory
                && memory > self.host.max_instance_memory
            {
                return Err(ConfigError::key(
                    file,
                    format!("handlers.{name}.memory"),
                    format!(
                        "{memory} exceeds host.max_instance_memory ({})",
                        self.host.max_instance_memory
                    ),
                ));
            }
        }
        for (name, queue) in &self.queues {
            let key = |k: &str| format!("queues.{name}.{k}");
            check_name(file, &format!("queues.{name}"), name)?;
            match &queue.handler {
                Some(handler) => check_name(file, &key("handler"), handler)?,
                None if queue.concurrency_setting.is_some() => {
                    return Err(ConfigError::key(
                        file,
                        key("concurrency"),
                        format!(
                            "the queue has no handler, so nothing runs there: set queues.{name}.handler, or remove concurrency"
                        ),
                    ));
                }
                None => {}
            }
            // A queue without a handler has no concurrency (0): nothing to check.
            let concurrency = queue.concurrency.max(u32::from(queue.handler.is_none()));
            for (k, v) in [
                ("concurrency", concurrency),
                ("max_attempts", queue.max_attempts),
                ("batch", queue.batch),
            ] {
                if v == 0 {
                    return Err(ConfigError::key(file, key(k), "must be at least 1"));
                }
            }
            if queue.max_payload.as_u64() == 0 {
                return Err(ConfigError::key(
                    file,
                    key("max_payload"),
                    "must be at least 1 byte",
                ));
            }
            if queue.timeout.is_zero() {
                return Err(ConfigError::key(
                    file,
                    key("timeout"),
                    "must be longer than 0s",
                ));
            }
            if queue.lease <= queue.timeout {
                return Err(ConfigError::key(
                    file,
                    key("lease"),
                    format!(
                        "{} must be longer than the timeout ({}), or a running message's lease expires",
                        humantime::format_duration(queue.lease),
                        humantime::format_duration(queue.timeout)
                    ),
                ));
            }
            if let Some(inbox) = &queue.inbox {
                if inbox.store == super::InboxStoreKind::Redis && self.inbox.redis.is_none() {
                    return Err(ConfigError::key(
                        file,
                        key("inbox.store"),
                        "`redis` is not configured: add `[inbox.redis]` with `url = \"redis://127.0.0.1:6379\"`",
                    ));
                }
                if inbox.cleanup_interval.is_zero() {
                    return Err(ConfigError::key(
                        file,
                        key("inbox.cleanup_interval"),
                        "must be longer than 0s",
                    ));
                }
            }
            if queue
                .endpoint
                .as_ref()
                .is_some_and(|e| e.is_empty() || e.chars().count() > 260)
            {
                return Err(ConfigError::key(
                    file,
                    key("endpoint"),
                    "must be 1–260 characters",
                ));
            }
            if queue.max_backoff < queue.backoff {
                return Err(ConfigError::key(
                    file,
                    key("max_backoff"),
                    "must not be shorter than backoff",
                ));
            }
            queue.check_rate_limit(file, name)?;
        }
        Ok(())
    }
}

/// Queue and handler names: letters, digits, `_`, `-` and `.`; 1–200 characters.
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

pub(crate) fn check_name(file: &Path, key: &str, name: &str) -> Result<(), ConfigError> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(ConfigError::key(
            file,
            key,
            format!("`{name}` is not a valid name (1–200 of letters, digits, `_`, `-`, `.`)"),
        ))
    }
}
