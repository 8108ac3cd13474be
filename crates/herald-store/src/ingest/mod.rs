//! The ingest transaction: one per poll batch, set-based statements only.
//!
//! Within [`IngestTx`] the batch's seller records are applied, the profiles and active
//! templates it needs are read, and [`IngestTx::converge`] turns rendered notifications into
//! intents: new business keys get an intent, its payload and an outbox row; known keys with
//! the same fingerprint converge (duplicates); known keys with another fingerprint are
//! recorded in `intent_conflicts` and never sent.

pub mod holds;
pub mod sellers;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_core::render::TemplateRevision;
use herald_core::{
    BusinessKey, Channel, Fingerprint, IdempotencyKey, IntentState, OrderEvent, Payload, SellerProfile,
    SellerRecord,
};
use tokio_postgres::types::Json;
use uuid::Uuid;

use crate::{templates, Connection, Result, Sql, Transaction};
use holds::{Decided, HeldIntent, Release};

/// Intents already holding some of a batch's business keys (notification_intents_business_key;
/// the idempotency key derived from it has no index of its own, migrations/V12).
pub(crate) const EXISTING_BY_BUSINESS_KEY: &str =
    "SELECT i.marketplace_id, i.order_id, i.event_kind, i.channel, i.id, i.request_fingerprint
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(marketplace_id, order_id, event_kind, channel)
     JOIN intent_contents i
       ON i.marketplace_id = k.marketplace_id AND i.order_id = k.order_id
      AND i.event_kind = k.event_kind AND i.channel = k.channel";

/// Where a message came from, kept on the intent and on a conflict as evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRef {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl SourceRef {
    /// A request to the HTTP ingest listener: `http:<Idempotency-Key>`, partition and offset
    /// -1 (no Kafka topic name holds a `:`, so it never names one). Unique per key, as
    /// `intent_conflicts_source` needs.
    pub fn http(idempotency_key: &str) -> Self {
        Self {
            topic: format!("http:{idempotency_key}"),
            partition: -1,
            offset: -1,
        }
    }
}

/// One (event, channel) ready to converge.
#[derive(Debug, Clone)]
pub struct NewIntent<'e> {
    pub key: BusinessKey,
    pub idempotency_key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub seller_id: String,
    pub payload: Payload,
    pub payload_digest: String,
    pub event_id: String,
    pub occurred_at: DateTime<Utc>,
    pub trace_context: Option<String>,
    pub source: SourceRef,
    /// The event as received, stored with a conflict as evidence and with a hold (borrowed:
    /// it is only serialised then).
    pub event_document: &'e serde_json::Map<String, serde_json::Value>,
    /// Held for this long (`awaiting_profile`): the seller has no profile yet. `payload` is
    /// then the rendering without a profile, frozen only if the wait runs out.
    pub hold_for: Option<Duration>,
    /// Created by a route in `observe` mode: frozen as `observed`, never queued (a held
    /// intent keeps this on its hold, for its release).
    pub observe: bool,
}

impl<'e> NewIntent<'e> {
    /// The intent of `event` on `channel`, with its rendered, frozen `payload`.
    pub fn new(
        event: &'e OrderEvent,
        channel: Channel,
        payload: Payload,
        trace_context: Option<String>,
        source: SourceRef,
    ) -> Self {
        let key = event.business_key(channel);
        Self {
            idempotency_key: key.idempotency_key(),
            key,
            fingerprint: event.fingerprint.clone(),
            seller_id: event.seller_id.clone(),
            payload_digest: payload.digest(),
            payload,
            event_id: event.event_id.clone(),
            occurred_at: event.occurred_at,
            trace_context,
            source,
            event_document: &event.document,
            hold_for: None,
            observe: false,
        }
    }

    /// The same intent for a route in `observe` mode.
    pub fn observed(mut self) -> Self {
        self.observe = true;
        self
    }

    /// The same intent held for the seller's profile, at most `wait`.
    pub fn held(mut self, wait: Duration) -> Self {
        self.hold_for = Some(wait);
        self
    }
}

/// What became of one [`NewIntent`], in input order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Convergence {
    /// A new intent (with an outbox row unless suppressed).
    Created { intent_id: Uuid, state: IntentState },
    /// The key existed with the same fingerprint: nothing written.
    Duplicate { intent_id: Uuid },
    /// The key existed with another fingerprint. `newly_recorded` is false when this very
    /// source offset had been recorded before (a replay after a crash).
    Conflict {
        intent_id: Uuid,
        existing_fingerprint: String,
        newly_recorded: bool,
    },
}

impl Convergence {
    /// The intent that holds the key, whatever became of this input.
    pub fn intent_id(&self) -> Uuid {
        match self {
            Convergence::Created { intent_id, .. }
            | Convergence::Duplicate { intent_id }
            | Convergence::Conflict { intent_id, .. } => *intent_id,
        }
    }
}

pub struct IngestTx<'a> {
    pub(crate) tx: Transaction<'a>,
}

impl<'a> IngestTx<'a> {
    pub async fn begin(conn: &'a mut Connection) -> Result<Self> {
        Ok(Self {
            tx: conn.transaction().await?,
        })
    }

    /// Applies the batch's seller records, folded to one per seller.
    pub async fn apply_sellers(&self, records: Vec<SellerRecord>) -> Result<(u64, u64)> {
        let folded = sellers::fold_seller_records(records);
        sellers::apply(&self.tx, &folded).await
    }

    pub async fn sellers(
        &self,
        keys: &[(String, String)],
    ) -> Result<HashMap<(String, String), SellerProfile>> {
        sellers::lookup(&self.tx, self.tx.destination_key()?, keys).await
    }

    pub async fn active_templates(&self) -> Result<Vec<TemplateRevision>> {
        templates::load_active(&self.tx).await
    }

    /// Takes the sellers' advisory locks until this transaction ends. A transaction that
    /// holds orders for missing profiles and one that stores those profiles both take them
    /// before looking, so the second to commit sees the first's rows.
    pub async fn lock_sellers(&self, sellers: &[(&str, &str)]) -> Result<()> {
        holds::lock_sellers(&self.tx, sellers).await
    }

    /// The open holds of `sellers` within their wait, locked for [`IngestTx::release`].
    pub async fn open_holds_of(&self, sellers: &[(&str, &str)]) -> Result<Vec<HeldIntent>> {
        holds::open_of_sellers(&self.tx, sellers).await
    }

    /// Up to `limit` open holds within their wait whose seller has a profile and that no
    /// release failed for, locked.
    pub async fn open_holds_with_profile(&self, limit: i64) -> Result<Vec<HeldIntent>> {
        holds::open_with_profile(&self.tx, limit).await
    }

    /// Freezes held intents rendered with their profiles (payload, state, outbox row).
    pub async fn release(&self, releases: &[Release]) -> Result<Vec<Decided>> {
        holds::release(&self.tx, releases).await
    }

    /// Notes on their holds why these intents could not be rendered; they stay held.
    pub async fn record_release_failures(&self, failures: &[(Uuid, String)]) -> Result<()> {
        holds::record_failures(&self.tx, failures).await
    }

    /// Freezes up to `limit` holds past their wait as `suppressed` / `no_seller_profile`.
    pub async fn expire_holds(&self, limit: i64) -> Result<Vec<Decided>> {
        holds::expire_due(&self.tx, limit).await
    }

    /// Creates or converges the intents of a batch. Returns one [`Convergence`] per input,
    /// in input order.
    pub async fn converge(&self, intents: &[NewIntent<'_>]) -> Result<Vec<Convergence>> {
        if intents.is_empty() {
            return Ok(Vec::new());
        }

        // The first occurrence of each key in the batch is the candidate for creation; later
        // occurrences are compared against whatever row ends up holding the key.
        let mut seen = HashSet::new();
        let mut candidates: Vec<(usize, Uuid)> = intents
            .iter()
            .enumerate()
            .filter(|(_, i)| seen.insert(i.idempotency_key.as_str()))
            .map(|(n, _)| (n, Uuid::now_v7()))
            .collect();
        // Two ingest instances inserting overlapping keys take the unique-index locks in
        // the same order (any order both derive from the keys alone), so they wait for each
        // other instead of deadlocking.
        candidates.sort_by(|a, b| intents[a.0].idempotency_key.cmp(&intents[b.0].idempotency_key));
        let created = self.insert_intents(intents, &candidates).await?;
        self.insert_holds(intents, &candidates, &created).await?;

        let created_at: HashMap<usize, Uuid> = candidates
            .iter()
            .filter(|(_, id)| created.contains_key(id))
            .copied()
            .collect();
        let others: Vec<&BusinessKey> = intents
            .iter()
            .enumerate()
            .filter(|(n, _)| !created_at.contains_key(n))
            .map(|(_, i)| &i.key)
            .collect();
        let existing = self.existing(&others).await?;

        let mut results = Vec::with_capacity(intents.len());
        let mut conflicts = Vec::new();
        for (n, intent) in intents.iter().enumerate() {
            if let Some(id) = created_at.get(&n) {
                results.push(Convergence::Created {
                    intent_id: *id,
                    state: created[id],
                });
                continue;
            }
            let (id, fingerprint) = existing.get(&intent.key).cloned().ok_or_else(|| {
                crate::StoreError::Corrupt(format!(
                    "intent {} vanished within the ingest transaction",
                    intent.key
                ))
            })?;
            if fingerprint == intent.fingerprint.as_str() {
                results.push(Convergence::Duplicate { intent_id: id });
            } else {
                conflicts.push((n, id, fingerprint.clone()));
                results.push(Convergence::Conflict {
                    intent_id: id,
                    existing_fingerprint: fingerprint,
                    newly_recorded: false,
                });
            }
        }
        if !conflicts.is_empty() {
            let recorded = self.insert_conflicts(intents, &conflicts).await?;
            for (n, id, _) in &conflicts {
                let s = &intents[*n].source;
                if recorded.contains(&(*id, s.partition, s.offset, s.topic.clone())) {
                    if let Convergence::Conflict { newly_recorded, .. } = &mut results[*n] {
                        *newly_recorded = true;
                    }
                }
            }
        }
        Ok(results)
    }

    /// Failure policy: a crash before this commit rolls everything back and the batch's
    /// offsets were not stored, so the batch is read again. A crash after it, before the
    /// offsets are stored, replays the batch: every key then converges as a duplicate (or a
    /// conflict already recorded), so no second intent or outbox row appears.
    pub async fn commit(self) -> Result<()> {
        self.tx.commit().await?;
        Ok(())
    }

    /// Inserts the candidates; returns the ids actually created with their state. The
    /// payloads of the created intents (a held one's fallback) and the outbox rows of the
    /// sendable ones are inserted by the same statement: a duplicate or a conflict stores
    /// no payload (its rendering is never referenced).
    async fn insert_intents(
        &self,
        intents: &[NewIntent<'_>],
        candidates: &[(usize, Uuid)],
    ) -> Result<HashMap<Uuid, IntentState>> {
        let mut c = IntentColumns::default();
        for (n, id) in candidates {
            c.push(*id, &intents[*n]);
        }
        // notification_intents_business_key: DO NOTHING leaves a
        // known key to the comparison in `converge`. Each new intent is two rows, its
        // frozen contents and its state (migrations/V13), inserted by this one statement:
        // the check of new intents runs at its end. next_attempt_at is now() for a
        // sendable intent: it is due at once. An observe-mode intent is frozen `observed`,
        // with no outbox row and no due time: nothing ever sends it. A held intent gets no payload, revision or
        // consent yet (its `payload` is the fallback, stored with its hold).
        // notification_payloads_pkey (digest): content-addressed, so an existing row is
        // the same content. Its body may have been purged by retention: then this content
        // (the same, by its digest) is put back, for the new intent will be sent. DO UPDATE
        // also locks the existing row until commit (retention's purge skips locked rows).
        // The intents' foreign key is checked at the end of the statement, when the
        // payloads are in; payload rows are locked in digest order, as everywhere.
        let rows = self
            .tx
            .query(
                "WITH input AS (
                    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                                         $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],
                                         $13::text[], $14::text[], $15::timestamptz[], $16::text[], $17::int4[], $18::int8[],
                                         $19::bool[], $20::text[], $21::text[], $22::text[], $23::text[], $24::text[],
                                         $25::bool[])
                        AS t(id, marketplace_id, order_id, event_kind, channel, idempotency_key,
                             request_fingerprint, seller_id, template, template_revision, payload_digest, consent,
                             trace_context, event_id, occurred_at, source_topic, source_partition, source_offset,
                             held, destination, locale, subject, body_text, body_html, observe)
                 ), frozen AS (
                    INSERT INTO intent_contents
                        (id, marketplace_id, order_id, event_kind, channel, idempotency_key, request_fingerprint,
                         seller_id, template, template_revision, payload_digest, consent,
                         trace_context, event_id, occurred_at, source_topic, source_partition, source_offset)
                    SELECT id, marketplace_id, order_id, event_kind, channel, idempotency_key, request_fingerprint,
                           seller_id, template,
                           CASE WHEN NOT held THEN template_revision END,
                           CASE WHEN NOT held THEN payload_digest END,
                           CASE WHEN NOT held THEN consent END,
                           trace_context, event_id, occurred_at, source_topic, source_partition, source_offset
                    FROM input
                    ON CONFLICT DO NOTHING
                    RETURNING id, trace_context, channel
                 ), created AS (
                    INSERT INTO intent_states (intent_id, state, next_attempt_at)
                    SELECT t.id,
                           CASE WHEN t.held THEN 'awaiting_profile' WHEN t.observe THEN 'observed'
                                WHEN t.consent = 'granted' THEN 'pending' ELSE 'suppressed' END,
                           CASE WHEN NOT t.held AND NOT t.observe AND t.consent = 'granted' THEN now() END
                    FROM input t JOIN frozen f ON f.id = t.id
                    RETURNING intent_id AS id, state
                 ), stored AS (
                    INSERT INTO notification_payloads AS p
                        (digest, channel, destination, locale, consent, template, template_revision, subject,
                         body_text, body_html)
                    SELECT DISTINCT ON (t.payload_digest) t.payload_digest, t.channel, t.destination, t.locale,
                           t.consent, t.template, t.template_revision, t.subject, t.body_text, t.body_html
                    FROM input t JOIN created c ON c.id = t.id
                    ORDER BY t.payload_digest
                    ON CONFLICT ON CONSTRAINT notification_payloads_pkey DO UPDATE
                       SET destination = EXCLUDED.destination, subject = EXCLUDED.subject,
                           body_text = EXCLUDED.body_text, body_html = EXCLUDED.body_html, body_purged_at = NULL
                     WHERE p.body_purged_at IS NOT NULL
                 ), queued AS (
                    INSERT INTO outbox (intent_id, trace_context, channel)
                    SELECT c.id, f.trace_context, f.channel FROM created c JOIN frozen f ON f.id = c.id
                     WHERE c.state = 'pending'
                 )
                 SELECT id, state FROM created",
                &[
                    &c.id, &c.marketplace, &c.order, &c.kind, &c.channel, &c.idempotency, &c.fingerprint,
                    &c.seller, &c.template, &c.revision, &c.digest, &c.consent, &c.trace, &c.event_id,
                    &c.occurred_at, &c.topic, &c.partition, &c.offset, &c.held, &c.destination,
                    &c.locale, &c.subject, &c.body_text, &c.body_html, &c.observe,
                ],
            )
            .await?;
        rows.iter()
            .map(|r| Ok((r.get(0), crate::intent_state(r.get(1))?)))
            .collect()
    }

    /// The holds of the held intents this batch created (each with its own wait).
    async fn insert_holds(
        &self,
        intents: &[NewIntent<'_>],
        candidates: &[(usize, Uuid)],
        created: &HashMap<Uuid, IntentState>,
    ) -> Result<()> {
        let mut by_wait: HashMap<Duration, Vec<_>> = HashMap::new();
        for (n, id) in candidates {
            let i = &intents[*n];
            if let (Some(wait), true) = (i.hold_for, created.contains_key(id)) {
                by_wait.entry(wait).or_default().push(holds::NewHold {
                    intent_id: *id,
                    marketplace_id: &i.key.marketplace_id,
                    seller_id: &i.seller_id,
                    event: i.event_document,
                    fallback_digest: &i.payload_digest,
                    observe: i.observe,
                });
            }
        }
        for (wait, holds) in by_wait {
            holds::insert(&self.tx, &holds, wait).await?;
        }
        Ok(())
    }

    /// The intents holding `keys`: (id, request fingerprint) by business key, the key the
    /// schema makes unique (not the idempotency key derived from it, which has no
    /// constraint of its own since V12).
    async fn existing(&self, keys: &[&BusinessKey]) -> Result<HashMap<BusinessKey, (Uuid, String)>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let marketplaces: Vec<&str> = keys.iter().map(|k| k.marketplace_id.as_str()).collect();
        let orders: Vec<&str> = keys.iter().map(|k| k.order_id.as_str()).collect();
        let kinds: Vec<&str> = keys.iter().map(|k| k.event_kind.as_str()).collect();
        let channels: Vec<&str> = keys.iter().map(|k| k.channel.as_str()).collect();
        // notification_intents_business_key
        let rows = self
            .tx
            .query(
                EXISTING_BY_BUSINESS_KEY,
                &[&marketplaces, &orders, &kinds, &channels],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let key = BusinessKey {
                    marketplace_id: r.get(0),
                    order_id: r.get(1),
                    event_kind: r.get(2),
                    channel: crate::intent_channel(r.get(3))?,
                };
                Ok((key, (r.get(4), r.get(5))))
            })
            .collect()
    }

    /// Returns the (intent, partition, offset, topic) of conflicts not recorded before.
    async fn insert_conflicts(
        &self,
        intents: &[NewIntent<'_>],
        conflicts: &[(usize, Uuid, String)],
    ) -> Result<HashSet<(Uuid, i32, i64, String)>> {
        let mut ids = Vec::new();
        let mut existing = Vec::new();
        let mut offending = Vec::new();
        let mut event_ids = Vec::new();
        let mut events = Vec::new();
        let mut topics = Vec::new();
        let mut partitions = Vec::new();
        let mut offsets = Vec::new();
        for (n, id, fp) in conflicts {
            let i = &intents[*n];
            ids.push(*id);
            existing.push(fp.as_str());
            offending.push(i.fingerprint.as_str());
            event_ids.push(i.event_id.as_str());
            events.push(Json(i.event_document));
            topics.push(i.source.topic.as_str());
            partitions.push(i.source.partition);
            offsets.push(i.source.offset);
        }
        // intent_conflicts_source: the same offending message (replayed) is recorded once.
        let rows = self
            .tx
            .query(
                "INSERT INTO intent_conflicts
                    (intent_id, existing_fingerprint, offending_fingerprint, offending_event_id, offending_event,
                     source_topic, source_partition, source_offset)
                 SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[],
                                      $6::text[], $7::int4[], $8::int8[])
                 ON CONFLICT ON CONSTRAINT intent_conflicts_source DO NOTHING
                 RETURNING intent_id, source_partition, source_offset, source_topic",
                &[&ids, &existing, &offending, &event_ids, &events, &topics, &partitions, &offsets],
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect())
    }
}

/// Stores payloads once per digest, `(digest, payload)` in any order with repeats.
pub(crate) async fn insert_payloads(client: &impl Sql, mut payloads: Vec<(&str, &Payload)>) -> Result<()> {
    // Sorted by digest: concurrent batches lock index entries in one order.
    payloads.sort_by(|a, b| a.0.cmp(b.0));
    payloads.dedup_by(|a, b| a.0 == b.0);
    let mut c = PayloadColumns::default();
    for (digest, payload) in payloads {
        c.push(digest, payload);
    }
    // notification_payloads_pkey (digest): content-addressed, so an existing row is
    // the same content. Its body may have been purged by retention: then this content
    // (the same, by its digest) is put back, for the new intent will be sent. DO UPDATE
    // also locks the existing row until commit, so retention, which locks the rows it
    // purges or deletes before it looks for their intents, sees this batch's intents
    // or makes it wait (see `retention`).
    client
        .execute(
            "INSERT INTO notification_payloads AS p
                (digest, channel, destination, locale, consent, template, template_revision, subject, body_text, body_html)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                                  $6::text[], $7::text[], $8::text[], $9::text[], $10::text[])
             ON CONFLICT ON CONSTRAINT notification_payloads_pkey DO UPDATE
                SET destination = EXCLUDED.destination, subject = EXCLUDED.subject,
                    body_text = EXCLUDED.body_text, body_html = EXCLUDED.body_html, body_purged_at = NULL
              WHERE p.body_purged_at IS NOT NULL",
            &[
                &c.digest, &c.channel, &c.destination, &c.locale, &c.consent, &c.template,
                &c.revision, &c.subject, &c.body_text, &c.body_html,
            ],
        )
        .await?;
    Ok(())
}

#[derive(Default)]
struct PayloadColumns<'a> {
    digest: Vec<&'a str>,
    channel: Vec<&'static str>,
    destination: Vec<Option<&'a str>>,
    locale: Vec<&'a str>,
    consent: Vec<&'static str>,
    template: Vec<&'a str>,
    revision: Vec<&'a str>,
    subject: Vec<Option<&'a str>>,
    body_text: Vec<&'a str>,
    body_html: Vec<Option<&'a str>>,
}

impl<'a> PayloadColumns<'a> {
    fn push(&mut self, digest: &'a str, p: &'a Payload) {
        self.digest.push(digest);
        self.channel.push(p.channel.as_str());
        self.destination.push(p.destination.as_deref());
        self.locale.push(&p.locale);
        self.consent.push(p.consent.as_str());
        self.template.push(&p.template);
        self.revision.push(&p.template_revision);
        self.subject.push(p.subject.as_deref());
        self.body_text.push(&p.body_text);
        self.body_html.push(p.body_html.as_deref());
    }
}

#[derive(Default)]
struct IntentColumns<'a> {
    id: Vec<Uuid>,
    marketplace: Vec<&'a str>,
    order: Vec<&'a str>,
    kind: Vec<&'a str>,
    channel: Vec<&'static str>,
    idempotency: Vec<&'a str>,
    fingerprint: Vec<&'a str>,
    seller: Vec<&'a str>,
    template: Vec<&'a str>,
    revision: Vec<&'a str>,
    digest: Vec<&'a str>,
    consent: Vec<&'static str>,
    trace: Vec<Option<&'a str>>,
    event_id: Vec<&'a str>,
    occurred_at: Vec<DateTime<Utc>>,
    topic: Vec<&'a str>,
    partition: Vec<i32>,
    offset: Vec<i64>,
    held: Vec<bool>,
    observe: Vec<bool>,
    destination: Vec<Option<&'a str>>,
    locale: Vec<&'a str>,
    subject: Vec<Option<&'a str>>,
    body_text: Vec<&'a str>,
    body_html: Vec<Option<&'a str>>,
}

impl<'a> IntentColumns<'a> {
    fn push(&mut self, id: Uuid, i: &'a NewIntent<'_>) {
        self.id.push(id);
        self.marketplace.push(&i.key.marketplace_id);
        self.order.push(&i.key.order_id);
        self.kind.push(&i.key.event_kind);
        self.channel.push(i.key.channel.as_str());
        self.idempotency.push(i.idempotency_key.as_str());
        self.fingerprint.push(i.fingerprint.as_str());
        self.seller.push(&i.seller_id);
        self.template.push(&i.payload.template);
        self.revision.push(&i.payload.template_revision);
        self.digest.push(&i.payload_digest);
        self.consent.push(i.payload.consent.as_str());
        self.trace.push(i.trace_context.as_deref());
        self.event_id.push(&i.event_id);
        self.occurred_at.push(i.occurred_at);
        self.topic.push(&i.source.topic);
        self.partition.push(i.source.partition);
        self.offset.push(i.source.offset);
        self.held.push(i.hold_for.is_some());
        self.observe.push(i.observe);
        self.destination.push(i.payload.destination.as_deref());
        self.locale.push(&i.payload.locale);
        self.subject.push(i.payload.subject.as_deref());
        self.body_text.push(&i.payload.body_text);
        self.body_html.push(i.payload.body_html.as_deref());
    }
}
