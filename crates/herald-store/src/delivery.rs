//! Delivery's SQL: claim intents (lease + `started` attempt), record attempts (outcome +
//! the intent's next state + an outbox row for a retry), expire the leases of dead
//! workers, and the operator's resolution of `unknown` intents.
//!
//! Claims and records take a batch each: the delivery worker groups the attempts about to
//! start, and those just finished, into one transaction every few milliseconds.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use herald_core::retry::{NextState, RetryPolicy};
use herald_core::{AttemptOutcome, Channel, IntentState};
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

/// A uniform sample in [0, 1) for backoff jitter.
pub fn jitter() -> f64 {
    (Uuid::new_v4().as_u128() >> 75) as f64 / (1u64 << 53) as f64
}

impl Store {
    /// Claims a batch of intents for `worker`: every due intent is leased for `lease` and
    /// gets a `started` attempt. A requested intent whose previous worker died (state
    /// `sending`, lease expired) has that attempt recorded `unknown` and moves on by its
    /// channel's policy; a retry that policy makes due comes back through its own outbox
    /// row. Returns one outcome per requested id, in order.
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
        intent_ids: &[Uuid],
        policies: &ChannelPolicies,
    ) -> Result<Vec<ClaimOutcome>> {
        let mut conn = self.conn().await?;
        // Sorted and unique: concurrent claimers lock rows in one order.
        let unique: Vec<Uuid> = intent_ids
            .iter()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let attempt_ids: Vec<Uuid> = unique.iter().map(|_| Uuid::now_v7()).collect();
        let claim = conn.prepare_cached(CLAIM).await?;
        let rows = conn
            .query(&claim, &[&unique, &attempt_ids, &worker, &lease.as_secs_f64()])
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
            let tx = conn.transaction().await?;
            expire_in(&tx, Some(&others), policies, others.len() as i64).await?;
            let why = tx.prepare_cached(SKIP_REASONS).await?;
            for r in tx.query(&why, &[&others]).await? {
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
            tx.commit().await?;
        }
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

    /// Records finished attempts, their intents' next states and an outbox row for each
    /// retry (due after its backoff) in one statement: atomic, one round trip.
    ///
    /// Failure policy: a crash before this commit leaves the attempts `started` under a
    /// lease (recorded `unknown` when it expires) and the Kafka offsets unstored (the
    /// messages come back and find the intent leased, then resolved by the sweeper).
    pub async fn record(&self, worker: &str, records: &[AttemptRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let conn = self.conn().await?;
        let attempt_ids: Vec<Uuid> = records.iter().map(|r| r.attempt_id).collect();
        let started: Vec<DateTime<Utc>> = records.iter().map(|r| r.started_at).collect();
        let outcomes: Vec<&str> = records.iter().map(|r| r.outcome.as_str()).collect();
        let provider_ids: Vec<Option<&str>> =
            records.iter().map(|r| r.provider_message_id.as_deref()).collect();
        let categories: Vec<Option<&str>> = records.iter().map(|r| r.error_category).collect();
        let details: Vec<Option<&str>> = records.iter().map(|r| r.error_detail.as_deref()).collect();
        let (intent_ids, states, delays) = next_state_columns(records.iter().map(|r| (r.intent_id, r.next)));
        let statement = conn.prepare_cached(RECORD).await?;
        conn.execute(
            &statement,
            &[
                &attempt_ids,
                &started,
                &outcomes,
                &provider_ids,
                &categories,
                &details,
                &intent_ids,
                &states,
                &delays,
                &worker,
            ],
        )
        .await?;
        Ok(())
    }

    /// Records `unknown` for up to `limit` attempts whose worker's lease expired, and moves
    /// their intents on by policy. Returns how many intents it settled.
    pub async fn expire_leases(&self, policies: &ChannelPolicies, limit: i64) -> Result<usize> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let n = expire_in(&tx, None, policies, limit).await?;
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
        apply_next_states(&tx, &[(id, next)], Guard::State(IntentState::Unknown)).await?;
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

/// Which intents a state change may touch (a worker recording its own attempts is
/// [`RECORD`]).
enum Guard {
    /// Still `sending` with an expired lease (the sweeper).
    LeaseExpired,
    /// In this state (an operator's resolution).
    State(IntentState),
}

/// The columns of `(intent, next state)` pairs for the `unnest` of [`move_intents!`].
fn next_state_columns(
    next: impl Iterator<Item = (Uuid, NextState)>,
) -> (Vec<Uuid>, Vec<&'static str>, Vec<Option<f64>>) {
    let mut columns = (Vec::new(), Vec::new(), Vec::new());
    for (id, n) in next {
        columns.0.push(id);
        columns.1.push(n.state().as_str());
        columns.2.push(match n {
            NextState::RetryAfter(d) => Some(d.as_secs_f64()),
            _ => None,
        });
    }
    columns
}

/// Sets the intents' next states, clears their leases, and queues an outbox row for each
/// retry, due when its backoff ends. One statement.
async fn apply_next_states(
    client: &impl GenericClient,
    next: &[(Uuid, NextState)],
    guard: Guard,
) -> Result<u64> {
    if next.is_empty() {
        return Ok(0);
    }
    let (ids, states, delays) = next_state_columns(next.iter().copied());
    Ok(match guard {
        Guard::LeaseExpired => {
            let statement = client.prepare_cached(NEXT_STATES_LEASE_EXPIRED).await?;
            client.execute(&statement, &[&ids, &states, &delays]).await?
        }
        Guard::State(s) => {
            let statement = client.prepare_cached(NEXT_STATES_IN_STATE).await?;
            client
                .execute(&statement, &[&ids, &states, &delays, &s.as_str()])
                .await?
        }
    })
}

/// The statement shared by every change of intents' next states: after `$with` (common
/// table expressions, among them `r` with columns `intent_id, next_state, delay_secs`),
/// move each intent allowed by `$guard` (notification_intents_pkey), clear its lease, and
/// queue an outbox row for each retry.
macro_rules! move_intents {
    ($with:expr, $guard:literal) => {
        concat!(
            $with,
            ", moved AS (
                UPDATE notification_intents i
                   SET state = r.next_state,
                       next_attempt_at = CASE WHEN r.delay_secs IS NULL THEN NULL
                                              ELSE now() + make_interval(secs => r.delay_secs) END,
                       lease_owner = NULL, lease_until = NULL, updated_at = now()
                  FROM r
                 WHERE i.id = r.intent_id AND ",
            $guard,
            "
                RETURNING i.id, i.trace_context, r.delay_secs
             )
             INSERT INTO outbox (intent_id, available_at, trace_context)
             SELECT id, now() + make_interval(secs => delay_secs), trace_context FROM moved
              WHERE delay_secs IS NOT NULL"
        )
    };
}

/// `r` from the parameters `$1..$3`: intent ids, next states, retry delays.
macro_rules! next_states_from_params {
    () => {
        "WITH r AS (SELECT * FROM unnest($1::uuid[], $2::text[], $3::float8[]) AS r(intent_id, next_state, delay_secs))"
    };
}

/// The sweeper's moves: intents still `sending` whose lease expired.
const NEXT_STATES_LEASE_EXPIRED: &str = move_intents!(
    next_states_from_params!(),
    "i.state = 'sending' AND i.lease_until < now()"
);

/// An operator's moves: intents in state `$4`.
const NEXT_STATES_IN_STATE: &str = move_intents!(next_states_from_params!(), "i.state = $4");

/// Why requested intents were not claimed.
const SKIP_REASONS: &str =
    "SELECT id, state, next_attempt_at > now() FROM notification_intents WHERE id = ANY($1::uuid[])";

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

/// Finished attempts: their outcomes (notification_attempts_pkey (id, started_at): one
/// partition each), their intents' next states while this worker (`$10`) still holds the
/// lease, and outbox rows for retries. An attempt the sweeper already marked unknown (lease
/// expired while the worker was slow) gets its real outcome: the ledger keeps the truth,
/// the intent keeps the sweeper's decision. The CTE that updates attempts runs to
/// completion although nothing reads it (PostgreSQL runs every data-modifying CTE).
pub(crate) const RECORD: &str = move_intents!(
    "WITH r AS (SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[],
                          $7::uuid[], $8::text[], $9::float8[])
         AS r(attempt_id, started_at, outcome, provider_message_id, error_category, error_detail,
              intent_id, next_state, delay_secs)
     ), attempts AS (
        UPDATE notification_attempts a
           SET outcome = r.outcome, finished_at = now(), provider_message_id = r.provider_message_id,
               error_category = r.error_category, error_detail = r.error_detail
          FROM r
         WHERE a.id = r.attempt_id AND a.started_at = r.started_at
           AND (a.outcome = 'started' OR (a.outcome = 'unknown' AND a.error_category = 'lease_expired'))
        RETURNING a.id
     )",
    "i.state = 'sending' AND i.lease_owner = $10"
);

/// Intents whose lease expired: dead workers' attempts
/// (notification_intents_sending_lease_idx).
pub(crate) const EXPIRED_LEASES: &str =
    "SELECT id, channel, attempt_count, lease_owner FROM notification_intents
     WHERE state = 'sending' AND lease_until < now() AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
     ORDER BY lease_until
     LIMIT $2
     FOR UPDATE SKIP LOCKED";

/// The `started` attempts of intents whose lease expired, recorded `unknown`.
const LEASE_EXPIRED_ATTEMPTS: &str = "UPDATE notification_attempts
    SET outcome = 'unknown', finished_at = now(), error_category = 'lease_expired',
        error_detail = 'the worker''s lease expired before it recorded an outcome (crash or stall)'
  WHERE intent_id = ANY($1::uuid[]) AND outcome = 'started'";

/// The sweep shared by [`Store::expire_leases`] and [`Store::claim`].
async fn expire_in(
    client: &impl GenericClient,
    only: Option<&[Uuid]>,
    policies: &ChannelPolicies,
    limit: i64,
) -> Result<usize> {
    // notification_intents_sending_lease_idx
    let expired = client.prepare_cached(EXPIRED_LEASES).await?;
    let rows = client.query(&expired, &[&only, &limit]).await?;
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
    let unknown = client.prepare_cached(LEASE_EXPIRED_ATTEMPTS).await?;
    client.execute(&unknown, &[&ids]).await?;
    apply_next_states(client, &next, Guard::LeaseExpired).await?;
    Ok(next.len())
}
