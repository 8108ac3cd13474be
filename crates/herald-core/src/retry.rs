//! What happens to an intent after an attempt: the next state, and for a retry, when.
//!
//! Exponential backoff with full jitter, capped, up to `max_attempts`; `unknown` follows
//! the channel's policy (`hold` for an operator, or `retry` with the next attempt flagged).
//! Deterministic given the jitter sample, so every row of the table is unit-tested.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::{AttemptOutcome, IntentState};

/// What to do with an intent whose attempt's outcome could not be observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownPolicy {
    /// Intent state `unknown` until an operator runs `herald intent resolve`.
    Hold,
    /// Schedule another attempt, flagged as following an unknown outcome: the seller may
    /// receive the message twice, and the ledger says why.
    Retry,
}

impl UnknownPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownPolicy::Hold => "hold",
            UnknownPolicy::Retry => "retry",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included. After the last, a retryable failure is `failed`.
    pub max_attempts: u32,
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    pub on_unknown: UnknownPolicy,
    /// How long an `unknown` outcome waits for the provider's own evidence (the
    /// `reconcile` role) before `on_unknown` decides. `None`: the policy decides at once
    /// (no evidence is read for this channel).
    pub evidence_window: Option<Duration>,
}

/// The intent's next state after an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NextState {
    Accepted,
    Rejected,
    /// Due again after this delay (a new outbox row becomes due then).
    RetryAfter(Duration),
    Failed,
    /// `unknown`, held for an operator.
    HoldUnknown,
    /// `unknown`, waiting this long for the provider's evidence; then the channel's
    /// `on_unknown` policy decides ([`RetryPolicy::after_silence`]).
    AwaitEvidence(Duration),
}

impl NextState {
    pub fn state(self) -> IntentState {
        match self {
            NextState::Accepted => IntentState::Accepted,
            NextState::Rejected => IntentState::Rejected,
            NextState::RetryAfter(_) => IntentState::RetryScheduled,
            NextState::Failed => IntentState::Failed,
            NextState::HoldUnknown | NextState::AwaitEvidence(_) => IntentState::Unknown,
        }
    }

    /// The delay the intent is stored with (`next_attempt_at`): a retry's backoff, or the
    /// end of the wait for evidence. Only a retry also gets an outbox row.
    pub fn delay(self) -> Option<Duration> {
        match self {
            NextState::RetryAfter(d) | NextState::AwaitEvidence(d) => Some(d),
            _ => None,
        }
    }
}

impl RetryPolicy {
    /// Backoff before attempt `attempt_no + 1`: a uniform sample (`jitter` in [0, 1)) of
    /// `min(max, base * 2^(attempt_no - 1))` ("full jitter"), never below 10% of it.
    pub fn backoff(&self, attempt_no: u32, jitter: f64) -> Duration {
        let exp = attempt_no.saturating_sub(1).min(30);
        let ceiling = self
            .base_backoff
            .saturating_mul(1u32 << exp)
            .min(self.max_backoff);
        ceiling.mul_f64(0.1 + 0.9 * jitter.clamp(0.0, 1.0))
    }

    /// The next state after the `tries`-th attempt that could have reached the provider
    /// ended with `outcome` (attempts recorded `not_sent` are not counted: they never
    /// reached it).
    pub fn next(&self, outcome: AttemptOutcome, tries: u32, jitter: f64) -> NextState {
        let attempt_no = tries.max(1);
        let retry = || {
            if attempt_no >= self.max_attempts {
                NextState::Failed
            } else {
                NextState::RetryAfter(self.backoff(attempt_no, jitter))
            }
        };
        match outcome {
            AttemptOutcome::Accepted => NextState::Accepted,
            AttemptOutcome::Rejected => NextState::Rejected,
            AttemptOutcome::Retryable => retry(),
            // Out of attempts after an unknown outcome, the honest state is still `unknown`
            // (the message may have arrived), not `failed`: an operator decides.
            AttemptOutcome::Unknown => match self.evidence_window {
                Some(window) => NextState::AwaitEvidence(window),
                None => self.after_silence(attempt_no, jitter),
            },
            // Nothing reached the provider: due again soon, never `failed` for it (a channel
            // held back by its rate must not use up the intent's attempts).
            AttemptOutcome::NotSent => NextState::RetryAfter(self.backoff(1, jitter)),
            // An attempt is never recorded as `started` twice; treat it as unknown.
            AttemptOutcome::Started => NextState::HoldUnknown,
        }
    }

    /// The channel's `on_unknown` decision for an `unknown` outcome of the `tries`-th
    /// attempt when no evidence settled it: at once without an evidence window, else once
    /// the window has passed in silence.
    pub fn after_silence(&self, tries: u32, jitter: f64) -> NextState {
        let attempt_no = tries.max(1);
        match self.on_unknown {
            UnknownPolicy::Retry if attempt_no < self.max_attempts => {
                NextState::RetryAfter(self.backoff(attempt_no, jitter))
            }
            _ => NextState::HoldUnknown,
        }
    }
}

/// A uniform sample in [0, 1) for backoff jitter. SipHash of the time, keyed by std's
/// per-process random keys (which advance on every call): no random-number crate needed
/// for a jitter.
pub fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(on_unknown: UnknownPolicy) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            base_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
            on_unknown,
            evidence_window: None,
        }
    }

    #[test]
    fn accepted_and_rejected_are_final() {
        let p = policy(UnknownPolicy::Retry);
        assert_eq!(p.next(AttemptOutcome::Accepted, 1, 0.5), NextState::Accepted);
        assert_eq!(p.next(AttemptOutcome::Rejected, 1, 0.5), NextState::Rejected);
    }

    #[test]
    fn retryable_backs_off_then_fails_after_max_attempts() {
        let p = policy(UnknownPolicy::Hold);
        assert_eq!(
            p.next(AttemptOutcome::Retryable, 1, 1.0),
            NextState::RetryAfter(Duration::from_secs(1))
        );
        assert_eq!(
            p.next(AttemptOutcome::Retryable, 2, 1.0),
            NextState::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(
            p.next(AttemptOutcome::Retryable, 3, 1.0),
            NextState::RetryAfter(Duration::from_secs(4))
        );
        assert_eq!(p.next(AttemptOutcome::Retryable, 4, 1.0), NextState::Failed);
    }

    #[test]
    fn backoff_is_capped_and_jittered() {
        let p = policy(UnknownPolicy::Hold);
        assert_eq!(p.backoff(10, 1.0), Duration::from_secs(5));
        assert_eq!(p.backoff(10, 0.0), Duration::from_millis(500));
        assert!(p.backoff(3, 0.5) < p.backoff(3, 0.9));
    }

    #[test]
    fn unknown_follows_the_channel_policy() {
        assert_eq!(
            policy(UnknownPolicy::Hold).next(AttemptOutcome::Unknown, 1, 0.5),
            NextState::HoldUnknown
        );
        assert!(matches!(
            policy(UnknownPolicy::Retry).next(AttemptOutcome::Unknown, 1, 0.5),
            NextState::RetryAfter(_)
        ));
        assert_eq!(
            policy(UnknownPolicy::Retry).next(AttemptOutcome::Unknown, 4, 0.5),
            NextState::HoldUnknown
        );
    }

    #[test]
    fn unknown_waits_for_evidence_then_the_policy_decides() {
        let window = Duration::from_secs(600);
        for on_unknown in [UnknownPolicy::Hold, UnknownPolicy::Retry] {
            let p = RetryPolicy {
                evidence_window: Some(window),
                ..policy(on_unknown)
            };
            let next = p.next(AttemptOutcome::Unknown, 1, 0.5);
            assert_eq!(next, NextState::AwaitEvidence(window));
            assert_eq!(next.state(), IntentState::Unknown);
            assert_eq!(next.delay(), Some(window));
            assert_eq!(
                p.after_silence(1, 0.5),
                policy(on_unknown).next(AttemptOutcome::Unknown, 1, 0.5)
            );
        }
        // Only `unknown` waits: the provider answered the others.
        let p = RetryPolicy {
            evidence_window: Some(window),
            ..policy(UnknownPolicy::Hold)
        };
        assert_eq!(p.next(AttemptOutcome::Accepted, 1, 0.5), NextState::Accepted);
        assert!(matches!(
            p.next(AttemptOutcome::Retryable, 1, 0.5),
            NextState::RetryAfter(_)
        ));
    }

    #[test]
    fn not_sent_comes_back_soon_and_never_uses_up_the_attempts() {
        let p = policy(UnknownPolicy::Hold);
        for tries in [0, 1, 4, 40] {
            match p.next(AttemptOutcome::NotSent, tries, 1.0) {
                NextState::RetryAfter(d) => assert_eq!(d, Duration::from_secs(1), "{tries}"),
                other => panic!("after {tries} tries: {other:?}"),
            }
        }
    }

    #[test]
    fn jitter_is_a_spread_sample_in_the_unit_interval() {
        let samples: Vec<f64> = (0..1000).map(|_| jitter()).collect();
        assert!(samples.iter().all(|j| (0.0..1.0).contains(j)));
        let low = samples.iter().filter(|j| **j < 0.5).count();
        assert!((350..650).contains(&low), "{low} of 1000 below 0.5");
    }

    #[test]
    fn next_state_maps_to_intent_states() {
        assert_eq!(NextState::HoldUnknown.state(), IntentState::Unknown);
        assert_eq!(
            NextState::RetryAfter(Duration::ZERO).state(),
            IntentState::RetryScheduled
        );
    }
}
