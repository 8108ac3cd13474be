//! The pipeline's floor, measured with statements Herald did not write: what PostgreSQL
//! itself allows for the same rows in the same tables with the same indexes.
//!
//! - [`ingest_copy`]: the workload's intents, rendered beforehand (untimed), loaded in
//!   batches of 500 events by the fastest bulk path PostgreSQL has: `COPY ... FROM STDIN
//!   (FORMAT binary)` into a temporary staging table, then one set-based insert of the
//!   intents (the unique constraints doing the duplicate check), their payloads and outbox
//!   rows, then one insert of the conflicts found against the stored fingerprints. Same
//!   outcome as Herald's ingest: the same intents, conflicts and outbox rows.
//! - [`delivery_statements`]: Herald's own claim and record statements alone, at a batch
//!   size, one batch after the other, without Kafka or a provider: the database's share
//!   of a delivery.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use futures::pin_mut;
use herald_core::retry::NextState;
use herald_core::AttemptOutcome;
use herald_store::delivery::{ClaimOutcome, ClaimRequest, ClaimTry};
use herald_store::IngestTx;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{Json, ToSql, Type};
use uuid::Uuid;

use super::delivery;
use super::ingest::{self, Workload};
use integration_tests::{pg_connect, TestEnv};

const STAGING: &str = "CREATE TEMPORARY TABLE floor_staging (
    ord int4, id uuid, marketplace_id text, order_id text, event_kind text, channel text,
    idempotency_key text, request_fingerprint text, seller_id text, template text,
    template_revision text, payload_digest text, consent text, trace_context text, event_id text,
    occurred_at timestamptz, source_topic text, source_partition int4, source_offset int8,
    destination text, locale text, subject text, body_text text, body_html text, event jsonb
) ON COMMIT DELETE ROWS";

const COLUMN_TYPES: [Type; 25] = [
    Type::INT4,
    Type::UUID,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TIMESTAMPTZ,
    Type::TEXT,
    Type::INT4,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::JSONB,
];

/// The first occurrence of each key becomes the intent; a sendable one gets its outbox
/// row, and its payload is stored once per digest.
const CONVERGE: &str = "WITH frozen AS (
        INSERT INTO intent_contents
            (id, marketplace_id, order_id, event_kind, channel, idempotency_key, request_fingerprint,
             seller_id, template, template_revision, payload_digest, consent,
             trace_context, event_id, occurred_at, source_topic, source_partition, source_offset)
        SELECT DISTINCT ON (idempotency_key)
               id, marketplace_id, order_id, event_kind, channel, idempotency_key, request_fingerprint,
               seller_id, template, template_revision, payload_digest, consent,
               trace_context, event_id, occurred_at, source_topic, source_partition, source_offset
        FROM floor_staging ORDER BY idempotency_key, ord
        ON CONFLICT DO NOTHING
        RETURNING id, consent, trace_context, channel
    ), created AS (
        INSERT INTO intent_states (intent_id, state, next_attempt_at)
        SELECT id, CASE WHEN consent = 'granted' THEN 'pending' ELSE 'suppressed' END,
               CASE WHEN consent = 'granted' THEN now() END
        FROM frozen
        RETURNING intent_id AS id, state
    ), stored AS (
        INSERT INTO notification_payloads
            (digest, channel, destination, locale, consent, template, template_revision, subject, body_text, body_html)
        SELECT DISTINCT ON (s.payload_digest) s.payload_digest, s.channel, s.destination, s.locale, s.consent,
               s.template, s.template_revision, s.subject, s.body_text, s.body_html
        FROM floor_staging s JOIN created c ON c.id = s.id
        ORDER BY s.payload_digest
        ON CONFLICT ON CONSTRAINT notification_payloads_pkey DO NOTHING
    ), queued AS (
        INSERT INTO outbox (intent_id, trace_context, channel)
        SELECT id, trace_context, channel FROM frozen WHERE consent = 'granted'
    )
    SELECT count(*) FROM created";

/// A staged row whose key is held (now, by this batch's insert too) with another
/// fingerprint is a conflict, kept as evidence.
const CONFLICTS: &str = "INSERT INTO intent_conflicts
        (intent_id, existing_fingerprint, offending_fingerprint, offending_event_id, offending_event,
         source_topic, source_partition, source_offset)
    SELECT i.id, i.request_fingerprint, s.request_fingerprint, s.event_id, s.event,
           s.source_topic, s.source_partition, s.source_offset
    FROM floor_staging s JOIN intent_contents i
      ON i.marketplace_id = s.marketplace_id AND i.order_id = s.order_id
     AND i.event_kind = s.event_kind AND i.channel = s.channel
    WHERE i.request_fingerprint <> s.request_fingerprint
    ON CONFLICT ON CONSTRAINT intent_conflicts_source DO NOTHING";

/// The workload's rows by COPY and set-based inserts, in batches of 500 events; events/s.
/// Returns also the conflicts stored, for the caller to compare with Herald's.
pub async fn ingest_copy(env: &TestEnv, w: &Workload) -> Result<(f64, i64)> {
    let store = ingest::store(env)?;
    ingest::apply_sellers(&store).await?;
    let values = w.events();
    let values: Vec<&[u8]> = values.iter().map(|(_, v)| v.as_slice()).collect();
    let events = ingest::decode(&values)?;
    let intents = {
        let mut conn = store.conn().await?;
        let tx = IngestTx::begin(&mut conn).await?;
        ingest::render(&tx, &events, 0).await?
    };
    let ids: Vec<Uuid> = intents.iter().map(|_| Uuid::now_v7()).collect();

    let mut client = pg_connect(&env.db_url).await?;
    client.batch_execute(STAGING).await?;
    let started = Instant::now();
    for (batch, chunk) in intents.chunks(500 * 2).enumerate() {
        let tx = client.transaction().await?;
        let sink = tx
            .copy_in("COPY floor_staging FROM STDIN (FORMAT binary)")
            .await?;
        let writer = BinaryCopyInWriter::new(sink, &COLUMN_TYPES);
        pin_mut!(writer);
        for (n, i) in chunk.iter().enumerate() {
            let ord = n as i32;
            let id = ids[batch * 1000 + n];
            let event = Json(i.event_document);
            let row: [&(dyn ToSql + Sync); 25] = [
                &ord,
                &id,
                &i.key.marketplace_id,
                &i.key.order_id,
                &i.key.event_kind,
                &i.key.channel.as_str(),
                &i.idempotency_key.as_str(),
                &i.fingerprint.as_str(),
                &i.seller_id,
                &i.payload.template,
                &i.payload.template_revision,
                &i.payload_digest,
                &i.payload.consent.as_str(),
                &i.trace_context,
                &i.event_id,
                &i.occurred_at,
                &i.source.topic,
                &i.source.partition,
                &i.source.offset,
                &i.payload.destination,
                &i.payload.locale,
                &i.payload.subject,
                &i.payload.body_text,
                &i.payload.body_html,
                &event,
            ];
            writer.as_mut().write(&row).await?;
        }
        writer.finish().await?;
        tx.query_one(CONVERGE, &[]).await?;
        tx.execute(CONFLICTS, &[]).await?;
        tx.commit().await?;
    }
    let rate = w.events as f64 / started.elapsed().as_secs_f64();
    let stored = env.count("SELECT count(*) FROM notification_intents").await?;
    ensure!(
        stored == w.intents(),
        "floor: {stored} intents, expected {}",
        w.intents()
    );
    let conflicts = env.count("SELECT count(*) FROM intent_conflicts").await?;
    Ok((rate, conflicts))
}

/// Claims and records (accepted) every pending intent with Herald's statements, `batch`
/// intents at a time, one statement after the other; notifications/s.
pub async fn delivery_statements(env: &TestEnv, batch: usize) -> Result<f64> {
    let store = env.store(2)?;
    let ids: Vec<Uuid> = env
        .db
        .query(
            "SELECT id FROM notification_intents WHERE state = 'pending' ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let policies = delivery::policies();
    let lease = Duration::from_secs(60);
    let started = Instant::now();
    for chunk in ids.chunks(batch) {
        let requests: Vec<ClaimRequest> = chunk.iter().map(|id| ClaimRequest::new(*id)).collect();
        let mut records = Vec::with_capacity(chunk.len());
        for outcome in store
            .claim("floor", lease, &requests, &policies, ClaimTry::First)
            .await?
        {
            let ClaimOutcome::Claimed(c) = outcome else {
                anyhow::bail!("an intent was not claimed: {outcome:?}");
            };
            records.push(c.record(
                AttemptOutcome::Accepted,
                Some(format!("floor-{}", c.attempt_id)),
                None,
                None,
                NextState::Accepted,
            ));
        }
        store.record(&records).await?;
    }
    let rate = ids.len() as f64 / started.elapsed().as_secs_f64();
    let accepted = env
        .count("SELECT count(*) FROM notification_intents WHERE state = 'accepted'")
        .await?;
    ensure!(
        accepted == ids.len() as i64,
        "floor: {accepted} of {} intents accepted",
        ids.len()
    );
    Ok(rate)
}
