//! `[schedules.NAME]`: periodic messages. Each tick of a cron expression in a time zone
//! enqueues one message into a queue, exactly once however many hosts share the store.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::{Config, ConfigError};
use crate::ticks::Ticks;

/// What a host that starts after every host was down does with the ticks it missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CatchUp {
    /// Skip them (counted in `wharf_schedule_ticks_missed_total`).
    None,
    /// Enqueue the latest of them, once (the default).
    #[default]
    Latest,
    /// Enqueue each of them, the most recent `catch_up_limit` at most.
    All,
}

/// `[schedules.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first.
    pub cron: String,
    /// The IANA time zone the expression is read in (default `UTC`).
    #[serde(default = "utc")]
    pub timezone: String,
    /// The queue each tick's message goes to (a queue of `[queues]`).
    pub queue: String,
    /// The message (any TOML value, sent as JSON; default `{}`).
    #[serde(default = "empty_object")]
    pub payload: toml::Value,
    /// The message's priority (higher runs first).
    #[serde(default)]
    pub priority: i32,
    /// Headers of every message, beside `wharf-schedule` and `wharf-scheduled-at`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Ticks missed while no host ran.
    #[serde(default)]
    pub catch_up: CatchUp,
    /// With `catch_up = "all"`: most missed ticks enqueued (the most recent).
    #[serde(default = "default_catch_up_limit")]
    pub catch_up_limit: u32,
}

fn utc() -> String {
    "UTC".to_string()
}

fn empty_object() -> toml::Value {
    toml::Value::Table(toml::Table::new())
}

fn default_catch_up_limit() -> u32 {
    100
}

impl ScheduleConfig {
    /// Its ticks (checked when the configuration was loaded).
    pub fn ticks(&self) -> Ticks {
        Ticks::parse(&self.cron, &self.timezone).expect("checked when the configuration loaded")
    }

    /// The payload as JSON text.
    pub fn payload_json(&self) -> String {
        serde_json::to_string(&self.payload).expect("a TOML value is JSON")
    }
}

impl Config {
    /// Every schedule's expression, time zone, queue and limit.
    pub(super) fn validate_schedules(&self, file: &Path) -> Result<(), ConfigError> {
        for (name, s) in &self.schedules {
            let key = |k: &str| format!("schedules.{name}.{k}");
            super::check_name(file, &format!("schedules.{name}"), name)?;
            if let Err(e) = Ticks::parse(&s.cron, &s.timezone) {
                let field = match e {
                    crate::ticks::TicksError::TimeZone(_) => "timezone",
                    crate::ticks::TicksError::Cron { .. } => "cron",
                };
                return Err(ConfigError::key(file, key(field), e.to_string()));
            }
            if !self.queues.contains_key(&s.queue) {
                return Err(ConfigError::key(
                    file,
                    key("queue"),
                    format!(
                        "no queue `{}`: add [queues.{}] or name one of the queues",
                        s.queue, s.queue
                    ),
                ));
            }
            if s.catch_up_limit == 0 {
                return Err(ConfigError::key(
                    file,
                    key("catch_up_limit"),
                    "must be at least 1 (catch_up = \"none\" skips missed ticks)",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn parse(schedule: &str) -> Result<Config, ConfigError> {
        let text =
            format!("[queues.reports]\n\n[schedules.nightly]\nqueue = \"reports\"\n{schedule}");
        Config::parse(Path::new("/etc/wharf/wharf.toml"), &text, &|_| None)
    }

    fn error(schedule: &str) -> String {
        parse(schedule).unwrap_err().to_string()
    }

    #[test]
    fn a_schedule_has_defaults_for_all_but_its_cron_and_queue() {
        let config = parse("cron = \"0 3 * * *\"").unwrap();
        let s = &config.schedules["nightly"];
        assert_eq!(s.timezone, "UTC");
        assert_eq!(s.catch_up, CatchUp::Latest);
        assert_eq!(s.catch_up_limit, 100);
        assert_eq!(s.payload_json(), "{}");
    }

    #[test]
    fn bad_values_name_the_key_and_what_is_expected() {
        let e = error("cron = \"0 3 * *\"");
        assert!(
            e.contains("`schedules.nightly.cron`") && e.contains("4 fields"),
            "{e}"
        );
        let e = error("cron = \"0 3 * * *\"\ntimezone = \"Europe/Atlantis\"");
        assert!(
            e.contains("`schedules.nightly.timezone`") && e.contains("IANA"),
            "{e}"
        );
        let e = error("cron = \"0 3 * * *\"\ncatch_up_limit = 0");
        assert!(e.contains("`schedules.nightly.catch_up_limit`"), "{e}");
        let e = error("cron = \"0 3 * * *\"\ncatch_up = \"some\"");
        assert!(e.contains("schedules.nightly.catch_up"), "{e}");
        let text = "[schedules.nightly]\ncron = \"0 3 * * *\"\nqueue = \"nowhere\"";
        let e = Config::parse(Path::new("/w.toml"), text, &|_| None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`schedules.nightly.queue`") && e.contains("no queue `nowhere`"),
            "{e}"
        );
    }
}
