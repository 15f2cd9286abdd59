//! The tick calculator: the instants (Unix ms) at which a cron expression fires in a time
//! zone. An expression matches wall-clock times; each matching wall-clock time is one tick:
//!
//! - a time the clock skips (spring forward: 02:30 in Europe/Berlin on the last Sunday of
//!   March) ticks at the first instant after the jump (03:00), once, however many skipped
//!   times match;
//! - a time the clock shows twice (fall back: 02:30 on the last Sunday of October) ticks at
//!   its first occurrence only.
//!
//! So a change of the clock neither skips a tick nor doubles one.

use std::str::FromStr as _;

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, TimeZone as _, Timelike as _, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// Why a schedule's `cron` or `timezone` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TicksError {
    /// The expression does not parse.
    #[error(
        "invalid cron expression `{expr}`: {reason} (5 fields: minute hour day-of-month month day-of-week, or 6 with seconds first)"
    )]
    Cron {
        /// The expression.
        expr: String,
        /// What is wrong.
        reason: String,
    },
    /// The time zone is not an IANA name.
    #[error("unknown time zone `{0}` (an IANA name such as `UTC` or `Europe/Berlin`)")]
    TimeZone(String),
}

/// When one schedule ticks.
#[derive(Debug, Clone)]
pub struct Ticks {
    cron: Cron,
    tz: Tz,
}

/// Wall-clock times a search steps over at most before it gives up (an expression that
/// matches only skipped times, which no real zone has).
const MAX_STEPS: usize = 100_000;

impl Ticks {
    /// `expr` (5 fields, or 6 with seconds first) in the IANA time zone `timezone`.
    pub fn parse(expr: &str, timezone: &str) -> Result<Ticks, TicksError> {
        let bad = |reason: String| TicksError::Cron {
            expr: expr.to_string(),
            reason,
        };
        let fields = expr.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(bad(format!("it has {fields} fields")));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| bad(e.to_string()))?;
        let tz = Tz::from_str(timezone).map_err(|_| TicksError::TimeZone(timezone.to_string()))?;
        Ok(Ticks { cron, tz })
    }

    /// The first tick strictly after `after_ms`; `None` when there is none (an expression
    /// such as February 30th).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let after = DateTime::<Utc>::from_timestamp_millis(after_ms)?;
        // Wall-clock times are searched as if they were UTC: no clock change in between.
        let mut wall = after.with_timezone(&self.tz).naive_local();
        for _ in 0..MAX_STEPS {
            wall = self
                .cron
                .find_next_occurrence(&Utc.from_utc_datetime(&wall), false)
                .ok()?
                .naive_utc();
            let at = self.instant(wall)?;
            if at > after_ms {
                return Some(at);
            }
        }
        None
    }

    /// The most recent `max` ticks in `(after_ms, until_ms]`, oldest first; the second
    /// value is how many there were in all (counted up to ten million).
    pub fn between(&self, after_ms: i64, until_ms: i64, max: usize) -> (Vec<i64>, usize) {
        let mut ticks = std::collections::VecDeque::new();
        let mut all = 0;
        let mut at = after_ms;
        while let Some(next) = self.next_after(at).filter(|t| *t <= until_ms) {
            all += 1;
            ticks.push_back(next);
            if ticks.len() > max {
                ticks.pop_front();
            }
            if all >= 10_000_000 {
                break;
            }
            at = next;
        }
        (ticks.into(), all)
    }

    /// The instant of the wall-clock time `wall`: its first occurrence, or for a time the
    /// clock skips, the first instant after the jump.
    fn instant(&self, wall: NaiveDateTime) -> Option<i64> {
        match self.tz.from_local_datetime(&wall) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t.timestamp_millis()),
            LocalResult::None => {
                // Skipped: step by whole minutes (every zone's jumps are on one) to the first
                // wall-clock time that exists after the jump.
                let mut probe = wall.with_second(0)?.with_nanosecond(0)?;
                for _ in 0..48 * 60 {
                    probe += Duration::minutes(1);
                    if let LocalResult::Single(t) | LocalResult::Ambiguous(t, _) =
                        self.tz.from_local_datetime(&probe)
                    {
                        return Some(t.timestamp_millis());
                    }
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Y-M-D h:m:s` in `tz` as Unix ms (the first occurrence).
    fn at(tz: &str, wall: &str) -> i64 {
        let tz = Tz::from_str(tz).unwrap();
        let wall = NaiveDateTime::parse_from_str(wall, "%Y-%m-%d %H:%M:%S").unwrap();
        tz.from_local_datetime(&wall)
            .earliest()
            .unwrap()
            .timestamp_millis()
    }

    fn utc(ms: i64) -> String {
        DateTime::<Utc>::from_timestamp_millis(ms)
            .unwrap()
            .format("%Y-%m-%d %H:%M:%S")
            .to_string()
    }

    fn ticks(expr: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
        let t = Ticks::parse(expr, tz).unwrap();
        let mut at_ms = at(tz, from);
        (0..n)
            .map(|_| {
                at_ms = t.next_after(at_ms).unwrap();
                utc(at_ms)
            })
            .collect()
    }

    #[test]
    fn a_daily_tick_in_the_skipped_hour_runs_right_after_the_jump() {
        // Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
        let got = ticks("30 2 * * *", "Europe/Berlin", "2026-03-27 12:00:00", 3);
        assert_eq!(
            got,
            [
                "2026-03-28 01:30:00", // 02:30 CET
                "2026-03-29 01:00:00", // 02:30 does not exist: 03:00 CEST
                "2026-03-30 00:30:00", // 02:30 CEST
            ]
        );
    }

    #[test]
    fn ticks_of_the_skipped_hour_become_one_tick_and_none_is_lost_after_it() {
        let got = ticks("*/30 * * * *", "Europe/Berlin", "2026-03-29 01:00:00", 4);
        assert_eq!(
            got,
            [
                "2026-03-29 00:30:00", // 01:30 CET
                "2026-03-29 01:00:00", // 02:00 and 02:30 skipped, and 03:00: one tick
                "2026-03-29 01:30:00", // 03:30 CEST
                "2026-03-29 02:00:00", // 04:00 CEST
            ]
        );
    }

    #[test]
    fn the_repeated_hour_ticks_once() {
        // Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00 UTC).
        let got = ticks("30 2 * * *", "Europe/Berlin", "2026-10-24 12:00:00", 2);
        assert_eq!(got, ["2026-10-25 00:30:00", "2026-10-26 01:30:00"]);
        let got = ticks("0,30 * * * *", "Europe/Berlin", "2026-10-25 01:45:00", 5);
        assert_eq!(
            got,
            [
                "2026-10-25 00:00:00", // 02:00 CEST
                "2026-10-25 00:30:00", // 02:30 CEST
                // 02:00 and 02:30 CET are the same wall-clock times: not again.
                "2026-10-25 02:00:00", // 03:00 CET
                "2026-10-25 02:30:00",
                "2026-10-25 03:00:00",
            ]
        );
    }

    #[test]
    fn a_host_started_inside_the_repeated_hour_waits_for_the_next_new_time() {
        let t = Ticks::parse("*/15 * * * *", "Europe/Berlin").unwrap();
        // 02:10 CET, the second 02:10 of the night (01:10 UTC).
        let second_pass = at("UTC", "2026-10-25 01:10:00");
        assert_eq!(
            utc(t.next_after(second_pass).unwrap()),
            "2026-10-25 02:00:00"
        );
    }

    #[test]
    fn six_fields_put_seconds_first() {
        let got = ticks("*/20 * * * * *", "UTC", "2026-01-01 00:00:00", 3);
        assert_eq!(
            got,
            [
                "2026-01-01 00:00:20",
                "2026-01-01 00:00:40",
                "2026-01-01 00:01:00"
            ]
        );
        let got = ticks(
            "15 10 9 * * MON",
            "America/New_York",
            "2026-01-01 00:00:00",
            1,
        );
        assert_eq!(got, ["2026-01-05 14:10:15"]);
    }

    #[test]
    fn between_counts_past_its_limit() {
        let t = Ticks::parse("* * * * * *", "UTC").unwrap();
        let from = at("UTC", "2026-01-01 00:00:00");
        let (ticks, all) = t.between(from, from + 10_000, 3);
        assert_eq!(ticks, [from + 8000, from + 9000, from + 10_000]);
        assert_eq!(all, 10);
    }

    #[test]
    fn bad_expressions_and_zones_say_what_is_expected() {
        let e = Ticks::parse("* * *", "UTC").unwrap_err().to_string();
        assert!(
            e.contains("it has 3 fields") && e.contains("5 fields"),
            "{e}"
        );
        let e = Ticks::parse("61 * * * *", "UTC").unwrap_err().to_string();
        assert!(e.contains("`61 * * * *`"), "{e}");
        let e = Ticks::parse("* * * * *", "Mars/Olympus")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown time zone `Mars/Olympus`"), "{e}");
    }
}
