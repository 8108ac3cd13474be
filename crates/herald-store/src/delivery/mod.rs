//! Delivery's SQL, by stage: [`claim`] (a lease, its fencing token and a `started`
//! attempt), [`record`] (the outcome, and the intent's next state while the attempt still
//! holds the lease), [`sweep`] (the leases of dead or stalled workers, intents stranded
//! without an outbox row, and an operator's resolution of `unknown` intents).
//!
//! Claims and records take a batch each: the delivery worker groups the attempts about to
//! start, and those just finished, into one statement every few milliseconds.
//!
//! The rules every statement here keeps (DESIGN.md, "Fencing"):
//! - the attempt that holds an intent's lease is stored on the intent
//!   (`lease_attempt_id`); a worker's record moves the intent only while its attempt
//!   still holds it;
//! - evidence is append-only: an attempt recorded `unknown` stays `unknown`; an outcome
//!   that arrives later is stored beside it (`late_*`) and settles the intent only when no
//!   newer attempt was claimed;
//! - `not_sent` attempts never reached the provider and do not count against
//!   `max_attempts` (`unsent_attempts`).

mod claim;
mod record;
mod sweep;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use herald_core::retry::{NextState, RetryPolicy};
use herald_core::{AttemptOutcome, Channel};
use uuid::Uuid;

pub(crate) use claim::CLAIM;
pub use claim::{ClaimOutcome, ClaimRequest, ClaimTry, Claimed, Skip};
pub use record::Recorded;
pub(crate) use record::RECORD;
pub use sweep::Resolution;
pub(crate) use sweep::EXPIRED_LEASES;

/// The result of one attempt, ready to record.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub intent_id: Uuid,
    /// The attempt, which is also the fencing token of the lease it was claimed under.
    pub attempt_id: Uuid,
    /// The attempt's partition key ([`Claimed::started_at`]): the record touches one
    /// partition of `notification_attempts`, not all of them.
    pub started_at: DateTime<Utc>,
    pub outcome: AttemptOutcome,
    pub provider_message_id: Option<String>,
    pub error_category: Option<&'static str>,
    pub error_detail: Option<String>,
    pub next: NextState,
}

/// The retry policy of each channel, for decisions the store takes itself (expired leases).
pub type ChannelPolicies = HashMap<Channel, RetryPolicy>;

/// An intent's attempts that could have reached the provider (`attempt_count -
/// unsent_attempts`, read from the ledger) as the retry policy counts them. Negative
/// cannot happen (both counters only grow, `unsent_attempts` with `attempt_count`); it
/// reads as none, and the policy counts at least one ([`RetryPolicy::next`]).
///
/// [`RetryPolicy::next`]: herald_core::retry::RetryPolicy::next
pub(crate) fn tries(sent_attempts: i32) -> u32 {
    u32::try_from(sent_attempts).unwrap_or(0)
}

/// The columns of `(intent, next state)` pairs for the `unnest` of the statements that
/// move intents.
fn next_state_columns(
    next: impl Iterator<Item = (Uuid, NextState)>,
) -> (Vec<Uuid>, Vec<&'static str>, Vec<Option<f64>>) {
    let mut columns = (Vec::new(), Vec::new(), Vec::new());
    for (id, n) in next {
        columns.0.push(id);
        columns.1.push(n.state().as_str());
        columns.2.push(n.delay().map(|d| d.as_secs_f64()));
    }
    columns
}
