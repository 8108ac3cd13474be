//! Intent states and attempt outcomes, exactly as named in DESIGN.md. Stored as text with
//! CHECK constraints (see migrations/) so psql output is readable during an incident.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentState {
    Pending,
    Sending,
    Accepted,
    Rejected,
    RetryScheduled,
    Unknown,
    Failed,
    Suppressed,
    /// The order's seller had no profile when the order was ingested: the intent's key and
    /// fingerprint are fixed, its payload is not. Rendered and frozen when the profile
    /// arrives; `suppressed` (`no_seller_profile`) once `ingest.profile_wait_secs` passed.
    AwaitingProfile,
    /// Created by a route in `observe` mode (the adoption path's first step): converged,
    /// rendered and frozen like any intent, with its consent decision, and never sent.
    /// Switching the route to `deliver` does not change it.
    Observed,
}

impl IntentState {
    pub const ALL: [IntentState; 10] = [
        IntentState::Pending,
        IntentState::Sending,
        IntentState::Accepted,
        IntentState::Rejected,
        IntentState::RetryScheduled,
        IntentState::Unknown,
        IntentState::Failed,
        IntentState::Suppressed,
        IntentState::AwaitingProfile,
        IntentState::Observed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IntentState::Pending => "pending",
            IntentState::Sending => "sending",
            IntentState::Accepted => "accepted",
            IntentState::Rejected => "rejected",
            IntentState::RetryScheduled => "retry_scheduled",
            IntentState::Unknown => "unknown",
            IntentState::Failed => "failed",
            IntentState::Suppressed => "suppressed",
            IntentState::AwaitingProfile => "awaiting_profile",
            IntentState::Observed => "observed",
        }
    }

    /// A terminal intent is never sent again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            IntentState::Accepted
                | IntentState::Rejected
                | IntentState::Failed
                | IntentState::Suppressed
                | IntentState::Observed
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Started,
    Accepted,
    Rejected,
    Retryable,
    Unknown,
    /// Claimed, and no request went to the provider: the worker's lease could no longer
    /// cover a send, or the worker released the attempt (shutdown, partition revoked).
    /// Does not count against `max_attempts`; the reason is a [`NotSentReason`].
    NotSent,
}

impl AttemptOutcome {
    pub const ALL: [AttemptOutcome; 6] = [
        AttemptOutcome::Started,
        AttemptOutcome::Accepted,
        AttemptOutcome::Rejected,
        AttemptOutcome::Retryable,
        AttemptOutcome::Unknown,
        AttemptOutcome::NotSent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Started => "started",
            AttemptOutcome::Accepted => "accepted",
            AttemptOutcome::Rejected => "rejected",
            AttemptOutcome::Retryable => "retryable",
            AttemptOutcome::Unknown => "unknown",
            AttemptOutcome::NotSent => "not_sent",
        }
    }
}

/// Why a claimed attempt sent nothing (its `error_category`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotSentReason {
    /// Just before the request, the worker's own deadline (its lease, less the attempt
    /// timeout and a margin) had passed: a send could outlive the lease.
    LeaseDeadline,
    /// The process was shutting down (SIGTERM) before the attempt's turn came.
    Shutdown,
    /// The delivery message's partition was revoked (rebalance) before the attempt's turn.
    Revoked,
}

impl NotSentReason {
    pub const ALL: [NotSentReason; 3] = [
        NotSentReason::LeaseDeadline,
        NotSentReason::Shutdown,
        NotSentReason::Revoked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotSentReason::LeaseDeadline => "lease_deadline",
            NotSentReason::Shutdown => "shutdown",
            NotSentReason::Revoked => "revoked",
        }
    }

    /// The attempt's `error_detail`.
    pub fn detail(self) -> &'static str {
        match self {
            NotSentReason::LeaseDeadline => {
                "not sent: the lease could no longer cover a send (waited too long for a send slot or the channel's rate)"
            }
            NotSentReason::Shutdown => "not sent: the worker was shutting down",
            NotSentReason::Revoked => "not sent: the delivery message's partition was revoked",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown {kind} {value:?}")]
pub struct UnknownValue {
    pub kind: &'static str,
    pub value: String,
}

macro_rules! text_enum {
    ($ty:ty, $kind:literal) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownValue {
                        kind: $kind,
                        value: s.to_owned(),
                    })
            }
        }
    };
}

text_enum!(IntentState, "intent state");
text_enum!(AttemptOutcome, "attempt outcome");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_text_form() {
        for s in IntentState::ALL {
            assert_eq!(s.as_str().parse::<IntentState>().unwrap(), s);
        }
        for o in AttemptOutcome::ALL {
            assert_eq!(o.as_str().parse::<AttemptOutcome>().unwrap(), o);
        }
        assert!("done".parse::<IntentState>().is_err());
        assert_eq!(AttemptOutcome::NotSent.as_str(), "not_sent");
    }

    #[test]
    fn only_final_states_are_terminal() {
        assert!(IntentState::Suppressed.is_terminal());
        assert!(IntentState::Accepted.is_terminal());
        assert!(!IntentState::Unknown.is_terminal());
        assert!(!IntentState::RetryScheduled.is_terminal());
        assert!(!IntentState::Pending.is_terminal());
        assert!(!IntentState::AwaitingProfile.is_terminal());
        assert!(IntentState::Observed.is_terminal());
    }
}

/// What a provider's event says about whether the provider had the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The provider took the message (it sent, delivered, bounced, was complained about,
    /// or is retrying delivery): an `unknown` attempt was accepted.
    Accepted,
    /// The provider refused the message (a virus, a rendering failure): it never left.
    Rejected,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "accepted" => Some(Verdict::Accepted),
            "rejected" => Some(Verdict::Rejected),
            _ => None,
        }
    }
}
