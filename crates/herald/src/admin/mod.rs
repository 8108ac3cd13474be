//! The admin HTTP endpoint (loopback by default): `/healthz`, `/readyz`, `/metrics`, the
//! inspection API under `/v1` and its OpenAPI document at `/openapi.json`.
//!
//! Everything under `/v1` needs a bearer token and answers 401 without one: reads take
//! `admin.read_token` or `admin.token`, mutations only `admin.token` (a read-only
//! operator cannot resolve, lift or replay: 403). Probes, metrics and the OpenAPI document need
//! none. At most `admin.max_concurrent_requests` `/v1` requests are answered at once (each
//! may hold a database connection the roles share): the rest wait a little, then get 503,
//! so that a flood of reads can never starve claims and records.

mod auth;
mod extract;

pub use auth::authorised;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::Resolution;
use herald_core::{BusinessKey, Channel};
use herald_kafka::inspect::{self, DeadLetterRecord, ReadBound, ReplaySelection};
use herald_kafka::KafkaSettings;
use herald_store::reconcile::{Destination, Suppression};
use herald_store::{IntentFilter, IntentRef, Store, StoreError};
use herald_telemetry::ScrapeHandle;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::health::Health;
use crate::shutdown::Shutdown;
use extract::{Body, Params, PathParam};

const OPENAPI: &str = include_str!("openapi.json");
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

pub struct AdminState {
    pub store: Store,
    pub scrape: ScrapeHandle,
    pub health: Arc<Health>,
    /// The operator's token: reads and mutations.
    pub token: Option<String>,
    /// A read-only operator's token.
    pub read_token: Option<String>,
    /// `/v1` requests answered at once (`admin.max_concurrent_requests`).
    pub requests: tokio::sync::Semaphore,
    pub kafka: KafkaSettings,
    pub dead_letter_topic: String,
    /// Where a replay may write: `Config::ingest_topics`.
    pub ingest_topics: Vec<String>,
    pub metrics: Arc<herald_telemetry::Metrics>,
    /// Held while the dead-letter topic is read.
    pub dead_letter_reads: tokio::sync::Mutex<()>,
}

type Shared = State<Arc<AdminState>>;

/// What `admin.probe_listen` serves: liveness, readiness and metrics, nothing of the ledger.
pub fn probe_router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

pub fn router(state: Arc<AdminState>) -> Router {
    let ledger = Router::new()
        .route("/v1/intents", get(list_intents))
        .route("/v1/intents/{intent_id}", get(get_intent))
        .route("/v1/intents/by-key/{business_key}", get(get_intent_by_key))
        .route("/v1/intents/{intent_id}/resolve", post(resolve_intent))
        .route("/v1/http-requests/{idempotency_key}", get(get_http_request))
        .route("/v1/suppressions", get(list_suppressions))
        .route("/v1/suppressions/lift", post(lift_suppression))
        .route("/v1/dead-letters", get(list_dead_letters))
        .route("/v1/dead-letters/replay", post(replay_dead_letters))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), gate))
        .with_state(state.clone());
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .merge(ledger)
        .with_state(state)
}

/// How long a `/v1` request waits for one of the `admin.max_concurrent_requests` slots.
const SLOT_WAIT: Duration = Duration::from_secs(5);

/// Every `/v1` request: a token (a read: the read-only or the operator's; a mutation: the
/// operator's, checked again by its handler), then a slot.
async fn gate(State(s): Shared, request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let headers = request.headers();
    let operator = auth::authorised(headers, s.token.as_deref());
    // A mutation needs the operator's token before its body is read or a slot taken: a
    // read-only token cannot hold a slot by trickling a body.
    if request.method() != axum::http::Method::GET && !operator {
        // The read-only operator is known, and refused (403); anyone else is not known (401).
        if auth::authorised(headers, s.read_token.as_deref()) {
            return ApiError(
                StatusCode::FORBIDDEN,
                "admin.read_token reads only: resolve, lift and replay need admin.token".into(),
            )
            .into_response();
        }
        return unauthorised().into_response();
    }
    if !operator && !auth::authorised(headers, s.read_token.as_deref()) {
        return ApiError(
            StatusCode::UNAUTHORIZED,
            "the ledger needs `Authorization: Bearer <admin.read_token or admin.token>`".into(),
        )
        .into_response();
    }
    let Ok(Ok(_slot)) = tokio::time::timeout(SLOT_WAIT, s.requests.acquire()).await else {
        s.metrics.admin_request_refused();
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            Json(serde_json::json!({
                "error": "admin.max_concurrent_requests are being answered: try again shortly"
            })),
        )
            .into_response();
    };
    next.run(request).await
}

/// Binds `listen` (`host:port`).
pub async fn bind(listen: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| anyhow::anyhow!("admin.listen {listen:?}: {e}"))?;
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("admin.listen {addr}: cannot bind: {e}"))
}

/// Serves on `listener` until shutdown: the whole admin API, or with `probes_only` the
/// probes and metrics.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    probes_only: bool,
    limits: crate::listener::Limits,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let metrics = state.metrics.clone();
    let app = if probes_only {
        tracing::info!(listen = %listener.local_addr()?, "probe endpoint listening");
        probe_router(state)
    } else {
        if state.token.is_none() {
            tracing::warn!("admin.token is not set: resolve, lift and dead-letter replay answer 401");
        }
        if state.token.is_none() && state.read_token.is_none() {
            tracing::warn!("neither admin.token nor admin.read_token is set: every /v1 request answers 401");
        }
        tracing::info!(listen = %listener.local_addr()?, "admin endpoint listening");
        router(state)
    };
    let name = if probes_only { "probe" } else { "admin" };
    crate::listener::serve(name, listener, app, limits, metrics, shutdown).await
}

#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match e {
            StoreError::IntentNotFound(_) => StatusCode::NOT_FOUND,
            StoreError::NotUnknown { .. } => StatusCode::CONFLICT,
            StoreError::ReasonRequired(_) => StatusCode::BAD_REQUEST,
            // A value PostgreSQL refuses (U+0000 in a text parameter, a value too long for
            // an index): the request's. A constraint violation is not the request's fault
            // (no request here writes a row a constraint could refuse): it is answered 503
            // with the other database failures.
            StoreError::Pool(_) | StoreError::Db(_)
                if matches!(e.sqlstate().and_then(|c| c.get(..2)), Some("22" | "54")) =>
            {
                return ApiError(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "the database refused a value of the request (SQLSTATE {}, {})",
                        e.sqlstate().unwrap_or("?"),
                        e.class().label()
                    ),
                );
            }
            StoreError::Pool(_) | StoreError::Db(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

fn unauthorised() -> ApiError {
    ApiError(
        StatusCode::UNAUTHORIZED,
        "this endpoint needs `Authorization: Bearer <admin.token>`".into(),
    )
}

async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "alive", "version": env!("CARGO_PKG_VERSION") }))
}

async fn readyz(State(s): Shared) -> Response {
    let r = s.health.readiness();
    let status = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(r)).into_response()
}

async fn metrics(State(s): Shared) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        s.scrape.render(),
    )
        .into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

#[derive(Serialize)]
struct IntentList {
    intents: Vec<herald_store::inspect::IntentView>,
}

async fn list_intents(
    State(s): Shared,
    Params(f): Params<IntentFilter>,
) -> Result<Json<IntentList>, ApiError> {
    if f.marketplace_id.is_empty() || f.order_id.is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "marketplace_id and order_id are required".into(),
        ));
    }
    Ok(Json(IntentList {
        intents: s.store.intent_views(&f).await?,
    }))
}

fn intent_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse()
        .map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("{raw:?} is not an intent id")))
}

async fn get_intent(
    State(s): Shared,
    PathParam(id): PathParam,
) -> Result<Json<herald_store::inspect::IntentView>, ApiError> {
    let id = intent_id(&id)?;
    match s.store.intent_view(IntentRef::Id(id)).await? {
        Some(v) => Ok(Json(v)),
        None => Err(ApiError(StatusCode::NOT_FOUND, format!("no intent {id}"))),
    }
}

/// `GET /v1/intents/by-key/{marketplace_id}:{order_id}:{event_kind}:{channel}`: the intent
/// of a business key, as an HTTP client checks what its posts became. Each part is
/// URL-encoded, a `:` inside a part as `%3A`; so the path is split on its raw colons before
/// the parts are decoded (axum's decoded path parameter could no longer tell them apart).
async fn get_intent_by_key(
    State(s): Shared,
    uri: Uri,
) -> Result<Json<herald_store::inspect::IntentView>, ApiError> {
    let raw = uri.path().rsplit('/').next().unwrap_or_default();
    let key = business_key(raw).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
    match s.store.intent_view(IntentRef::Key(&key)).await? {
        Some(v) => Ok(Json(v)),
        None => Err(ApiError(StatusCode::NOT_FOUND, format!("no intent for {key}"))),
    }
}

/// `GET /v1/http-requests/{idempotency_key}` (URL-encoded): what HTTP ingest stored for a
/// key until it expires, its answer and the other requests refused under it.
async fn get_http_request(
    State(s): Shared,
    PathParam(key): PathParam,
) -> Result<Json<herald_store::http_ingest::RequestKeyView>, ApiError> {
    match s.store.request_key(&key).await? {
        Some(v) => Ok(Json(v)),
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no live HTTP request with Idempotency-Key {key:?}"),
        )),
    }
}

/// Parses `marketplace_id:order_id:event_kind:channel`, each part percent-encoded.
fn business_key(raw: &str) -> Result<BusinessKey, String> {
    const SHAPE: &str = "the key is <marketplace_id>:<order_id>:<event_kind>:<channel>, each part \
                         URL-encoded (a ':' inside a part as %3A)";
    let parts = raw
        .split(':')
        .map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8()
                .map(|p| p.into_owned())
                .map_err(|_| format!("{raw:?}: a part is not UTF-8 once decoded; {SHAPE}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let [marketplace_id, order_id, event_kind, channel] =
        <[String; 4]>::try_from(parts).map_err(|p| format!("{raw:?} has {} parts; {SHAPE}", p.len()))?;
    if [&marketplace_id, &order_id, &event_kind]
        .iter()
        .any(|p| p.is_empty())
    {
        return Err(format!("{raw:?} has an empty part; {SHAPE}"));
    }
    Ok(BusinessKey {
        marketplace_id,
        order_id,
        event_kind,
        channel: channel.parse().map_err(|e| format!("{raw:?}: channel: {e}"))?,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveRequest {
    #[serde(rename = "as")]
    resolution: Resolution,
    reason: String,
    operator: Option<String>,
}

async fn resolve_intent(
    State(s): Shared,
    headers: HeaderMap,
    PathParam(id): PathParam,
    Body(req): Body<ResolveRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if !auth::authorised(&headers, s.token.as_deref()) {
        return Err(unauthorised());
    }
    let id = intent_id(&id)?;
    let reason = req.reason.trim();
    if reason.is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "reason is empty: say why, it is stored with the resolution".into(),
        ));
    }
    let resolution = req.resolution;
    let operator = req.operator.unwrap_or_else(|| "admin-api".into());
    let (_, channel) = s
        .store
        .resolve_unknown(IntentRef::Id(id), resolution, reason, &operator)
        .await?;
    s.metrics
        .unknown_settled(channel.as_str(), "operator", resolution.as_str());
    tracing::warn!(intent_id = %id, resolved_as = resolution.as_str(), operator = %operator, "intent resolved through the admin API");
    Ok(Json(serde_json::json!({
        "intent_id": id,
        "resolved_as": resolution.as_str(),
        "operator": operator,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SuppressionQuery {
    #[serde(default)]
    all: bool,
    limit: Option<i64>,
}

#[derive(Serialize)]
struct SuppressionList {
    suppressions: Vec<Suppression>,
}

async fn list_suppressions(
    State(s): Shared,
    Params(q): Params<SuppressionQuery>,
) -> Result<Json<SuppressionList>, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    Ok(Json(SuppressionList {
        suppressions: s.store.suppressions(q.all, limit).await?,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LiftRequest {
    channel: Channel,
    /// The address (digested as ingest does; never stored) or the listed digest.
    address: Option<String>,
    digest: Option<String>,
    reason: String,
    operator: Option<String>,
}

async fn lift_suppression(
    State(s): Shared,
    headers: HeaderMap,
    Body(req): Body<LiftRequest>,
) -> Result<Json<Suppression>, ApiError> {
    if !auth::authorised(&headers, s.token.as_deref()) {
        return Err(unauthorised());
    }
    if req.reason.trim().is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "reason is empty: say why, it is stored with the entry".into(),
        ));
    }
    let destination = match (&req.address, &req.digest) {
        (Some(a), None) => Destination::Address(a),
        (None, Some(d)) => Destination::Digest(d),
        _ => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "give exactly one of address and digest".into(),
            ))
        }
    };
    let operator = req.operator.unwrap_or_else(|| "admin-api".into());
    match s
        .store
        .lift_suppression(req.channel, destination, &operator, &req.reason)
        .await?
    {
        Some(lifted) => {
            tracing::warn!(suppression = lifted.id, channel = %lifted.channel, operator = %operator,
                           "suppression lifted through the admin API");
            Ok(Json(lifted))
        }
        None => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no live suppression for that {} destination", req.channel),
        )),
    }
}

/// Reads the dead-letter topic, one read at a time per process (each builds a Kafka client
/// and holds what it reads).
async fn read_dead_letters(
    s: &AdminState,
    bound: ReadBound,
) -> Result<(Vec<DeadLetterRecord>, bool), ApiError> {
    let _one_at_a_time = s.dead_letter_reads.lock().await;
    let (settings, topic) = (s.kafka.clone(), s.dead_letter_topic.clone());
    tokio::task::spawn_blocking(move || inspect::read_dead_letters(&settings, &topic, bound, KAFKA_TIMEOUT))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterQuery {
    limit: Option<usize>,
}

/// Records per list: 100 unless asked, at most 1,000; and at most 8 MiB of them.
const LIST_LIMIT: (usize, usize) = (100, 1000);
const LIST_MAX_BYTES: usize = 8 << 20;

#[derive(Serialize)]
struct DeadLetterList {
    topic: String,
    records: Vec<DeadLetterRecord>,
    /// The list stopped at its bound: the topic holds more (from the offsets after these).
    truncated: bool,
}

async fn list_dead_letters(
    State(s): Shared,
    Params(q): Params<DeadLetterQuery>,
) -> Result<Json<DeadLetterList>, ApiError> {
    let bound = ReadBound {
        records: q.limit.unwrap_or(LIST_LIMIT.0).clamp(1, LIST_LIMIT.1),
        bytes: LIST_MAX_BYTES,
    };
    let (records, truncated) = read_dead_letters(&s, bound).await?;
    Ok(Json(DeadLetterList {
        topic: s.dead_letter_topic.clone(),
        records,
        truncated,
    }))
}

async fn replay_dead_letters(
    State(s): Shared,
    headers: HeaderMap,
    Body(sel): Body<ReplaySelection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if !auth::authorised(&headers, s.token.as_deref()) {
        return Err(unauthorised());
    }
    sel.validate()
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let chosen: Vec<DeadLetterRecord> = read_dead_letters(&s, ReadBound::ALL)
        .await?
        .0
        .into_iter()
        .filter(|r| sel.picks(r))
        .collect();
    let ingest_topics: Vec<&str> = s.ingest_topics.iter().map(String::as_str).collect();
    let report = inspect::replay(&s.kafka, &s.dead_letter_topic, &ingest_topics, &chosen)
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    tracing::warn!(
        replayed = report.replayed,
        refused = report.refused.len(),
        "dead letters replayed through the admin API"
    );
    Ok(Json(
        serde_json::json!({ "replayed": report.replayed, "refused": report.refused, "records": chosen }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_business_key_is_split_on_its_raw_colons_then_decoded() {
        let k = business_key("acme:8042:order.created:email").unwrap();
        assert_eq!(
            (
                k.marketplace_id.as_str(),
                k.order_id.as_str(),
                k.event_kind.as_str(),
                k.channel
            ),
            ("acme", "8042", "order.created", Channel::Email)
        );
        let k = business_key("acme%3Aeu:80%2042:order.created:sms").unwrap();
        assert_eq!(
            (k.marketplace_id.as_str(), k.order_id.as_str()),
            ("acme:eu", "80 42")
        );
        for bad in [
            "acme:8042:order.created",
            "acme:8042:order.created:email:x",
            "acme::order.created:email",
            "acme:8042:order.created:fax",
            "acme:%FF:order.created:email",
        ] {
            assert!(business_key(bad).is_err(), "{bad}");
        }
    }
}
