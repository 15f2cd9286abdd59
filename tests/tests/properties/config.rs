//! The configuration loader: any text — and any TOML built from the real sections and keys
//! with values of every type — loads or stops with an error naming the file (and the key,
//! where one is to blame); never a panic. Interpolation expands exactly once: a variable's
//! value is inserted as it is, even when it looks like `${…}` itself.

use proptest::prelude::*;
use wharf_host::config::{Config, ConfigError, interpolate};

const SECTIONS: &[&str] = &[
    "host",
    "storage",
    "admin",
    "queues.orders",
    "queues.orders.retention",
    "queues.orders.inbox",
    "handlers.orders",
    "inbox",
    "inbox.sql",
    "inbox.redis",
    "providers.main",
    "external",
    "bogus",
];

const KEYS: &[&str] = &[
    "handlers_dir",
    "cache_dir",
    "admin_listen",
    "shutdown_grace",
    "deploy_debounce",
    "max_instances",
    "instance_memory",
    "max_instance_memory",
    "metrics_interval",
    "token",
    "url",
    "schema",
    "poll_interval",
    "max_connections",
    "memory",
    "env",
    "inherit_env",
    "preopens",
    "network",
    "allowed_outbound_hosts",
    "handler",
    "concurrency",
    "max_attempts",
    "lease",
    "timeout",
    "backoff",
    "max_backoff",
    "batch",
    "max_payload",
    "idempotent",
    "retry_abandoned",
    "endpoint",
    "store",
    "storage",
    "provider",
    "type",
    "key_prefix",
    "age",
    "count",
    "table",
    "auto_create_table",
    "reconcile_interval",
    "unknown_key",
];

/// A TOML value of any type, including near-misses of the accepted forms.
fn value() -> impl Strategy<Value = String> {
    let text = prop_oneof![
        Just("30s".to_string()),
        Just("0ms".to_string()),
        Just("64MiB".to_string()),
        Just("-1s".to_string()),
        Just("sqlite://wharf.db".to_string()),
        Just("postgres://nowhere:1/x".to_string()),
        Just("redis://127.0.0.1:1".to_string()),
        Just("127.0.0.1:0".to_string()),
        Just("${WHARF_PROPERTY_VAR}".to_string()),
        Just("${UNSET_PROPERTY_VAR}".to_string()),
        Just("${BAD NAME}".to_string()),
        Just("${UNCLOSED".to_string()),
        Just("$${LITERAL}".to_string()),
        "\\PC{0,12}",
    ];
    prop_oneof![
        text.prop_map(|s| toml_string(&s)),
        any::<i64>().prop_map(|n| n.to_string()),
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(u32::MAX as i64 + 1)]
            .prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:?}")),
        prop::collection::vec("[a-z.:*0-9]{0,10}", 0..3).prop_map(|items| format!(
            "[{}]",
            items
                .iter()
                .map(|s| toml_string(s))
                .collect::<Vec<_>>()
                .join(",")
        )),
        Just("{ store = \"sql\" }".to_string()),
    ]
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn document() -> impl Strategy<Value = String> {
    let entry = (prop::sample::select(KEYS), value());
    let section = (
        prop::sample::select(SECTIONS),
        prop::collection::vec(entry, 0..6),
    );
    prop::collection::vec(section, 0..6).prop_map(|sections| {
        let mut text = String::new();
        let mut seen = std::collections::HashSet::new();
        for (name, entries) in sections {
            if !seen.insert(name) {
                continue; // a table is defined once
            }
            text.push_str(&format!("[{name}]\n"));
            let mut keys = std::collections::HashSet::new();
            for (key, value) in entries {
                if keys.insert(key) {
                    text.push_str(&format!("{key} = {value}\n"));
                }
            }
        }
        text
    })
}

fn env(name: &str) -> Option<String> {
    (name == "WHARF_PROPERTY_VAR").then(|| "${NESTED}".to_string())
}

fn load(text: &str) -> Result<Config, ConfigError> {
    let dir = std::env::temp_dir();
    Config::parse(&dir.join("wharf.toml"), text, &env)
}

fn names_the_file(error: &ConfigError) -> bool {
    error.to_string().contains("wharf.toml")
}

proptest! {
    #![proptest_config(super::runner(256))]

    #[test]
    fn any_text_loads_or_names_the_file(text in any::<String>()) {
        if let Err(e) = load(&text) {
            prop_assert!(names_the_file(&e), "{e}");
        }
    }

    #[test]
    fn any_document_loads_or_names_file_and_key(text in document()) {
        match load(&text) {
            Ok(config) => prop_assert!(config.queues.len() <= 1),
            Err(ConfigError::Key { key, reason, .. }) => {
                prop_assert!(!key.is_empty() && !reason.is_empty(), "{text}");
            }
            Err(e) => prop_assert!(names_the_file(&e), "{e}\n{text}"),
        }
    }

    #[test]
    fn text_without_variables_is_kept(text in "[^$]*") {
        prop_assert_eq!(interpolate(&text, &env).unwrap(), text);
    }

    #[test]
    fn a_value_is_inserted_once_as_it_is(
        before in "[^$]{0,8}",
        value in any::<String>().prop_filter("set", |v| !v.is_empty()),
        after in "[^$]{0,8}",
    ) {
        let lookup = |name: &str| (name == "V").then(|| value.clone());
        let expanded = interpolate(&format!("{before}${{V}}{after}"), &lookup).unwrap();
        prop_assert_eq!(expanded, format!("{before}{value}{after}"));
    }

    #[test]
    fn an_escaped_dollar_stays_literal(rest in "[^$]{0,12}") {
        prop_assert_eq!(interpolate(&format!("$${{{rest}"), &env).unwrap(), format!("${{{rest}"));
    }
}

#[test]
fn an_interpolated_value_is_not_expanded_again() {
    let text = "[queues.orders]\nhandler = \"orders\"\nendpoint = \"${WHARF_PROPERTY_VAR}\"\n";
    let config = load(text).unwrap();
    assert_eq!(
        config.queues["orders"].endpoint.as_deref(),
        Some("${NESTED}")
    );
}
