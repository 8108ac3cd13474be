//! Held intents (`awaiting_profile`): orders whose seller had no profile when they were
//! ingested. Their rows in `intent_holds` keep the order event until the profile arrives
//! (the intent is then rendered and frozen in the profile's transaction) or the wait runs
//! out (the intent is frozen with the payload rendered without a profile, `suppressed`).
//!
//! Orders and profiles of one seller may be ingested by two transactions at once (two
//! instances, or two topics' batches). Both take the seller's transaction-scoped advisory
//! lock before looking: whichever commits second sees the other's rows, so an order is
//! never held after its profile committed, and a profile never misses a held order.

use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_core::{Channel, Payload};
use serde_json::Value;
use tokio_postgres::types::Json;
use uuid::Uuid;

use crate::{Result, Sql, StoreError};

/// The advisory lock class of seller keys (ASCII "sell"); the second key is the hash of
/// marketplace and seller. A collision only makes two sellers wait for each other.
const SELLER_LOCK_CLASS: i32 = 0x7365_6c6c;

/// Open holds of some sellers (intent_holds_open_seller_idx), locked for the release.
/// Holds past their deadline are left to the expiry: the wait decides, not the race.
pub(crate) const OPEN_HOLDS_OF_SELLERS: &str =
    "SELECT h.intent_id, h.marketplace_id, h.seller_id, h.event, i.channel, i.template
     FROM intent_holds h
     JOIN unnest($1::text[], $2::text[]) AS k(marketplace_id, seller_id)
       ON h.marketplace_id = k.marketplace_id AND h.seller_id = k.seller_id
     JOIN intent_contents i ON i.id = h.intent_id
     WHERE h.decision IS NULL AND h.hold_until > now()
     FOR UPDATE OF h SKIP LOCKED";

/// One held intent, with what rendering it needs.
#[derive(Debug, Clone)]
pub struct HeldIntent {
    pub intent_id: Uuid,
    pub marketplace_id: String,
    pub seller_id: String,
    pub channel: Channel,
    pub template: String,
    /// The order event as received.
    pub event: Value,
}

/// A held intent rendered with its seller's profile, ready to be frozen.
#[derive(Debug, Clone)]
pub struct Release {
    pub intent_id: Uuid,
    pub payload: Payload,
    pub digest: String,
    pub profile_version: i64,
}

/// What a release or an expiry decided, per intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub intent_id: Uuid,
    /// `pending` or `suppressed` (`observed` for a route in `observe` mode).
    pub state: String,
    /// How long the intent was held.
    pub held_for: Duration,
    pub channel: String,
    /// The consent decision frozen with it.
    pub consent: String,
}

/// The held intents, for the gauges.
#[derive(Debug, Clone, Copy, Default)]
pub struct HoldSample {
    pub open: i64,
    pub oldest_age: Duration,
}

/// Takes the advisory locks of `sellers` (marketplace, seller) until the transaction ends,
/// in one order, so that two transactions locking overlapping sets wait, not deadlock.
pub(crate) async fn lock_sellers(client: &impl Sql, sellers: &[(&str, &str)]) -> Result<()> {
    if sellers.is_empty() {
        return Ok(());
    }
    let m: Vec<&str> = sellers.iter().map(|k| k.0).collect();
    let s: Vec<&str> = sellers.iter().map(|k| k.1).collect();
    client
        .query_one(
            "SELECT count(pg_advisory_xact_lock($3, h)) FROM (
                SELECT DISTINCT hashtext(m || chr(31) || s) AS h
                FROM unnest($1::text[], $2::text[]) AS k(m, s) ORDER BY h) l",
            &[&m, &s, &SELLER_LOCK_CLASS],
        )
        .await?;
    Ok(())
}

/// A hold to record with its newly created intent.
pub(crate) struct NewHold<'a> {
    pub intent_id: Uuid,
    pub marketplace_id: &'a str,
    pub seller_id: &'a str,
    pub event: &'a serde_json::Map<String, Value>,
    /// The payload rendered without a profile.
    pub fallback_digest: &'a str,
    /// Created by a route in `observe` mode: released or expired as `observed`.
    pub observe: bool,
}

/// Records new holds, each held for `wait` from now.
pub(crate) async fn insert(client: &impl Sql, holds: &[NewHold<'_>], wait: Duration) -> Result<()> {
    if holds.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = holds.iter().map(|h| h.intent_id).collect();
    let m: Vec<&str> = holds.iter().map(|h| h.marketplace_id).collect();
    let s: Vec<&str> = holds.iter().map(|h| h.seller_id).collect();
    let events: Vec<Json<&serde_json::Map<String, Value>>> = holds.iter().map(|h| Json(h.event)).collect();
    let fallback: Vec<&str> = holds.iter().map(|h| h.fallback_digest).collect();
    let observe: Vec<bool> = holds.iter().map(|h| h.observe).collect();
    // intent_holds_pkey: the intents were created by this very transaction.
    client
        .execute(
            "INSERT INTO intent_holds (intent_id, marketplace_id, seller_id, event, fallback_digest, observe, hold_until)
             SELECT id, m, s, e, f, o, now() + make_interval(secs => $7)
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::bool[])
                  AS t(id, m, s, e, f, o)",
            &[&ids, &m, &s, &events, &fallback, &observe, &wait.as_secs_f64()],
        )
        .await?;
    Ok(())
}

fn held(rows: Vec<tokio_postgres::Row>) -> Result<Vec<HeldIntent>> {
    rows.into_iter()
        .map(|r| {
            let channel: &str = r.get(4);
            let Json(event): Json<Value> = r
                .try_get::<_, Option<Json<Value>>>(3)?
                .ok_or_else(|| StoreError::Corrupt("an open hold without its event".into()))?;
            Ok(HeldIntent {
                intent_id: r.get(0),
                marketplace_id: r.get(1),
                seller_id: r.get(2),
                channel: channel
                    .parse()
                    .map_err(|e| StoreError::Corrupt(format!("notification_intents.channel: {e}")))?,
                template: r.get(5),
                event,
            })
        })
        .collect()
}

/// The open holds of `sellers`, locked (holds another transaction is deciding are skipped:
/// that transaction decides them).
pub(crate) async fn open_of_sellers(client: &impl Sql, sellers: &[(&str, &str)]) -> Result<Vec<HeldIntent>> {
    if sellers.is_empty() {
        return Ok(Vec::new());
    }
    let m: Vec<&str> = sellers.iter().map(|k| k.0).collect();
    let s: Vec<&str> = sellers.iter().map(|k| k.1).collect();
    held(client.query(OPEN_HOLDS_OF_SELLERS, &[&m, &s]).await?)
}

/// Open holds whose seller has a profile and that no release failed for: a backstop for a
/// profile stored by another path than ingest. Locked, oldest deadline first.
pub(crate) async fn open_with_profile(client: &impl Sql, limit: i64) -> Result<Vec<HeldIntent>> {
    held(client.query(OPEN_HOLDS_WITH_PROFILE, &[&limit]).await?)
}

/// Open holds whose seller has a profile, oldest deadline first (intent_holds_open_until_idx,
/// then sellers_pkey and notification_intents_pkey), locked for the release.
pub(crate) const OPEN_HOLDS_WITH_PROFILE: &str =
    "SELECT h.intent_id, h.marketplace_id, h.seller_id, h.event, i.channel, i.template
     FROM intent_holds h
     JOIN sellers s ON s.marketplace_id = h.marketplace_id AND s.seller_id = h.seller_id
     JOIN intent_contents i ON i.id = h.intent_id
     WHERE h.decision IS NULL AND h.hold_until > now() AND h.last_error IS NULL
     ORDER BY h.hold_until LIMIT $1
     FOR UPDATE OF h SKIP LOCKED";

/// Freezes released intents: their payloads, then each intent (`pending` with an outbox
/// row when consent is granted, else `suppressed`; `observed` when held by a route in
/// `observe` mode, whatever the route's mode is now), then the hold's decision. Only intents
/// still `awaiting_profile` change.
pub(crate) async fn release(client: &impl Sql, releases: &[Release]) -> Result<Vec<Decided>> {
    if releases.is_empty() {
        return Ok(Vec::new());
    }
    let payloads: Vec<(&str, &Payload)> = releases.iter().map(|r| (r.digest.as_str(), &r.payload)).collect();
    crate::ingest::insert_payloads(client, payloads).await?;
    let ids: Vec<Uuid> = releases.iter().map(|r| r.intent_id).collect();
    let digests: Vec<&str> = releases.iter().map(|r| r.digest.as_str()).collect();
    let revisions: Vec<&str> = releases
        .iter()
        .map(|r| r.payload.template_revision.as_str())
        .collect();
    let consents: Vec<&str> = releases.iter().map(|r| r.payload.consent.as_str()).collect();
    let versions: Vec<i64> = releases.iter().map(|r| r.profile_version).collect();
    let rows = client
        .query(RELEASE, &[&ids, &digests, &revisions, &consents, &versions])
        .await?;
    Ok(decided(rows))
}

/// Releases held intents by id with their rendered payloads (intent_states_pkey,
/// notification_intents_pkey, intent_holds_pkey): the state moves first, then the frozen
/// decision is written on the contents (checked together at commit, migrations/V13).
pub(crate) const RELEASE: &str = concat!(
    "WITH input AS (
        SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int8[])
            AS t(id, digest, revision, consent, version)
     ), moved AS (
        UPDATE intent_states s
           SET state = CASE WHEN h.observe THEN 'observed' WHEN t.consent = 'granted' THEN 'pending'
                            ELSE 'suppressed' END,
               next_attempt_at = CASE WHEN NOT h.observe AND t.consent = 'granted' THEN now() END,
               updated_at = now()
          FROM input t JOIN intent_holds h ON h.intent_id = t.id
         WHERE s.intent_id = t.id AND ",
    state_is_one_of!("s", "awaiting_profile"),
    "
        RETURNING s.intent_id, s.state
     ), released AS (
        UPDATE intent_contents i
           SET payload_digest = t.digest, template_revision = t.revision, consent = t.consent
          FROM input t JOIN moved m ON m.intent_id = t.id
         WHERE i.id = t.id
        RETURNING i.id, m.state, i.trace_context, i.channel, i.consent
     ), queued AS (
        INSERT INTO outbox (intent_id, trace_context, channel)
        SELECT id, trace_context, channel FROM released WHERE state = 'pending'
     ), decided AS (
        UPDATE intent_holds h
           SET decision = 'released', decided_at = now(), profile_version = t.version,
               event = NULL, last_error = NULL
          FROM input t
         WHERE h.intent_id = t.id AND t.id IN (SELECT id FROM released)
        RETURNING h.intent_id, EXTRACT(EPOCH FROM now() - h.held_at)::float8 AS held_secs
     )
     SELECT r.id, r.state, d.held_secs, r.channel, r.consent
       FROM released r JOIN decided d ON d.intent_id = r.id"
);

/// Freezes up to `$1` holds past their deadline with their fallback payloads
/// (intent_holds_open_until_idx; intent_states_pkey, notification_intents_pkey).
pub(crate) const EXPIRE_DUE: &str = concat!(
    "WITH due AS (
        SELECT h.intent_id, h.fallback_digest, h.observe FROM intent_holds h
         WHERE h.decision IS NULL AND h.hold_until <= now()
         ORDER BY h.hold_until LIMIT $1
         FOR UPDATE OF h SKIP LOCKED
     ), moved AS (
        UPDATE intent_states s
           SET state = CASE WHEN d.observe THEN 'observed' ELSE 'suppressed' END, updated_at = now()
          FROM due d
         WHERE s.intent_id = d.intent_id AND ",
    state_is_one_of!("s", "awaiting_profile"),
    "
        RETURNING s.intent_id, s.state
     ), frozen AS (
        UPDATE intent_contents i
           SET payload_digest = d.fallback_digest, template_revision = p.template_revision, consent = p.consent
          FROM due d JOIN moved m ON m.intent_id = d.intent_id
               JOIN notification_payloads p ON p.digest = d.fallback_digest
         WHERE i.id = d.intent_id
        RETURNING i.id, m.state, i.channel, i.consent
     ), decided AS (
        UPDATE intent_holds h SET decision = 'expired', decided_at = now(), event = NULL
          FROM due d WHERE h.intent_id = d.intent_id
        RETURNING h.intent_id, EXTRACT(EPOCH FROM now() - h.held_at)::float8 AS held_secs
     )
     SELECT f.id, f.state, d.held_secs, f.channel, f.consent
       FROM frozen f JOIN decided d ON d.intent_id = f.id"
);

fn decided(rows: Vec<tokio_postgres::Row>) -> Vec<Decided> {
    rows.into_iter()
        .map(|r| Decided {
            intent_id: r.get(0),
            state: r.get(1),
            held_for: Duration::from_secs_f64(r.get::<_, f64>(2).max(0.0)),
            channel: r.get(3),
            consent: r.get(4),
        })
        .collect()
}

/// Keeps held intents that could not be rendered with their profile held, with the reason
/// (shown by `herald intent show`); the wait still runs.
pub(crate) async fn record_failures(client: &impl Sql, failures: &[(Uuid, String)]) -> Result<()> {
    if failures.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = failures.iter().map(|f| f.0).collect();
    let errors: Vec<&str> = failures.iter().map(|f| f.1.as_str()).collect();
    // intent_holds_pkey
    client
        .execute(
            "UPDATE intent_holds h SET last_error = t.error
             FROM unnest($1::uuid[], $2::text[]) AS t(id, error)
             WHERE h.intent_id = t.id AND h.decision IS NULL",
            &[&ids, &errors],
        )
        .await?;
    Ok(())
}

/// Expires up to `limit` holds past their deadline: each intent is frozen with the payload
/// rendered without a profile (consent `no_seller_profile`), `suppressed` (`observed` for a
/// route in `observe` mode). One statement:
/// a crash before its commit leaves the holds open for the next round.
pub(crate) async fn expire_due(client: &impl Sql, limit: i64) -> Result<Vec<Decided>> {
    let rows = client.query(EXPIRE_DUE, &[&limit]).await?;
    Ok(decided(rows))
}

/// Open holds and the age of the oldest (intent_holds_open_until_idx covers the open set).
pub(crate) async fn sample(client: &impl Sql) -> Result<HoldSample> {
    let r = client
        .query_one(
            "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(held_at)), 0)::float8
             FROM intent_holds WHERE decision IS NULL",
            &[],
        )
        .await?;
    Ok(HoldSample {
        open: r.get(0),
        oldest_age: Duration::from_secs_f64(r.get::<_, f64>(1).max(0.0)),
    })
}

/// The hold of one intent, for `herald intent show`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HoldView {
    pub held_at: DateTime<Utc>,
    pub hold_until: DateTime<Utc>,
    /// `released` (rendered with the profile), `expired` (suppressed), or none yet.
    pub decision: Option<String>,
    pub decided_at: Option<DateTime<Utc>>,
    pub profile_version: Option<i64>,
    pub last_error: Option<String>,
}

pub(crate) async fn view(client: &impl Sql, intent_id: Uuid) -> Result<Option<HoldView>> {
    // intent_holds_pkey
    let row = client
        .query_opt(
            "SELECT held_at, hold_until, decision, decided_at, profile_version, last_error
             FROM intent_holds WHERE intent_id = $1",
            &[&intent_id],
        )
        .await?;
    Ok(row.map(|r| HoldView {
        held_at: r.get(0),
        hold_until: r.get(1),
        decision: r.get(2),
        decided_at: r.get(3),
        profile_version: r.get(4),
        last_error: r.get(5),
    }))
}
