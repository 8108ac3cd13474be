//! The reconcile role's statements, the provider's own evidence: events stored against the
//! attempt they concern, `unknown` intents settled by them (or, after the silence window,
//! by the channel's policy), and the suppression list that bounces and complaints feed
//! (read by ingest's consent decision, lifted by operators).
//!
//! Rules every statement here keeps:
//! - evidence is append-only: an attempt recorded `unknown` stays `unknown`; the event is
//!   stored beside it and the intent's resolution names the event;
//! - only an intent in state `unknown`, not leased, is settled (or one whose resend the
//!   silence sweep scheduled and no worker claimed yet): an operator's resolution, a late
//!   outcome or a newer attempt came first and wins;
//! - `accepted` from any attempt of the intent settles it (the provider had one of its
//!   messages); `rejected` only from its newest attempt (an older refusal says nothing of
//!   the newer send);
//! - duplicates converge on `event_key`: a duplicate has no effect at all.

use chrono::{DateTime, Utc};
use herald_core::consent::SuppressionReason;
use herald_core::retry::{jitter, NextState};
use herald_core::state::Verdict;
use herald_core::Channel;
use uuid::Uuid;

use crate::delivery::ChannelPolicies;
use crate::destination::DestinationKey;
use crate::{Hot, Result, Sql, Store, StoreError};

/// One provider event, decoded, ready to store. Carries no address: `suppress` names
/// destinations by digest.
#[derive(Debug, Clone)]
pub struct ProviderEvent {
    /// Converges duplicates.
    pub key: String,
    pub channel: Channel,
    pub event_type: String,
    pub provider_message_id: String,
    pub occurred_at: DateTime<Utc>,
    /// Herald's tags, as the event carried them: the intent id and the attempt number (any
    /// text: matched only if they name an attempt of this ledger).
    pub intent_tag: Option<String>,
    pub attempt_tag: Option<String>,
    pub verdict: Option<Verdict>,
    pub bounce_type: Option<String>,
    pub bounce_subtype: Option<String>,
    pub complaint_type: Option<String>,
    pub detail: Option<String>,
    /// An SMS delivery status's price.
    pub price_usd: Option<f64>,
    /// A permanent bounce or a complaint, and the addresses it concerns: PostgreSQL
    /// stores their keyed digests (see `destination`), never the addresses.
    pub suppress: Option<(SuppressionReason, Vec<String>)>,
}

/// How an event was matched to an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedBy {
    Tags,
    MessageId,
}

impl MatchedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            MatchedBy::Tags => "tags",
            MatchedBy::MessageId => "message_id",
        }
    }
}

/// What storing one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Seen before (same `event_key`): nothing written.
    Duplicate,
    Stored {
        id: i64,
        matched: Option<MatchedBy>,
        /// The intent it settled from `unknown`, and to what.
        settled: Option<(Uuid, Verdict)>,
        /// Destinations newly added to the suppression list.
        suppressed: u64,
        /// Addresses the event named for suppression that were not suppressed: it matched
        /// no attempt of this ledger, or they are not the matched intent's destination.
        refused: u64,
    },
}

/// An `unknown` intent whose silence window passed, and what was decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Silence {
    /// Evidence had arrived before the attempt was recorded `unknown` (out of order): it
    /// settled the intent now.
    Evidence(Uuid, Channel, Verdict),
    /// No evidence: the channel's `on_unknown` decision.
    Policy(Uuid, Channel, NextState),
}

/// One live or lifted entry of the suppression list.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Suppression {
    pub id: i64,
    pub channel: String,
    pub destination_digest: String,
    pub reason: String,
    pub provider_event_id: Option<i64>,
    pub event_type: Option<String>,
    pub created_at: DateTime<Utc>,
    pub lifted_at: Option<DateTime<Utc>>,
    pub lifted_by: Option<String>,
    pub lift_reason: Option<String>,
}

/// A destination on the suppression list: the address (digested by PostgreSQL, never
/// stored) or the digest `suppression list` shows.
#[derive(Debug, Clone, Copy)]
pub enum Destination<'a> {
    Address(&'a str),
    Digest(&'a str),
}

/// Who the ledger names for decisions the `reconcile` role and the silence sweep take.
pub const RECONCILER: &str = "herald reconcile";

impl Store {
    /// Stores provider events, in order, in one transaction: each is matched to its
    /// attempt, settles its intent if it is `unknown`, and adds suppressions.
    ///
    /// Failure policy: the caller deletes the queue messages only after this commits. A
    /// crash before the commit leaves nothing: the messages come back after their
    /// visibility timeout and are stored then. A crash after it, before the delete: they
    /// come back and converge on `event_key` as duplicates.
    pub async fn apply_provider_events(&self, events: &[ProviderEvent]) -> Result<Vec<Applied>> {
        let key = self.destination_key()?;
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let mut applied = Vec::with_capacity(events.len());
        for event in events {
            applied.push(apply(&tx, key, event).await?);
        }
        tx.commit().await?;
        Ok(applied)
    }

    /// Keeps a queue message that is not a provider event, with its reason. Returns false
    /// if it was kept before (a redelivery after a crash before its delete).
    pub async fn reject_provider_message(
        &self,
        source: &str,
        message_id: &str,
        reason: &str,
        body: &str,
    ) -> Result<bool> {
        let conn = self.conn().await?;
        let prefix = clean(prefix(body, 16 * 1024));
        let size = i32::try_from(body.len()).unwrap_or(i32::MAX);
        let n = conn
            .execute(
                "INSERT INTO provider_event_rejects (source, message_id, reason, body_prefix, body_size)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (source, message_id) DO NOTHING",
                &[&source, &clean(message_id), &clean(reason), &prefix, &size],
            )
            .await?;
        Ok(n == 1)
    }

    /// Decides up to `limit` `unknown` intents waiting for evidence: one with evidence
    /// stored (an event that arrived before its attempt was recorded `unknown`) is settled by
    /// it at once; one whose silence window has passed without any goes to the channel's
    /// `on_unknown` policy (`hold`: stays `unknown` for an operator; `retry`: sent again),
    /// and the resolution records that no evidence came.
    ///
    /// Failure policy: one transaction; intents a record, a resolve or another sweeper
    /// holds are skipped and come back next pass. A crash before the commit changes
    /// nothing; after it, the decided intents no longer match (`next_attempt_at` cleared).
    pub async fn settle_silent(&self, policies: &ChannelPolicies, limit: i64) -> Result<Vec<Silence>> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        // notification_intents_awaiting_evidence_idx
        let rows = tx.query(Hot(SILENT_DUE), &[&limit]).await?;
        let mut decided = Vec::with_capacity(rows.len());
        for r in &rows {
            let intent_id: Uuid = r.get(0);
            let channel = crate::intent_channel(r.get(1))?;
            let tries: i32 = r.get(2);
            let attempt_no: i32 = r.get(3);
            let waited: f64 = r.get(4);
            let window_ended: bool = r.get(5);
            // Evidence that arrived before the attempt was recorded `unknown`.
            if let Some(e) = tx
                .query_opt(Hot(STORED_VERDICT), &[&intent_id, &attempt_no])
                .await?
            {
                let (event_id, attempt_id, verdict): (i64, Uuid, String) = (e.get(0), e.get(1), e.get(2));
                let event_attempt_no: i32 = e.get(3);
                let verdict = Verdict::parse(&verdict).ok_or_else(|| {
                    StoreError::Corrupt(format!("provider event {event_id}: verdict {verdict:?}"))
                })?;
                if settle(&tx, intent_id, attempt_id, event_attempt_no, event_id, verdict).await? {
                    decided.push(Silence::Evidence(intent_id, channel, verdict));
                }
                continue;
            }
            if !window_ended {
                // Stored evidence that does not settle it (a refusal of an older attempt).
                continue;
            }
            let policy = policies
                .get(&channel)
                .ok_or_else(|| StoreError::Corrupt(format!("no retry policy for channel {channel}")))?;
            let next = policy.after_silence(crate::delivery::tries(tries), jitter());
            let (resolved_as, delay) = match next {
                NextState::RetryAfter(d) => ("retry", Some(d.as_secs_f64())),
                _ => ("hold", None),
            };
            let reason = format!(
                "no provider event within {} s of the attempt: the channel's on_unknown policy ({resolved_as}) decided",
                waited.round() as i64
            );
            tx.execute(
                Hot(SILENCE_DECIDED),
                &[&intent_id, &delay, &resolved_as, &reason, &RECONCILER],
            )
            .await?;
            decided.push(Silence::Policy(intent_id, channel, next));
        }
        tx.commit().await?;
        Ok(decided)
    }

    /// The suppression list: live entries only unless `all`, newest first.
    pub async fn suppressions(&self, all: bool, limit: i64) -> Result<Vec<Suppression>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT s.id, s.channel, s.destination_digest, s.reason, s.provider_event_id, e.event_type,
                        s.created_at, s.lifted_at, s.lifted_by, s.lift_reason
                   FROM suppressions s LEFT JOIN provider_events e ON e.id = s.provider_event_id
                  WHERE $1 OR s.lifted_at IS NULL
                  ORDER BY s.id DESC
                  LIMIT $2",
                &[&all, &limit],
            )
            .await?;
        Ok(rows.iter().map(suppression).collect())
    }

    /// Records this store's key as the suppression list's when none is recorded yet, and
    /// refuses another ([`StoreError::DestinationKeyChanged`]): entries keyed with one key
    /// match no address under another, so the destinations they stand for would be sent
    /// to again. `herald run` checks at start, retention before each pass.
    pub async fn check_destination_key(&self) -> Result<()> {
        let key = self.destination_key()?;
        let conn = self.conn().await?;
        // Two statements: the SELECT's snapshot, taken after the INSERT, sees the row an
        // instance starting at the same moment recorded first.
        conn.execute(RECORD_KEY, &[&key.id()]).await?;
        let recorded: String = conn.query_one(RECORDED_KEY, &[]).await?.get(0);
        crate::destination::same_key(key, recorded)
    }

    /// Lifts the live entry of a destination, named by its address or its digest: later
    /// intents to it are sent again. `None`: no live entry.
    pub async fn lift_suppression(
        &self,
        channel: Channel,
        destination: Destination<'_>,
        operator: &str,
        reason: &str,
    ) -> Result<Option<Suppression>> {
        if reason.trim().is_empty() {
            return Err(StoreError::ReasonRequired("a suppression's lifting"));
        }
        // An address names its keyed entry, or its unkeyed one of before V17 (`$6`, `$3`).
        let (keyed, named, is_address) = match destination {
            Destination::Address(a) => {
                let a = clean(a);
                (self.destination_key()?.digest(channel.as_str(), &a), a, true)
            }
            Destination::Digest(d) => (clean(d), clean(d), false),
        };
        let conn = self.conn().await?;
        // suppressions_live. Both entries of an address are lifted, should both be live
        // (retention lifts an unkeyed entry once a keyed one of its address exists).
        let rows = conn
            .query(
                "UPDATE suppressions s SET lifted_at = now(), lifted_by = $4, lift_reason = $5
                  WHERE s.channel = $1 AND s.lifted_at IS NULL
                    AND (s.destination_digest = $6
                         OR ($3 AND s.destination_digest = herald_destination_digest($1, $2)))
                 RETURNING s.id, s.channel, s.destination_digest, s.reason, s.provider_event_id,
                           (SELECT event_type FROM provider_events e WHERE e.id = s.provider_event_id),
                           s.created_at, s.lifted_at, s.lifted_by, s.lift_reason",
                &[
                    &channel.as_str(),
                    &named,
                    &is_address,
                    &clean(operator),
                    &clean(reason.trim()),
                    &keyed,
                ],
            )
            .await?;
        Ok(rows.iter().map(suppression).min_by_key(|s| s.id))
    }
}

impl Store {
    /// Where reading `source` (a CloudWatch Logs group) stopped: the newest event time
    /// stored from it.
    pub async fn log_cursor(&self, source: &str) -> Result<Option<DateTime<Utc>>> {
        let conn = self.conn().await?;
        Ok(conn
            .query_opt(
                "SELECT position FROM provider_log_cursors WHERE source = $1",
                &[&source],
            )
            .await?
            .map(|r| r.get(0)))
    }

    /// Moves the cursor of `source` forward to `position` (never back).
    ///
    /// Failure policy: called after the events up to `position` are committed; a crash
    /// before it reads them again next time, and they converge on their keys.
    pub async fn advance_log_cursor(&self, source: &str, position: DateTime<Utc>) -> Result<()> {
        let conn = self.conn().await?;
        conn.execute(
            "INSERT INTO provider_log_cursors (source, position) VALUES ($1, $2)
             ON CONFLICT (source) DO UPDATE SET position = greatest(provider_log_cursors.position, EXCLUDED.position),
                                               updated_at = now()",
            &[&source, &position],
        )
        .await?;
        Ok(())
    }
}

fn suppression(r: &tokio_postgres::Row) -> Suppression {
    Suppression {
        id: r.get(0),
        channel: r.get(1),
        destination_digest: r.get(2),
        reason: r.get(3),
        provider_event_id: r.get(4),
        event_type: r.get(5),
        created_at: r.get(6),
        lifted_at: r.get(7),
        lifted_by: r.get(8),
        lift_reason: r.get(9),
    }
}

/// Stores one event and applies its effects, inside the caller's transaction.
async fn apply(tx: &impl Sql, key: &DestinationKey, e: &ProviderEvent) -> Result<Applied> {
    let matched = match_attempt(tx, e).await?;
    let (intent_id, attempt_id, matched_by, attempt_no) = match matched {
        Some((intent, attempt, by, no)) => (Some(intent), Some(attempt), Some(by.as_str()), Some(no)),
        None => (None, None, None, None),
    };
    let Some(row) = tx
        .query_opt(
            Hot(INSERT_EVENT),
            &[
                &e.key,
                &e.channel.as_str(),
                &clean(&e.event_type),
                &clean(&e.provider_message_id),
                &e.occurred_at,
                &e.verdict.map(Verdict::as_str),
                &intent_id,
                &attempt_id,
                &matched_by,
                &e.bounce_type.as_deref().map(clean),
                &e.bounce_subtype.as_deref().map(clean),
                &e.complaint_type.as_deref().map(clean),
                &e.detail.as_deref().map(clean),
                &e.price_usd,
            ],
        )
        .await?
    else {
        return Ok(Applied::Duplicate);
    };
    let id: i64 = row.get(0);
    let mut settled = None;
    if let (Some(intent), Some(attempt), Some(no), Some(verdict)) =
        (intent_id, attempt_id, attempt_no, e.verdict)
    {
        if settle(tx, intent, attempt, no, id, verdict).await? {
            settled = Some((intent, verdict));
        }
    }
    // Only the destination of the attempt the event is about: evidence about no attempt of
    // this ledger, or naming other addresses, never suppresses anyone (whoever can write to
    // the event queue could otherwise silence any address).
    let (mut suppressed, mut refused) = (0, 0);
    if let Some((reason, addresses)) = &e.suppress {
        for address in addresses {
            let (channel, address) = (e.channel.as_str(), clean(address));
            let named = match intent_id {
                Some(intent) => destination_named(tx, key, channel, &address, intent).await?,
                None => None,
            };
            let Some((digest, destination)) = named else {
                // It matched no attempt of this ledger, or it is not the intent's destination.
                refused += 1;
                continue;
            };
            let added = tx
                .query_opt(
                    Hot(SUPPRESS),
                    &[&channel, &digest, &reason.as_str(), &id, &key.id(), &destination],
                )
                .await?;
            // None: the destination, already on the list.
            if added.is_some() {
                suppressed += 1;
            }
        }
    }
    if suppressed > 0 {
        tx.execute(
            "UPDATE provider_events SET effect = CASE effect WHEN 'settled' THEN 'settled_suppressed'
                                                        ELSE 'suppressed' END
              WHERE id = $1",
            &[&id],
        )
        .await?;
    }
    Ok(Applied::Stored {
        id,
        matched: matched.map(|m| m.2),
        settled,
        suppressed,
        refused,
    })
}

/// The attempt an event concerns: by Herald's tags (`herald_intent`: the intent id,
/// `herald_attempt`: the attempt number), else by the message id SendEmail returned.
async fn match_attempt(tx: &impl Sql, e: &ProviderEvent) -> Result<Option<(Uuid, Uuid, MatchedBy, i32)>> {
    let intent = e.intent_tag.as_deref().and_then(|t| Uuid::parse_str(t).ok());
    let attempt_no = e.attempt_tag.as_deref().and_then(|t| t.parse::<i32>().ok());
    if let (Some(intent), Some(attempt_no)) = (intent, attempt_no) {
        // notification_attempts_intent_idx
        if let Some(r) = tx
            .query_opt(Hot(ATTEMPT_BY_TAGS), &[&intent, &attempt_no])
            .await?
        {
            return Ok(Some((intent, r.get(0), MatchedBy::Tags, attempt_no)));
        }
    }
    if e.provider_message_id.is_empty() {
        return Ok(None);
    }
    // notification_attempts_provider_message_idx
    Ok(tx
        .query_opt(Hot(ATTEMPT_BY_MESSAGE_ID), &[&clean(&e.provider_message_id)])
        .await?
        .map(|r| (r.get(0), r.get(1), MatchedBy::MessageId, r.get(2))))
}

/// Settles an `unknown`, unleased intent from an event about its attempt `attempt_no`
/// (the resolution names the event, and the event says it settled). Returns false if the
/// intent was not `unknown` any more (a resolution came first), or the event refuses an
/// older attempt than the newest.
async fn settle(
    tx: &impl Sql,
    intent: Uuid,
    attempt: Uuid,
    attempt_no: i32,
    event_id: i64,
    verdict: Verdict,
) -> Result<bool> {
    let rows = tx
        .query(
            Hot(SETTLE),
            &[
                &intent,
                &verdict.as_str(),
                &attempt,
                &event_id,
                &RECONCILER,
                &attempt_no,
            ],
        )
        .await?;
    Ok(!rows.is_empty())
}

const ATTEMPT_BY_TAGS: &str =
    "SELECT id FROM notification_attempts WHERE intent_id = $1 AND attempt_no = $2 LIMIT 1";

const ATTEMPT_BY_MESSAGE_ID: &str = "SELECT intent_id, id, attempt_no FROM notification_attempts
     WHERE provider_message_id = $1 AND provider_message_id IS NOT NULL
     ORDER BY started_at DESC LIMIT 1";

/// provider_events_key: a duplicate inserts nothing and returns no row.
const INSERT_EVENT: &str = "INSERT INTO provider_events
        (event_key, channel, event_type, provider_message_id, occurred_at, verdict,
         intent_id, attempt_id, matched_by, bounce_type, bounce_subtype, complaint_type, detail, price_usd)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
     ON CONFLICT (event_key) DO NOTHING
     RETURNING id";

/// Moves the intent (intent_states_pkey, locked) only while it is `unknown`, no
/// worker holds it, and the event speaks for it (`accepted` from any attempt, `rejected`
/// from the newest: checked on the locked row, so a newer attempt claimed meanwhile is
/// seen); records the resolution naming the event and marks the event, in one statement.
/// Also an `accepted` that comes after the silence sweep scheduled a resend of this very
/// attempt and before the resend was claimed: the resend would be a duplicate (its outbox
/// row stays; the claim finds the intent accepted and skips it). Never after an operator's
/// decision: the last resolution must be the silence sweep's, about this attempt.
pub(crate) const SETTLE: &str = concat!(
    "WITH moved AS (
        UPDATE intent_states i
           SET state = $2, next_attempt_at = NULL, updated_at = now()
         WHERE i.intent_id = $1 AND i.lease_attempt_id IS NULL
           AND ((",
    state_is_one_of!("i", "unknown"),
    " AND ($2 = 'accepted' OR i.attempt_count = $6))
                OR (",
    state_is_one_of!("i", "retry_scheduled"),
    " AND $2 = 'accepted' AND i.attempt_count = $6
                    AND (SELECT r.settled_by = 'silence' AND r.attempt_id = $3
                           FROM intent_resolutions r WHERE r.intent_id = i.intent_id ORDER BY r.id DESC LIMIT 1)))
        RETURNING i.intent_id AS id
     ), resolved AS (
        INSERT INTO intent_resolutions (intent_id, resolved_as, reason, operator, settled_by, attempt_id, provider_event_id)
        SELECT id, $2, 'the provider''s event settled the unknown attempt', $5, 'evidence', $3, $4 FROM moved
     )
     UPDATE provider_events SET effect = CASE effect WHEN 'suppressed' THEN 'settled_suppressed' ELSE 'settled' END
      WHERE id = $4 AND EXISTS (SELECT 1 FROM moved)
     RETURNING id"
);

/// `unknown` intents waiting for evidence (notification_intents_awaiting_evidence_idx)
/// whose window has passed or that have evidence stored (provider_events_intent_idx), with
/// the attempts that count against max_attempts, the newest attempt, how long it waited and
/// whether the window has passed. Intents another transaction holds are skipped.
const SILENT_DUE: &str = "SELECT i.intent_id, c.channel, i.attempt_count - i.unsent_attempts, i.attempt_count,
            extract(epoch FROM now() - i.updated_at)::float8, i.next_attempt_at <= now()
       FROM intent_states i JOIN intent_contents c ON c.id = i.intent_id
      WHERE i.state = 'unknown' AND i.next_attempt_at IS NOT NULL AND i.lease_attempt_id IS NULL
        AND (i.next_attempt_at <= now()
             OR EXISTS (SELECT 1 FROM provider_events e WHERE e.intent_id = i.intent_id AND e.verdict IS NOT NULL))
      ORDER BY i.next_attempt_at
      LIMIT $1
      FOR UPDATE OF i SKIP LOCKED";

/// Evidence already stored for the intent (provider_events_intent_idx): an acceptance of
/// any attempt, else a refusal of the newest.
const STORED_VERDICT: &str = "SELECT e.id, e.attempt_id, e.verdict, a.attempt_no FROM provider_events e
       JOIN notification_attempts a ON a.id = e.attempt_id
      WHERE e.intent_id = $1 AND e.attempt_id IS NOT NULL
        AND (e.verdict = 'accepted' OR (e.verdict = 'rejected' AND a.attempt_no = $2))
      ORDER BY e.verdict = 'accepted' DESC, e.id
      LIMIT 1";

/// The policy's decision after silence (`$2`: a retry's delay, NULL: hold), recorded with
/// the resolution. A retry gets its outbox row.
pub(crate) const SILENCE_DECIDED: &str = concat!(
    "WITH moved AS (
        UPDATE intent_states i
           SET state = CASE WHEN $2::float8 IS NULL THEN 'unknown' ELSE 'retry_scheduled' END,
               next_attempt_at = CASE WHEN $2::float8 IS NULL THEN NULL
                                      ELSE now() + make_interval(secs => $2::float8) END,
               updated_at = now()
         WHERE i.intent_id = $1 AND ",
    state_is_one_of!("i", "unknown"),
    "
        RETURNING i.intent_id AS id
     ), resolved AS (
        INSERT INTO intent_resolutions (intent_id, resolved_as, reason, operator, settled_by, attempt_id)
        SELECT m.id, $3, $4, $5, 'silence',
               (SELECT a.id FROM notification_attempts a WHERE a.intent_id = m.id ORDER BY a.attempt_no DESC LIMIT 1)
          FROM moved m
     )
     INSERT INTO outbox (intent_id, available_at, trace_context, channel)
     SELECT m.id, now() + make_interval(secs => $2::float8), c.trace_context, c.channel
       FROM moved m JOIN intent_contents c ON c.id = m.id WHERE $2::float8 IS NOT NULL"
);

/// Records the suppression list's key id unless one is recorded (suppression_key_pkey): the
/// key of a live keyed entry when there is one (the record lost, the list still keyed
/// with it), else `$1`.
pub(crate) const RECORD_KEY: &str = "INSERT INTO suppression_key (key_id)
     SELECT coalesce((SELECT digest_key FROM suppressions
                       WHERE digest_key IS NOT NULL AND lifted_at IS NULL LIMIT 1), $1)
     ON CONFLICT (singleton) DO NOTHING";
/// The suppression list's key id.
pub(crate) const RECORDED_KEY: &str = "SELECT key_id FROM suppression_key";

/// The destination of intent `$1` (intent_contents_pkey, then notification_payloads_pkey):
/// the address, or once its payload was purged the digest kept in its place (V16), and
/// whether that digest is the unkeyed one of `$3` on channel `$2` (a purge before V17).
/// No row: no such intent.
const DESTINATION_OF: &str = "SELECT p.destination, p.destination_digest,
            coalesce(p.destination_digest = herald_destination_digest($2, $3), false)
       FROM intent_contents c JOIN notification_payloads p ON p.digest = c.payload_digest
      WHERE c.id = $1";

/// Puts the destination keyed `$2` (under the key whose id is `$5`) on the list, unless a
/// live entry has it: keyed (suppressions_live), or unkeyed from before V17 (the unkeyed
/// digest of `$6`, the destination's address, or of the event's when the payload was
/// purged). A row if it was added.
const SUPPRESS: &str = "INSERT INTO suppressions (channel, destination_digest, reason, provider_event_id, digest_version, digest_key)
     SELECT $1, $2, $3, $4, 2, $5
      WHERE NOT EXISTS (SELECT 1 FROM suppressions x
                         WHERE x.channel = $1 AND x.lifted_at IS NULL
                           AND x.destination_digest = herald_destination_digest($1, $6))
     ON CONFLICT (channel, destination_digest) WHERE lifted_at IS NULL DO NOTHING
     RETURNING 1";

/// Whether `address`, named by an event about intent `intent`, is that intent's
/// destination, and if so its keyed digest and the address whose unkeyed digest an entry
/// from before V17 would carry. The comparison is made here, with the normalization the
/// keyed digests use, so that the entry added is the one ingest computes from the profile.
async fn destination_named(
    tx: &impl Sql,
    key: &DestinationKey,
    channel: &str,
    address: &str,
    intent: Uuid,
) -> Result<Option<(String, String)>> {
    let Some(row) = tx
        .query_opt(Hot(DESTINATION_OF), &[&intent, &channel, &address])
        .await?
    else {
        return Ok(None);
    };
    let (destination, kept, unkeyed_match): (Option<String>, Option<String>, bool) =
        (row.get(0), row.get(1), row.get(2));
    Ok(match (destination, kept) {
        (Some(d), _) if crate::destination::same_address(channel, &d, address) => {
            Some((key.digest(channel, &d), d))
        }
        (Some(_), _) => None,
        // Purged: the kept digest is keyed (after V17) or unkeyed (before).
        (None, Some(kept)) if unkeyed_match || kept == key.digest(channel, address) => {
            Some((key.digest(channel, address), address.to_owned()))
        }
        (None, _) => None,
    })
}

/// Text from outside (queue bodies, provider fields): PostgreSQL refuses U+0000 in text.
fn clean(s: &str) -> String {
    s.replace('\0', "\u{fffd}")
}

fn prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
