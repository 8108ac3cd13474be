//! What no worker will finish by itself: attempts whose lease expired (a dead, stalled or
//! cut-off worker), intents left due without an outbox row (a lost delivery message, a
//! clock step), and an operator's resolution of `unknown` intents.

use std::time::Duration;

use herald_core::retry::{jitter, NextState};
use herald_core::{AttemptOutcome, IntentState};
use uuid::Uuid;

use super::{next_state_columns, ChannelPolicies};
use crate::inspect::IntentRef;
use crate::{Hot, Result, Sql, Store, StoreError};

pub use herald_core::Resolution;

impl Store {
    /// Records `unknown` for up to `limit` attempts whose lease expired, and moves their
    /// intents on by policy. Returns how many intents it settled.
    pub async fn expire_leases(&self, policies: &ChannelPolicies, limit: i64) -> Result<usize> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let n = expire_in(&tx, None, policies, limit).await?;
        tx.commit().await?;
        Ok(n)
    }

    /// Queues an outbox row for up to `limit` intents that are due (`pending`, or
    /// `retry_scheduled` past their time) by more than `grace` and have no outbox row:
    /// nothing would ever bring them to a worker. Returns the intents re-queued.
    ///
    /// Such an intent is evidence of a loss elsewhere (a delivery message the broker
    /// acknowledged and then lost, a database clock step): re-queueing can at worst
    /// publish a second message for an intent whose first is only slow, which the claim
    /// turns into a skip.
    pub async fn requeue_stranded(&self, grace: Duration, limit: i64) -> Result<Vec<Uuid>> {
        let conn = self.conn().await?;
        Ok(conn
            .query(Hot(STRANDED), &[&grace.as_secs_f64(), &limit])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
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
    ) -> Result<(Uuid, herald_core::Channel)> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let id = crate::inspect::intent_id(&tx, intent, true).await?;
        let row = tx
            .query_one(
                "SELECT state, channel FROM notification_intents WHERE id = $1",
                &[&id],
            )
            .await?;
        let state: String = row.get(0);
        let channel = crate::intent_channel(row.get(1))?;
        if state != IntentState::Unknown.as_str() {
            return Err(StoreError::NotUnknown {
                id,
                named: intent.to_string(),
                state,
            });
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
        let (ids, states, delays) = next_state_columns(std::iter::once((id, next)));
        tx.execute(
            Hot(NEXT_STATES_IN_STATE),
            &[&ids, &states, &delays, &IntentState::Unknown.as_str()],
        )
        .await?;
        tx.commit().await?;
        Ok((id, channel))
    }
}

/// The statement shared by the sweeper's and the operator's moves: after `$with` (common
/// table expressions, among them `r` with columns `intent_id, next_state, delay_secs`),
/// move each intent allowed by `$guard` (intent_states_pkey), apply `$set`, clear
/// its lease and token, and queue an outbox row for each retry (an `unknown` waiting for
/// evidence keeps its delay as `next_attempt_at` only).
macro_rules! move_intents {
    ($with:expr, $set:literal, $guard:literal) => {
        concat!(
            $with,
            ", moved AS (
                UPDATE intent_states i
                   SET state = r.next_state,
                       next_attempt_at = CASE WHEN r.delay_secs IS NULL THEN NULL
                                              ELSE now() + make_interval(secs => r.delay_secs) END,
                       lease_owner = NULL, lease_until = NULL, lease_attempt_id = NULL, updated_at = now()",
            $set,
            "
                  FROM r
                 WHERE i.intent_id = r.intent_id AND ",
            $guard,
            "
                RETURNING i.intent_id AS id, r.delay_secs, r.next_state
             )
             INSERT INTO outbox (intent_id, available_at, trace_context, channel)
             SELECT m.id, now() + make_interval(secs => m.delay_secs), c.trace_context, c.channel
               FROM moved m JOIN intent_contents c ON c.id = m.id
              WHERE m.next_state = 'retry_scheduled'"
        )
    };
}

/// `r` from the parameters `$1..$3`: intent ids, next states, retry delays.
macro_rules! next_states_from_params {
    () => {
        "WITH r AS (SELECT * FROM unnest($1::uuid[], $2::text[], $3::float8[]) AS r(intent_id, next_state, delay_secs))"
    };
}

/// The sweeper's moves: intents still `sending` whose lease expired. Their attempt was
/// recorded `unknown`, which the intent keeps on record.
const NEXT_STATES_LEASE_EXPIRED: &str = move_intents!(
    next_states_from_params!(),
    ", had_unknown = true",
    "i.state = 'sending' AND i.lease_until < now()"
);

/// An operator's moves: intents in state `$4`.
const NEXT_STATES_IN_STATE: &str = move_intents!(next_states_from_params!(), "", "i.state = $4");

/// Intents whose lease expired: dead or stalled workers' attempts
/// (notification_intents_sending_lease_idx). Intents a record is writing right now are
/// locked, and skipped: that record settles them.
pub(crate) const EXPIRED_LEASES: &str =
    "SELECT s.intent_id, c.channel, s.attempt_count - s.unsent_attempts, s.lease_owner
       FROM intent_states s JOIN intent_contents c ON c.id = s.intent_id
     WHERE s.state = 'sending' AND s.lease_until < now() AND ($1::uuid[] IS NULL OR s.intent_id = ANY($1::uuid[]))
     ORDER BY s.lease_until
     LIMIT $2
     FOR UPDATE OF s SKIP LOCKED";

/// The `started` attempts of intents whose lease expired, recorded `unknown`
/// (notification_attempts_intent_idx).
const LEASE_EXPIRED_ATTEMPTS: &str = "UPDATE notification_attempts
    SET outcome = 'unknown', finished_at = now(), error_category = 'lease_expired',
        error_detail = 'the worker''s lease expired before it recorded an outcome (crash, stall or lost database)'
  WHERE intent_id = ANY($1::uuid[]) AND outcome = 'started'";

/// Intents due for longer than `$1` seconds with no outbox row, up to `$2`, each given one
/// (notification_intents_state_idx: the non-terminal states only; the outbox is scanned
/// once, it holds only what is waiting). Intents another sweeper is re-queueing are
/// skipped.
const STRANDED: &str = "WITH stranded AS (
        SELECT i.intent_id, c.trace_context, c.channel FROM intent_states i JOIN intent_contents c ON c.id = i.intent_id
         WHERE i.state IN ('pending', 'retry_scheduled')
           AND coalesce(i.next_attempt_at, i.updated_at) < now() - make_interval(secs => $1::float8)
           AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.intent_id = i.intent_id)
         ORDER BY i.intent_id
         LIMIT $2
         FOR UPDATE OF i SKIP LOCKED
     )
     INSERT INTO outbox (intent_id, trace_context, channel)
     SELECT intent_id, trace_context, channel FROM stranded
     RETURNING intent_id";

/// The sweep shared by [`Store::expire_leases`] and [`Store::claim`].
pub(super) async fn expire_in(
    client: &impl Sql,
    only: Option<&[Uuid]>,
    policies: &ChannelPolicies,
    limit: i64,
) -> Result<usize> {
    // notification_intents_sending_lease_idx
    let rows = client.query(Hot(EXPIRED_LEASES), &[&only, &limit]).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut next = Vec::with_capacity(rows.len());
    for r in &rows {
        let channel = crate::intent_channel(r.get(1))?;
        let tries: i32 = r.get(2);
        let policy = policies
            .get(&channel)
            .ok_or_else(|| StoreError::Corrupt(format!("no retry policy for channel {channel}")))?;
        let owner: Option<String> = r.get(3);
        tracing::warn!(intent_id = %r.get::<_, Uuid>(0), channel = channel.as_str(), tries,
                       worker = owner.as_deref().unwrap_or("-"), "lease expired: attempt recorded unknown");
        next.push((
            r.get(0),
            policy.next(AttemptOutcome::Unknown, super::tries(tries), jitter()),
        ));
    }
    let ids: Vec<Uuid> = next.iter().map(|(id, _)| *id).collect();
    client.execute(Hot(LEASE_EXPIRED_ATTEMPTS), &[&ids]).await?;
    let (ids, states, delays) = next_state_columns(next.iter().copied());
    client
        .execute(Hot(NEXT_STATES_LEASE_EXPIRED), &[&ids, &states, &delays])
        .await?;
    Ok(next.len())
}
