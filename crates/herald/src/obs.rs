//! What every role needs to be observed: the metric instruments, whether spans are
//! exported, and the constructors of the spans that carry a trace across Kafka and the
//! outbox. Span names and attributes follow the OpenTelemetry messaging conventions
//! (`process T`, `send T`, `receive T`); Herald's own attributes are ids, channels,
//! revisions and outcomes, never a destination or a body.

use std::sync::Arc;

use herald_telemetry::{propagation, Metrics};
use tracing::{info_span, Span};

#[derive(Clone)]
pub struct Obs {
    pub metrics: Arc<Metrics>,
    /// Spans are exported: build the per-message spans and store their contexts. When
    /// off, the producer's `traceparent` is carried through unchanged.
    pub tracing: bool,
}

/// The `traceparent` to pass on from `span`: its own when spans are exported, otherwise
/// the one it received (`fallback`), so that a trace continues past a Herald that does
/// not export.
pub fn traceparent_or(span: &Span, fallback: Option<&str>) -> Option<String> {
    propagation::traceparent_of(span).or_else(|| fallback.map(str::to_owned))
}

/// The stages of an ingest batch, in order: where the ingest hop's time goes (taking a
/// pooled connection, BEGIN, the active templates read and compiled, the seller profiles
/// of a batch that carries some, the sellers and suppressions of its orders, rendering,
/// the convergence statement, the commit, what follows it). Each is a span under the
/// batch's `receive` span, named `ingest <stage>`, with `herald.ingest.stage`; the HTTP
/// ingest shares `sellers` and `render`, under its request's span.
pub const INGEST_STAGES: [&str; 9] = [
    "connection",
    "begin",
    "templates",
    "profiles",
    "sellers",
    "render",
    "converge",
    "commit",
    "report",
];

/// The span of one of [`INGEST_STAGES`], child of the current span; none when spans are
/// not exported.
pub fn ingest_stage(obs: &Obs, stage: &'static str) -> Span {
    debug_assert!(INGEST_STAGES.contains(&stage), "{stage} is not an ingest stage");
    if !obs.tracing {
        return Span::none();
    }
    info_span!(
        "ingest stage",
        otel.name = format!("ingest {stage}"),
        herald.ingest.stage = stage
    )
}

/// A consumer's per-message span, child of the producer's context in `traceparent`.
pub fn process_span(
    topic: &str,
    group: &str,
    partition: i32,
    offset: i64,
    key: Option<&str>,
    traceparent: Option<&str>,
) -> Span {
    let span = info_span!(
        "process",
        otel.name = format!("process {topic}"),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = topic,
        messaging.consumer.group.name = group,
        messaging.destination.partition.id = partition.to_string(),
        messaging.kafka.offset = offset,
        messaging.kafka.message.key = key,
    );
    propagation::set_remote_parent(&span, traceparent);
    span
}

/// An HTTP server span (`POST /v1/order-events`), child of the client's `traceparent`;
/// `http.response.status_code` and `herald.outcome` (`created`, `replayed`,
/// `idempotency_key_reused`, a refusal...) are recorded once answered.
pub fn http_server_span(method: &str, route: &str, traceparent: Option<&str>) -> Span {
    let span = info_span!(
        "http",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
        herald.outcome = tracing::field::Empty,
    );
    propagation::set_remote_parent(&span, traceparent);
    span
}

/// A poll batch: linked to each message's producer context (a batch has many parents).
pub fn receive_span<'a>(
    topic: &str,
    group: &str,
    messages: usize,
    parents: impl IntoIterator<Item = &'a str>,
) -> Span {
    let span = info_span!(
        "receive",
        otel.name = format!("receive {topic}"),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation.type = "receive",
        messaging.operation.name = "poll",
        messaging.destination.name = topic,
        messaging.consumer.group.name = group,
        messaging.batch.message_count = messages,
    );
    for tp in parents {
        propagation::add_link(&span, tp);
    }
    span
}

/// The relay's publish of one intent id, child of the context stored with the outbox row.
pub fn send_span(topic: &str, key: &str, traceparent: Option<&str>) -> Span {
    let span = info_span!(
        "send",
        otel.name = format!("send {topic}"),
        otel.kind = "producer",
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = topic,
        messaging.kafka.message.key = key,
    );
    propagation::set_remote_parent(&span, traceparent);
    span
}
