//! Turning what a handler call produced into what happens to the message: complete, retry
//! with backoff, fail, or — when the handler never ran for want of a free instance — hand
//! it back uncounted. Pure functions, so every rule is unit-tested.

use crate::queue::{Backoff, Disposition, now_ms};
use crate::runtime::{HandlerError, InvokeError, InvokeResult, Outcome};

/// A transient failure of attempt `attempt`: retry after the backoff, or fail when it was
/// the last attempt.
pub fn transient(error: String, attempt: u32, max_attempts: u32, backoff: Backoff) -> Disposition {
    if attempt >= max_attempts {
        Disposition::Fail {
            error: format!("{error} (attempt {attempt} of {max_attempts}, no attempts left)"),
        }
    } else {
        let delay = backoff.delay(attempt);
        Disposition::Retry {
            at_ms: now_ms() + delay.as_millis() as i64,
            error: Some(error),
        }
    }
}

/// The disposition of a message after attempt `attempt` of `max_attempts`.
pub fn decide(
    result: &InvokeResult,
    attempt: u32,
    max_attempts: u32,
    backoff: Backoff,
) -> Disposition {
    let last = attempt >= max_attempts;
    let retry_or_fail = |error: String| transient(error, attempt, max_attempts, backoff);
    match result {
        Ok(Ok(Outcome::Completed | Outcome::PendingHandoff)) => Disposition::Complete,
        Ok(Ok(Outcome::RetryAfter(ms))) if last => Disposition::Fail {
            error: format!(
                "handler asked to retry after {ms} ms on attempt {attempt} of {max_attempts}, no attempts left"
            ),
        },
        Ok(Ok(Outcome::RetryAfter(ms))) => Disposition::Retry {
            at_ms: now_ms() + *ms as i64,
            error: None,
        },
        Ok(Err(HandlerError::Permanent(error))) => Disposition::Fail {
            error: format!("permanent error: {error}"),
        },
        Ok(Err(HandlerError::Transient(error))) => {
            retry_or_fail(format!("transient error: {error}"))
        }
        // Not the handler's doing: it never ran.
        Err(InvokeError::NoInstance(_)) => Disposition::Release,
        Err(invoke_error) => retry_or_fail(invoke_error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const B: Backoff = Backoff {
        base: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };

    #[test]
    fn success_and_handoff_complete() {
        assert_eq!(
            decide(&Ok(Ok(Outcome::Completed)), 1, 3, B),
            Disposition::Complete
        );
        assert_eq!(
            decide(&Ok(Ok(Outcome::PendingHandoff)), 3, 3, B),
            Disposition::Complete
        );
    }

    #[test]
    fn permanent_fails_at_once() {
        let d = decide(&Ok(Err(HandlerError::Permanent("bad sku".into()))), 1, 5, B);
        assert_eq!(
            d,
            Disposition::Fail {
                error: "permanent error: bad sku".into()
            }
        );
    }

    #[test]
    fn transient_retries_with_backoff_then_fails() {
        let before = now_ms();
        match decide(&Ok(Err(HandlerError::Transient("db down".into()))), 1, 3, B) {
            Disposition::Retry { at_ms, error } => {
                assert!(at_ms >= before + 50 && at_ms <= now_ms() + 100, "{at_ms}");
                assert_eq!(error.as_deref(), Some("transient error: db down"));
            }
            other => panic!("{other:?}"),
        }
        match decide(&Err(InvokeError::Trap("unreachable".into())), 3, 3, B) {
            Disposition::Fail { error } => assert!(
                error.contains("trapped: unreachable") && error.contains("no attempts left"),
                "{error}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_free_instance_hands_the_message_back_even_on_its_last_attempt() {
        let none = Err(InvokeError::NoInstance(Duration::from_secs(1)));
        assert_eq!(decide(&none, 1, 3, B), Disposition::Release);
        assert_eq!(decide(&none, 3, 3, B), Disposition::Release);
    }

    #[test]
    fn retry_after_uses_the_handlers_delay() {
        let before = now_ms();
        match decide(&Ok(Ok(Outcome::RetryAfter(5000))), 1, 3, B) {
            Disposition::Retry { at_ms, error: None } => assert!(at_ms >= before + 5000),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decide(&Ok(Ok(Outcome::RetryAfter(1))), 3, 3, B),
            Disposition::Fail { .. }
        ));
    }
}
