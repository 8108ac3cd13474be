//! Every answer of `POST /v1/order-events`: its status, the outcome label it is counted
//! under, and its JSON body (the shapes `openapi.json` describes). A converged request's
//! answer is also what its key replays, so it is built before the commit and stored by it.

use std::collections::HashMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_core::event::DecodeError;
use herald_core::{BusinessKey, IntentState};
use herald_store::{Convergence, NewIntent};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::roles::ingest::Unrendered;

/// Seconds a client is told to wait before retrying a 409 or a 503.
const RETRY_AFTER_SECS: u64 = 1;

/// Percent-encoded in a part of a business key in a path: all but RFC 3986's unreserved.
const KEY_PART: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// `herald_http_ingest_requests_total{outcome}`.
    pub outcome: &'static str,
    pub body: Value,
    /// A replay of a stored answer (`Idempotent-Replayed: true`).
    pub replayed: bool,
    pub retry_after: bool,
}

impl Answer {
    fn refusal(status: StatusCode, outcome: &'static str, error: &str, detail: impl Into<String>) -> Self {
        Self {
            status,
            outcome,
            body: json!({ "error": error, "detail": detail.into() }),
            replayed: false,
            retry_after: false,
        }
    }

    pub fn unauthorised() -> Self {
        Self::refusal(
            StatusCode::UNAUTHORIZED,
            "unauthorised",
            "unauthorised",
            "this endpoint needs `Authorization: Bearer <http_ingest.token>`",
        )
    }

    pub fn missing_key() -> Self {
        Self::refusal(
            StatusCode::BAD_REQUEST,
            "missing_key",
            "idempotency_key_missing",
            "the Idempotency-Key header is required: a unique value per request, the same on its retries",
        )
    }

    pub fn invalid_key(detail: String) -> Self {
        Self::refusal(
            StatusCode::BAD_REQUEST,
            "invalid",
            "idempotency_key_invalid",
            detail,
        )
    }

    pub fn unsupported_media_type() -> Self {
        Self::refusal(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "unsupported_media_type",
            "the body must be `Content-Type: application/json`",
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "too_large",
            format!("the body is larger than {limit} bytes (ingest.max_message_bytes)"),
        )
    }

    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self::refusal(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            "body_timeout",
            format!("the body did not arrive within {} s", limit.as_secs()),
        )
    }

    pub fn unreadable_body(detail: String) -> Self {
        Self::refusal(StatusCode::BAD_REQUEST, "invalid", "unreadable_body", detail)
    }

    /// A body that is not an order event, with the dead-letter topic's reason.
    pub fn invalid(e: DecodeError) -> Self {
        let status = match e.reason.as_str() {
            "too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        let outcome = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "too_large"
        } else {
            "invalid"
        };
        Self::refusal(status, outcome, e.reason.as_str(), e.detail)
    }

    /// PostgreSQL refused the request's data (a constraint or a value Herald's decoder does
    /// not know of): what a Kafka event would be dead-lettered for. Nothing was stored.
    pub fn store_rejected(sqlstate: &str, class: &str) -> Self {
        Self::refusal(
            StatusCode::UNPROCESSABLE_ENTITY,
            "store_rejected",
            "store_rejected",
            format!(
                "SQLSTATE {sqlstate} ({class}): the database refused the request's data; nothing was stored"
            ),
        )
    }

    pub fn not_routed(detail: String) -> Self {
        Self::refusal(
            StatusCode::UNPROCESSABLE_ENTITY,
            "not_routed",
            "not_routed",
            detail,
        )
    }

    /// A channel did not render: nothing was stored, the key is free for a retry.
    pub fn unrendered(u: &Unrendered) -> Self {
        Self::refusal(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unrendered",
            u.reason.as_str(),
            format!("{}; nothing was stored, the same key may be retried", u.detail),
        )
    }

    pub fn in_progress(key: &str) -> Self {
        Self {
            retry_after: true,
            ..Self::refusal(
                StatusCode::CONFLICT,
                "in_progress",
                "request_in_progress",
                format!("a request with Idempotency-Key {key:?} is still in progress; retry after it"),
            )
        }
    }

    /// The database failed under the request (the cause is in Herald's log, not here).
    pub fn unavailable() -> Self {
        Self {
            retry_after: true,
            ..Self::refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "unavailable",
                "the database could not take the request; nothing was stored, retry with the same key",
            )
        }
    }

    /// `http_ingest.max_in_flight` requests are being converged.
    pub fn overloaded() -> Self {
        Self {
            retry_after: true,
            ..Self::refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "overloaded",
                "too many requests in progress (http_ingest.max_in_flight); nothing was stored, retry with the same key",
            )
        }
    }

    /// The key holds another request: 422 naming the key and both fingerprints.
    pub fn key_reused(key: &str, stored: &str, offending: &str) -> Self {
        Self {
            body: json!({
                "error": "idempotency_key_reused",
                "detail": format!("Idempotency-Key {key:?} was used with another request; \
                                   this one is kept as evidence and not converged"),
                "idempotency_key": key,
                "stored_fingerprint": stored,
                "request_fingerprint": offending,
            }),
            ..Self::refusal(StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused", "", "")
        }
    }

    /// A stored answer, again: 200 for a 201, the same status otherwise.
    pub fn replay(status: u16, mut body: Value) -> Self {
        let status = match status {
            201 => StatusCode::OK,
            s => StatusCode::from_u16(s).unwrap_or(StatusCode::OK),
        };
        if let Some(o) = body.as_object_mut() {
            o.insert("replayed".into(), Value::Bool(true));
        }
        Self {
            status,
            outcome: "replayed",
            body,
            replayed: true,
            retry_after: false,
        }
    }

    /// What the request converged on: 201, or 422 when a business key already holds
    /// other content (that conflict is recorded, as a Kafka one is).
    pub fn converged(
        key: &str,
        fingerprint: &str,
        intents: &[NewIntent<'_>],
        results: &[Convergence],
        states: &HashMap<Uuid, IntentState>,
    ) -> Self {
        let entries: Vec<Value> = intents
            .iter()
            .zip(results)
            .map(|(intent, result)| intent_entry(intent, result, states))
            .collect();
        let conflicts = results
            .iter()
            .filter(|r| matches!(r, Convergence::Conflict { .. }))
            .count();
        let mut body = json!({
            "idempotency_key": key,
            "request_fingerprint": fingerprint,
            "replayed": false,
            "intents": entries,
        });
        if conflicts == 0 {
            return Self {
                status: StatusCode::CREATED,
                outcome: "created",
                body,
                replayed: false,
                retry_after: false,
            };
        }
        let o = body.as_object_mut().expect("built as an object");
        o.insert("error".into(), "business_key_conflict".into());
        o.insert(
            "detail".into(),
            format!(
                "{conflicts} of the order's notifications already exist with other content: \
                 recorded as a conflict, not sent (see each intent's existing_fingerprint)"
            )
            .into(),
        );
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            outcome: "business_key_conflict",
            body,
            replayed: false,
            retry_after: false,
        }
    }
}

fn intent_entry(intent: &NewIntent<'_>, result: &Convergence, states: &HashMap<Uuid, IntentState>) -> Value {
    let (id, outcome, existing) = match result {
        Convergence::Created { intent_id, .. } => (intent_id, "created", None),
        Convergence::Duplicate { intent_id } => (intent_id, "duplicate", None),
        Convergence::Conflict {
            intent_id,
            existing_fingerprint,
            ..
        } => (intent_id, "conflict", Some(existing_fingerprint)),
    };
    let key = &intent.key;
    let mut entry = json!({
        "intent_id": id,
        "marketplace_id": key.marketplace_id,
        "order_id": key.order_id,
        "event_kind": key.event_kind,
        "channel": key.channel.as_str(),
        "outcome": outcome,
        "state": states.get(id).map(|s| s.as_str()),
        "event_fingerprint": intent.fingerprint.as_str(),
        "inspect": format!("/v1/intents/by-key/{}", path_key(key)),
    });
    if let Some(existing) = existing {
        entry["existing_fingerprint"] = existing.as_str().into();
    }
    entry
}

/// `marketplace_id:order_id:event_kind:channel`, each part percent-encoded: the admin
/// API's `/v1/intents/by-key/{business_key}`.
pub fn path_key(key: &BusinessKey) -> String {
    [
        key.marketplace_id.as_str(),
        &key.order_id,
        &key.event_kind,
        key.channel.as_str(),
    ]
    .map(|p| utf8_percent_encode(p, KEY_PART).to_string())
    .join(":")
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body)).into_response();
        if self.replayed {
            r.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
        }
        if self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::Channel;

    #[test]
    fn business_key_parts_are_encoded_for_the_inspection_path() {
        let key = BusinessKey {
            marketplace_id: "acme:eu".into(),
            order_id: "80 42/7".into(),
            event_kind: "order.created".into(),
            channel: Channel::Email,
        };
        assert_eq!(path_key(&key), "acme%3Aeu:80%2042%2F7:order.created:email");
    }

    #[test]
    fn a_replay_is_marked_and_a_created_answer_replays_as_200() {
        let a = Answer::replay(201, json!({ "replayed": false, "intents": [] }));
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body["replayed"], true);
        let r = a.into_response();
        assert_eq!(r.headers()["idempotent-replayed"], "true");
        let conflict = Answer::replay(422, json!({ "error": "business_key_conflict" }));
        assert_eq!(conflict.status, StatusCode::UNPROCESSABLE_ENTITY);
        let busy = Answer::in_progress("k").into_response();
        assert_eq!(busy.status(), StatusCode::CONFLICT);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
    }
}
