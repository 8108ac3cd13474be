//! What the log and trace layers cost per span: the attempt's two spans (`attempt` and the
//! provider call, with their fields, one `record` each and one event inside; the attempt's
//! span entered and left four times, as a future's span is at each poll), under Herald's log
//! layer (`log_layer`, JSON) and under a JSON log layer that sees spans (as it did before
//! `EventsOnly`), each alone and beside an OpenTelemetry layer sampling at 0.1 without an
//! exporter: `tracing_opentelemetry`'s defaults (as before 2026-12-06) or Herald's
//! (`trace_layer`). Writes to a sink; prints microseconds per attempt, 5 rounds.
//!
//! `cargo bench -p herald-telemetry --bench spans` (release; keep the machine otherwise idle).

use std::time::Instant;

use herald_telemetry::LogSettings;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::field::Empty;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

const ATTEMPTS: u32 = 50_000;
/// Times the attempt's span is entered: its future's polls (claim room, send, record).
const POLLS: u32 = 4;

fn attempts() -> f64 {
    let start = Instant::now();
    for i in 0..ATTEMPTS {
        let attempt = tracing::info_span!("attempt", herald.intent.id = %i, herald.attempt.id = %i,
            herald.attempt.number = 1, herald.channel = "email", herald.template.revision = "3",
            herald.after_unknown = false, herald.outcome = Empty);
        let call = tracing::info_span!(parent: &attempt, "SES SendEmail", otel.kind = "client",
            rpc.system = "aws-api", rpc.service = "SESv2", rpc.method = "SendEmail", herald.outcome = Empty);
        for _ in 0..POLLS {
            let _poll = attempt.enter();
        }
        call.in_scope(|| tracing::debug!(intent_id = %i, "inside the call"));
        call.record("herald.outcome", "accepted");
        attempt.record("herald.outcome", "accepted");
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(ATTEMPTS)
}

/// A JSON log layer that sees spans: Herald's format and level, without `EventsOnly`.
fn seeing_spans<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::sink)
        .with_target(true)
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_filter(EnvFilter::new("info"))
}

#[derive(Clone, Copy)]
enum Traces {
    Off,
    /// `tracing_opentelemetry::layer()` with its defaults, as Herald added it before.
    CrateDefaults,
    /// Herald's `trace_layer`.
    Herald,
}

/// The OpenTelemetry layer, sampling at 0.1, or none.
fn traces<S>(provider: &SdkTracerProvider, traces: Traces) -> Option<Box<dyn Layer<S> + Send + Sync>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    match traces {
        Traces::Off => None,
        Traces::CrateDefaults => Some(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("bench"))
                .with_filter(Targets::new().with_default(tracing::Level::INFO))
                .boxed(),
        ),
        Traces::Herald => Some(herald_telemetry::trace_layer(provider.tracer("bench")).boxed()),
    }
}

fn run(herald_layer: bool, traced: Traces) -> f64 {
    let provider = SdkTracerProvider::builder()
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(0.1))))
        .build();
    if herald_layer {
        let log = herald_telemetry::log_layer(&LogSettings::default(), std::io::sink).expect("log layer");
        let subscriber = tracing_subscriber::registry()
            .with(log)
            .with(traces(&provider, traced));
        tracing::subscriber::with_default(subscriber, attempts)
    } else {
        let subscriber = tracing_subscriber::registry()
            .with(seeing_spans())
            .with(traces(&provider, traced));
        tracing::subscriber::with_default(subscriber, attempts)
    }
}

fn main() {
    println!("µs per attempt's two spans | log sees spans | Herald's log layer");
    for round in 1..=5 {
        for (name, t) in [
            ("no traces exported", Traces::Off),
            ("traces at 0.1, the crate's defaults", Traces::CrateDefaults),
            ("traces at 0.1, Herald's trace layer", Traces::Herald),
        ] {
            println!(
                "round {round}, {name:<36} | {:.2} | {:.2}",
                run(false, t),
                run(true, t)
            );
        }
    }
}
