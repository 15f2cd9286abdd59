//! Rate limits: a queue's `rate_limit = "200/s"` and `burst`, and the budget arithmetic
//! behind them — the generic cell rate algorithm (a token bucket kept as one number).
//!
//! The bucket's whole state is its *theoretical arrival time* (`tat`, Unix µs): the moment
//! the bucket would be full again. Taking `n` messages' budget moves it `n` intervals later;
//! time catching up with it refills the bucket. Budget is there while `tat` is at most
//! `burst − 1` intervals ahead of now. So in any window as long as the rate's period, at most
//! the rate's count plus `burst − 1` messages are granted; with the default `burst = 1`
//! never more than the count, evenly spaced. Because the state is one number, hosts share a
//! queue's budget by keeping it in one SQL row ([`crate::queue`]) and one host keeps an
//! external queue's in memory ([`LocalBudget`]).
//!
//! A budget starts empty when it is first used (a new queue or limit, a new store, a host's
//! start for an external queue) and fills at the rate, up to `burst`, while unused: a host
//! cannot know what the protected service saw just before, so the first burst waits for a
//! quiet spell like any other.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

/// A rate: `count` per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Messages per period (at least 1).
    pub count: u32,
    /// The period: a second, a minute or an hour.
    pub period: Duration,
}

/// Why a `rate_limit` value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RateError {
    /// Not `COUNT/UNIT`.
    #[error("`{0}` is not a rate: write COUNT/UNIT, e.g. \"200/s\", \"30/min\" or \"1000/h\"")]
    Form(String),
    /// A unit other than second, minute, hour.
    #[error("`{0}` is not a unit: use s (second), min (minute) or h (hour)")]
    Unit(String),
    /// A count of 0.
    #[error("a limit of 0 lets nothing run: give at least 1 (or remove rate_limit)")]
    Zero,
}

impl Rate {
    /// Parse `COUNT/UNIT`: `s`/`sec`/`second`, `m`/`min`/`minute`, `h`/`hour`.
    pub fn parse(text: &str) -> Result<Rate, RateError> {
        let (count, unit) = text
            .split_once('/')
            .ok_or_else(|| RateError::Form(text.to_string()))?;
        let count: u32 = count
            .trim()
            .replace('_', "")
            .parse()
            .map_err(|_| RateError::Form(text.to_string()))?;
        let period = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            other => return Err(RateError::Unit(other.to_string())),
        };
        if count == 0 {
            return Err(RateError::Zero);
        }
        Ok(Rate { count, period })
    }

    /// The budget this rate and `burst` give.
    pub fn limit(self, burst: u32) -> Limit {
        let period_us = self.period.as_micros() as i64;
        // Rounded up: never faster than the rate.
        let interval_us = (period_us + i64::from(self.count) - 1) / i64::from(self.count);
        Limit {
            interval_us,
            tolerance_us: interval_us * (i64::from(burst.max(1)) - 1),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period.as_secs() {
            1 => "s",
            60 => "min",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// A rate and burst as budget arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Microseconds of budget one message takes.
    pub interval_us: i64,
    /// How far ahead of now the bucket's `tat` may run: `burst − 1` intervals.
    pub tolerance_us: i64,
}

/// What one take did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The bucket's new `tat`.
    pub tat_us: i64,
    /// Messages granted (at most those asked for).
    pub granted: u32,
    /// With none granted: microseconds until one would be.
    pub wait_us: i64,
}

/// Take budget for up to `wanted` messages from a bucket at `tat_us`, at `now_us`.
pub fn take(limit: Limit, tat_us: i64, now_us: i64, wanted: u32) -> Taken {
    let base = tat_us.max(now_us);
    // Message j (from 0) is granted while base + j·interval ≤ now + tolerance.
    let room = now_us + limit.tolerance_us - base;
    if room < 0 {
        return Taken {
            tat_us,
            granted: 0,
            wait_us: -room,
        };
    }
    let granted = (room / limit.interval_us + 1).min(i64::from(wanted)) as u32;
    Taken {
        tat_us: base + i64::from(granted) * limit.interval_us,
        granted,
        wait_us: 0,
    }
}

impl Limit {
    /// The `tat` of an empty bucket at `now_us`: one message now, then one per interval.
    pub fn empty_at(self, now_us: i64) -> i64 {
        now_us + self.tolerance_us
    }

    /// The budget of `messages`, in microseconds. Budget taken and not used (fewer messages
    /// were ready than granted) goes back: the bucket's `tat` moves back by this much.
    pub fn budget_us(self, messages: u32) -> i64 {
        i64::from(messages) * self.interval_us
    }
}

/// One host's budget for a queue, in memory.
#[derive(Debug)]
pub struct LocalBudget {
    limit: Limit,
    tat_us: Mutex<i64>,
}

impl LocalBudget {
    /// An empty bucket at `now_us`.
    pub fn new(limit: Limit, now_us: i64) -> Self {
        LocalBudget {
            limit,
            tat_us: Mutex::new(limit.empty_at(now_us)),
        }
    }

    /// Take budget for up to `wanted` messages now.
    pub fn take(&self, now_us: i64, wanted: u32) -> Taken {
        let mut tat = self.tat_us.lock().expect("rate budget");
        let taken = take(self.limit, *tat, now_us, wanted);
        *tat = taken.tat_us;
        taken
    }

    /// Return `unused` budget.
    pub fn give_back(&self, unused: u32) {
        let mut tat = self.tat_us.lock().expect("rate budget");
        *tat -= self.limit.budget_us(unused);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn rates_parse_in_seconds_minutes_and_hours() {
        assert_eq!(
            Rate::parse("200/s"),
            Ok(Rate {
                count: 200,
                period: Duration::from_secs(1)
            })
        );
        assert_eq!(Rate::parse("30 / min").unwrap().period.as_secs(), 60);
        assert_eq!(Rate::parse("1_000/hour").unwrap().count, 1000);
        assert_eq!(Rate::parse("0/s"), Err(RateError::Zero));
        assert!(matches!(Rate::parse("200"), Err(RateError::Form(_))));
        assert!(matches!(Rate::parse("200/day"), Err(RateError::Unit(_))));
        assert_eq!(Rate::parse("30/minute").unwrap().to_string(), "30/min");
    }

    #[test]
    fn a_full_bucket_grants_the_burst_then_one_per_interval() {
        let limit = Rate::parse("200/s").unwrap().limit(10);
        assert_eq!(limit.interval_us, 5_000);
        let t0 = 100 * S;
        let first = take(limit, 0, t0, 100);
        assert_eq!(first.granted, 10, "the burst at once");
        let none = take(limit, first.tat_us, t0, 100);
        assert_eq!((none.granted, none.wait_us), (0, 5_000));
        let next = take(limit, first.tat_us, t0 + 5_000, 100);
        assert_eq!(next.granted, 1);
        // A second later (from empty): 200 more, not 210 — the bucket holds at most `burst`.
        let later = take(limit, next.tat_us, t0 + 5_000 + S, 1_000);
        assert_eq!(later.granted, 10);
    }

    #[test]
    fn no_window_of_a_period_grants_more_than_the_count_plus_burst_minus_one() {
        let limit = Rate::parse("200/s").unwrap().limit(10);
        let mut tat = 0;
        let mut grants = Vec::new();
        // Asking every 0.7 ms for up to 3 for 5 seconds.
        let mut now = 10 * S;
        while now < 15 * S {
            let t = take(limit, tat, now, 3);
            tat = t.tat_us;
            grants.extend(std::iter::repeat_n(now, t.granted as usize));
            now += 700;
        }
        let most = grants
            .iter()
            .map(|&start| {
                grants
                    .iter()
                    .filter(|&&g| g >= start && g < start + S)
                    .count()
            })
            .max()
            .unwrap();
        assert_eq!(most, 209);
        let total = grants.len() as i64;
        assert!((total - (10 + 5 * 200)).abs() <= 1, "{total}");
    }

    #[test]
    fn the_default_burst_spaces_messages_evenly() {
        let limit = Rate::parse("2/s").unwrap().limit(1);
        let a = take(limit, 0, 10 * S, 5);
        assert_eq!(a.granted, 1);
        let b = take(limit, a.tat_us, 10 * S + S / 2 - 1, 5);
        assert_eq!((b.granted, b.wait_us), (0, 1));
    }

    #[test]
    fn unused_budget_goes_back() {
        let budget = LocalBudget::new(Rate::parse("10/s").unwrap().limit(5), 0);
        assert_eq!(budget.take(0, 5).granted, 1, "a new budget starts empty");
        assert_eq!(budget.take(S, 5).granted, 5, "and fills up to the burst");
        assert_eq!(budget.take(S, 5).granted, 0);
        budget.give_back(3);
        assert_eq!(budget.take(S, 5).granted, 3);
    }

    #[test]
    fn an_uneven_rate_rounds_towards_slower() {
        assert_eq!(Rate::parse("3/s").unwrap().limit(1).interval_us, 333_334);
    }
}
