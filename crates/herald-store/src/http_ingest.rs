//! The Idempotency-Key of HTTP ingest (`http_requests`, V10): claimed at the start of the
//! request's ingest transaction, answered just before it commits, so the key, the intents
//! and the stored response are one atomic fact.

use std::collections::HashMap;
use std::time::Duration;

use herald_core::IntentState;
use tokio_postgres::types::Json;
use uuid::Uuid;

use crate::ingest::IngestTx;
use crate::{Result, Sql, StoreError};

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyClaim {
    /// The key is this transaction's (new, or expired and taken over): converge, then
    /// [`IngestTx::answer_request`].
    Claimed,
    /// A committed request holds the key: its fingerprint and the response it got.
    Answered {
        fingerprint: String,
        status: u16,
        response: serde_json::Value,
    },
    /// Another transaction holds the key and did not finish within the wait: it is still
    /// in progress. This transaction is aborted; drop it.
    InProgress,
}

/// The SQLSTATE of `lock_timeout` running out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

impl IngestTx<'_> {
    /// Claims `key` for a request with `fingerprint`, answered until `retention` from now.
    /// Waits at most `wait` for a transaction that holds the key (an uncommitted insert, or
    /// a row being taken over), then reports [`KeyClaim::InProgress`].
    pub async fn claim_request_key(
        &self,
        key: &str,
        fingerprint: &str,
        retention: Duration,
        wait: Duration,
    ) -> Result<KeyClaim> {
        // Only these statements wait so briefly: the convergence after them waits for
        // Kafka batches on the same business keys as long as it must. set_config(.., true)
        // lasts until the transaction ends or the next set_config.
        let prior: String = self
            .tx
            .query_one(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)",
                &[&format!("{}ms", wait.as_millis().max(1))],
            )
            .await?
            .get(0);
        let claimed = match self.try_claim(key, fingerprint, retention).await {
            Err(e) if e.sqlstate() == Some(LOCK_NOT_AVAILABLE) => return Ok(KeyClaim::InProgress),
            other => other?,
        };
        self.tx
            .execute("SELECT set_config('lock_timeout', $1, true)", &[&prior])
            .await?;
        Ok(claimed)
    }

    async fn try_claim(&self, key: &str, fingerprint: &str, retention: Duration) -> Result<KeyClaim> {
        // http_requests_pkey. An expired key is free: its row (and its mismatches) go first.
        self.tx
            .execute(
                "DELETE FROM http_requests WHERE idempotency_key = $1 AND expires_at <= now()",
                &[&key],
            )
            .await?;
        // Blocks on another transaction's uncommitted row with this key until it ends (or
        // lock_timeout): committed, DO NOTHING; rolled back, this insert goes in.
        let inserted = self
            .tx
            .query_opt(
                "INSERT INTO http_requests (idempotency_key, request_fingerprint, expires_at)
                 VALUES ($1, $2, now() + make_interval(secs => $3))
                 ON CONFLICT ON CONSTRAINT http_requests_pkey DO NOTHING
                 RETURNING 1",
                &[&key, &fingerprint, &(retention.as_secs() as f64)],
            )
            .await?;
        if inserted.is_some() {
            return Ok(KeyClaim::Claimed);
        }
        let row = self
            .tx
            .query_one(
                "SELECT request_fingerprint, response_status, response FROM http_requests
                 WHERE idempotency_key = $1",
                &[&key],
            )
            .await?;
        let (status, response): (Option<i16>, Option<Json<serde_json::Value>>) = (row.get(1), row.get(2));
        match (status, response) {
            (Some(status), Some(Json(response))) => Ok(KeyClaim::Answered {
                fingerprint: row.get(0),
                status: status as u16,
                response,
            }),
            _ => Err(StoreError::Corrupt(format!(
                "http_requests {key:?} is committed without a response"
            ))),
        }
    }

    /// Stores the response of the request that claimed `key`, replayed to its retries.
    pub async fn answer_request(&self, key: &str, status: u16, response: &serde_json::Value) -> Result<()> {
        // http_requests_pkey
        let n = self
            .tx
            .execute(
                "UPDATE http_requests SET response_status = $2, response = $3 WHERE idempotency_key = $1",
                &[&key, &(status as i16), &Json(response)],
            )
            .await?;
        if n != 1 {
            return Err(StoreError::Corrupt(format!(
                "http_requests {key:?} vanished within its transaction"
            )));
        }
        Ok(())
    }

    /// Keeps a request that reused `key` with another fingerprint, once per fingerprint.
    /// Returns whether it was new.
    pub async fn record_request_mismatch(
        &self,
        key: &str,
        stored_fingerprint: &str,
        offending_fingerprint: &str,
        offending_request: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<bool> {
        // http_request_mismatches_once
        let n = self
            .tx
            .execute(
                "INSERT INTO http_request_mismatches
                    (idempotency_key, stored_fingerprint, offending_fingerprint, offending_request)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT ON CONSTRAINT http_request_mismatches_once DO NOTHING",
                &[
                    &key,
                    &stored_fingerprint,
                    &offending_fingerprint,
                    &Json(offending_request),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    /// The current state of each of `ids`.
    pub async fn intent_states(&self, ids: &[Uuid]) -> Result<HashMap<Uuid, IntentState>> {
        // intent_states_pkey
        let rows = self
            .tx
            .query(
                "SELECT intent_id, state FROM intent_states WHERE intent_id = ANY($1)",
                &[&ids],
            )
            .await?;
        rows.into_iter()
            .map(|r| Ok((r.get(0), crate::intent_state(r.get(1))?)))
            .collect()
    }
}

impl crate::Store {
    /// Deletes up to `limit` expired keys (with their mismatches); returns how many.
    pub async fn delete_expired_request_keys(&self, limit: i64) -> Result<u64> {
        let conn = self.conn().await?;
        // http_requests_expires_at_idx. SKIP LOCKED: a key being taken over is that
        // request's to delete.
        conn.execute(DELETE_EXPIRED_KEYS, &[&limit]).await
    }

    /// A key's stored request and the mismatches kept for it, for inspection.
    pub async fn request_key(&self, key: &str) -> Result<Option<RequestKeyView>> {
        let conn = self.conn().await?;
        // http_requests_pkey
        let Some(r) = conn
            .query_opt(
                "SELECT request_fingerprint, response_status, response, received_at, expires_at
                 FROM http_requests WHERE idempotency_key = $1 AND expires_at > now()",
                &[&key],
            )
            .await?
        else {
            return Ok(None);
        };
        // http_request_mismatches_once (leading column idempotency_key)
        let mismatches = conn
            .query(
                "SELECT offending_fingerprint, offending_request, detected_at, document_purged_at
                 FROM http_request_mismatches WHERE idempotency_key = $1 ORDER BY id",
                &[&key],
            )
            .await?
            .into_iter()
            .map(|m| {
                let request: Option<Json<serde_json::Value>> = m.get(1);
                MismatchView {
                    offending_fingerprint: m.get(0),
                    offending_request: request.map(|Json(r)| r),
                    detected_at: m.get(2),
                    document_purged_at: m.get(3),
                }
            })
            .collect();
        let status: Option<i16> = r.get(1);
        let response: Option<Json<serde_json::Value>> = r.get(2);
        Ok(Some(RequestKeyView {
            idempotency_key: key.to_owned(),
            request_fingerprint: r.get(0),
            response_status: status.map(|s| s as u16),
            response: response.map(|Json(v)| v),
            received_at: r.get(3),
            expires_at: r.get(4),
            mismatches,
        }))
    }
}

#[derive(Debug, serde::Serialize)]
pub struct RequestKeyView {
    pub idempotency_key: String,
    pub request_fingerprint: String,
    pub response_status: Option<u16>,
    pub response: Option<serde_json::Value>,
    pub received_at: chrono::DateTime<chrono::Utc>,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    pub mismatches: Vec<MismatchView>,
}

#[derive(Debug, serde::Serialize)]
pub struct MismatchView {
    pub offending_fingerprint: String,
    /// `None` once retention purged it (retention.conflict_document_days).
    pub offending_request: Option<serde_json::Value>,
    pub detected_at: chrono::DateTime<chrono::Utc>,
    pub document_purged_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Up to `$1` keys past their expiry, oldest first (http_requests_expires_at_idx); their
/// mismatches go with them (ON DELETE CASCADE). SKIP LOCKED: a key being taken over is
/// that request's to delete. Run by the listener's sweep and by retention.
pub(crate) const DELETE_EXPIRED_KEYS: &str = "DELETE FROM http_requests WHERE idempotency_key IN (
        SELECT idempotency_key FROM http_requests WHERE expires_at <= now()
        ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)";
