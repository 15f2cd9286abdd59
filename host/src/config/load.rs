//! Reading `wharf.toml`: TOML syntax, `${VAR}` interpolation, schema, path resolution and
//! validation. Every error names the file, and the key where one is to blame.

use std::path::{Path, PathBuf};

use super::interpolate::interpolate;
use super::{AUTO_CONCURRENCY, Config};

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {error}")]
    Read {
        /// The file.
        file: PathBuf,
        /// The I/O error (printed, not chained, so a report shows it once).
        error: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{file}: invalid TOML: {reason}")]
    Syntax {
        /// The file.
        file: PathBuf,
        /// The parser's message, with line and column.
        reason: String,
    },
    /// A key has a bad value, is unknown, or is missing.
    #[error("{file}: `{key}`: {reason}")]
    Key {
        /// The file.
        file: PathBuf,
        /// Dotted path of the key, e.g. `queues.orders.timeout`.
        key: String,
        /// What is wrong and what was expected.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn key(file: &Path, key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Key {
            file: file.to_path_buf(),
            key: key.into(),
            reason: reason.into(),
        }
    }
}

impl Config {
    /// Load and validate a configuration file, reading variables from the environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            file: path.to_path_buf(),
            error,
        })?;
        Config::parse(path, &text, &|name| std::env::var(name).ok())
    }

    /// Parse configuration text as if it came from `path` (paths resolve against its folder).
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            file: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        for (key, value) in table.iter_mut() {
            interpolate_value(path, key, value, env)?;
        }
        let mut config: Config = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| {
                let key = e.path().to_string();
                let key = if key == "." {
                    "(top level)".to_string()
                } else {
                    key
                };
                ConfigError::key(path, key, e.inner().to_string())
            })?;
        config.source = path.to_path_buf();
        config.admin.resolve(env(super::TOKEN_ENV));
        config.traces = config
            .telemetry
            .resolve(env)
            .map_err(|(key, reason)| ConfigError::key(path, key, reason))?;
        config.resolve_paths();
        config.resolve_concurrency();
        config.validate()?;
        Ok(config)
    }

    /// The folder relative paths in this configuration are resolved against.
    pub fn base_dir(&self) -> PathBuf {
        let dir = match self.source.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::canonicalize(&dir).unwrap_or(dir)
    }

    fn resolve_paths(&mut self) {
        let base = self.base_dir();
        let join = |p: &PathBuf| {
            if p.is_absolute() {
                p.clone()
            } else {
                base.join(p)
            }
        };
        self.host.handlers_dir = join(&self.host.handlers_dir);
        self.host.cache_dir = join(&self.host.cache_dir);
        for handler in self.handlers.values_mut() {
            for preopen in &mut handler.preopens {
                preopen.host = join(&preopen.host);
            }
        }
        if let Some(rest) = self.storage.url.strip_prefix("sqlite://")
            && !rest.starts_with('/')
            && !rest.starts_with(":memory:")
        {
            self.storage.url = format!("sqlite://{}", base.join(rest).display());
        }
    }

    /// Give every queue without a `concurrency` setting an equal share of the instances the
    /// others leave, at most [`AUTO_CONCURRENCY`] and at least 1 (too little is then
    /// reported by the total check).
    fn resolve_concurrency(&mut self) {
        // A queue without a handler runs nothing: it takes no instances.
        let running = || self.queues.values().filter(|q| q.handler.is_some());
        let set: u64 = running()
            .filter_map(|q| q.concurrency_setting)
            .map(u64::from)
            .sum();
        let auto = running()
            .filter(|q| q.concurrency_setting.is_none())
            .count() as u64;
        let share = (u64::from(self.host.max_instances).saturating_sub(set))
            .checked_div(auto)
            .unwrap_or(0)
            .clamp(1, u64::from(AUTO_CONCURRENCY)) as u32;
        for queue in self.queues.values_mut() {
            queue.concurrency = match &queue.handler {
                Some(_) => queue.concurrency_setting.unwrap_or(share),
                None => 0,
            };
        }
    }
}

fn interpolate_value(
    file: &Path,
    key: &str,
    value: &mut toml::Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match value {
        toml::Value::String(s) => {
            *s = interpolate(s, env).map_err(|e| ConfigError::key(file, key, e.to_string()))?;
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                interpolate_value(file, &format!("{key}[{i}]"), item, env)?;
            }
        }
        toml::Value::Table(table) => {
            for (k, v) in table.iter_mut() {
                interpolate_value(file, &format!("{key}.{k}"), v, env)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/wharf/wharf.toml"), text, &|n| {
            (n == "DB").then(|| "postgres://db/test".to_string())
        })
    }

    fn key_error(text: &str) -> (String, String) {
        match parse(text).unwrap_err() {
            ConfigError::Key { key, reason, file } => {
                assert_eq!(file, Path::new("/etc/wharf/wharf.toml"));
                (key, reason)
            }
            other => panic!("expected a key error, got {other}"),
        }
    }

    #[test]
    fn defaults_and_relative_paths() {
        let c = parse("[queues.orders]\nhandler = \"order-export\"\n").unwrap();
        assert_eq!(c.host.handlers_dir, Path::new("/etc/wharf/handlers"));
        assert_eq!(c.storage.url, "sqlite:///etc/wharf/wharf.db");
        let q = &c.queues["orders"];
        assert_eq!((q.concurrency, q.batch, q.max_attempts), (64, 256, 5));
        assert_eq!(q.timeout, std::time::Duration::from_secs(10));
    }

    #[test]
    fn unset_concurrency_shares_the_instances_left() {
        let c = parse(
            "[host]\nmax_instances = 100\n[queues.a]\nhandler = \"h\"\nconcurrency = 10\n\
             [queues.b]\nhandler = \"h\"\n[queues.c]\nhandler = \"h\"\n",
        )
        .unwrap();
        let of = |q: &str| c.queues[q].concurrency;
        assert_eq!((of("a"), of("b"), of("c")), (10, 45, 45));
        let c = parse("[queues.a]\nhandler = \"h\"\n[queues.b]\nhandler = \"h\"\n").unwrap();
        assert_eq!(c.queues["a"].concurrency, 64, "at most 64 each");
        let (key, reason) = key_error(
            "[host]\nmax_instances = 4\n[queues.a]\nhandler = \"h\"\nconcurrency = 4\n\
             [queues.b]\nhandler = \"h\"\n",
        );
        assert_eq!(key, "host.max_instances");
        assert!(reason.contains("total concurrency (5)"), "{reason}");
    }

    #[test]
    fn a_queue_without_a_handler_holds_its_messages_and_takes_no_instances() {
        let c = parse(
            "[host]\nmax_instances = 4\n[queues.a]\nhandler = \"h\"\nconcurrency = 4\n\
             [queues.collected]\n[queues.b]\nhandler = \"h\"\nconcurrency = 0\n",
        );
        // `b` is still checked; the sink is not counted (a total of 4 fits).
        assert!(c.is_err());
        let c =
            parse("[host]\nmax_instances = 4\n[queues.a]\nhandler = \"h\"\n[queues.collected]\n")
                .unwrap();
        assert_eq!(c.queues["collected"].handler(), None);
        assert_eq!(c.queues["collected"].concurrency, 0);
        assert_eq!(
            c.queues["a"].concurrency, 4,
            "the whole pool: the sink takes none"
        );
        let (key, reason) = key_error("[queues.collected]\nconcurrency = 2\n");
        assert_eq!(key, "queues.collected.concurrency");
        assert!(reason.contains("set queues.collected.handler"), "{reason}");
    }

    #[test]
    fn interpolates_environment() {
        let c = parse("[storage]\nurl = \"${DB}\"\n[host]\nhandlers_dir = \"${HD:-/srv/h}\"\n")
            .unwrap();
        assert_eq!(c.storage.url, "postgres://db/test");
        assert_eq!(c.host.handlers_dir, Path::new("/srv/h"));
        let (key, reason) = key_error("[storage]\nurl = \"${MISSING}\"\n");
        assert_eq!(key, "storage.url");
        assert!(reason.contains("MISSING"), "{reason}");
    }

    #[test]
    fn unknown_key_is_named() {
        let (key, reason) = key_error("[queues.orders]\nhandler = \"h\"\nconcurency = 3\n");
        assert_eq!(key, "queues.orders.concurency");
        assert!(reason.contains("unknown field `concurency`"), "{reason}");
        let (key, _) = key_error("[hots]\nx = 1\n");
        assert_eq!(key, "hots");
    }

    #[test]
    fn max_payload_defaults_to_a_mebibyte_and_takes_sizes() {
        let c = parse("[queues.orders]\nhandler = \"h\"\n").unwrap();
        assert_eq!(c.queues["orders"].max_payload.as_u64(), 1024 * 1024);
        let c = parse("[queues.orders]\nhandler = \"h\"\nmax_payload = \"256KiB\"\n").unwrap();
        assert_eq!(c.queues["orders"].max_payload.as_u64(), 256 * 1024);
        let (key, reason) = key_error("[queues.orders]\nhandler = \"h\"\nmax_payload = \"0B\"\n");
        assert_eq!(key, "queues.orders.max_payload");
        assert!(reason.contains("at least 1 byte"), "{reason}");
    }

    #[test]
    fn external_intervals_default_and_have_floors() {
        let c = parse("[external]\nprobe_interval = \"2s\"\n").unwrap();
        assert_eq!(c.external.probe_interval, std::time::Duration::from_secs(2));
        assert_eq!(
            c.external.reconcile_interval,
            std::time::Duration::from_secs(30)
        );
        let (key, reason) = key_error("[external]\nprobe_interval = \"10ms\"\n");
        assert_eq!(key, "external.probe_interval");
        assert!(reason.contains("at least 100ms"), "{reason}");
    }

    #[test]
    fn bad_duration_is_named() {
        let (key, reason) =
            key_error("[queues.orders]\nhandler = \"h\"\ntimeout = \"30 parsecs\"\n");
        assert_eq!(key, "queues.orders.timeout");
        assert!(reason.contains("unknown time unit"), "{reason}");
    }

    #[test]
    fn bad_outbound_host_is_named() {
        let (key, reason) = key_error(
            "[handlers.h]\nallowed_outbound_hosts = [\"https://ok.example.com\", \"api.example.com\"]\n",
        );
        assert_eq!(key, "handlers.h.allowed_outbound_hosts[1]");
        assert!(
            reason.contains("`api.example.com`") && reason.contains("scheme is missing"),
            "{reason}"
        );
    }

    #[test]
    fn validation_names_the_key() {
        let (key, _) = key_error("[queues.orders]\nhandler = \"h\"\nconcurrency = 0\n");
        assert_eq!(key, "queues.orders.concurrency");
        let (key, reason) = key_error("[queues.orders]\nhandler = \"h\"\nlease = \"5s\"\n");
        assert_eq!(key, "queues.orders.lease");
        assert!(reason.contains("longer than the timeout"), "{reason}");
        let (key, _) = key_error("[queues.\"a b\"]\nhandler = \"h\"\n");
        assert_eq!(key, "queues.a b");
        let (key, _) = key_error("[storage]\nurl = \"mysql://x\"\n");
        assert_eq!(key, "storage.url");
        let (key, reason) =
            key_error("[queues.a]\nhandler = \"h\"\ninbox = { store = \"redis\" }\n");
        assert_eq!(key, "queues.a.inbox.store");
        assert!(reason.contains("add `[inbox.redis]`"), "{reason}");
        let (key, _) = key_error("[queues.a]\nhandler = \"h\"\ninbox = { store = \"cosmos\" }\n");
        assert_eq!(key, "queues.a.inbox.store");
        let (key, reason) =
            key_error("[host]\nmax_instances = 4\n[queues.a]\nhandler = \"h\"\nconcurrency = 5\n");
        assert_eq!(key, "host.max_instances");
        assert!(reason.contains("total concurrency (5)"), "{reason}");
    }

    #[test]
    fn syntax_error_names_the_file() {
        let err = parse("[queues\n").unwrap_err().to_string();
        assert!(
            err.starts_with("/etc/wharf/wharf.toml: invalid TOML"),
            "{err}"
        );
    }
}
