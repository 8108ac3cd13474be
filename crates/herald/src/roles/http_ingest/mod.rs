//! HTTP ingest: `POST /v1/order-events` on its own listener (`[http_ingest]`), for
//! producers that cannot write to Kafka, with Idempotency-Key semantics as
//! draft-ietf-httpapi-idempotency-key-header and Stripe define them; and its OpenAPI
//! document at `GET /openapi.json`. Served by processes running the ingest role.
//!
//! Stages: `request` (the key, the body and its fingerprint; pure), `converge` (one
//! transaction: the key, then the ingest convergence), `answer` (statuses and bodies).

mod answer;
mod converge;
mod request;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use herald_kafka::headers::valid_traceparent;
use tracing::Instrument;

use answer::Answer;
use converge::Accepted;

use crate::roles::ingest::IngestContext;
use crate::shutdown::Shutdown;

const OPENAPI: &str = include_str!("openapi.json");
const ROUTE: &str = "/v1/order-events";
/// How often expired keys are deleted, and how many per statement.
const SWEEP_EVERY: Duration = Duration::from_secs(600);
const SWEEP_BATCH: i64 = 1000;
/// How long a request's body may take to arrive once its headers have.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

struct HttpState {
    ctx: Arc<IngestContext>,
    token: String,
    in_flight: Arc<tokio::sync::Semaphore>,
    retention: Duration,
    wait: Duration,
}

type Shared = State<Arc<HttpState>>;

fn router(state: Arc<HttpState>, max_body: usize) -> Router {
    Router::new()
        .route("/openapi.json", get(openapi))
        .route(ROUTE, post(post_order_event))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Binds `[http_ingest] listen` and reads its token, then serves in a task until shutdown
/// (requests in flight are finished), deleting expired keys meanwhile. A port clash or an
/// unreadable token fails here, and with it the ingest role's start.
pub async fn start(
    ctx: Arc<IngestContext>,
    shutdown: Shutdown,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let settings = &ctx.config.http_ingest;
    let addr: SocketAddr = settings
        .listen
        .parse()
        .map_err(|e| anyhow::anyhow!("http_ingest.listen {:?}: {e}", settings.listen))?;
    let token = settings.bearer_token()?.ok_or_else(|| {
        anyhow::anyhow!("http_ingest.listen is set without http_ingest.token or token_file")
    })?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("http_ingest.listen {addr}: cannot bind: {e}"))?;
    let state = Arc::new(HttpState {
        ctx: ctx.clone(),
        token,
        in_flight: Arc::new(tokio::sync::Semaphore::new(settings.max_in_flight)),
        retention: settings.key_retention(),
        wait: Duration::from_millis(settings.in_progress_wait_ms),
    });
    ctx.obs.metrics.init_http_ingest();
    tracing::info!(listen = %listener.local_addr()?, key_retention_hours = settings.key_retention_hours,
                   "HTTP ingest listening");
    let app = router(state, ctx.config.ingest.max_message_bytes);
    let (limits, metrics) = (ctx.config.listeners.http_ingest(), ctx.obs.metrics.clone());
    Ok(tokio::spawn(async move {
        let sweeper = tokio::spawn(sweep_every(ctx, SWEEP_EVERY));
        let served = crate::listener::serve("http_ingest", listener, app, limits, metrics, shutdown).await;
        sweeper.abort();
        served
    }))
}

async fn sweep_every(ctx: Arc<IngestContext>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        loop {
            match ctx.store.delete_expired_request_keys(SWEEP_BATCH).await {
                Ok(n) => {
                    if n > 0 {
                        tracing::debug!(deleted = n, "expired Idempotency-Keys deleted");
                    }
                    if (n as i64) < SWEEP_BATCH {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "deleting expired Idempotency-Keys failed; trying again later");
                    break;
                }
            }
        }
    }
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn post_order_event(State(s): Shared, request: Request) -> Response {
    let traceparent = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(valid_traceparent)
        .map(str::to_owned);
    let traceparent = traceparent.as_deref();
    let span = s
        .ctx
        .obs
        .tracing
        .then(|| crate::obs::http_server_span("POST", ROUTE, traceparent));
    let answer = match span.clone() {
        Some(span) => {
            answer(&s, request, traceparent, Some(span.clone()))
                .instrument(span)
                .await
        }
        None => answer(&s, request, traceparent, None).await,
    };
    if let Some(span) = &span {
        span.record("http.response.status_code", answer.status.as_u16());
        span.record("herald.outcome", answer.outcome);
    }
    s.ctx.obs.metrics.http_ingest_request(answer.outcome);
    answer.into_response()
}

async fn answer(
    s: &HttpState,
    request: Request,
    traceparent: Option<&str>,
    span: Option<tracing::Span>,
) -> Answer {
    let headers = request.headers();
    if !crate::admin::authorised(headers, Some(&s.token)) {
        return Answer::unauthorised();
    }
    let mut keys = headers.get_all("idempotency-key").iter();
    let key = match (keys.next(), keys.next()) {
        (None, _) => return Answer::missing_key(),
        (Some(_), Some(_)) => return Answer::invalid_key("Idempotency-Key is given more than once".into()),
        (Some(v), None) => match request::idempotency_key(v.as_bytes()) {
            Ok(k) => k,
            Err(e) => return Answer::invalid_key(e),
        },
    };
    if !is_json(headers) {
        return Answer::unsupported_media_type();
    }
    let max = s.ctx.config.ingest.max_message_bytes;
    // Read only now, after the token and the key were checked, and within a deadline: a
    // client that sends its body slowly does not hold the request (and its connection) open.
    // The limit is DefaultBodyLimit's (the router's layer).
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, Bytes::from_request(request, &())).await {
        Err(_) => return Answer::body_timeout(BODY_READ_TIMEOUT),
        Ok(Ok(b)) => b,
        Ok(Err(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Answer::too_large(max),
        Ok(Err(e)) => return Answer::unreadable_body(e.body_text()),
    };
    let request = match request::order_request(&body, max) {
        Ok(r) => r,
        Err(e) => return Answer::invalid(e),
    };
    let event_kind = &request.event.event_kind;
    let Some(route) = s.ctx.config.route(event_kind) else {
        return Answer::not_routed(format!("no route for event_kind {event_kind:?}"));
    };
    let mut route = route.clone();
    if let Some(channel) = request.channel {
        if !route.channels.contains(&channel) {
            return Answer::not_routed(format!(
                "the route of {event_kind:?} has no {channel} channel (it has {:?})",
                route.channels.iter().map(|c| c.as_str()).collect::<Vec<_>>()
            ));
        }
        route.channels = vec![channel];
    }
    // At most max_in_flight transactions: the ingest role's Kafka batches share the pool.
    let Ok(permit) = s.in_flight.clone().try_acquire_owned() else {
        return Answer::overloaded();
    };
    let accepted = Accepted {
        key: key.clone(),
        request,
        route,
        trace_context: traceparent.map(str::to_owned),
        span,
    };
    // In a task of its own: a client that hangs up drops this handler, never the
    // transaction halfway (which would hand a connection still running its statements back
    // to the pool, and lose the logs and counters of a committed request).
    let (ctx, retention, wait) = (s.ctx.clone(), s.retention, s.wait);
    let work = tokio::spawn(
        async move {
            let _permit = permit;
            converge::converge(&ctx, retention, wait, accepted).await
        }
        .in_current_span(),
    );
    match work.await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => failed(&key, e),
        Err(e) => {
            tracing::error!(idempotency_key = %key, error = %e, "HTTP ingest request task failed");
            Answer::unavailable()
        }
    }
}

/// A request whose transaction failed (and rolled back).
fn failed(key: &str, e: anyhow::Error) -> Answer {
    // As a Kafka batch's: data PostgreSQL refuses is the request's (it would be
    // dead-lettered `store_rejected`); anything else is the environment's.
    let store = e
        .chain()
        .find_map(|c| c.downcast_ref::<herald_store::StoreError>());
    match store.filter(|s| !s.class().is_transient()) {
        Some(s) => {
            let (sqlstate, class) = (s.sqlstate().unwrap_or("?"), s.class().label());
            // Without PostgreSQL's detail: "Failing row contains (...)" holds the row,
            // destinations included.
            tracing::warn!(idempotency_key = %key, sqlstate, class, "HTTP ingest request refused by the database");
            Answer::store_rejected(sqlstate, class)
        }
        None => {
            tracing::warn!(idempotency_key = %key, error = %format!("{e:#}"), "HTTP ingest request failed; answered 503");
            Answer::unavailable()
        }
    }
}

/// `Content-Type: application/json`, parameters (a charset) allowed.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}
