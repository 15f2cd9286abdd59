//! Retry delays: exponential with "equal jitter" (half fixed, half random), capped.

use std::time::Duration;

/// Backoff policy of one queue.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// Delay before the second attempt.
    pub base: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Backoff {
    /// The delay before the attempt after `attempt` (1-based): `base * 2^(attempt-1)`,
    /// capped at `max`, then drawn uniformly from its upper half.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(32);
        let full = self.base.saturating_mul(1u32 << exp.min(31)).min(self.max);
        let half = full / 2;
        let jitter_ms = half.as_millis() as u64;
        let jitter = if jitter_ms == 0 {
            0
        } else {
            rand::random_range(0..=jitter_ms)
        };
        half + Duration::from_millis(jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_and_caps() {
        let b = Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(10),
        };
        for _ in 0..100 {
            let d1 = b.delay(1);
            assert!(
                d1 >= Duration::from_millis(500) && d1 <= Duration::from_secs(1),
                "{d1:?}"
            );
            let d3 = b.delay(3);
            assert!(
                d3 >= Duration::from_secs(2) && d3 <= Duration::from_secs(4),
                "{d3:?}"
            );
            let d40 = b.delay(40);
            assert!(
                d40 >= Duration::from_secs(5) && d40 <= Duration::from_secs(10),
                "{d40:?}"
            );
        }
    }
}
