//! Retention's SQL (DESIGN.md, "Retention"): the three clocks, each in bounded batches of
//! one transaction, so that no pass holds a lock for long and a pass cut short anywhere
//! leaves only whole batches done.
//!
//! - attempts: Herald's monthly partitions of `notification_attempts` whose upper bound
//!   is before the cutoff are detached and dropped; older rows of the default partition
//!   deleted.
//! - payload bodies: subject, bodies and destination of payloads created before the
//!   cutoff are set NULL (`body_purged_at` set); digest, template, revision, locale and
//!   consent stay. Never while a non-terminal intent references the digest.
//! - intents (optional): terminal intents created and last updated before the cutoff are
//!   deleted with their conflicts, resolutions, outbox rows and attempts, and the payloads
//!   no intent references any more.
//! - evidence documents: the offending event of a fingerprint conflict and the offending
//!   request of a reused Idempotency-Key detected before the cutoff, and the body of a
//!   refused queue message received before its own, are set NULL (their purge time set);
//!   the rows stay. HTTP ingest's expired keys are deleted here too, so that they go even
//!   where no listener sweeps them.
//!
//! Runs as the schema owner (DDL), on one connection holding [`RETENTION_LOCK`]. This
//! module decides nothing about when: the binary schedules it.

use chrono::{DateTime, NaiveDate, Utc};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::destination::{DestinationKey, KEYED, UNKEYED};
use crate::partitions::{self, LockMode};
use crate::{Result, Store};

/// One retention pass at a time across instances. ASCII "heraldr\0".
pub const RETENTION_LOCK: i64 = 0x6865_7261_6c64_7200;

/// Intent states that never change again. Everything else — pending, sending,
/// retry_scheduled, unknown (resolved `retry`, it is sent again), awaiting_profile, and any
/// state added later — is non-terminal: its payload is needed and it is never deleted.
pub const TERMINAL_STATES: [&str; 5] = ["accepted", "rejected", "failed", "suppressed", "observed"];

/// What each clock removes: everything strictly before its instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cutoffs {
    /// Partitions whose upper bound is at or before this day are dropped; default-partition
    /// rows that started before it deleted.
    pub attempts: NaiveDate,
    pub payload_bodies: DateTime<Utc>,
    /// `None`: intents are kept forever.
    pub intents: Option<DateTime<Utc>>,
    /// Offending documents of conflicts and HTTP key mismatches.
    pub conflict_documents: DateTime<Utc>,
    /// Bodies of refused provider messages.
    pub reject_bodies: DateTime<Utc>,
}

/// The smallest UUIDv7 of the millisecond `at`: every v7 id generated before `at` sorts
/// below it, so "created before `at`" is a primary-key range.
pub fn v7_floor(at: DateTime<Utc>) -> Uuid {
    let millis = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(millis, &[0; 10]).into_uuid()
}

/// What one batch of the intent clock deleted (or a preview would delete).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IntentsRemoved {
    pub intents: u64,
    pub conflicts: u64,
    pub resolutions: u64,
    /// Holds of intents that once waited for their seller's profile.
    pub holds: u64,
    pub outbox: u64,
    pub attempts: u64,
    pub payloads: u64,
}

impl std::ops::AddAssign for IntentsRemoved {
    fn add_assign(&mut self, o: Self) {
        self.intents += o.intents;
        self.conflicts += o.conflicts;
        self.resolutions += o.resolutions;
        self.holds += o.holds;
        self.outbox += o.outbox;
        self.attempts += o.attempts;
        self.payloads += o.payloads;
    }
}

/// What a whole pass removed, or would remove (a preview).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Removed {
    pub partitions: Vec<String>,
    /// Rows of the default partition older than the attempts' cutoff.
    pub default_attempts: u64,
    pub payload_bodies: u64,
    /// Provider events and rejected queue messages received before the attempts' cutoff.
    pub provider_events: u64,
    pub intents: IntentsRemoved,
    /// Offending documents purged (conflicts and HTTP key mismatches).
    pub conflict_documents: u64,
    /// Bodies of refused provider messages purged.
    pub reject_bodies: u64,
    /// HTTP ingest keys past their expiry, deleted (with their mismatches).
    pub http_requests: u64,
}

/// Where the body purge continues: the last (created_at, digest) it looked at.
pub type PayloadCursor = (DateTime<Utc>, String);

/// A connection holding [`RETENTION_LOCK`]; dropping it ends the session and the lock.
pub struct RetentionSession {
    client: Client,
    /// The suppression list's key: a purged payload keeps its destination's keyed digest,
    /// and unkeyed entries are re-keyed with it.
    key: DestinationKey,
}

impl Store {
    /// A session for one retention pass; `Ok(None)` when another instance is running one.
    pub async fn retention_session(&self) -> Result<Option<RetentionSession>> {
        let key = self.destination_key()?.clone();
        let client = self.session("retention (its advisory lock)").await?;
        // No statement of a pass waits long for a lock: it fails, and the next pass retries.
        client.batch_execute(partitions::SESSION_LOCK_TIMEOUT).await?;
        let locked: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&RETENTION_LOCK])
            .await?
            .get(0);
        if !locked {
            return Ok(None);
        }
        // A pass with another key would key purged payloads and re-key entries so that the
        // running instances match none of them.
        client.execute(crate::reconcile::RECORD_KEY, &[&key.id()]).await?;
        let recorded: String = client
            .query_one(crate::reconcile::RECORDED_KEY, &[])
            .await?
            .get(0);
        crate::destination::same_key(&key, recorded)?;
        Ok(Some(RetentionSession { client, key }))
    }
}

// notification_payloads_unpurged_idx (created_at, digest) WHERE body_purged_at IS NULL:
// the next payloads whose body is due, locked so that ingest (which locks the row it
// reuses, see `ingest`) cannot attach a new intent to a body being purged.
pub const PURGE_CANDIDATES: &str =
    "SELECT created_at, digest, channel, destination FROM notification_payloads
     WHERE body_purged_at IS NULL AND created_at < $1 AND (created_at, digest) > ($2, $3)
     ORDER BY created_at, digest LIMIT $4
     FOR UPDATE SKIP LOCKED";

// notification_payloads_pkey, and notification_intents_payload_digest_idx (hash) for the
// guard: a body stays while any non-terminal intent references its digest. States are
// listed terminal-first on purpose (see TERMINAL_STATES). `$2`: each payload's destination
// digest, keyed (see `destination`), kept in the address's place.
pub const PURGE_BODIES: &str = concat!(
    "UPDATE notification_payloads p
        SET subject = NULL, body_text = NULL, body_html = NULL, destination = NULL, body_purged_at = now(),
            destination_digest = d.keyed
       FROM unnest($1::text[], $2::text[]) AS d(digest, keyed)
      WHERE p.digest = d.digest AND p.body_purged_at IS NULL
        AND NOT EXISTS (SELECT 1 FROM notification_intents i
                         WHERE i.payload_digest = p.digest
                           AND NOT ",
    state_is_one_of!("i", "accepted", "rejected", "failed", "suppressed", "observed"),
    ")"
);

// notification_intents_pkey, then intent_states_pkey (the view; both rows are locked, and
// skipped when either is held): a range of ids (UUIDv7, time-ordered) below the cutoff's,
// continued from the last id seen. created_at is checked too, for ids that are not v7.
pub const INTENT_CANDIDATES: &str = "SELECT id, payload_digest FROM notification_intents
     WHERE id > $1 AND id < $2 AND created_at < $3 AND updated_at < $3
       AND state IN ('accepted', 'rejected', 'failed', 'suppressed', 'observed')
     ORDER BY id LIMIT $4
     FOR UPDATE SKIP LOCKED";

// suppressions_unkeyed_idx: the next live unkeyed entries after `$1`, locked, each with the
// addresses of the sellers table whose unkeyed digest is the entry's (NULL: none).
pub const REKEY_CANDIDATES: &str = "WITH unkeyed AS (
        SELECT id, channel, destination_digest FROM suppressions
         WHERE digest_version = 1 AND lifted_at IS NULL AND id > $1
         ORDER BY id LIMIT $2
         FOR UPDATE
     ), addresses AS (
        SELECT 'email' AS channel, email AS address FROM sellers WHERE email IS NOT NULL
        UNION ALL
        SELECT 'sms', phone FROM sellers WHERE phone IS NOT NULL
     )
     SELECT u.id, u.channel, array_agg(DISTINCT a.address) FILTER (WHERE a.address IS NOT NULL)
       FROM unkeyed u
       LEFT JOIN addresses a
         ON a.channel = u.channel AND herald_destination_digest(a.channel, a.address) = u.destination_digest
      GROUP BY u.id, u.channel
      ORDER BY u.id";

// suppressions_pkey, suppressions_live for the twins. Under the key `$3`: entries `$1` take
// their keyed digests `$2`, or are lifted when a live entry already carries it (the
// reconcile role adds no keyed entry beside a live unkeyed one, but an operator's lift and
// a new bounce in between can make one); entries `$6` are lifted (an earlier entry of the
// batch carries their destination); entries `$7` get another keyed entry each, `$8` (an
// address whose keyed normalization tells apart what SQL's `lower` did not). Returns how
// many entries changed or were added.
pub const REKEY: &str = "WITH d AS (
        SELECT * FROM unnest($1::int8[], $2::text[]) AS d(id, keyed)
     ), lifted AS (
        UPDATE suppressions s
           SET lifted_at = now(), lifted_by = 'herald retention',
               lift_reason = 're-keyed: a keyed entry of this destination is live'
         WHERE s.id = ANY ($1::int8[] || $6::int8[]) AND s.digest_version = $4 AND s.lifted_at IS NULL
           AND (s.id = ANY ($6::int8[])
                OR EXISTS (SELECT 1 FROM d JOIN suppressions k
                             ON k.channel = s.channel AND k.destination_digest = d.keyed AND k.lifted_at IS NULL
                            WHERE d.id = s.id))
        RETURNING s.id
     ), rekeyed AS (
        UPDATE suppressions s
           SET destination_digest = d.keyed, digest_version = $5, digest_key = $3
          FROM d
         WHERE s.id = d.id AND s.digest_version = $4 AND s.lifted_at IS NULL
           AND s.id NOT IN (SELECT id FROM lifted)
        RETURNING s.id
     ), added AS (
        INSERT INTO suppressions (channel, destination_digest, reason, provider_event_id, created_at,
                                  digest_version, digest_key)
        SELECT s.channel, e.keyed, s.reason, s.provider_event_id, s.created_at, $5, $3
          FROM unnest($7::int8[], $8::text[]) AS e(id, keyed) JOIN suppressions s ON s.id = e.id
         WHERE s.lifted_at IS NULL
        ON CONFLICT (channel, destination_digest) WHERE lifted_at IS NULL DO NOTHING
        RETURNING 1
     )
     SELECT (SELECT count(*) FROM lifted) + (SELECT count(*) FROM rekeyed) + (SELECT count(*) FROM added)";

// notification_payloads_pkey, then notification_intents_payload_digest_idx (hash).
pub const DELETE_UNREFERENCED_PAYLOADS: &str = "DELETE FROM notification_payloads p
      WHERE p.digest = ANY($1)
        AND NOT EXISTS (SELECT 1 FROM intent_contents i WHERE i.payload_digest = p.digest)
        AND NOT EXISTS (SELECT 1 FROM intent_holds h WHERE h.fallback_digest = p.digest)";

/// What [`REKEY`] does to a batch of unkeyed entries.
#[derive(Default)]
struct RekeyPlan {
    ids: Vec<i64>,
    keyed: Vec<String>,
    lift: Vec<i64>,
    extra_of: Vec<i64>,
    extra: Vec<String>,
}

impl RekeyPlan {
    fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.lift.is_empty()
    }
}

/// From [`REKEY_CANDIDATES`]' rows (id, channel, the addresses whose unkeyed digest is the
/// entry's): each entry takes the keyed digest of its first address; another address that
/// keys differently gets an entry of its own; an entry whose every keyed digest an earlier
/// entry of the batch took is lifted (two keyed digests alike in one batch would break the
/// list's unique index, and the batch would fail on every pass).
fn rekey_plan(key: &DestinationKey, candidates: &[(i64, String, Option<Vec<String>>)]) -> RekeyPlan {
    let mut plan = RekeyPlan::default();
    let mut taken = std::collections::HashSet::new();
    for (id, channel, addresses) in candidates {
        let (id, channel) = (*id, channel.as_str());
        let Some(addresses) = addresses else {
            continue;
        };
        let mut digests: Vec<String> = addresses.iter().map(|a| key.digest(channel, a)).collect();
        digests.sort();
        digests.dedup();
        let mut fresh = digests
            .into_iter()
            .filter(|d| taken.insert((channel.to_owned(), d.clone())));
        match fresh.next() {
            Some(first) => {
                plan.ids.push(id);
                plan.keyed.push(first);
                for d in fresh {
                    plan.extra_of.push(id);
                    plan.extra.push(d);
                }
            }
            None => plan.lift.push(id),
        }
    }
    plan
}

impl RetentionSession {
    /// Drops Herald's attempt partitions entirely before `cutoff`, oldest first, each in
    /// its own transaction, under [`partitions::PARTITION_LOCK`]. `Ok(None)`: another
    /// instance holds that lock (creating partitions); the next pass drops them.
    pub async fn drop_attempt_partitions(&mut self, cutoff: NaiveDate) -> Result<Option<Vec<String>>> {
        if !partitions::lock(&self.client, LockMode::Try).await? {
            return Ok(None);
        }
        let result = self.drop_locked(cutoff).await;
        let _ = self
            .client
            .execute("SELECT pg_advisory_unlock($1)", &[&partitions::PARTITION_LOCK])
            .await;
        result.map(Some)
    }

    async fn drop_locked(&mut self, cutoff: NaiveDate) -> Result<Vec<String>> {
        let mut dropped = Vec::new();
        for name in partitions::partitions_before(&self.client, cutoff).await? {
            partitions::drop_partition(&mut self.client, &name).await?;
            tracing::info!(partition = %name, "attempt partition dropped (retention)");
            dropped.push(name);
        }
        Ok(dropped)
    }

    /// Deletes up to `batch` rows of the default partition that started before `cutoff`;
    /// returns how many. The default partition is small (see `partitions`): scanned.
    pub async fn delete_default_attempts(&mut self, cutoff: NaiveDate, batch: i64) -> Result<u64> {
        // Failure policy: one statement, its own transaction: all of the batch or none.
        Ok(self
            .client
            .execute(
                "DELETE FROM ONLY notification_attempts_default WHERE (id, started_at) IN
                    (SELECT id, started_at FROM ONLY notification_attempts_default
                      WHERE started_at < $1::date LIMIT $2)",
                &[&cutoff, &batch],
            )
            .await?)
    }

    /// Deletes up to `batch` provider events, then up to `batch` rejected queue messages,
    /// received before `cutoff` (the attempts' clock: the evidence goes with the attempts
    /// it concerns). Returns how many. A resolution or a suppression naming a deleted
    /// event keeps its row; its event id becomes NULL.
    pub async fn delete_provider_events(&mut self, cutoff: NaiveDate, batch: i64) -> Result<u64> {
        // Failure policy: each statement its own transaction; a crash between them leaves
        // the rejects for the next pass.
        let mut removed = 0;
        // provider_events_received_idx, provider_event_rejects_received_idx
        for table in ["provider_events", "provider_event_rejects"] {
            removed += self
                .client
                .execute(
                    &format!(
                        "DELETE FROM {table} WHERE id IN
                            (SELECT id FROM {table} WHERE received_at < $1::date ORDER BY received_at LIMIT $2)"
                    ),
                    &[&cutoff, &batch],
                )
                .await?;
        }
        Ok(removed)
    }

    /// Purges the bodies of the next `batch` payloads created before `cutoff` after
    /// `cursor`, and moves the cursor. Returns (bodies purged, payloads looked at): 0
    /// looked at means the clock is done for this pass. A payload kept by the guard is
    /// passed over (the cursor moves past it) and looked at again next pass.
    pub async fn purge_payload_bodies(
        &mut self,
        cutoff: DateTime<Utc>,
        batch: i64,
        cursor: &mut PayloadCursor,
    ) -> Result<(u64, usize)> {
        let tx = self.client.transaction().await?;
        let rows = tx
            .query(PURGE_CANDIDATES, &[&cutoff, &cursor.0, &cursor.1, &batch])
            .await?;
        let Some(last) = rows.last() else {
            return Ok((0, 0));
        };
        *cursor = (last.get(0), last.get(1));
        let digests: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
        let keyed: Vec<Option<String>> = rows
            .iter()
            .map(|r| {
                let destination: Option<&str> = r.get(3);
                destination.map(|d| self.key.digest(r.get(2), d))
            })
            .collect();
        // A new snapshot, taken after the rows were locked: every intent committed by an
        // ingest that reused one of these payloads before we locked it is seen here.
        let purged = tx.execute(PURGE_BODIES, &[&digests, &keyed]).await?;
        // Failure policy: a crash before this commit purges nothing of the batch (the locks
        // go with the connection); the next pass starts from the oldest payload again.
        tx.commit().await?;
        Ok((purged, digests.len()))
    }

    /// Deletes the next `batch` terminal intents created and last updated before `cutoff`
    /// after `cursor` (an id), with everything that references them, and the payloads no
    /// intent references any more; moves the cursor. `Ok(None)`: none left this pass.
    pub async fn delete_intents(
        &mut self,
        cutoff: DateTime<Utc>,
        batch: i64,
        cursor: &mut Uuid,
    ) -> Result<Option<IntentsRemoved>> {
        let ceiling = v7_floor(cutoff);
        let tx = self.client.transaction().await?;
        let rows = tx
            .query(INTENT_CANDIDATES, &[&*cursor, &ceiling, &cutoff, &batch])
            .await?;
        let Some(last) = rows.last() else {
            return Ok(None);
        };
        *cursor = last.get(0);
        let ids: Vec<Uuid> = rows.iter().map(|r| r.get(0)).collect();
        let mut digests: Vec<String> = rows
            .iter()
            .filter_map(|r| r.get::<_, Option<String>>(1))
            .collect();
        digests.sort_unstable();
        digests.dedup();
        let mut removed = IntentsRemoved {
            // intent_conflicts_source (intent_id, ...)
            conflicts: tx
                .execute("DELETE FROM intent_conflicts WHERE intent_id = ANY($1)", &[&ids])
                .await?,
            // intent_resolutions_intent_idx
            resolutions: tx
                .execute(
                    "DELETE FROM intent_resolutions WHERE intent_id = ANY($1)",
                    &[&ids],
                )
                .await?,
            // outbox_intent_id_idx (V11)
            outbox: tx
                .execute("DELETE FROM outbox WHERE intent_id = ANY($1)", &[&ids])
                .await?,
            // notification_attempts_intent_idx, on each remaining partition.
            attempts: tx
                .execute(
                    "DELETE FROM notification_attempts WHERE intent_id = ANY($1)",
                    &[&ids],
                )
                .await?,
            ..IntentsRemoved::default()
        };
        // intent_holds_pkey: the hold of an intent that once waited for its profile (an
        // open hold's intent is non-terminal, never selected). Its fallback payload goes
        // with the intent's own if nothing else references it.
        let holds = tx
            .query(
                "DELETE FROM intent_holds WHERE intent_id = ANY($1) RETURNING fallback_digest",
                &[&ids],
            )
            .await?;
        removed.holds = holds.len() as u64;
        digests.extend(holds.iter().map(|r| r.get::<_, String>(0)));
        digests.sort_unstable();
        digests.dedup();
        removed.intents = tx
            // Its state row goes with it, in the same statement (migrations/V13 checks at
            // its end that no intent is left without one).
            .execute(
                "WITH state AS (DELETE FROM intent_states WHERE intent_id = ANY($1))
                 DELETE FROM intent_contents WHERE id = ANY($1)",
                &[&ids],
            )
            .await?;
        // Lock the payloads first (in digest order, as ingest does), then look for
        // references with a snapshot taken after the locks: an ingest reusing one of them
        // either committed before (its intent is seen: kept) or waits for us and then
        // inserts the payload afresh.
        tx.query(
            "SELECT 1 FROM notification_payloads WHERE digest = ANY($1) ORDER BY digest FOR UPDATE",
            &[&digests],
        )
        .await?;
        removed.payloads = tx.execute(DELETE_UNREFERENCED_PAYLOADS, &[&digests]).await?;
        // Failure policy: a crash before this commit deletes nothing: intents, their rows
        // and their payloads go together or stay together; the next pass selects them again.
        tx.commit().await?;
        Ok(Some(removed))
    }
}

/// One statement per table and batch for the evidence documents: (table, document
/// column, purge-time column, time column). Each its own transaction: a crash leaves
/// whole batches purged, and the next pass continues.
const DOCUMENTS: [(&str, &str, &str, &str); 3] = [
    (
        "intent_conflicts",
        "offending_event",
        "document_purged_at",
        "detected_at",
    ),
    (
        "http_request_mismatches",
        "offending_request",
        "document_purged_at",
        "detected_at",
    ),
    (
        "provider_event_rejects",
        "body_prefix",
        "body_purged_at",
        "received_at",
    ),
];

fn purge_documents(table: &str, document: &str, purged_at: &str, time: &str) -> String {
    // <table>_document_idx / provider_event_rejects_body_idx: the rows whose document is
    // still there, oldest first.
    format!(
        "UPDATE {table} SET {document} = NULL, {purged_at} = now() WHERE id IN
            (SELECT id FROM {table} WHERE {document} IS NOT NULL AND {time} < $1 ORDER BY {time} LIMIT $2)"
    )
}

/// What the purge of `table` will find, after the pass deleted the expired HTTP keys
/// (their mismatches go with them, before the purge).
fn count_documents(table: &str, document: &str, time: &str) -> String {
    let unexpired = if table == "http_request_mismatches" {
        " AND idempotency_key NOT IN (SELECT idempotency_key FROM http_requests WHERE expires_at <= now())"
    } else {
        ""
    };
    format!("SELECT count(*) FROM {table} WHERE {document} IS NOT NULL AND {time} < $1{unexpired}")
}

impl RetentionSession {
    /// Purges up to `batch` offending documents detected before `cutoff` in each of the
    /// conflicts and HTTP key mismatches. Returns how many.
    pub async fn purge_conflict_documents(&mut self, cutoff: DateTime<Utc>, batch: i64) -> Result<u64> {
        let mut purged = 0;
        for (table, document, purged_at, time) in &DOCUMENTS[..2] {
            purged += self
                .client
                .execute(
                    &purge_documents(table, document, purged_at, time),
                    &[&cutoff, &batch],
                )
                .await?;
        }
        Ok(purged)
    }

    /// Purges up to `batch` bodies of refused provider messages received before `cutoff`.
    pub async fn purge_reject_bodies(&mut self, cutoff: DateTime<Utc>, batch: i64) -> Result<u64> {
        let (table, document, purged_at, time) = DOCUMENTS[2];
        Ok(self
            .client
            .execute(
                &purge_documents(table, document, purged_at, time),
                &[&cutoff, &batch],
            )
            .await?)
    }

    /// Re-keys the next `batch` live unkeyed suppression-list entries (made before V17,
    /// see `destination`) after `cursor` (an id), and moves the cursor: an entry whose
    /// address a seller's profile holds gets its keyed digest, or is lifted when a keyed
    /// entry of that address is live already. Returns (entries re-keyed or lifted, entries
    /// looked at): 0 looked at means none are left after the cursor. An entry no profile
    /// names stays unkeyed (still matched by ingest and the reconcile role, counted by
    /// `herald_suppressions_unkeyed`) and is looked at again next pass.
    pub async fn rekey_suppressions(&mut self, batch: i64, cursor: &mut i64) -> Result<(u64, usize)> {
        // suppressions_unkeyed_idx for the batch, locked until the commit: an operator's
        // lift in between would otherwise leave an entry lifted for a twin no longer live.
        // The sellers table is read whole once per batch, hashed against the batch's
        // digests (no index holds an address's digest).
        let tx = self.client.transaction().await?;
        let rows = tx.query(REKEY_CANDIDATES, &[&*cursor, &batch]).await?;
        let Some(last) = rows.last() else {
            return Ok((0, 0));
        };
        *cursor = last.get(0);
        let candidates: Vec<(i64, String, Option<Vec<String>>)> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        let plan = rekey_plan(&self.key, &candidates);
        if plan.is_empty() {
            return Ok((0, rows.len()));
        }
        let changed: i64 = tx
            .query_one(
                REKEY,
                &[
                    &plan.ids,
                    &plan.keyed,
                    &self.key.id(),
                    &UNKEYED,
                    &KEYED,
                    &plan.lift,
                    &plan.extra_of,
                    &plan.extra,
                ],
            )
            .await?
            .get(0);
        // Failure policy: a crash before this commit leaves the batch unkeyed (still
        // matched) for the next pass.
        tx.commit().await?;
        Ok((changed as u64, rows.len()))
    }

    /// Deletes up to `batch` HTTP ingest keys past their expiry (their mismatches go with
    /// them, ON DELETE CASCADE). A key being taken over is that request's to delete.
    pub async fn delete_expired_http_requests(&mut self, batch: i64) -> Result<u64> {
        Ok(self
            .client
            .execute(crate::http_ingest::DELETE_EXPIRED_KEYS, &[&batch])
            .await?)
    }
}

impl Store {
    /// What a pass with these cutoffs would remove now, computed with SELECTs in one
    /// read-only snapshot; changes nothing. The counts are those a pass started from this
    /// state removes (the attempts of deleted intents exclude those in partitions the
    /// attempt clock drops first).
    pub async fn retention_preview(&self, cutoffs: &Cutoffs) -> Result<Removed> {
        let mut client = self.session("the retention preview").await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let partitions = partitions::partitions_before(&tx, cutoffs.attempts).await?;
        let default_attempts: i64 = tx
            .query_one(
                "SELECT count(*) FROM ONLY notification_attempts_default WHERE started_at < $1::date",
                &[&cutoffs.attempts],
            )
            .await?
            .get(0);
        let provider_events: i64 = tx
            .query_one(
                "SELECT (SELECT count(*) FROM provider_events WHERE received_at < $1::date)
                      + (SELECT count(*) FROM provider_event_rejects WHERE received_at < $1::date)",
                &[&cutoffs.attempts],
            )
            .await?
            .get(0);
        // The same predicate as PURGE_CANDIDATES + PURGE_BODIES, over the whole range (a
        // count of the whole range: reading every live intent once is its expected plan).
        let payload_bodies: i64 = tx
            .query_one(
                "SELECT count(*) FROM notification_payloads p
                  WHERE p.body_purged_at IS NULL AND p.created_at < $1
                    AND NOT EXISTS (SELECT 1 FROM notification_intents i
                                     WHERE i.payload_digest = p.digest
                                       AND i.state NOT IN ('accepted', 'rejected', 'failed', 'suppressed', 'observed'))",
                &[&cutoffs.payload_bodies],
            )
            .await?
            .get(0);
        let mut intents = IntentsRemoved::default();
        if let Some(cutoff) = cutoffs.intents {
            let row = tx
                .query_one(
                    "WITH doomed AS (
                        SELECT id, payload_digest FROM notification_intents
                         WHERE id < $1 AND created_at < $2 AND updated_at < $2
                           AND state IN ('accepted', 'rejected', 'failed', 'suppressed', 'observed')
                     )
                     SELECT (SELECT count(*) FROM doomed),
                            (SELECT count(*) FROM intent_conflicts WHERE intent_id IN (SELECT id FROM doomed)),
                            (SELECT count(*) FROM intent_resolutions WHERE intent_id IN (SELECT id FROM doomed)),
                            (SELECT count(*) FROM intent_holds WHERE intent_id IN (SELECT id FROM doomed)),
                            (SELECT count(*) FROM outbox WHERE intent_id IN (SELECT id FROM doomed)),
                            (SELECT count(*) FROM notification_attempts a
                              WHERE a.intent_id IN (SELECT id FROM doomed)
                                AND a.tableoid::regclass::text <> ALL($3)
                                AND NOT (a.tableoid = 'notification_attempts_default'::regclass
                                         AND a.started_at < $4::date)),
                            (SELECT count(*) FROM (
                                SELECT payload_digest AS digest FROM doomed WHERE payload_digest IS NOT NULL
                                UNION
                                SELECT fallback_digest FROM intent_holds WHERE intent_id IN (SELECT id FROM doomed)) d
                              WHERE NOT EXISTS (
                                SELECT 1 FROM notification_intents i
                                 WHERE i.payload_digest = d.digest
                                   AND NOT (i.id < $1 AND i.created_at < $2 AND i.updated_at < $2
                                            AND i.state IN ('accepted', 'rejected', 'failed', 'suppressed', 'observed')))
                                AND NOT EXISTS (
                                SELECT 1 FROM intent_holds h
                                 WHERE h.fallback_digest = d.digest
                                   AND h.intent_id NOT IN (SELECT id FROM doomed)))",
                    &[&v7_floor(cutoff), &cutoff, &partitions, &cutoffs.attempts],
                )
                .await?;
            let n = |i: usize| row.get::<_, i64>(i) as u64;
            intents = IntentsRemoved {
                intents: n(0),
                conflicts: n(1),
                resolutions: n(2),
                holds: n(3),
                outbox: n(4),
                attempts: n(5),
                payloads: n(6),
            };
        }
        let mut conflict_documents = 0;
        for (table, document, _, time) in &DOCUMENTS[..2] {
            let n: i64 = tx
                .query_one(
                    &count_documents(table, document, time),
                    &[&cutoffs.conflict_documents],
                )
                .await?
                .get(0);
            conflict_documents += n as u64;
        }
        let (table, document, _, time) = DOCUMENTS[2];
        let reject_bodies: i64 = tx
            .query_one(&count_documents(table, document, time), &[&cutoffs.reject_bodies])
            .await?
            .get(0);
        let http_requests: i64 = tx
            .query_one(
                "SELECT count(*) FROM http_requests WHERE expires_at <= now()",
                &[],
            )
            .await?
            .get(0);
        tx.rollback().await?;
        Ok(Removed {
            partitions,
            default_attempts: default_attempts as u64,
            payload_bodies: payload_bodies as u64,
            provider_events: provider_events as u64,
            intents,
            conflict_documents,
            reject_bodies: reject_bodies as u64,
            http_requests: http_requests as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v7_floor_sorts_above_every_earlier_id_and_below_every_later_one() {
        let at = DateTime::parse_from_rfc3339("2026-01-15T12:00:00Z")
            .unwrap()
            .to_utc();
        let floor = v7_floor(at);
        assert_eq!(floor.get_version_num(), 7);
        let id_at = |t: DateTime<Utc>, fill: u8| {
            uuid::Builder::from_unix_timestamp_millis(t.timestamp_millis() as u64, &[fill; 10]).into_uuid()
        };
        let ms = chrono::Duration::milliseconds(1);
        // Byte order is PostgreSQL's uuid order.
        assert!(id_at(at - ms, 0xff).as_bytes() < floor.as_bytes());
        assert!(id_at(at, 0x00).as_bytes() >= floor.as_bytes());
        assert!(id_at(at + ms, 0x00).as_bytes() > floor.as_bytes());
    }

    #[test]
    fn every_statement_names_exactly_the_terminal_states() {
        let listed = "'accepted', 'rejected', 'failed', 'suppressed', 'observed'";
        assert_eq!(TERMINAL_STATES.map(|s| format!("'{s}'")).join(", "), listed);
        assert!(INTENT_CANDIDATES.contains(listed), "{INTENT_CANDIDATES}");
        // The guard is "not one of the terminal states": a state added later (held intents,
        // `awaiting_profile`) keeps its body.
        let when: String = TERMINAL_STATES.map(|s| format!(" WHEN '{s}' THEN true")).concat();
        assert!(PURGE_BODIES.contains(&format!("NOT CASE i.state{when} ELSE false END")));
    }
}

#[cfg(test)]
mod rekey_tests {
    use super::*;

    #[test]
    fn each_distinct_keyed_destination_is_keyed_once() {
        let key = DestinationKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let candidate = |id: i64, channel: &str, addresses: Option<&[&str]>| {
            (
                id,
                channel.to_owned(),
                addresses.map(|a| a.iter().map(|s| s.to_string()).collect()),
            )
        };
        let plan = rekey_plan(
            &key,
            &[
                // Two spellings that key alike: one entry, no other.
                candidate(1, "email", Some(&["A@x.example", "a@x.example"])),
                // What entry 1 carries already: lifted.
                candidate(2, "email", Some(&[" a@x.example"])),
                // No profile holds its address: left.
                candidate(3, "email", None),
                // Two that key apart (İ lowercases to i̇): the entry and one more.
                candidate(4, "email", Some(&["İ@x.example", "i@x.example"])),
                // Another channel's digest is its own.
                candidate(5, "sms", Some(&["a@x.example"])),
            ],
        );
        assert_eq!(plan.ids, vec![1, 4, 5]);
        assert_eq!(plan.keyed[0], key.digest("email", "a@x.example"));
        assert_eq!(plan.lift, vec![2]);
        assert_eq!(plan.extra_of, vec![4]);
        let mut four = vec![plan.keyed[1].clone(), plan.extra[0].clone()];
        four.sort();
        let mut expected = vec![
            key.digest("email", "İ@x.example"),
            key.digest("email", "i@x.example"),
        ];
        expected.sort();
        assert_eq!(four, expected);
        assert_eq!(plan.keyed[2], key.digest("sms", "a@x.example"));
    }
}
