//! The global `tracing` subscriber: JSON lines (or human-readable text) to stderr, so that
//! command output on stdout stays machine-readable, plus the OpenTelemetry layer when traces
//! are exported. Destinations and bodies never reach a log field: callers log ids, channels,
//! revisions and outcome classes only.
//!
//! Routine lines (an intent created to be sent, observed or suppressed by consent, a
//! duplicate converged, a first attempt started or accepted) are marked `routine = true` at their call sites and may be sampled with
//! `log.routine_sampling_ratio`; every other line is always written. The decision is a hash
//! of the line's `intent_id`, the same in every process, so an intent's routine lines are
//! all written or all left out, whichever role writes them. Sampling applies to the log
//! output only: the same events still reach the spans exported for tracing.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use opentelemetry_sdk::trace::Tracer;
use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::{LogSettings, TelemetryError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Json,
    Text,
}

pub(crate) fn install(log: &LogSettings, tracer: Option<Tracer>) -> Result<(), TelemetryError> {
    let lines = log_layer(log, std::io::stderr)?;
    let otel = tracer.map(trace_layer);
    // A second initialisation (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry().with(lines).with(otel).try_init();
    Ok(())
}

/// The OpenTelemetry layer: every INFO span becomes a span for export, kept or dropped by
/// the tracer's sampler (the log level does not choose them). Public for the span
/// benchmark (`benches/spans.rs`).
///
/// Its work is per span and, for a future's span, per poll; with a sampling ratio of 0.1
/// nine spans in ten are built and then dropped. Four defaults of `tracing_opentelemetry`
/// that nothing reads are off:
/// - context activation: each poll attached the span's OpenTelemetry context to the
///   thread and detached it. Nothing in Herald reads `opentelemetry::Context::current()`:
///   a span's parent is its `tracing` parent, and propagation reads the span's own
///   context (`propagation.rs`). The span is then started (and sampled) when a child or
///   the propagator first needs its context, or when it closes; its start time is still
///   taken when it is created.
/// - inactivity tracking: two clock reads per poll, for `busy_ns` and `idle_ns`.
/// - thread attributes: a `thread.name` string allocated per span.
/// - location: three attributes (`code.file.path`, `code.module.name`,
///   `code.line.number`) per span. The `target` attribute still names the module.
pub fn trace_layer<S>(tracer: Tracer) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_context_activation(false)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_filter(tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO))
}

/// The log output, to `writer`: the level filter (`RUST_LOG`, else `log.level`), routine
/// sampling, and in JSON no spans at all (see [`EventsOnly`]). Public for the span
/// benchmark (`benches/spans.rs`); the process installs it through [`crate::Telemetry`].
pub fn log_layer<W>(
    log: &LogSettings,
    writer: W,
) -> Result<impl Layer<tracing_subscriber::Registry> + Send + Sync, TelemetryError>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(&v),
        _ => EnvFilter::try_new(&log.level),
    }
    .map_err(|source| TelemetryError::LogFilter {
        level: log.level.clone(),
        source,
    })?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_target(true);
    let (fmt, spans) = match log.format {
        LogFormat::Json => (
            fmt.json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .boxed(),
            false,
        ),
        LogFormat::Text => (fmt.with_ansi(false).boxed(), true),
    };
    // EventsOnly first: a span the JSON log ignores goes no further down the chain.
    Ok(fmt.with_filter(
        EventsOnly { spans }
            .and(filter)
            .and(RoutineSampler::new(log.routine_sampling_ratio)),
    ))
}

/// Keeps spans away from the JSON log output, which writes none of their fields
/// (`with_current_span(false)`, `with_span_list(false)`): seen by the fmt layer, every span
/// would still have its fields formatted into JSON when created, and parsed and written
/// again at every `record`, all of it thrown away: about 3 µs for an attempt's two spans
/// (`cargo bench -p herald-telemetry --bench spans`; BENCHMARKS.md, 2026-12-05 19:00). The
/// spans still reach the OpenTelemetry layer when traces are exported; without it they cost
/// next to nothing. The text format prints the spans a line is in, so it sees them. A
/// span-scoped directive (`RUST_LOG=info,herald[attempt]=debug`) needs the text format:
/// the JSON log's filter never sees the span it names.
struct EventsOnly {
    spans: bool,
}

impl<S> Filter<S> for EventsOnly {
    fn enabled(&self, meta: &tracing::Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.spans || !meta.is_span()
    }

    fn callsite_enabled(&self, meta: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        if self.spans || !meta.is_span() {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    // No level ruled out: the level filter's maximum stands (see RoutineSampler's).
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
}

/// Routine lines left out of the log by sampling since the process started (the metric
/// `herald_log_routine_sampled_out_total`).
static ROUTINE_SAMPLED_OUT: AtomicU64 = AtomicU64::new(0);

pub fn routine_lines_sampled_out() -> u64 {
    ROUTINE_SAMPLED_OUT.load(Relaxed)
}

/// Whether the routine lines of `intent_id` are written at `ratio`: FNV-1a over the id's
/// text, mixed (the ids of one moment share their leading digits), against the ratio's
/// share of the hash space. Stable across processes and releases: changing it would split
/// an intent's lines between two decisions during a rolling upgrade.
pub fn routine_kept(ratio: f64, intent_id: &str) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in intent_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    // The top 53 bits as a fraction in [0, 1).
    ((h >> 11) as f64 / (1u64 << 53) as f64) < ratio
}

/// The log output's filter for `routine = true` lines; see the module's comment.
struct RoutineSampler {
    ratio: f64,
}

impl RoutineSampler {
    fn new(ratio: f64) -> Self {
        Self { ratio }
    }
}

impl<S> Filter<S> for RoutineSampler {
    fn enabled(&self, _: &tracing::Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    // Only the callsites of routine lines are decided per event (event_enabled), and only
    // when sampling: every other callsite is always of interest, so that combined with the
    // level filter (`and`) the level filter's own interest stands. A routine callsite must
    // stay "sometimes": tracing-subscriber asserts (debug builds) that an event disabled in
    // event_enabled went through an `enabled` pass, which a callsite cached "always" skips.
    fn callsite_enabled(&self, meta: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        if self.ratio < 1.0 && meta.fields().field("routine").is_some() {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::always()
        }
    }

    // No level is ruled out here: the level filter's maximum stands (the default, no hint,
    // would lift the combined maximum to TRACE).
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn event_enabled(&self, event: &tracing::Event<'_>, _: &Context<'_, S>) -> bool {
        if self.ratio >= 1.0 || event.metadata().fields().field("routine").is_none() {
            return true;
        }
        let mut fields = RoutineFields::default();
        event.record(&mut fields);
        // A line not marked routine, or without an intent to decide by, is always written.
        let keep = match (fields.routine, fields.intent_id) {
            (true, Some(id)) => routine_kept(self.ratio, &id),
            _ => true,
        };
        if !keep {
            ROUTINE_SAMPLED_OUT.fetch_add(1, Relaxed);
        }
        keep
    }
}

#[derive(Default)]
struct RoutineFields {
    routine: bool,
    intent_id: Option<String>,
}

impl Visit for RoutineFields {
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "routine" {
            self.routine = value;
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "intent_id" {
            self.intent_id = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "intent_id" {
            self.intent_id = Some(format!("{value:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> impl Iterator<Item = String> {
        // Ids of one moment: the same leading digits, as UUIDv7s made together have.
        (0..n).map(|i| format!("0193a1b2-c3d4-7e5f-8a6b-{i:012x}"))
    }

    #[test]
    fn the_ratio_keeps_its_share_of_intents() {
        for ratio in [0.01, 0.1, 0.5] {
            let kept = ids(100_000).filter(|id| routine_kept(ratio, id)).count() as f64;
            let share = kept / 100_000.0;
            assert!(
                (share - ratio).abs() < ratio * 0.1 + 0.002,
                "ratio {ratio}: kept {share}"
            );
        }
        assert!(ids(1000).all(|id| routine_kept(1.0, &id)));
        assert!(ids(1000).all(|id| !routine_kept(0.0, &id)));
    }

    #[test]
    fn an_intent_gets_the_same_decision_every_time() {
        for id in ids(1000) {
            assert_eq!(routine_kept(0.3, &id), routine_kept(0.3, &id));
        }
        // Pinned: the decision must not change between releases (see routine_kept).
        let kept: Vec<bool> = ids(8).map(|id| routine_kept(0.5, &id)).collect();
        assert_eq!(kept, PINNED);
    }

    /// Records the messages of the events it is given.
    #[derive(Clone, Default)]
    struct Seen(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Message(String);
            impl Visit for Message {
                fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
    }

    #[test]
    fn sampling_leaves_out_log_lines_only_and_keeps_the_level_filter_static() {
        let (log, spans) = (Seen::default(), Seen::default());
        let level = EnvFilter::new("info");
        let sampled = level.and(RoutineSampler::new(0.0));
        // The level filter's maximum stands (INFO), not lifted by the sampler.
        assert_eq!(
            Filter::<tracing_subscriber::Registry>::max_level_hint(&sampled),
            Some(tracing::level_filters::LevelFilter::INFO)
        );
        let subscriber =
            tracing_subscriber::registry()
                .with(log.clone().with_filter(sampled))
                // Stands for the OpenTelemetry layer (filtered by level as install() does): span
                // events come from here.
                .with(spans.clone().with_filter(
                    tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO),
                ));
        tracing::subscriber::with_default(subscriber, || {
            let id = "0193a1b2-c3d4-7e5f-8a6b-000000000001";
            tracing::info!(intent_id = %id, routine = true, "routine line");
            tracing::info!(intent_id = %id, routine = false, "not routine");
            tracing::warn!(intent_id = %id, "rare line");
            tracing::info!(routine = true, "routine without an intent");
        });
        assert_eq!(
            *log.0.lock().unwrap(),
            ["not routine", "rare line", "routine without an intent"],
            "the log leaves out the routine line of an unsampled intent, and only it"
        );
        assert_eq!(
            spans.0.lock().unwrap().len(),
            4,
            "every event still reaches the other layers"
        );
    }

    /// What a log layer wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Written(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Records the names of the spans it is given.
    #[derive(Clone, Default)]
    struct SpanNames(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanNames {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0.lock().unwrap().push(attrs.metadata().name().to_owned());
        }
    }

    /// Runs `f` under the log layer of `format` and a stand-in of the OpenTelemetry layer
    /// (filtered at INFO, as `install` does), returning what was written and the names of
    /// the spans the stand-in saw.
    fn logged(format: LogFormat, f: impl FnOnce()) -> (String, Vec<String>) {
        let written = Written::default();
        let out = written.clone();
        let log = LogSettings {
            format,
            ..LogSettings::default()
        };
        let spans = SpanNames::default();
        let subscriber =
            tracing_subscriber::registry()
                .with(log_layer(&log, move || out.clone()).expect("log layer"))
                .with(spans.clone().with_filter(
                    tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO),
                ));
        tracing::subscriber::with_default(subscriber, f);
        let bytes = written.0.lock().unwrap().clone();
        let seen = spans.0.lock().unwrap().clone();
        (String::from_utf8(bytes).expect("utf-8"), seen)
    }

    #[test]
    fn json_lines_are_written_without_spans_and_text_lines_with_them() {
        let in_a_span = || {
            let span = tracing::info_span!(
                "attempt",
                herald.intent.id = "i-1",
                herald.outcome = tracing::field::Empty
            );
            span.record("herald.outcome", "accepted");
            span.in_scope(|| tracing::info!(intent_id = "i-1", outcome = "accepted", "attempt finished"));
        };
        let (json, spans) = logged(LogFormat::Json, in_a_span);
        let line: serde_json::Value = serde_json::from_str(json.trim()).expect(&json);
        assert_eq!(line["message"], "attempt finished", "{json}");
        assert_eq!(line["outcome"], "accepted", "{json}");
        assert!(
            !json.contains("herald.intent.id") && !json.contains("span"),
            "{json}"
        );
        assert_eq!(spans, ["attempt"], "the span still reaches the other layers");

        // Seen by the fmt layer, a span gets its fields formatted (text keeps them, after
        // the span's name); in JSON the layer never sees it: nothing of it is formatted.
        let (text, _) = logged(LogFormat::Text, in_a_span);
        assert!(
            text.contains("attempt{herald.intent.id=\"i-1\" herald.outcome=\"accepted\"}"),
            "{text}"
        );
        // Nor does ignoring spans lift the level the layer asks for (a filter without a
        // hint would make every debug call site be checked).
        let json_layer = log_layer(&LogSettings::default(), std::io::sink).expect("log layer");
        assert_eq!(
            Layer::<tracing_subscriber::Registry>::max_level_hint(&json_layer),
            Some(tracing::level_filters::LevelFilter::INFO)
        );
        // Asked of the subscriber itself: whether a span's callsite is enabled is cached
        // per process, from every subscriber alive at the time, those of the tests that
        // run beside this one included (asked through a span, 1 run in 200 failed).
        let attempt = tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            tracing::info_span!("attempt")
                .metadata()
                .expect("a span the bare registry enables has its metadata")
        });
        let sees_spans = |format| {
            let log = LogSettings {
                format,
                ..LogSettings::default()
            };
            let only_the_log =
                tracing_subscriber::registry().with(log_layer(&log, std::io::sink).expect("log layer"));
            !tracing::Subscriber::register_callsite(&only_the_log, attempt).is_never()
        };
        assert!(
            !sees_spans(LogFormat::Json),
            "the JSON log layer takes no interest in spans"
        );
        assert!(sees_spans(LogFormat::Text));
    }

    const PINNED: [bool; 8] = [true, true, false, true, false, false, false, true];
}
