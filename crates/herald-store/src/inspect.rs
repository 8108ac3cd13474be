//! Read-only views for operators: one intent with its payload, attempts, conflicts and
//! outbox rows (`herald intent show`, `GET /v1/intents`), and the figures behind the
//! database gauges.

use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_core::BusinessKey;
use serde::Serialize;
use uuid::Uuid;

use crate::ingest::holds::{self, HoldView};
use crate::{Connection, Result, Sql, Store, StoreError};

/// An intent's attempts (notification_attempts_intent_idx, on every partition).
pub(crate) const ATTEMPTS_OF_INTENT: &str =
    "SELECT attempt_no, outcome, after_unknown, worker, started_at, finished_at,
            provider_message_id, error_category, late_outcome, late_provider_message_id,
            late_error_category, late_recorded_at, id
     FROM notification_attempts WHERE intent_id = $1 ORDER BY attempt_no";
/// The provider's events about an intent's attempts (provider_events_intent_idx).
const EVENTS_OF_INTENT: &str =
    "SELECT attempt_id, id, event_type, occurred_at, matched_by, verdict, bounce_type,
            bounce_subtype, complaint_type, detail, effect, received_at, price_usd
     FROM provider_events WHERE intent_id = $1 ORDER BY occurred_at, id";
/// Who settled the intent's `unknown` attempts, and how (intent_resolutions_intent_idx).
const RESOLUTIONS_OF_INTENT: &str =
    "SELECT resolved_as, settled_by, reason, operator, resolved_at, provider_event_id
     FROM intent_resolutions WHERE intent_id = $1 ORDER BY id";
/// An intent by business key (notification_intents_business_key, then intent_states_pkey).
pub(crate) const INTENT_BY_BUSINESS_KEY: &str = "SELECT c.id FROM intent_contents c
       JOIN intent_states s ON s.intent_id = c.id
     WHERE c.marketplace_id = $1 AND c.order_id = $2 AND c.event_kind = $3 AND c.channel = $4";

/// How an operator names an intent: by business key or by id.
#[derive(Debug, Clone, Copy)]
pub enum IntentRef<'a> {
    Key(&'a BusinessKey),
    Id(Uuid),
}

impl std::fmt::Display for IntentRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IntentRef::Key(k) => write!(f, "{k}"),
            IntentRef::Id(id) => write!(f, "intent {id}"),
        }
    }
}

/// `GET /v1/intents` and `herald intent list`: the intents of one order, optionally
/// narrowed to an event kind and channel.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct IntentFilter {
    pub marketplace_id: String,
    pub order_id: String,
    pub event_kind: Option<String>,
    pub channel: Option<String>,
}

/// The database figures exported as gauges.
#[derive(Debug, Clone, Copy)]
pub struct BacklogSample {
    /// Outbox rows due for publishing.
    pub outbox_due: i64,
    /// Age of the oldest due outbox row (zero when none).
    pub outbox_oldest_age: Duration,
    pub intents_unknown: i64,
    /// `unknown` intents inside their silence window (notification_intents_awaiting_evidence_idx).
    pub intents_awaiting_evidence: i64,
    /// Live entries of the suppression list (suppressions_live).
    pub suppressions: i64,
    /// Of those, entries made before V17 and not re-keyed yet (suppressions_unkeyed_idx).
    pub suppressions_unkeyed: i64,
    /// Intents `awaiting_profile`, and the age of the oldest.
    pub holds: holds::HoldSample,
}

/// Resolves an [`IntentRef`] to the intent's id, its state row locked `FOR UPDATE` when
/// `lock` (never the contents row: the reconciler locks state rows first and then takes
/// the contents row's key-share lock for a resolution's foreign key, so locking both here
/// could deadlock with it).
pub(crate) async fn intent_id(conn: &impl Sql, r: IntentRef<'_>, lock: bool) -> Result<Uuid> {
    let lock = if lock { " FOR UPDATE OF s" } else { "" };
    let row = match r {
        // notification_intents_business_key
        IntentRef::Key(key) => {
            conn.query_opt(
                &format!("{INTENT_BY_BUSINESS_KEY}{lock}"),
                &[
                    &key.marketplace_id,
                    &key.order_id,
                    &key.event_kind,
                    &key.channel.as_str(),
                ],
            )
            .await?
        }
        // intent_states_pkey
        IntentRef::Id(id) => {
            conn.query_opt(
                &format!("SELECT s.intent_id FROM intent_states s WHERE s.intent_id = $1{lock}"),
                &[&id],
            )
            .await?
        }
    };
    row.map(|r| r.get(0))
        .ok_or_else(|| StoreError::IntentNotFound(r.to_string()))
}

#[derive(Debug, Clone, Serialize)]
pub struct IntentView {
    pub id: Uuid,
    pub marketplace_id: String,
    pub order_id: String,
    pub event_kind: String,
    pub channel: String,
    pub idempotency_key: String,
    pub request_fingerprint: String,
    pub seller_id: String,
    pub template: String,
    /// Revision, payload and consent are frozen together: none of them while the intent
    /// is `awaiting_profile`.
    pub template_revision: Option<String>,
    pub payload_digest: Option<String>,
    pub consent: Option<String>,
    pub state: String,
    pub attempt_count: i32,
    /// Attempts recorded `not_sent` (claimed, nothing sent): not counted by the retry policy.
    pub unsent_attempts: i32,
    /// Whether an attempt was ever recorded `unknown`, whatever settled the intent later.
    pub had_unknown: bool,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub trace_context: Option<String>,
    pub event_id: String,
    pub occurred_at: DateTime<Utc>,
    pub source: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub payload: Option<PayloadView>,
    /// Set when the order was held for its seller's profile.
    pub hold: Option<HoldView>,
    pub attempts: Vec<AttemptView>,
    /// Decisions on the intent's `unknown` attempts: an operator's, the provider's
    /// evidence, or the channel's policy after silence.
    pub resolutions: Vec<ResolutionView>,
    pub conflicts: Vec<ConflictView>,
    pub outbox_rows: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ResolutionView {
    pub resolved_as: String,
    /// `operator`, `evidence` or `silence`.
    pub settled_by: String,
    pub reason: String,
    pub operator: String,
    pub resolved_at: DateTime<Utc>,
    pub provider_event_id: Option<i64>,
}

/// One event the provider published about an attempt (never an address).
#[derive(Debug, Clone, Serialize)]
pub struct ProviderEventView {
    pub id: i64,
    pub event_type: String,
    pub occurred_at: DateTime<Utc>,
    /// `tags` or `message_id`.
    pub matched_by: Option<String>,
    pub verdict: Option<String>,
    pub bounce_type: Option<String>,
    pub bounce_subtype: Option<String>,
    pub complaint_type: Option<String>,
    pub detail: Option<String>,
    /// `recorded`, `settled`, `suppressed` or `settled_suppressed`.
    pub effect: String,
    pub received_at: DateTime<Utc>,
    /// An SMS delivery status's price.
    pub price_usd: Option<f64>,
}

/// The frozen payload, with the destination masked: `intent show` output ends up in
/// tickets and chat.
#[derive(Debug, Clone, Serialize)]
pub struct PayloadView {
    pub destination: Option<String>,
    pub locale: String,
    pub subject: Option<String>,
    pub body_bytes: Option<i32>,
    pub has_html: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct AttemptView {
    pub attempt_no: i32,
    pub outcome: String,
    pub after_unknown: bool,
    pub worker: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub provider_message_id: Option<String>,
    pub error_category: Option<String>,
    /// An outcome that arrived after the attempt had been recorded `unknown` (its lease
    /// expired first), stored beside it.
    pub late: Option<LateOutcomeView>,
    /// What the provider published about this attempt, in the provider's time order.
    pub provider_events: Vec<ProviderEventView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LateOutcomeView {
    pub outcome: String,
    pub provider_message_id: Option<String>,
    pub error_category: Option<String>,
    pub recorded_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConflictView {
    pub offending_event_id: String,
    pub offending_fingerprint: String,
    pub source: String,
    pub detected_at: DateTime<Utc>,
}

impl Store {
    pub async fn intent_view(&self, r: IntentRef<'_>) -> Result<Option<IntentView>> {
        let conn = self.conn().await?;
        let id = match intent_id(&conn, r, false).await {
            Ok(id) => id,
            Err(StoreError::IntentNotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        view_by_id(&conn, id).await
    }

    /// The intents of one order (at most 4 event kinds x channels in practice; capped at
    /// 100), each with its attempts and conflicts.
    pub async fn intent_views(&self, f: &IntentFilter) -> Result<Vec<IntentView>> {
        let conn = self.conn().await?;
        // notification_intents_business_key (leading marketplace_id, order_id)
        let ids: Vec<Uuid> = conn
            .query(
                "SELECT id FROM notification_intents
                 WHERE marketplace_id = $1 AND order_id = $2
                   AND ($3::text IS NULL OR event_kind = $3) AND ($4::text IS NULL OR channel = $4)
                 ORDER BY event_kind, channel LIMIT 100",
                &[&f.marketplace_id, &f.order_id, &f.event_kind, &f.channel],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut views = Vec::with_capacity(ids.len());
        for id in ids {
            views.extend(view_by_id(&conn, id).await?);
        }
        Ok(views)
    }

    /// Outbox backlog and intents in `unknown`, for the gauges (index-only ranges:
    /// outbox_available_at_idx and the partial notification_intents_state_idx).
    pub async fn backlog_sample(&self) -> Result<BacklogSample> {
        let conn = self.conn().await?;
        let r = conn
            .query_one(
                "SELECT (SELECT count(*) FROM outbox WHERE available_at <= now()),
                        (SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(available_at)), 0)::float8
                           FROM outbox WHERE available_at <= now()),
                        (SELECT count(*) FROM intent_states WHERE state = 'unknown'),
                        (SELECT count(*) FROM intent_states
                          WHERE state = 'unknown' AND next_attempt_at IS NOT NULL),
                        (SELECT count(*) FROM suppressions WHERE lifted_at IS NULL),
                        (SELECT count(*) FROM suppressions WHERE digest_version = 1 AND lifted_at IS NULL)",
                &[],
            )
            .await?;
        Ok(BacklogSample {
            outbox_due: r.get(0),
            outbox_oldest_age: Duration::from_secs_f64(r.get::<_, f64>(1).max(0.0)),
            intents_unknown: r.get(2),
            intents_awaiting_evidence: r.get(3),
            suppressions: r.get(4),
            suppressions_unkeyed: r.get(5),
            holds: holds::sample(&conn).await?,
        })
    }

    /// Rows of the tables that only retention bounds and whose growth means something is
    /// wrong (a producer reusing keys, a queue fed by strangers, a retention that does not
    /// run): PostgreSQL's estimate as of the last ANALYZE (autovacuum's, or retention's
    /// tables' own), 0 for a table never analyzed. Read from pg_class: it never waits on a
    /// lock a migration or a long transaction holds on the tables themselves.
    pub async fn evidence_table_rows(&self) -> Result<Vec<(&'static str, i64)>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT t.name, COALESCE((SELECT greatest(c.reltuples, 0)::int8 FROM pg_class c
                                           WHERE c.oid = to_regclass(t.name)), 0)
                   FROM unnest($1::text[]) AS t(name)",
                &[&EVIDENCE_TABLES.as_slice()],
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let name: String = r.get(0);
                let table = EVIDENCE_TABLES.iter().find(|t| **t == name)?;
                Some((*table, r.get(1)))
            })
            .collect())
    }

    /// Readiness: a connection from the pool answers a trivial query.
    pub async fn ping(&self) -> Result<()> {
        self.conn().await?.batch_execute("SELECT 1").await?;
        Ok(())
    }
}

async fn view_by_id(conn: &Connection, id: Uuid) -> Result<Option<IntentView>> {
    {
        // notification_intents_pkey; outbox_intent_id_idx for the count
        let Some(r) = conn
            .query_opt(
                "SELECT i.id, i.marketplace_id, i.order_id, i.event_kind, i.channel, i.idempotency_key,
                        i.request_fingerprint, i.seller_id, i.template, i.template_revision, i.payload_digest,
                        i.consent, i.state, i.attempt_count, i.next_attempt_at, i.lease_owner, i.lease_until,
                        i.trace_context, i.event_id, i.occurred_at,
                        CASE WHEN i.source_partition < 0 THEN i.source_topic
                             ELSE i.source_topic || '/' || i.source_partition || '@' || i.source_offset END,
                        i.created_at, i.updated_at,
                        p.destination, p.locale, p.subject, octet_length(p.body_text), p.body_html IS NOT NULL,
                        (SELECT count(*) FROM outbox o WHERE o.intent_id = i.id),
                        i.unsent_attempts, i.had_unknown
                 FROM notification_intents i LEFT JOIN notification_payloads p ON p.digest = i.payload_digest
                 WHERE i.id = $1",
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        // notification_attempts_intent_idx
        let mut events: Vec<(Uuid, ProviderEventView)> = conn
            .query(EVENTS_OF_INTENT, &[&id])
            .await?
            .into_iter()
            .map(|e| {
                (
                    e.get(0),
                    ProviderEventView {
                        id: e.get(1),
                        event_type: e.get(2),
                        occurred_at: e.get(3),
                        matched_by: e.get(4),
                        verdict: e.get(5),
                        bounce_type: e.get(6),
                        bounce_subtype: e.get(7),
                        complaint_type: e.get(8),
                        detail: e.get(9),
                        effect: e.get(10),
                        received_at: e.get(11),
                        price_usd: e.get(12),
                    },
                )
            })
            .collect();
        let attempts = conn
            .query(ATTEMPTS_OF_INTENT, &[&id])
            .await?
            .into_iter()
            .map(|a| AttemptView {
                provider_events: {
                    let attempt: Uuid = a.get(12);
                    let (mine, rest) = std::mem::take(&mut events)
                        .into_iter()
                        .partition(|(at, _)| *at == attempt);
                    events = rest;
                    mine.into_iter().map(|(_, e)| e).collect()
                },
                attempt_no: a.get(0),
                outcome: a.get(1),
                after_unknown: a.get(2),
                worker: a.get(3),
                started_at: a.get(4),
                finished_at: a.get(5),
                provider_message_id: a.get(6),
                error_category: a.get(7),
                late: a.get::<_, Option<String>>(8).map(|outcome| LateOutcomeView {
                    outcome,
                    provider_message_id: a.get(9),
                    error_category: a.get(10),
                    recorded_at: a.get(11),
                }),
            })
            .collect();
        let resolutions = conn
            .query(RESOLUTIONS_OF_INTENT, &[&id])
            .await?
            .into_iter()
            .map(|r| ResolutionView {
                resolved_as: r.get(0),
                settled_by: r.get(1),
                reason: r.get(2),
                operator: r.get(3),
                resolved_at: r.get(4),
                provider_event_id: r.get(5),
            })
            .collect();
        // intent_conflicts_source (leading column intent_id)
        let conflicts = conn
            .query(
                "SELECT offending_event_id, offending_fingerprint,
                        CASE WHEN source_partition < 0 THEN source_topic
                             ELSE source_topic || '/' || source_partition || '@' || source_offset END, detected_at
                 FROM intent_conflicts WHERE intent_id = $1 ORDER BY id",
                &[&id],
            )
            .await?
            .into_iter()
            .map(|c| ConflictView {
                offending_event_id: c.get(0),
                offending_fingerprint: c.get(1),
                source: c.get(2),
                detected_at: c.get(3),
            })
            .collect();
        let destination: Option<String> = r.get(23);
        let payload = r.get::<_, Option<String>>(24).map(|locale| PayloadView {
            destination: destination.as_deref().map(herald_core::destination::mask),
            locale,
            subject: r.get(25),
            body_bytes: r.get(26),
            has_html: r.get::<_, Option<bool>>(27).unwrap_or(false),
        });
        let hold = holds::view(conn, id).await?;
        Ok(Some(IntentView {
            id,
            marketplace_id: r.get(1),
            order_id: r.get(2),
            event_kind: r.get(3),
            channel: r.get(4),
            idempotency_key: r.get(5),
            request_fingerprint: r.get(6),
            seller_id: r.get(7),
            template: r.get(8),
            template_revision: r.get(9),
            payload_digest: r.get(10),
            consent: r.get(11),
            state: r.get(12),
            attempt_count: r.get(13),
            unsent_attempts: r.get(29),
            had_unknown: r.get(30),
            next_attempt_at: r.get(14),
            lease_owner: r.get(15),
            lease_until: r.get(16),
            trace_context: r.get(17),
            event_id: r.get(18),
            occurred_at: r.get(19),
            source: r.get(20),
            created_at: r.get(21),
            updated_at: r.get(22),
            payload,
            hold,
            attempts,
            resolutions,
            conflicts,
            outbox_rows: r.get(28),
        }))
    }
}

/// The tables [`Store::evidence_table_rows`] samples (`herald_evidence_table_rows{table}`).
pub const EVIDENCE_TABLES: [&str; 6] = [
    "intent_conflicts",
    "http_requests",
    "http_request_mismatches",
    "provider_events",
    "provider_event_rejects",
    "suppressions",
];
