//! Records: each finished attempt's outcome, and its intent's next state (with an outbox
//! row for a retry) while the attempt still holds the intent's lease.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{next_state_columns, AttemptRecord};
use crate::{Hot, Result, Sql, Store};

/// What recording one attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The attempt was `started`: its outcome is recorded. `moved`: the attempt still held
    /// the intent's lease, so the intent took its next state; otherwise the lease had been
    /// lost and the intent was left as it was.
    OnTime { moved: bool },
    /// The attempt had already been recorded `unknown` (its lease expired first): the
    /// outcome is stored beside it. `settled`: no newer attempt had been claimed, so the
    /// intent took the outcome's next state.
    Late { settled: bool },
    /// This very outcome was recorded before (a retry after a lost reply): nothing to do.
    AlreadyRecorded,
    /// No such attempt, or it already has a different late outcome: nothing was written.
    Missing,
}

impl Store {
    /// Records finished attempts, their intents' next states and an outbox row for each
    /// retry (due after its backoff) in one statement: atomic, one round trip. Returns
    /// what happened to each record, in order.
    ///
    /// Fencing: an intent moves only while the attempt holds its lease
    /// (`lease_attempt_id`). An attempt already recorded `unknown` keeps that outcome;
    /// the late one is stored beside it, and moves the intent only if no newer attempt was
    /// claimed and the outcome tells more than the intent's state does.
    ///
    /// Failure policy: a crash before this commit leaves the attempts `started` under a
    /// lease (recorded `unknown` when it expires) and the Kafka offsets unstored (the
    /// messages come back and find the intent leased, then resolved by the sweeper). A
    /// crash after it, before the caller hears back: the retried record finds its own
    /// outcome and says [`Recorded::AlreadyRecorded`].
    pub async fn record(&self, records: &[AttemptRecord]) -> Result<Vec<Recorded>> {
        if records.is_empty() {
            return Ok(Vec::new());
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
        let rows = conn
            .query(
                Hot(RECORD),
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
                ],
            )
            .await?;
        let mut done: HashMap<Uuid, Recorded> = HashMap::with_capacity(rows.len());
        for r in &rows {
            let (on_time, moved): (bool, bool) = (r.get(1), r.get(2));
            let what = if on_time {
                Recorded::OnTime { moved }
            } else {
                Recorded::Late { settled: moved }
            };
            done.insert(r.get(0), what);
        }
        // The rest were recorded before (a retry after a lost reply) or do not exist.
        let rest: Vec<&AttemptRecord> = records
            .iter()
            .filter(|r| !done.contains_key(&r.attempt_id))
            .collect();
        if !rest.is_empty() {
            let ids: Vec<Uuid> = rest.iter().map(|r| r.attempt_id).collect();
            let stored: HashMap<Uuid, (String, Option<String>)> = conn
                .query(Hot(PRIOR_OUTCOMES), &[&ids])
                .await?
                .iter()
                .map(|r| (r.get(0), (r.get(1), r.get(2))))
                .collect();
            for r in rest {
                let again = stored.get(&r.attempt_id).is_some_and(|(outcome, late)| {
                    outcome == r.outcome.as_str() || late.as_deref() == Some(r.outcome.as_str())
                });
                let what = if again {
                    Recorded::AlreadyRecorded
                } else {
                    Recorded::Missing
                };
                done.insert(r.attempt_id, what);
            }
        }
        Ok(records.iter().map(|r| done[&r.attempt_id]).collect())
    }
}

/// Finished attempts (notification_attempts_pkey (id, started_at): one partition each) and
/// their intents' next states (intent_states_pkey: only the state row changes), with outbox
/// rows for retries (their trace context from the contents, notification_intents_pkey).
///
/// Only an attempt the sweeper recorded `unknown` (`lease_expired`) takes a late outcome:
/// a worker's own `unknown` retried after a lost reply is already recorded.
///
/// `r` locks the intents first, in id order; the sweeper skips locked intents, so a
/// record and a sweep never wait on each other in opposite orders. One UPDATE decides
/// per attempt between the outcome (still `started`) and a late outcome (already
/// `unknown`): if the sweeper committed while this statement waited, PostgreSQL re-reads
/// the attempt and the CASEs see `unknown`, so the outcome lands as late, never lost.
/// An intent moves on time only while the attempt holds its lease; late, only when no
/// newer attempt was claimed (`attempt_count`), its lease is free, and the outcome tells
/// more than its state: `unknown` learns any outcome but `unknown`, `retry_scheduled`
/// (the sweeper's retry, not yet claimed) learns only that the message was accepted or
/// rejected. An `unknown` waiting for evidence keeps its delay as `next_attempt_at` (the
/// end of the silence window) and gets no outbox row: only a retry is sent again.
/// PostgreSQL runs every data-modifying CTE whether or not it is read.
pub(crate) const RECORD: &str = "WITH input AS (
        SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[],
                             $7::uuid[], $8::text[], $9::float8[])
            AS r(attempt_id, started_at, outcome, provider_message_id, error_category, error_detail,
                 intent_id, next_state, delay_secs)
     ), r AS (
        SELECT input.* FROM input JOIN intent_states i ON i.intent_id = input.intent_id
         ORDER BY i.intent_id FOR UPDATE OF i
     ), recorded AS (
        UPDATE notification_attempts a
           SET outcome = CASE WHEN a.outcome = 'started' THEN r.outcome ELSE a.outcome END,
               finished_at = CASE WHEN a.outcome = 'started' THEN now() ELSE a.finished_at END,
               provider_message_id = CASE WHEN a.outcome = 'started' THEN r.provider_message_id
                                          ELSE a.provider_message_id END,
               error_category = CASE WHEN a.outcome = 'started' THEN r.error_category ELSE a.error_category END,
               error_detail = CASE WHEN a.outcome = 'started' THEN r.error_detail ELSE a.error_detail END,
               late_outcome = CASE WHEN a.outcome = 'started' THEN NULL ELSE r.outcome END,
               late_provider_message_id = CASE WHEN a.outcome = 'started' THEN NULL ELSE r.provider_message_id END,
               late_error_category = CASE WHEN a.outcome = 'started' THEN NULL ELSE r.error_category END,
               late_error_detail = CASE WHEN a.outcome = 'started' THEN NULL ELSE r.error_detail END,
               late_recorded_at = CASE WHEN a.outcome = 'started' THEN NULL ELSE now() END
          FROM r
         WHERE a.id = r.attempt_id AND a.started_at = r.started_at
           AND (a.outcome = 'started'
                OR (a.outcome = 'unknown' AND a.error_category = 'lease_expired' AND a.late_outcome IS NULL))
        RETURNING a.id, a.attempt_no, a.late_outcome IS NULL AS on_time
     ), moved AS (
        UPDATE intent_states i
           SET state = r.next_state,
               next_attempt_at = CASE WHEN r.delay_secs IS NULL THEN NULL
                                      ELSE now() + make_interval(secs => r.delay_secs) END,
               lease_owner = NULL, lease_until = NULL, lease_attempt_id = NULL,
               unsent_attempts = i.unsent_attempts
                   + CASE WHEN rec.on_time AND r.outcome = 'not_sent' THEN 1 ELSE 0 END,
               had_unknown = i.had_unknown OR (rec.on_time AND r.outcome = 'unknown'),
               updated_at = now()
          FROM r JOIN recorded rec ON rec.id = r.attempt_id
         WHERE i.intent_id = r.intent_id
           AND CASE WHEN rec.on_time THEN i.state = 'sending' AND i.lease_attempt_id = r.attempt_id
                    ELSE i.lease_attempt_id IS NULL AND i.attempt_count = rec.attempt_no
                         AND ((i.state = 'unknown' AND r.next_state <> 'unknown')
                              OR (i.state = 'retry_scheduled' AND r.next_state IN ('accepted', 'rejected')))
               END
        RETURNING i.intent_id AS id, r.delay_secs, r.attempt_id, r.next_state
     ), queued AS (
        INSERT INTO outbox (intent_id, available_at, trace_context, channel)
        SELECT m.id, now() + make_interval(secs => m.delay_secs), c.trace_context, c.channel
          FROM moved m JOIN intent_contents c ON c.id = m.id
         WHERE m.next_state = 'retry_scheduled'
     )
     SELECT rec.id, rec.on_time, EXISTS (SELECT 1 FROM moved m WHERE m.attempt_id = rec.id)
       FROM recorded rec";

/// What is already stored for attempts a record did not write (the attempts' primary key,
/// on every partition: rare, only after a lost reply or for a corrupt record).
const PRIOR_OUTCOMES: &str =
    "SELECT id, outcome, late_outcome FROM notification_attempts WHERE id = ANY($1::uuid[])";
