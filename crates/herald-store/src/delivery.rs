//! Delivery's SQL: claim intents (lease + `started` attempt), record attempts (outcome +
//! the intent's next state + an outbox row for a retry), expire the leases of dead
//! workers, and the operator's resolution of `unknown` intents.
//!
//! Claims and records take a batch each: the delivery worker groups the attempts about to
//! start, and those just finished, into one transaction every few milliseconds.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_core::retry::{NextState, RetryPolicy};
use herald_core::{AttemptOutcome, Channel, IntentState};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::inspect::IntentRef;
use crate::{Result, Store, StoreError};

/// A claimed intent: its lease is held and its attempt row says `started`. Carries the
/// frozen payload: workers never re-render or re-read the seller.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub intent_id: Uuid,
    pub attempt_id: Uuid,
    pub attempt_no: i32,
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
}

/// Why a delivery message was acknowledged without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// accepted, rejected, failed or suppressed: never sent again.
    Terminal,
    /// `unknown`, held for an operator.
    HeldUnknown,
    /// Another live worker holds the lease (or this batch asked twice).
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

#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    Claimed(Box<Claimed>),
    Skipped(Skip),
}

/// The result of one attempt, ready to record.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub intent_id: Uuid,
    pub attempt_id: Uuid,
    pub outcome: AttemptOutcome,
    pub provider_message_id: Option<String>,
    pub error_category: Option<&'static str>,
    pub error_detail: Option<String>,
    pub next: NextState,
}

/// The retry policy of each channel, for decisions the store takes itself (expired leases).
pub type ChannelPolicies = HashMap<Channel, RetryPolicy>;

/// A uniform sample in [0, 1) for backoff jitter.
pub fn jitter() -> f64 {
    (Uuid::new_v4().as_u128() >> 75) as f64 / (1u64 << 53) as f64
}

impl Store {
    /// Claims a batch of intents for `worker`. First, any requested intent whose previous
    /// worker died (state `sending`, lease expired) has that attempt recorded `unknown`
    /// and moves on by its channel's policy; then every due intent is leased for `lease`
    /// and gets a `started` attempt. Returns one outcome per requested id, in order.
    ///
    /// Failure policy: the claim is one transaction. A crash after its commit leaves
    /// `started` attempts under a lease; when the lease expires, the sweeper (or the next
    /// claim of the redelivered message) records them `unknown`.
    pub async fn claim(
        &self,
        worker: &str,
        lease: Duration,
        intent_ids: &[Uuid],
        policies: &ChannelPolicies,
    ) -> Result<Vec<ClaimOutcome>> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        // Sorted and unique: concurrent claimers lock rows in one order.
        let unique: Vec<Uuid> = intent_ids
            .iter()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        expire_in(&*tx, Some(&unique), policies, unique.len() as i64).await?;
        let attempt_ids: Vec<Uuid> = unique.iter().map(|_| Uuid::now_v7()).collect();
        // notification_intents_pkey; notification_attempts_intent_idx for after_unknown.
        let rows = tx
            .query(CLAIM, &[&unique, &attempt_ids, &worker, &lease.as_secs_f64()])
            .await?;
        let mut claimed: HashMap<Uuid, Claimed> = HashMap::with_capacity(rows.len());
        for r in rows {
            let channel: &str = r.get(3);
            let c = Claimed {
                intent_id: r.get(0),
                attempt_id: r.get(1),
                attempt_no: r.get(2),
                channel: channel
                    .parse()
                    .map_err(|e| StoreError::Corrupt(format!("notification_intents.channel: {e}")))?,
                marketplace_id: r.get(4),
                trace_context: r.get(5),
                after_unknown: r.get(6),
                started_at: r.get(7),
                destination: r.get(8),
                subject: r.get(9),
                body_text: r.get(10),
                body_html: r.get(11),
                template_revision: r.get(12),
            };
            claimed.insert(c.intent_id, c);
        }
        let others: Vec<Uuid> = unique
            .iter()
            .filter(|id| !claimed.contains_key(id))
            .copied()
            .collect();
        let mut reasons: HashMap<Uuid, Skip> = HashMap::new();
        if !others.is_empty() {
            for r in tx
                .query(
                    "SELECT id, state, next_attempt_at > now() FROM notification_intents WHERE id = ANY($1::uuid[])",
                    &[&others],
                )
                .await?
            {
                let state: &str = r.get(1);
                let not_due: Option<bool> = r.get(2);
                let reason = match state.parse::<IntentState>() {
                    Ok(IntentState::Unknown) => Skip::HeldUnknown,
                    Ok(IntentState::Sending) => Skip::Leased,
                    Ok(s) if s.is_terminal() => Skip::Terminal,
                    _ if not_due == Some(true) => Skip::NotDue,
                    _ => Skip::Leased,
                };
                reasons.insert(r.get(0), reason);
            }
        }
        tx.commit().await?;
        // Requested twice in one batch: the second copy is skipped as leased.
        let claimed_ids: BTreeSet<Uuid> = claimed.keys().copied().collect();
        Ok(intent_ids
            .iter()
            .map(|id| match claimed.remove(id) {
                Some(c) => ClaimOutcome::Claimed(Box::new(c)),
                None if claimed_ids.contains(id) => ClaimOutcome::Skipped(Skip::Leased),
                None => ClaimOutcome::Skipped(reasons.get(id).copied().unwrap_or(Skip::Missing)),
            })
            .collect())
    }

    /// Records finished attempts and their intents' next states in one transaction; a
    /// retry gets an outbox row that becomes due after its backoff.
    ///
    /// Failure policy: a crash before this commit leaves the attempts `started` under a
    /// lease (recorded `unknown` when it expires) and the Kafka offsets unstored (the
    /// messages come back and find the intent leased, then resolved by the sweeper).
    pub async fn record(&self, worker: &str, records: &[AttemptRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let ids: Vec<Uuid> = records.iter().map(|r| r.attempt_id).collect();
        let outcomes: Vec<&str> = records.iter().map(|r| r.outcome.as_str()).collect();
        let provider_ids: Vec<Option<&str>> =
            records.iter().map(|r| r.provider_message_id.as_deref()).collect();
        let categories: Vec<Option<&str>> = records.iter().map(|r| r.error_category).collect();
        let details: Vec<Option<&str>> = records.iter().map(|r| r.error_detail.as_deref()).collect();
        // notification_attempts_pkey (id, started_at): a lookup per partition. An attempt the
        // sweeper already marked unknown (lease expired while we were slow) gets its real
        // outcome: the ledger keeps the truth, the intent keeps the sweeper's decision.
        tx.execute(
            RECORD_ATTEMPTS,
            &[&ids, &outcomes, &provider_ids, &categories, &details],
        )
        .await?;
        let next: Vec<(Uuid, NextState)> = records.iter().map(|r| (r.intent_id, r.next)).collect();
        apply_next_states(&*tx, &next, Guard::LeaseHeldBy(worker)).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records `unknown` for up to `limit` attempts whose worker's lease expired, and moves
    /// their intents on by policy. Returns how many intents it settled.
    pub async fn expire_leases(&self, policies: &ChannelPolicies, limit: i64) -> Result<usize> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let n = expire_in(&*tx, None, policies, limit).await?;
        tx.commit().await?;
        Ok(n)
    }

    /// An operator's decision on an intent in state `unknown`: `accepted` (the seller got
    /// it) or `retry` (send again, flagged as following an unknown outcome). The reason and
    /// operator are stored in `intent_resolutions`.
    pub async fn resolve_unknown(
        &self,
        intent: IntentRef<'_>,
        resolution: Resolution,
        reason: &str,
        operator: &str,
    ) -> Result<Uuid> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let id = crate::inspect::intent_id(&*tx, intent, true).await?;
        let row = tx
            .query_one("SELECT state FROM notification_intents WHERE id = $1", &[&id])
            .await?;
        let state: String = row.get(0);
        if state != IntentState::Unknown.as_str() {
            return Err(StoreError::InvalidState(format!(
                "intent {id} ({intent}) is {state}, not unknown: only unknown intents are resolved"
            )));
        }
        tx.execute(
            "INSERT INTO intent_resolutions (intent_id, resolved_as, reason, operator) VALUES ($1, $2, $3, $4)",
            &[&id, &resolution.as_str(), &reason, &operator],
        )
        .await?;
        let next = match resolution {
            Resolution::Accepted => NextState::Accepted,
            Resolution::Retry => NextState::RetryAfter(Duration::ZERO),
        };
        apply_next_states(&*tx, &[(id, next)], Guard::State(IntentState::Unknown)).await?;
        tx.commit().await?;
        Ok(id)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    Accepted,
    Retry,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Accepted => "accepted",
            Resolution::Retry => "retry",
        }
    }
}

/// Which intents a state change may touch.
enum Guard<'a> {
    /// Still `sending` under this worker's lease (a worker recording its own attempt).
    LeaseHeldBy(&'a str),
    /// Still `sending` with an expired lease (the sweeper).
    LeaseExpired,
    /// In this state (an operator's resolution).
    State(IntentState),
}

/// Sets the intents' next states, clears their leases, and queues an outbox row for each
/// retry, due when its backoff ends. One statement.
async fn apply_next_states(
    client: &impl GenericClient,
    next: &[(Uuid, NextState)],
    guard: Guard<'_>,
) -> Result<u64> {
    if next.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = next.iter().map(|(id, _)| *id).collect();
    let states: Vec<&str> = next.iter().map(|(_, n)| n.state().as_str()).collect();
    let delays: Vec<Option<f64>> = next
        .iter()
        .map(|(_, n)| match n {
            NextState::RetryAfter(d) => Some(d.as_secs_f64()),
            _ => None,
        })
        .collect();
    let (guard_sql, guard_arg): (&str, Option<&str>) = match guard {
        Guard::LeaseHeldBy(worker) => ("i.state = 'sending' AND i.lease_owner = $4", Some(worker)),
        Guard::LeaseExpired => ("i.state = 'sending' AND i.lease_until < now()", None),
        Guard::State(s) => ("i.state = $4", Some(s.as_str())),
    };
    // notification_intents_pkey; outbox rows for retries in the same statement.
    let sql = format!(
        "WITH r AS (
            SELECT * FROM unnest($1::uuid[], $2::text[], $3::float8[]) AS r(id, state, delay_secs)
         ), moved AS (
            UPDATE notification_intents i
               SET state = r.state,
                   next_attempt_at = CASE WHEN r.delay_secs IS NULL THEN NULL
                                          ELSE now() + make_interval(secs => r.delay_secs) END,
                   lease_owner = NULL, lease_until = NULL, updated_at = now()
              FROM r
             WHERE i.id = r.id AND {guard_sql}
            RETURNING i.id, i.trace_context, r.delay_secs
         )
         INSERT INTO outbox (intent_id, available_at, trace_context)
         SELECT id, now() + make_interval(secs => delay_secs), trace_context FROM moved WHERE delay_secs IS NOT NULL"
    );
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&ids, &states, &delays];
    if let Some(arg) = &guard_arg {
        params.push(arg);
    }
    Ok(client.execute(&sql, &params).await?)
}

/// Claims due intents by id: lease, attempt row `started`, the frozen payload
/// (notification_intents_pkey; notification_attempts_intent_idx for after_unknown).
pub(crate) const CLAIM: &str = "WITH req AS (
                    SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS r(intent_id, attempt_id)
                 ), claimed AS (
                    UPDATE notification_intents i
                       SET state = 'sending', lease_owner = $3,
                           lease_until = now() + make_interval(secs => $4::float8),
                           attempt_count = i.attempt_count + 1, updated_at = now()
                      FROM req
                     WHERE i.id = req.intent_id
                       AND i.state IN ('pending', 'retry_scheduled')
                       AND (i.next_attempt_at IS NULL OR i.next_attempt_at <= now())
                    RETURNING i.id, req.attempt_id, i.attempt_count, i.channel, i.marketplace_id,
                              i.payload_digest, i.trace_context, i.template_revision,
                              EXISTS (SELECT 1 FROM notification_attempts a
                                      WHERE a.intent_id = i.id AND a.outcome = 'unknown') AS after_unknown
                 ), attempts AS (
                    INSERT INTO notification_attempts (id, intent_id, attempt_no, outcome, after_unknown, worker, trace_context)
                    SELECT attempt_id, id, attempt_count, 'started', after_unknown, $3, trace_context FROM claimed
                    RETURNING id, started_at
                 )
                 SELECT c.id, c.attempt_id, c.attempt_count, c.channel, c.marketplace_id, c.trace_context,
                        c.after_unknown, a.started_at, p.destination, p.subject, p.body_text, p.body_html,
                        c.template_revision
                 FROM claimed c
                 JOIN attempts a ON a.id = c.attempt_id
                 JOIN notification_payloads p ON p.digest = c.payload_digest";

/// Attempts' outcomes (notification_attempts_pkey (id, started_at): a lookup per partition).
pub(crate) const RECORD_ATTEMPTS: &str = "UPDATE notification_attempts a
    SET outcome = r.outcome, finished_at = now(), provider_message_id = r.provider_message_id,
        error_category = r.error_category, error_detail = r.error_detail
   FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
        AS r(id, outcome, provider_message_id, error_category, error_detail)
  WHERE a.id = r.id
    AND (a.outcome = 'started' OR (a.outcome = 'unknown' AND a.error_category = 'lease_expired'))";

/// Intents whose lease expired: dead workers' attempts
/// (notification_intents_sending_lease_idx).
pub(crate) const EXPIRED_LEASES: &str =
    "SELECT id, channel, attempt_count, lease_owner FROM notification_intents
     WHERE state = 'sending' AND lease_until < now() AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
     ORDER BY lease_until
     LIMIT $2
     FOR UPDATE SKIP LOCKED";

/// The sweep shared by [`Store::expire_leases`] and [`Store::claim`].
async fn expire_in(
    client: &impl GenericClient,
    only: Option<&[Uuid]>,
    policies: &ChannelPolicies,
    limit: i64,
) -> Result<usize> {
    // notification_intents_sending_lease_idx
    let rows = client.query(EXPIRED_LEASES, &[&only, &limit]).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut next = Vec::with_capacity(rows.len());
    for r in &rows {
        let channel: &str = r.get(1);
        let channel: Channel = channel
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("notification_intents.channel: {e}")))?;
        let attempt_no: i32 = r.get(2);
        let policy = policies
            .get(&channel)
            .ok_or_else(|| StoreError::Corrupt(format!("no retry policy for channel {channel}")))?;
        let owner: Option<String> = r.get(3);
        tracing::warn!(intent_id = %r.get::<_, Uuid>(0), channel = channel.as_str(), attempt_no,
                       worker = owner.as_deref().unwrap_or("-"), "lease expired: attempt recorded unknown");
        next.push((
            r.get(0),
            policy.next(AttemptOutcome::Unknown, attempt_no.max(0) as u32, jitter()),
        ));
    }
    let ids: Vec<Uuid> = next.iter().map(|(id, _)| *id).collect();
    // notification_attempts_intent_idx
    client
        .execute(
            "UPDATE notification_attempts
                SET outcome = 'unknown', finished_at = now(), error_category = 'lease_expired',
                    error_detail = 'the worker''s lease expired before it recorded an outcome (crash or stall)'
              WHERE intent_id = ANY($1::uuid[]) AND outcome = 'started'",
            &[&ids],
        )
        .await?;
    apply_next_states(client, &next, Guard::LeaseExpired).await?;
    Ok(next.len())
}
