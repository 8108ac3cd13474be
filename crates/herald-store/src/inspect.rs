//! Read-only views for operators: one intent with its payload, attempts, conflicts and
//! outbox rows (`herald intent show`).

use chrono::{DateTime, Utc};
use herald_core::BusinessKey;
use serde::Serialize;
use uuid::Uuid;

use crate::{Result, Store};

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
    pub template_revision: String,
    pub payload_digest: String,
    pub consent: String,
    pub state: String,
    pub attempt_count: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub trace_context: Option<String>,
    pub event_id: String,
    pub occurred_at: DateTime<Utc>,
    pub source: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub payload: PayloadView,
    pub attempts: Vec<AttemptView>,
    pub conflicts: Vec<ConflictView>,
    pub outbox_rows: i64,
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
}

#[derive(Debug, Clone, Serialize)]
pub struct ConflictView {
    pub offending_event_id: String,
    pub offending_fingerprint: String,
    pub source: String,
    pub detected_at: DateTime<Utc>,
}

impl Store {
    pub async fn intent_view(&self, key: &BusinessKey) -> Result<Option<IntentView>> {
        let conn = self.conn().await?;
        // notification_intents_business_key
        let Some(r) = conn
            .query_opt(
                "SELECT i.id, i.marketplace_id, i.order_id, i.event_kind, i.channel, i.idempotency_key,
                        i.request_fingerprint, i.seller_id, i.template, i.template_revision, i.payload_digest,
                        i.consent, i.state, i.attempt_count, i.next_attempt_at, i.lease_owner, i.lease_until,
                        i.trace_context, i.event_id, i.occurred_at,
                        i.source_topic || '/' || i.source_partition || '@' || i.source_offset,
                        i.created_at, i.updated_at,
                        p.destination, p.locale, p.subject, octet_length(p.body_text), p.body_html IS NOT NULL,
                        (SELECT count(*) FROM outbox o WHERE o.intent_id = i.id)
                 FROM notification_intents i JOIN notification_payloads p ON p.digest = i.payload_digest
                 WHERE i.marketplace_id = $1 AND i.order_id = $2 AND i.event_kind = $3 AND i.channel = $4",
                &[&key.marketplace_id, &key.order_id, &key.event_kind, &key.channel.as_str()],
            )
            .await?
        else {
            return Ok(None);
        };
        let id: Uuid = r.get(0);
        // notification_attempts_intent_idx
        let attempts = conn
            .query(
                "SELECT attempt_no, outcome, after_unknown, worker, started_at, finished_at,
                        provider_message_id, error_category
                 FROM notification_attempts WHERE intent_id = $1 ORDER BY attempt_no",
                &[&id],
            )
            .await?
            .into_iter()
            .map(|a| AttemptView {
                attempt_no: a.get(0),
                outcome: a.get(1),
                after_unknown: a.get(2),
                worker: a.get(3),
                started_at: a.get(4),
                finished_at: a.get(5),
                provider_message_id: a.get(6),
                error_category: a.get(7),
            })
            .collect();
        // intent_conflicts_source (leading column intent_id)
        let conflicts = conn
            .query(
                "SELECT offending_event_id, offending_fingerprint,
                        source_topic || '/' || source_partition || '@' || source_offset, detected_at
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
            next_attempt_at: r.get(14),
            lease_owner: r.get(15),
            lease_until: r.get(16),
            trace_context: r.get(17),
            event_id: r.get(18),
            occurred_at: r.get(19),
            source: r.get(20),
            created_at: r.get(21),
            updated_at: r.get(22),
            payload: PayloadView {
                destination: destination.as_deref().map(mask_destination),
                locale: r.get(24),
                subject: r.get(25),
                body_bytes: r.get(26),
                has_html: r.get(27),
            },
            attempts,
            conflicts,
            outbox_rows: r.get(28),
        }))
    }
}

/// `s19@example.com` -> `s***@example.com`, `+15555550100` -> `+1******0100`.
pub fn mask_destination(d: &str) -> String {
    if let Some((local, domain)) = d.split_once('@') {
        let first: String = local.chars().take(1).collect();
        return format!("{first}***@{domain}");
    }
    let chars: Vec<char> = d.chars().collect();
    if chars.len() <= 6 {
        return "*".repeat(chars.len());
    }
    let head: String = chars[..2].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}{}{tail}", "*".repeat(chars.len() - 6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_masked() {
        assert_eq!(mask_destination("s19@example.com"), "s***@example.com");
        assert_eq!(mask_destination("+15555550100"), "+1******0100");
        assert_eq!(mask_destination("+1234"), "*****");
    }
}
