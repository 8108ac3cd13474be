//! W3C trace context in and out of `traceparent` strings: read from Kafka headers and the
//! outbox row, written into the `herald.deliveries` headers and stored on the intent.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";

/// The remote context a `traceparent` value names (an empty context when malformed).
pub fn context_from(traceparent: &str) -> Context {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// The span context a `traceparent` names, for span links; `None` when malformed.
pub fn span_context_from(traceparent: &str) -> Option<SpanContext> {
    let cx = context_from(traceparent);
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Makes `traceparent` the parent of `span`. Must be called before the span's
/// OpenTelemetry span starts, which is when a child, [`traceparent_of`] or its close first
/// needs its context (tracing-opentelemetry 0.34 refuses afterwards; call it before the
/// span is entered); none or a malformed value leaves the span's parent as it is.
pub fn set_remote_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    if span_context_from(traceparent).is_some() {
        // Fails only for a span already started or not recorded by the OpenTelemetry
        // layer (tracing disabled): either way the span simply starts its own trace.
        let _ = span.set_parent(context_from(traceparent));
    }
}

/// Links `span` to the context `traceparent` names (a batch with many parents).
pub fn add_link(span: &tracing::Span, traceparent: &str) {
    if let Some(sc) = span_context_from(traceparent) {
        span.add_link(sc);
    }
}

/// The `traceparent` of `span` as exported, or `None` when tracing is off (the span has
/// no OpenTelemetry context).
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Renames `span` once its OpenTelemetry span exists (after [`traceparent_of`] was asked,
/// tracing-opentelemetry ignores `otel.name` records). No-op when tracing is off.
pub fn rename(span: &tracing::Span, name: &'static str) {
    let cx = span.context();
    if cx.span().span_context().is_valid() {
        cx.span().update_name(name);
    }
}

/// The trace id part of a `traceparent`, for log lines.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, id) = (parts.next()?, parts.next()?);
    (id.len() == 32).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_a_traceparent() {
        let sc = span_context_from(TP).expect("valid");
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        assert!(span_context_from("00-zz-00f067aa0ba902b7-01").is_none());
        assert_eq!(trace_id(TP), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(trace_id("garbage"), None);
    }

    #[test]
    fn a_span_without_an_opentelemetry_layer_has_no_traceparent() {
        let span = tracing::info_span!("x");
        assert_eq!(traceparent_of(&span), None);
    }
}
