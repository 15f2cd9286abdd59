//! Validation of `[providers.NAME]` sections and of the queues that select them: the
//! provider module named by `type` checks its own keys, and a queue may only ask for what
//! its provider can do (capabilities, never provider names).

use std::path::Path;

use super::registry;
use crate::config::{Config, ConfigError, QueueConfig, QueueStorage, check_name};

/// Check every `[providers.NAME]` with its provider module, then where each queue keeps its
/// pending messages and that its provider can do what the queue asks for. The configuration
/// is read without knowing the providers; this runs on it before anything starts
/// ([`crate::host::load_config`], [`crate::start_with`]).
pub fn check_config(config: &Config, file: &Path) -> Result<(), ConfigError> {
    check_providers(config, file)?;
    for (name, queue) in &config.queues {
        check_storage(config, file, name, queue)?;
    }
    Ok(())
}

/// Check every `[providers.NAME]` with its provider module.
fn check_providers(config: &Config, file: &Path) -> Result<(), ConfigError> {
    for (name, provider) in &config.providers {
        check_name(file, &format!("providers.{name}"), name)?;
        let Some(kind) = registry::find(&provider.kind) else {
            if registry::left_out().contains(&provider.kind.as_str()) {
                return Err(ConfigError::key(
                    file,
                    format!("providers.{name}.type"),
                    format!(
                        "provider type `{kind}` is not in this build of wharf: build it with `--features {kind}` (or the default features)",
                        kind = provider.kind
                    ),
                ));
            }
            return Err(ConfigError::key(
                file,
                format!("providers.{name}.type"),
                format!(
                    "unknown provider type `{}` (known: {})",
                    provider.kind,
                    registry::names().join(", ")
                ),
            ));
        };
        kind.check(&provider.settings).map_err(|e| {
            let key = match e.key.as_str() {
                "" => format!("providers.{name}"),
                key => format!("providers.{name}.{key}"),
            };
            ConfigError::key(file, key, e.reason)
        })?;
    }
    Ok(())
}

/// Check where `queue` keeps its pending messages, and that its provider can do what
/// the queue asks for.
fn check_storage(
    config: &Config,
    file: &Path,
    name: &str,
    queue: &QueueConfig,
) -> Result<(), ConfigError> {
    let key = |k: &str| format!("queues.{name}.{k}");
    let known = registry::names().join("`, `");
    let provider = match (queue.storage, &queue.provider) {
        (QueueStorage::External, None) => {
            return Err(ConfigError::key(
                file,
                key("provider"),
                format!(
                    "is required with storage = \"external\": add `provider = \"NAME\"` and a `[providers.NAME]` section with `type` one of `{known}`"
                ),
            ));
        }
        (QueueStorage::Sql, Some(_)) => {
            return Err(ConfigError::key(
                file,
                key("provider"),
                "only applies to external queues: add `storage = \"external\"` or remove it",
            ));
        }
        (QueueStorage::Sql, None) => {
            if queue.replace_by_id.is_some() {
                return Err(ConfigError::key(
                    file,
                    key("replace_by_id"),
                    "only applies to external queues (the SQL queue always replaces by id)",
                ));
            }
            return Ok(());
        }
        (QueueStorage::External, Some(provider)) => provider,
    };
    let Some(section) = config.providers.get(provider) else {
        return Err(ConfigError::key(
            file,
            key("provider"),
            format!(
                "provider `{provider}` is not configured: add `[providers.{provider}]` with `type` one of `{known}` and its settings (see docs/configuration.md)"
            ),
        ));
    };
    let Some(caps) =
        registry::find(&section.kind).and_then(|kind| kind.check(&section.settings).ok())
    else {
        return Ok(()); // reported by check_providers
    };
    let kind = &section.kind;
    if queue.idempotent && !caps.idempotency {
        return Err(ConfigError::key(
            file,
            key("idempotent"),
            format!(
                "provider `{provider}` (type `{kind}`) cannot discard identical messages: use `storage = \"sql\"` or a provider that can (redis), or remove `idempotent`"
            ),
        ));
    }
    if queue.replace_by_id == Some(true) && !caps.id_replacement {
        return Err(ConfigError::key(
            file,
            key("replace_by_id"),
            format!(
                "provider `{provider}` (type `{kind}`) cannot replace a pending message by its id: use `storage = \"sql\"` or a provider that can (redis), or remove `replace_by_id`"
            ),
        ));
    }
    if queue.sessions && !caps.keyed_order {
        return Err(ConfigError::key(
            file,
            key("sessions"),
            format!(
                "provider `{provider}` (type `{kind}`) cannot keep the messages of one session in order across consumers: use `storage = \"sql\"` or a provider that can (kafka, or rabbitmq with `single_active_consumer = true` and no `max_priority`), or remove `sessions`"
            ),
        ));
    }
    if queue.idempotent && queue.replace_by_id == Some(false) {
        return Err(ConfigError::key(
            file,
            key("replace_by_id"),
            "`idempotent = true` needs ids to be tracked: remove `replace_by_id = false`",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, ConfigError};

    /// Read `text` and check its providers, as a host does.
    fn parse(text: &str) -> Result<Config, ConfigError> {
        let config = Config::parse(Path::new("wharf.toml"), text, &|_| None)?;
        super::check_config(&config, Path::new("wharf.toml"))?;
        Ok(config)
    }

    fn key_error(text: &str) -> (String, String) {
        match parse(text) {
            Err(ConfigError::Key { key, reason, .. }) => (key, reason),
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    const QUEUE: &str = "[queues.q]\nhandler = \"h\"\nstorage = \"external\"\nprovider = \"p\"\n";

    #[test]
    fn settings_that_can_never_work_name_their_key() {
        let cases = [
            (
                "type = \"kafkaa\"",
                "providers.p.type",
                "unknown provider type `kafkaa`",
            ),
            ("type = \"redis\"", "providers.p", "missing field `url`"),
            (
                "type = \"redis\"\nurl = \"http://x\"",
                "providers.p.url",
                "not a Redis URL",
            ),
            (
                "type = \"redis\"\nurl = \"redis://h\"\nprefix = \"x\"",
                "providers.p.prefix",
                "unknown field `prefix`",
            ),
            (
                "type = \"rabbitmq\"\nurl = \"amqp://[::1\"",
                "providers.p.url",
                "not an AMQP URL",
            ),
            (
                "type = \"rabbitmq\"\nurl = \"amqps://h\"",
                "providers.p.url",
                "TLS",
            ),
            (
                "type = \"rabbitmq\"\nurl = \"amqp://h\"\nheartbeat = \"1500ms\"",
                "providers.p.heartbeat",
                "whole seconds",
            ),
            (
                "type = \"redis\"\nurl = \"redis+cluster://h:1,,h:2\"",
                "providers.p.url",
                "not a Redis URL",
            ),
            (
                "type = \"rabbitmq\"\nurl = \"amqp://h\"\nqueue_type = \"quorum\"\nmax_priority = 5",
                "providers.p.max_priority",
                "quorum queues have no priorities",
            ),
            (
                "type = \"rabbitmq\"\nurl = \"amqp://h\"\nqueue_type = \"lazy\"",
                "providers.p.queue_type",
                "unknown variant",
            ),
            (
                "type = \"servicebus\"\nconnection_string = \"Endpoint=sb://shop/;SharedAccessKeyName=k\"",
                "providers.p.connection_string",
                "no SharedAccessKey",
            ),
            (
                "type = \"servicebus\"\nconnection_string = \"Endpoint=sb://shop/;SharedAccessKeyName=k;SharedAccessKey=s\"\nlock_renewal = \"yes\"",
                "providers.p.lock_renewal",
                "invalid type",
            ),
        ];
        for (section, key, reason) in cases {
            let (k, r) = key_error(&format!("[providers.p]\n{section}\n\n{QUEUE}"));
            assert_eq!(k, key, "{section}: {r}");
            assert!(r.contains(reason), "{section}: {r}");
        }
    }

    #[test]
    fn provider_settings_never_show_their_values() {
        let config = parse(&format!(
                "[providers.p]\ntype = \"servicebus\"\nconnection_string = \"Endpoint=sb://shop/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0\"\n\n{QUEUE}"
            ))
        .expect("a valid file");
        let shown = format!("{config:?}");
        assert!(shown.contains("connection_string"), "{shown}");
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
    }

    #[test]
    fn a_queue_asks_only_for_what_its_provider_can_do() {
        let rabbit = "[providers.p]\ntype = \"rabbitmq\"\nurl = \"amqp://h\"\n\n";
        let (key, reason) = key_error(&format!("{rabbit}{QUEUE}idempotent = true\n"));
        assert_eq!(key, "queues.q.idempotent");
        assert!(
            reason.contains("provider `p` (type `rabbitmq`)"),
            "{reason}"
        );
        let (key, _) = key_error(&format!("{rabbit}{QUEUE}replace_by_id = true\n"));
        assert_eq!(key, "queues.q.replace_by_id");
        let bus = "[providers.p]\ntype = \"servicebus\"\nconnection_string = \"Endpoint=sb://shop/;SharedAccessKeyName=k;SharedAccessKey=s\"\n\n";
        let (key, reason) = key_error(&format!("{bus}{QUEUE}idempotent = true\n"));
        assert_eq!(key, "queues.q.idempotent");
        assert!(reason.contains("type `servicebus`"), "{reason}");
        let redis = "[providers.p]\ntype = \"redis\"\nurl = \"redis://h\"\n\n";
        parse(&format!(
            "{redis}{QUEUE}idempotent = true\nreplace_by_id = true\n"
        ))
        .expect("redis can");
        let (key, reason) = key_error(&format!(
            "{redis}{QUEUE}idempotent = true\nreplace_by_id = false\n"
        ));
        assert_eq!(key, "queues.q.replace_by_id");
        assert!(reason.contains("idempotent"), "{reason}");
        let (key, reason) = key_error(QUEUE);
        assert_eq!(key, "queues.q.provider");
        assert!(reason.contains("`[providers.p]`"), "{reason}");
    }

    #[test]
    fn sessions_need_a_provider_that_keeps_each_key_in_order() {
        let sac = "type = \"rabbitmq\"\nurl = \"amqp://h\"\nsingle_active_consumer = true";
        let refused = [
            "type = \"redis\"\nurl = \"redis://h\"".to_string(),
            "type = \"rabbitmq\"\nurl = \"amqp://h\"".to_string(),
            format!("{sac}\nmax_priority = 5"),
            "type = \"servicebus\"\nconnection_string = \"Endpoint=sb://shop/;SharedAccessKeyName=k;SharedAccessKey=s\"".to_string(),
        ];
        for section in &refused {
            let (key, reason) = key_error(&format!(
                "[providers.p]\n{section}\n\n{QUEUE}sessions = true\n"
            ));
            assert_eq!(key, "queues.q.sessions", "{section}");
            assert!(
                reason.contains("cannot keep the messages of one session in order"),
                "{reason}"
            );
        }
        for section in ["type = \"kafka\"\nbrokers = \"h:9092\"", sac] {
            parse(&format!(
                "[providers.p]\n{section}\n\n{QUEUE}sessions = true\n"
            ))
            .unwrap_or_else(|e| panic!("{section}: {e}"));
        }
    }
}
