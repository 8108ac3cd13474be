//! Claims: a due intent gets a lease, its fencing token (the new attempt's id) and a
//! `started` attempt, and hands out its frozen payload.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_core::retry::NextState;
use herald_core::{AttemptOutcome, Channel, IntentState};
use tokio_postgres::Row;
use uuid::Uuid;

use super::{sweep, AttemptRecord, ChannelPolicies};
use crate::{intent_channel, Hot, Result, Sql, Store};

/// One intent to claim, under the id its attempt will have. The caller makes the id once
/// and reuses it when it retries the claim, so a claim whose commit succeeded but whose
/// reply was lost is found again instead of leaving an orphan `started` attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest {
    pub intent_id: Uuid,
    pub attempt_id: Uuid,
}

impl ClaimRequest {
    /// A request with a fresh attempt id (UUIDv7: attempts sort by creation).
    pub fn new(intent_id: Uuid) -> Self {
        Self {
            intent_id,
            attempt_id: Uuid::now_v7(),
        }
    }
}

/// A claimed intent: its lease is held by `attempt_id` and its attempt row says `started`.
/// Carries the frozen payload: workers never re-render or re-read the seller.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub intent_id: Uuid,
    /// The attempt, and the lease's fencing token.
    pub attempt_id: Uuid,
    pub attempt_no: i32,
    /// Attempts that could have reached the provider, this one included (`not_sent`
    /// ones are not counted): what the retry policy counts against `max_attempts`.
    pub tries: u32,
    pub after_unknown: bool,
    pub channel: Channel,
    pub marketplace_id: String,
    pub trace_context: Option<String>,
    /// For logs and spans: which template revision the frozen payload came from.
    pub template_revision: String,
    pub started_at: DateTime<Utc>,
    pub destination: Option<String>,
    pub subject: Option<String>,
    pub body_text: Option<String>,
    pub body_html: Option<String>,
    /// An earlier try of the same request had made this claim (its reply was lost): the
    /// lease was granted then, not now.
    pub reclaimed: bool,
}

impl Claimed {
    /// The record of this attempt's outcome, for [`Store::record`]: its fencing token and
    /// partition key come from the claim.
    pub fn record(
        &self,
        outcome: AttemptOutcome,
        provider_message_id: Option<String>,
        error_category: Option<&'static str>,
        error_detail: Option<String>,
        next: NextState,
    ) -> AttemptRecord {
        AttemptRecord {
            intent_id: self.intent_id,
            attempt_id: self.attempt_id,
            started_at: self.started_at,
            outcome,
            provider_message_id,
            error_category,
            error_detail,
            next,
        }
    }
}

/// Why a delivery message was acknowledged without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// accepted, rejected, failed or suppressed: never sent again.
    Terminal,
    /// `unknown`, held for an operator.
    HeldUnknown,
    /// Another live attempt holds the lease (or this batch asked twice).
    Leased,
    /// A retry not yet due: its own outbox row will bring it back.
    NotDue,
    /// No such intent (a message from another environment, or corrupt).
    Missing,
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Terminal => "terminal",
            Skip::HeldUnknown => "held_unknown",
            Skip::Leased => "leased",
            Skip::NotDue => "not_due",
            Skip::Missing => "missing",
        }
    }
}

/// Whether a claim statement is the first try of its requests, or a retry after an error
/// (whose cause may have been a lost reply to a commit that happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimTry {
    First,
    Again,
}

#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    Claimed(Box<Claimed>),
    Skipped(Skip),
}

impl Store {
    /// Claims a batch of intents: every due intent is leased for `lease` to its request's
    /// attempt and gets that `started` attempt. A requested intent whose previous lease
    /// expired (state `sending`) has that attempt recorded `unknown` and moves on by its
    /// channel's policy; a retry that policy makes due comes back through its own outbox
    /// row. An intent this very request had already claimed (same attempt id: a retry
    /// after a lost reply) is handed out again, marked [`Claimed::reclaimed`]. Returns one
    /// outcome per request, in order; an intent asked for twice is claimed once.
    ///
    /// The common case is one statement (atomic on its own, no transaction round trips);
    /// intents that were not claimable cost a second transaction that says why.
    ///
    /// Failure policy: a crash after the claim's commit leaves `started` attempts under a
    /// lease; when the lease expires, the sweeper (or the next claim of the redelivered
    /// message) records them `unknown`.
    pub async fn claim(
        &self,
        worker: &str,
        lease: Duration,
        requests: &[ClaimRequest],
        policies: &ChannelPolicies,
        attempt: ClaimTry,
    ) -> Result<Vec<ClaimOutcome>> {
        let mut conn = self.conn().await?;
        // One attempt per intent (the first request's), sorted: concurrent claimers lock
        // rows in one order.
        let mut unique: BTreeMap<Uuid, Uuid> = BTreeMap::new();
        for r in requests {
            unique.entry(r.intent_id).or_insert(r.attempt_id);
        }
        let intent_ids: Vec<Uuid> = unique.keys().copied().collect();
        let attempt_ids: Vec<Uuid> = unique.values().copied().collect();
        // A retry must not claim again under an attempt id an earlier try already used
        // (that attempt may have been swept since): the first try needs no such check.
        let claim = Hot(match attempt {
            ClaimTry::First => CLAIM,
            ClaimTry::Again => CLAIM_AGAIN,
        });
        let rows = conn
            .query(claim, &[&intent_ids, &attempt_ids, &worker, &lease.as_secs_f64()])
            .await?;
        let mut claimed: HashMap<Uuid, Claimed> = HashMap::with_capacity(rows.len());
        for r in &rows {
            let c = claimed_from_row(r, false)?;
            claimed.insert(c.intent_id, c);
        }
        let others: Vec<Uuid> = intent_ids
            .iter()
            .filter(|id| !claimed.contains_key(id))
            .copied()
            .collect();
        let mut reasons: HashMap<Uuid, Skip> = HashMap::new();
        if !others.is_empty() {
            let tx = conn.transaction().await?;
            // On a retry, intents held by this very request's attempt: an earlier try
            // committed and its reply was lost. Locked, and never swept here: nothing was
            // sent, whatever the lease says. Handed out again; if the lease ran out
            // meanwhile, the send stage's deadline check records it `not_sent`. A first
            // try's attempt ids are new: nothing can be held by them.
            let mut ours: Vec<Uuid> = Vec::new();
            if attempt == ClaimTry::Again {
                ours = tx
                    .query(Hot(HELD), &[&others])
                    .await?
                    .iter()
                    .filter(|r| unique.get(&r.get::<_, Uuid>(0)) == Some(&r.get::<_, Uuid>(1)))
                    .map(|r| r.get(0))
                    .collect();
            }
            let rest: Vec<Uuid> = others.iter().filter(|id| !ours.contains(id)).copied().collect();
            sweep::expire_in(&tx, Some(&rest), policies, rest.len() as i64).await?;
            for r in tx.query(Hot(SKIP_REASONS), &[&rest]).await? {
                let state: &str = r.get(1);
                let not_due: Option<bool> = r.get(2);
                let reason = match state.parse::<IntentState>() {
                    Ok(IntentState::Unknown) => Skip::HeldUnknown,
                    Ok(IntentState::Sending) => Skip::Leased,
                    Ok(s) if s.is_terminal() => Skip::Terminal,
                    _ if not_due == Some(true) => Skip::NotDue,
                    // Due and not claimed: another claimer got there first, or (a retry)
                    // this request's attempt id was used before.
                    _ => Skip::Leased,
                };
                reasons.insert(r.get(0), reason);
            }
            if !ours.is_empty() {
                for r in tx.query(Hot(RECLAIM), &[&ours]).await? {
                    let c = claimed_from_row(&r, true)?;
                    claimed.insert(c.intent_id, c);
                }
            }
            tx.commit().await?;
        }
        // Requested twice in one batch: the second copy is skipped as leased.
        let mut handed_out = std::collections::HashSet::new();
        Ok(requests
            .iter()
            .map(|r| match claimed.remove(&r.intent_id) {
                Some(c) => {
                    handed_out.insert(r.intent_id);
                    ClaimOutcome::Claimed(Box::new(c))
                }
                None if handed_out.contains(&r.intent_id) => ClaimOutcome::Skipped(Skip::Leased),
                None => ClaimOutcome::Skipped(reasons.get(&r.intent_id).copied().unwrap_or(Skip::Missing)),
            })
            .collect())
    }
}

/// A row of [`CLAIM`] or [`RECLAIM`] (the same columns).
fn claimed_from_row(r: &Row, reclaimed: bool) -> Result<Claimed> {
    let attempt_no: i32 = r.get(2);
    let unsent: i32 = r.get(3);
    Ok(Claimed {
        intent_id: r.get(0),
        attempt_id: r.get(1),
        attempt_no,
        tries: super::tries(attempt_no - unsent).max(1),
        channel: intent_channel(r.get(4))?,
        marketplace_id: r.get(5),
        trace_context: r.get(6),
        after_unknown: r.get(7),
        started_at: r.get(8),
        destination: r.get(9),
        subject: r.get(10),
        body_text: r.get(11),
        body_html: r.get(12),
        template_revision: r.get(13),
        reclaimed,
    })
}

/// Why requested intents were not claimed (intent_states_pkey).
const SKIP_REASONS: &str =
    "SELECT intent_id, state, next_attempt_at > now() FROM intent_states WHERE intent_id = ANY($1::uuid[])";

/// The attempt holding the lease of requested intents in `sending`, locked
/// (intent_states_pkey).
const HELD: &str = "SELECT intent_id, lease_attempt_id FROM intent_states
                     WHERE intent_id = ANY($1::uuid[]) AND state = 'sending' FOR UPDATE";

/// The claim statement, with `$guard` added to the conditions an intent must meet. Only
/// the intent's state row changes (migrations/V13); its frozen contents are read.
macro_rules! claim_statement {
    ($guard:literal) => {
        concat!("WITH req AS (
                    SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS r(intent_id, attempt_id)
                 ), claimed AS (
                    UPDATE intent_states s
                       SET state = 'sending', lease_owner = $3, lease_attempt_id = req.attempt_id,
                           lease_until = now() + make_interval(secs => $4::float8),
                           attempt_count = s.attempt_count + 1, updated_at = now()
                      FROM req
                     WHERE s.intent_id = req.intent_id
                       AND ", state_is_one_of!("s", "pending", "retry_scheduled"), "
                       AND (s.next_attempt_at IS NULL OR s.next_attempt_at <= now())", $guard, "
                    RETURNING s.intent_id AS id, req.attempt_id, s.attempt_count, s.unsent_attempts, s.had_unknown
                 ), attempts AS (
                    INSERT INTO notification_attempts (id, intent_id, attempt_no, outcome, after_unknown, worker)
                    SELECT attempt_id, id, attempt_count, 'started', had_unknown, $3 FROM claimed
                    RETURNING id, started_at
                 )
                 SELECT c.id, c.attempt_id, c.attempt_count, c.unsent_attempts, i.channel, i.marketplace_id,
                        i.trace_context, c.had_unknown, a.started_at, p.destination, p.subject, p.body_text,
                        p.body_html, i.template_revision
                 FROM claimed c
                 JOIN attempts a ON a.id = c.attempt_id
                 JOIN intent_contents i ON i.id = c.id
                 JOIN notification_payloads p ON p.digest = i.payload_digest")
    };
}

/// Claims due intents by id: lease, fencing token, attempt row `started`, the frozen
/// payload (intent_states_pkey, then notification_intents_pkey for the contents).
pub(crate) const CLAIM: &str = claim_statement!("");

/// [`CLAIM`] for a retry: not under an attempt id an earlier try already used
/// (notification_attempts_intent_idx).
const CLAIM_AGAIN: &str = claim_statement!(
    "
                       AND NOT EXISTS (SELECT 1 FROM notification_attempts a
                                        WHERE a.intent_id = s.intent_id AND a.id = req.attempt_id)"
);

/// Claims this request had already made (the view: intent_states_pkey and
/// notification_intents_pkey;
/// notification_attempts_intent_idx for the attempt): the same columns as [`CLAIM`].
const RECLAIM: &str = "SELECT i.id, a.id, i.attempt_count, i.unsent_attempts, i.channel, i.marketplace_id,
                              i.trace_context, a.after_unknown, a.started_at, p.destination, p.subject,
                              p.body_text, p.body_html, i.template_revision
                         FROM notification_intents i
                         JOIN notification_attempts a
                           ON a.intent_id = i.id AND a.attempt_no = i.attempt_count AND a.id = i.lease_attempt_id
                         JOIN notification_payloads p ON p.digest = i.payload_digest
                        WHERE i.id = ANY($1::uuid[]) AND i.state = 'sending'";
