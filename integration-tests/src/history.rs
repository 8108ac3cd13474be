//! A ledger with history: delivered notifications written by SQL, for measurements and
//! plan checks that must see the table sizes of a running deployment, not empty tables.

use anyhow::Result;

use crate::TestEnv;

/// Fills the ledger with `notifications` delivered notifications (payload, intent
/// `accepted` in marketplace `history`, one accepted attempt, this month), then VACUUMs,
/// ANALYZEs and checkpoints: untimed. The latency bench (`herald-tools`) starts its runs on
/// such a ledger; the plan test (`tests/plans.rs`) gives its statements one too.
pub async fn history(env: &TestEnv, notifications: i64) -> Result<()> {
    env.db
        .batch_execute(&format!(
            "INSERT INTO notification_payloads (digest, channel, destination, locale, consent, template,
                                                template_revision, subject, body_text, body_html)
             SELECT 'history-' || g, CASE WHEN g % 2 = 0 THEN 'email' ELSE 'sms' END,
                    'seller-' || (g % 1000) || '@seller.example', 'en', 'granted', 'order_created', '1',
                    'New order h' || g, repeat('You have a new order. ', 12), repeat('<p>You have a new order.</p>', 12)
               FROM generate_series(1, {n}) g;
             WITH frozen AS (
                 INSERT INTO intent_contents (id, marketplace_id, order_id, event_kind, channel, idempotency_key,
                        request_fingerprint, seller_id, template, template_revision, payload_digest, consent,
                        event_id, occurred_at, source_topic, source_partition, source_offset)
                 SELECT gen_random_uuid(), 'history', 'h' || (g / 2), 'order.created',
                        CASE WHEN g % 2 = 0 THEN 'email' ELSE 'sms' END, encode(sha256(('k' || g)::bytea), 'hex'),
                        encode(sha256(('f' || (g / 2))::bytea), 'hex'), 'seller-' || (g % 1000), 'order_created', '1',
                        'history-' || g, 'granted', 'evt-h' || (g / 2),
                        now() - interval '1 hour', 'history', 0, g
                   FROM generate_series(1, {n}) g
                 RETURNING id
             )
             INSERT INTO intent_states (intent_id, state, attempt_count) SELECT id, 'accepted', 1 FROM frozen;
             INSERT INTO notification_attempts (id, intent_id, attempt_no, outcome, worker, started_at,
                                                finished_at, provider_message_id)
             SELECT gen_random_uuid(), id, 1, 'accepted', 'history', date_trunc('month', now()) + interval '1 second',
                    date_trunc('month', now()) + interval '2 seconds', gen_random_uuid()::text
               FROM intent_contents WHERE source_topic = 'history';",
            n = notifications
        ))
        .await?;
    // VACUUM too: autovacuum would otherwise come for the inserted rows during the run.
    // (Its ids are v4 and its keys sha256, unlike Herald's: nothing reads them back.)
    env.db.batch_execute("VACUUM ANALYZE").await?;
    // A checkpoint, then Herald's start, the warm-up and the measured stretch: every run is
    // at the same point of a checkpoint cycle, early in it, so each pays about the same
    // full-page images (the first change of each page after a checkpoint writes the whole
    // page to the WAL). Otherwise whether a checkpoint fell inside a run decides its WAL and
    // CPU. Autovacuum may still come during a run: its own writes cross the thresholds.
    env.db.batch_execute("CHECKPOINT").await?;
    Ok(())
}
