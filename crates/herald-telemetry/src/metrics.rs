//! Every metric Herald exports, built once from one meter. Label values come only from
//! bounded sets: channel, event kind (from the configured routes), template revision,
//! outcome class, reason, consent decision, consumer group, topic, partition and version. Never an order,
//! seller, intent, destination or trace id: the series count must not grow with traffic.
//!
//! Prometheus names (the exporter adds `_total` to counters and `_seconds` to histograms
//! in seconds) are listed in `deploy/prometheus/alerts.yml` and the Grafana dashboard; a
//! test checks both against a real scrape.
//!
//! The metrics are Herald's one count: the log lines that report totals (each role's
//! progress and final lines) read them back through [`Metrics::read`], the same values
//! the scrape serves, rather than counting beside them. Like the scrape, they are the
//! process's counts since it started, whichever of its roles counted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::KeyValue;

/// Upper bounds (seconds) for latency histograms: a provider call takes tens to hundreds
/// of milliseconds, a database commit a few.
const LATENCY_BOUNDS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const BATCH_BOUNDS: [f64; 10] = [1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0];

/// Why an HTTP listener closed a connection (`herald_http_connections_closed_total{listener,reason}`).
pub const HTTP_CLOSE_REASONS: [&str; 3] = ["limit", "header_timeout", "idle"];
/// How HTTP ingest answered (`herald_http_ingest_requests_total{outcome}`).
pub const HTTP_INGEST_OUTCOMES: [&str; 16] = [
    "created",
    "replayed",
    "business_key_conflict",
    "idempotency_key_reused",
    "in_progress",
    "invalid",
    "missing_key",
    "too_large",
    "body_timeout",
    "unsupported_media_type",
    "unauthorised",
    "not_routed",
    "unrendered",
    "store_rejected",
    "overloaded",
    "unavailable",
];

/// What became of held intents (`herald_intents_held_total{outcome}`).
pub const HOLD_OUTCOMES: [&str; 4] = ["held", "released", "expired", "release_failed"];

pub struct Metrics {
    /// The registry the meter's Prometheus reader fills: what the scrape and [`Metrics::read`] read.
    registry: prometheus::Registry,
    /// The provider of [`Metrics::unexported`], kept for as long as its instruments: a
    /// provider dropped stops its readers. (`Telemetry` keeps the process's own.)
    _provider: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
    ingest_messages: Counter<u64>,
    seller_updates: Counter<u64>,
    intents_created: Counter<u64>,
    intents_observed: Counter<u64>,
    intents_suppressed: Counter<u64>,
    duplicates_converged: Counter<u64>,
    fingerprint_conflicts: Counter<u64>,
    events_ignored: Counter<u64>,
    dead_letters: Counter<u64>,
    attempts_started: Counter<u64>,
    attempts: Counter<u64>,
    attempts_not_sent: Counter<u64>,
    attempt_records: Counter<u64>,
    claims_skipped: Counter<u64>,
    relay_published: Counter<u64>,
    intents_requeued: Counter<u64>,
    batches_retried: Counter<u64>,
    messages_isolated: Counter<u64>,
    holds: Counter<u64>,
    http_ingest_requests: Counter<u64>,
    http_connections: opentelemetry::metrics::UpDownCounter<i64>,
    http_connections_closed: Counter<u64>,
    admin_requests_refused: Counter<u64>,
    attempt_duration: Histogram<f64>,
    ingest_batch_size: Histogram<u64>,
    ingest_commit_duration: Histogram<f64>,
    delivery_batch_size: Histogram<u64>,
    delivery_db_duration: Histogram<f64>,
    retention_removed: Counter<u64>,
    retention_failures: Counter<u64>,
    provider_messages: Counter<u64>,
    provider_events: Counter<u64>,
    unknown_settled: Counter<u64>,
    suppressions_added: Counter<u64>,
    suppressions_refused: Counter<u64>,
    gauges: Arc<Gauges>,
}

/// What the `reconcile` role did with each queue message (`herald_provider_messages_total{result}`).
pub const PROVIDER_MESSAGE_RESULTS: [&str; 5] =
    ["event", "ignored", "rejected", "unauthenticated", "deferred"];
/// What storing a provider event found (`herald_provider_events_total{type,outcome}`).
pub const PROVIDER_EVENT_OUTCOMES: [&str; 3] = ["matched", "unmatched", "duplicate"];
/// Who settled an `unknown` intent (`herald_unknown_settled_total{channel,by,as}`), and as what.
pub const UNKNOWN_SETTLED_BY: [&str; 3] = ["evidence", "silence", "operator"];
pub const UNKNOWN_SETTLED_AS: [&str; 4] = ["accepted", "rejected", "retry", "hold"];
/// Why a provider event put destinations on the suppression list (`herald_suppressions_added_total{reason}`).
pub const SUPPRESSION_REASONS: [&str; 2] = ["bounced", "complained"];

/// What retention removes (`herald_retention_removed_total{what}`).
pub const RETENTION_REMOVED: [&str; 9] = [
    "partitions",
    "default_attempts",
    "payload_bodies",
    "provider_events",
    "intents",
    "payloads",
    "conflict_documents",
    "reject_bodies",
    "http_requests",
];
/// The steps of a retention pass that can fail (`herald_retention_failures_total{step}`).
pub const RETENTION_STEPS: [&str; 7] = [
    "connect",
    "partition_upkeep",
    "attempts",
    "payload_bodies",
    "intents",
    "evidence_documents",
    "suppression_keys",
];

impl Metrics {
    /// The instruments of `meter`, whose provider has a Prometheus reader filling `registry`.
    pub fn new(meter: &Meter, registry: prometheus::Registry, version: &'static str) -> Self {
        let gauges = Arc::new(Gauges::default());
        register_gauges(meter, &gauges, version);
        Self {
            registry,
            _provider: None,
            ingest_messages: meter
                .u64_counter("herald_ingest_messages")
                .with_description(
                    "Messages ingest took from Kafka and finished with: converged into the ledger, or dead-lettered with \
                     their reason (a message read again after a restart or a rebalance counts again)",
                )
                .build(),
            seller_updates: meter
                .u64_counter("herald_seller_updates")
                .with_description("Seller profile records (and tombstones) ingest applied")
                .build(),
            intents_suppressed: meter
                .u64_counter("herald_intents_suppressed")
                .with_description(
                    "Intents frozen `suppressed` when they were created (never sent), by channel and the consent \
                     decision that suppressed them",
                )
                .build(),
            intents_created: meter
                .u64_counter("herald_intents_created")
                .with_description("Notification intents created (first sight of a business key and channel)")
                .build(),
            http_ingest_requests: meter
                .u64_counter("herald_http_ingest_requests")
                .with_description(
                    "Requests to POST /v1/order-events, by how they were answered (created, replayed, \
                     business_key_conflict, idempotency_key_reused, in_progress, the refusals)",
                )
                .build(),
            http_connections: meter
                .i64_up_down_counter("herald_http_connections")
                .with_description("Connections open now on each HTTP listener (http_ingest, admin, probe)")
                .build(),
            http_connections_closed: meter
                .u64_counter("herald_http_connections_closed")
                .with_description(
                    "Connections an HTTP listener closed, by listener and reason: limit (at [listeners] \
                     max_connections, closed as accepted), header_timeout (headers not finished within \
                     header_read_timeout_ms), idle (no byte and no request for idle_timeout_secs)",
                )
                .build(),
            admin_requests_refused: meter
                .u64_counter("herald_admin_requests_refused")
                .with_description(
                    "Admin /v1 requests answered 503 because admin.max_concurrent_requests were being answered for 5 s",
                )
                .build(),
            intents_observed: meter
                .u64_counter("herald_intents_observed")
                .with_description(
                    "Intents frozen `observed` by a route in observe mode (never sent), by the consent \
                     decision that delivery would have acted on",
                )
                .build(),
            duplicates_converged: meter
                .u64_counter("herald_duplicates_converged")
                .with_description("Order events that converged on an existing intent with the same content")
                .build(),
            fingerprint_conflicts: meter
                .u64_counter("herald_fingerprint_conflicts")
                .with_description("Business keys reused with different content (recorded, never sent)")
                .build(),
            events_ignored: meter
                .u64_counter("herald_events_ignored")
                .with_description("Order events skipped without an intent, by reason")
                .build(),
            dead_letters: meter
                .u64_counter("herald_dead_letters")
                .with_description("Messages written to the dead-letter topic, by source and reason")
                .build(),
            attempts_started: meter
                .u64_counter("herald_attempts_started")
                .with_description("Delivery attempts started (claimed and recorded before the send)")
                .build(),
            attempts: meter
                .u64_counter("herald_attempts")
                .with_description("Delivery attempts finished, by channel and outcome class")
                .build(),
            attempts_not_sent: meter
                .u64_counter("herald_attempts_not_sent")
                .with_description(
                    "Claimed attempts that sent nothing, by channel and reason (lease_deadline, shutdown, revoked)",
                )
                .build(),
            attempt_records: meter
                .u64_counter("herald_attempt_records")
                .with_description(
                    "Attempt records by what they could do: on_time, fenced (lease lost: intent untouched), \
                     late_settled / late_kept (after the attempt was recorded unknown), already_recorded, missing",
                )
                .build(),
            intents_requeued: meter
                .u64_counter("herald_intents_requeued")
                .with_description("Intents found due without an outbox row (stranded) and queued again")
                .build(),
            batches_retried: meter
                .u64_counter("herald_batches_retried")
                .with_description(
                    "Batches run again after a transient failure, by stage (ingest, relay, claim, record) and error class",
                )
                .build(),
            messages_isolated: meter
                .u64_counter("herald_ingest_messages_isolated")
                .with_description(
                    "Messages a permanent failure was narrowed down to (by bisecting their batch) and dead-lettered \
                     alone, by error class",
                )
                .build(),
            holds: meter
                .u64_counter("herald_intents_held")
                .with_description(
                    "Intents of orders whose seller had no profile, by what happened: held (awaiting_profile), \
                     released (rendered with the profile), expired (suppressed after the wait), release_failed \
                     (did not render with the profile; still held)",
                )
                .build(),
            claims_skipped: meter
                .u64_counter("herald_claims_skipped")
                .with_description("Delivery messages that started no attempt, by reason")
                .build(),
            relay_published: meter
                .u64_counter("herald_relay_published")
                .with_description("Outbox rows published to the deliveries topic")
                .build(),
            attempt_duration: meter
                .f64_histogram("herald_attempt_duration")
                .with_unit("s")
                .with_description("Provider call duration of delivery attempts, by channel and outcome")
                .with_boundaries(LATENCY_BOUNDS.to_vec())
                .build(),
            ingest_batch_size: meter
                .u64_histogram("herald_ingest_batch_size")
                .with_description(
                    "Messages per committed Kafka ingest transaction (a poll batch, or a part of one being bisected); \
                     HTTP ingest's are not counted here",
                )
                .with_boundaries(BATCH_BOUNDS.to_vec())
                .build(),
            ingest_commit_duration: meter
                .f64_histogram("herald_ingest_commit_duration")
                .with_unit("s")
                .with_description("Time to converge and commit one ingest batch in PostgreSQL")
                .with_boundaries(LATENCY_BOUNDS.to_vec())
                .build(),
            delivery_batch_size: meter
                .u64_histogram("herald_delivery_batch_size")
                .with_description("Attempts per delivery database statement, by stage (claim, record)")
                .with_boundaries(BATCH_BOUNDS.to_vec())
                .build(),
            delivery_db_duration: meter
                .f64_histogram("herald_delivery_db_duration")
                .with_unit("s")
                .with_description(
                    "Time to claim or record one batch of delivery attempts in PostgreSQL, retries included",
                )
                .with_boundaries(LATENCY_BOUNDS.to_vec())
                .build(),
            retention_removed: meter
                .u64_counter("herald_retention_removed")
                .with_description(
                    "What retention removed, by what: partitions (dropped), default_attempts (rows of the default \
                     partition), payload_bodies (purged), provider_events (events and rejected queue messages), intents and \
                     payloads (deleted)",
                )
                .build(),
            retention_failures: meter
                .u64_counter("herald_retention_failures")
                .with_description(
                    "Retention passes or partition upkeeps that failed, by step (connect, partition_upkeep, attempts, \
                     payload_bodies, intents); the daemon keeps running and tries again",
                )
                .build(),
            provider_messages: meter
                .u64_counter("herald_provider_messages")
                .with_description(
                    "Messages the reconcile role read from the provider's event queue (and SMS status records it could \
                     not take), by result: event (stored), ignored (subscription confirmations, test notifications), \
                     rejected (malformed: kept with the reason, deleted; one read again is counted again), \
                     unauthenticated (not a signed SNS envelope of a configured topic, or a bare record without \
                     reconcile.raw_delivery: kept with the reason, never read as evidence), deferred (its signing \
                     certificate could not be fetched now: left on the queue, read again after its visibility timeout)",
                )
                .build(),
            provider_events: meter
                .u64_counter("herald_provider_events")
                .with_description(
                    "Provider events (SES event publishing) by type and outcome: matched (to an attempt, by tags or \
                     message id), unmatched (no attempt of this ledger), duplicate (seen before: no effect)",
                )
                .build(),
            unknown_settled: meter
                .u64_counter("herald_unknown_settled")
                .with_description(
                    "Unknown intents settled, by channel, by whom (evidence: the provider's event; silence: the \
                     on_unknown policy once no event came; operator: through the admin API, not counted for \
                     `herald intent resolve` run as a command) and as what",
                )
                .build(),
            suppressions_added: meter
                .u64_counter("herald_suppressions_added")
                .with_description(
                    "Destinations the provider's events put on the suppression list, by reason (bounced: a permanent \
                     bounce; complained)",
                )
                .build(),
            suppressions_refused: meter
                .u64_counter("herald_suppressions_refused")
                .with_description(
                    "Addresses a bounce or complaint named that were not suppressed, by reason: the event matched no \
                     attempt of this ledger, or the address was not the matched intent's destination (forged or \
                     misrouted evidence never suppresses)",
                )
                .build(),
            gauges,
        }
    }

    /// Exports the reconcile counters at 0, so that rates and alerts see them at once.
    pub fn init_reconcile(&self, event_types: &[&'static str]) {
        for result in PROVIDER_MESSAGE_RESULTS {
            self.provider_messages.add(0, &[KeyValue::new("result", result)]);
        }
        for reason in SUPPRESSION_REASONS {
            self.suppressions_added.add(0, &[KeyValue::new("reason", reason)]);
            self.suppressions_refused
                .add(0, &[KeyValue::new("reason", reason)]);
        }
        for t in event_types {
            for outcome in PROVIDER_EVENT_OUTCOMES {
                self.provider_events
                    .add(0, &[KeyValue::new("type", *t), KeyValue::new("outcome", outcome)]);
            }
        }
    }

    /// One queue message read, with `result` one of [`PROVIDER_MESSAGE_RESULTS`].
    pub fn provider_message(&self, result: &'static str) {
        debug_assert!(PROVIDER_MESSAGE_RESULTS.contains(&result), "{result}");
        self.provider_messages.add(1, &[KeyValue::new("result", result)]);
    }

    /// One provider event stored (or a duplicate), with `outcome` one of
    /// [`PROVIDER_EVENT_OUTCOMES`].
    pub fn provider_event(&self, event_type: &'static str, outcome: &'static str) {
        debug_assert!(PROVIDER_EVENT_OUTCOMES.contains(&outcome), "{outcome}");
        self.provider_events.add(
            1,
            &[
                KeyValue::new("type", event_type),
                KeyValue::new("outcome", outcome),
            ],
        );
    }

    /// `n` destinations put on the suppression list, `reason` one of [`SUPPRESSION_REASONS`].
    pub fn suppressions_added(&self, reason: &'static str, n: u64) {
        debug_assert!(SUPPRESSION_REASONS.contains(&reason), "{reason}");
        self.suppressions_added.add(n, &[KeyValue::new("reason", reason)]);
    }

    /// `n` addresses a `reason` event named and that were not suppressed (no attempt of
    /// this ledger, or not its destination).
    pub fn suppressions_refused(&self, reason: &'static str, n: u64) {
        debug_assert!(SUPPRESSION_REASONS.contains(&reason), "{reason}");
        self.suppressions_refused
            .add(n, &[KeyValue::new("reason", reason)]);
    }

    /// An `unknown` intent settled `by` one of [`UNKNOWN_SETTLED_BY`], `as` one of
    /// [`UNKNOWN_SETTLED_AS`].
    pub fn unknown_settled(&self, channel: &str, by: &'static str, r#as: &'static str) {
        debug_assert!(UNKNOWN_SETTLED_BY.contains(&by) && UNKNOWN_SETTLED_AS.contains(&r#as));
        self.unknown_settled.add(
            1,
            &[
                KeyValue::new("channel", channel.to_owned()),
                KeyValue::new("by", by),
                KeyValue::new("as", r#as),
            ],
        );
    }

    /// Exports the retention counters at 0 for every label, so alerts see them at once.
    pub fn init_retention(&self) {
        for what in RETENTION_REMOVED {
            self.retention_removed.add(0, &[KeyValue::new("what", what)]);
        }
        for step in RETENTION_STEPS {
            self.retention_failures.add(0, &[KeyValue::new("step", step)]);
        }
    }

    /// Retention removed `n` of `what` (one of [`RETENTION_REMOVED`]).
    pub fn retention_removed(&self, what: &'static str, n: u64) {
        self.retention_removed.add(n, &[KeyValue::new("what", what)]);
    }

    /// A retention step failed (one of [`RETENTION_STEPS`]).
    pub fn retention_failed(&self, step: &'static str) {
        self.retention_failures.add(1, &[KeyValue::new("step", step)]);
    }

    pub fn gauges(&self) -> &Arc<Gauges> {
        &self.gauges
    }

    pub fn intent_created(&self, event_kind: &str, channel: &str, template_revision: &str) {
        self.intents_created.add(
            1,
            &[
                KeyValue::new("event_kind", event_kind.to_owned()),
                KeyValue::new("channel", channel.to_owned()),
                KeyValue::new("template_revision", template_revision.to_owned()),
            ],
        );
    }

    /// An intent frozen `observed`: `consent` is its decision (`granted`: delivery would
    /// have sent it).
    pub fn intent_observed(&self, channel: &str, consent: &str) {
        self.intents_observed.add(
            1,
            &[
                KeyValue::new("channel", channel.to_owned()),
                KeyValue::new("consent", consent.to_owned()),
            ],
        );
    }

    /// An intent frozen `suppressed` when it was created: `consent` is why (not `granted`).
    pub fn intent_suppressed(&self, channel: &str, consent: &str) {
        self.intents_suppressed.add(
            1,
            &[
                KeyValue::new("channel", channel.to_owned()),
                KeyValue::new("consent", consent.to_owned()),
            ],
        );
    }

    /// Ingest finished with `n` messages (converged, or dead-lettered).
    pub fn ingest_messages(&self, n: u64) {
        self.ingest_messages.add(n, &[]);
    }

    /// Ingest applied `n` seller profile records.
    pub fn seller_updates(&self, n: u64) {
        self.seller_updates.add(n, &[]);
    }

    /// Exports ingest's counters at 0 (held intents by outcome, messages, seller updates),
    /// so that rates and alerts see them at once.
    pub fn init_ingest(&self) {
        for outcome in HOLD_OUTCOMES {
            self.holds.add(0, &[KeyValue::new("outcome", outcome)]);
        }
        self.ingest_messages.add(0, &[]);
        self.seller_updates.add(0, &[]);
    }

    pub fn duplicate_converged(&self, event_kind: &str, channel: &str) {
        self.duplicates_converged
            .add(1, &kind_channel(event_kind, channel));
    }

    pub fn fingerprint_conflict(&self, event_kind: &str, channel: &str) {
        self.fingerprint_conflicts
            .add(1, &kind_channel(event_kind, channel));
    }

    pub fn events_ignored(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.events_ignored.add(n, &[KeyValue::new("reason", reason)]);
        }
    }

    /// `source` is the role that dead-lettered (`ingest`); `reason` a dead-letter reason
    /// code.
    pub fn dead_lettered(&self, source: &'static str, reason: &'static str) {
        self.dead_letters.add(
            1,
            &[KeyValue::new("source", source), KeyValue::new("reason", reason)],
        );
    }

    pub fn attempt_started(&self, channel: &str) {
        self.attempts_started
            .add(1, &[KeyValue::new("channel", channel.to_owned())]);
    }

    pub fn attempt_finished(&self, channel: &str, outcome: &str, took: Duration) {
        let labels = [
            KeyValue::new("channel", channel.to_owned()),
            KeyValue::new("outcome", outcome.to_owned()),
        ];
        self.attempts.add(1, &labels);
        self.attempt_duration.record(took.as_secs_f64(), &labels);
    }

    /// Exports the delivery counters whose labels are known in advance at 0 (each channel,
    /// each `not_sent` reason), so that rates and alerts see a series before its first
    /// increment.
    pub fn init_delivery(&self, channels: &[&str], not_sent_reasons: &[&'static str]) {
        for channel in channels {
            for reason in not_sent_reasons {
                self.attempts_not_sent.add(
                    0,
                    &[
                        KeyValue::new("channel", (*channel).to_owned()),
                        KeyValue::new("reason", *reason),
                    ],
                );
            }
            // The decisions the delivery role takes itself (silence) and the operator's,
            // at 0; evidence only settles e-mail.
            let mut settled = vec![
                ("silence", "hold"),
                ("silence", "retry"),
                ("operator", "accepted"),
                ("operator", "retry"),
            ];
            if *channel == "email" {
                settled.extend([("evidence", "accepted"), ("evidence", "rejected")]);
            }
            for (by, r#as) in settled {
                self.unknown_settled.add(
                    0,
                    &[
                        KeyValue::new("channel", (*channel).to_owned()),
                        KeyValue::new("by", by),
                        KeyValue::new("as", r#as),
                    ],
                );
            }
        }
    }

    /// A claimed attempt that sent nothing: counted with the attempts (outcome
    /// `not_sent`), not in the provider-call histogram. `reason`: a `NotSentReason`.
    pub fn attempt_not_sent(&self, channel: &str, reason: &'static str) {
        self.attempts.add(
            1,
            &[
                KeyValue::new("channel", channel.to_owned()),
                KeyValue::new("outcome", "not_sent"),
            ],
        );
        self.attempts_not_sent.add(
            1,
            &[
                KeyValue::new("channel", channel.to_owned()),
                KeyValue::new("reason", reason),
            ],
        );
    }

    /// What one attempt record could do (`result`: on_time, fenced, late_settled,
    /// late_kept, already_recorded, missing).
    pub fn attempt_recorded(&self, result: &'static str) {
        self.attempt_records.add(1, &[KeyValue::new("result", result)]);
    }

    /// One pass of the stranded-intent check found and re-queued `n` intents.
    pub fn intents_requeued(&self, n: usize) {
        self.intents_requeued.add(n as u64, &[]);
        self.gauges.stranded.store(n as i64, Relaxed);
        self.gauges.stranded_checked.store(true, Relaxed);
    }

    /// A batch of `stage` failed with a transient error of `class` and runs again.
    pub fn batch_retried(&self, stage: &'static str, class: &'static str) {
        self.batches_retried
            .add(1, &[KeyValue::new("stage", stage), KeyValue::new("class", class)]);
    }

    /// A message alone failed permanently with an error of `class`: dead-lettered.
    pub fn message_isolated(&self, class: &'static str) {
        self.messages_isolated.add(1, &[KeyValue::new("class", class)]);
    }

    /// Every outcome at 0, so that a rate over them exists before the first request.
    pub fn init_http_ingest(&self) {
        for outcome in HTTP_INGEST_OUTCOMES {
            self.http_ingest_requests
                .add(0, &[KeyValue::new("outcome", outcome)]);
        }
    }

    /// Every close reason of `listener` at 0, and its open connections.
    pub fn init_http_listener(&self, listener: &'static str) {
        self.admin_requests_refused.add(0, &[]);
        self.http_connections
            .add(0, &[KeyValue::new("listener", listener)]);
        for reason in HTTP_CLOSE_REASONS {
            self.http_connections_closed.add(
                0,
                &[
                    KeyValue::new("listener", listener),
                    KeyValue::new("reason", reason),
                ],
            );
        }
    }

    pub fn admin_request_refused(&self) {
        self.admin_requests_refused.add(1, &[]);
    }

    pub fn http_connection_opened(&self, listener: &'static str) {
        self.http_connections
            .add(1, &[KeyValue::new("listener", listener)]);
    }

    pub fn http_connection_ended(&self, listener: &'static str) {
        self.http_connections
            .add(-1, &[KeyValue::new("listener", listener)]);
    }

    /// A connection `listener` closed for `reason`, one of [`HTTP_CLOSE_REASONS`].
    pub fn http_connection_closed(&self, listener: &'static str, reason: &'static str) {
        debug_assert!(HTTP_CLOSE_REASONS.contains(&reason), "{reason}");
        self.http_connections_closed.add(
            1,
            &[
                KeyValue::new("listener", listener),
                KeyValue::new("reason", reason),
            ],
        );
    }

    /// An HTTP ingest request answered with `outcome`, one of [`HTTP_INGEST_OUTCOMES`].
    pub fn http_ingest_request(&self, outcome: &'static str) {
        debug_assert!(HTTP_INGEST_OUTCOMES.contains(&outcome), "{outcome}");
        self.http_ingest_requests
            .add(1, &[KeyValue::new("outcome", outcome)]);
    }

    /// `n` held intents had `outcome`, one of [`HOLD_OUTCOMES`].
    pub fn holds(&self, outcome: &'static str, n: u64) {
        debug_assert!(HOLD_OUTCOMES.contains(&outcome), "{outcome}");
        if n > 0 {
            self.holds.add(n, &[KeyValue::new("outcome", outcome)]);
        }
    }

    /// Metrics served nowhere (only [`Metrics::read`] sees them), for tests of code that
    /// records them.
    pub fn unexported() -> Self {
        let registry = prometheus::Registry::new();
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(crate::prometheus_reader(&registry).expect("a Prometheus reader on a new registry"))
            .build();
        Self {
            _provider: Some(provider.clone()),
            ..Self::new(
                &opentelemetry::metrics::MeterProvider::meter(&provider, "unexported"),
                registry,
                "0.0.0",
            )
        }
    }

    /// The values as a scrape would read them now (one collection of every instrument).
    pub fn read(&self) -> Reading {
        Reading(self.registry.gather())
    }

    /// `reason`: `terminal`, `leased` or `not_due`.
    pub fn claim_skipped(&self, reason: &'static str) {
        self.claims_skipped.add(1, &[KeyValue::new("reason", reason)]);
    }

    pub fn relay_published(&self, n: u64) {
        self.relay_published.add(n, &[]);
    }

    /// One claim or record statement of the delivery role (`stage`).
    pub fn delivery_batch(&self, stage: &'static str, attempts: usize, took: Duration) {
        let labels = [KeyValue::new("stage", stage)];
        self.delivery_batch_size.record(attempts as u64, &labels);
        self.delivery_db_duration.record(took.as_secs_f64(), &labels);
    }

    pub fn ingest_batch(&self, messages: usize, commit: Duration) {
        self.ingest_batch_size.record(messages as u64, &[]);
        self.ingest_commit_duration.record(commit.as_secs_f64(), &[]);
    }
}

fn kind_channel(event_kind: &str, channel: &str) -> [KeyValue; 2] {
    [
        KeyValue::new("event_kind", event_kind.to_owned()),
        KeyValue::new("channel", channel.to_owned()),
    ]
}

/// The metrics at one moment, read by their exported names (`herald_attempts_total`, a
/// histogram without its `_count`). A series never recorded is absent, and reads 0.
pub struct Reading(Vec<prometheus::proto::MetricFamily>);

impl Reading {
    fn series<'r>(&'r self, name: &'r str) -> impl Iterator<Item = &'r prometheus::proto::Metric> {
        self.0
            .iter()
            .filter(move |f| f.name() == name)
            .flat_map(|f| f.get_metric())
    }

    /// A counter's series summed, those whose `label` has `value` when one is given.
    pub fn total(&self, name: &str, only: Option<(&str, &str)>) -> u64 {
        self.series(name)
            .filter(|m| only.is_none_or(|(l, v)| label(m, l) == Some(v)))
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// A counter's series summed by the values of `label`; zeros left out.
    pub fn by(&self, name: &str, by: &str) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for m in self.series(name) {
            let n = m.get_counter().get_value() as u64;
            if n > 0 {
                *out.entry(label(m, by).unwrap_or_default().to_owned())
                    .or_default() += n;
            }
        }
        out
    }

    /// How many values a histogram observed, over all its series.
    pub fn observations(&self, name: &str) -> u64 {
        self.series(name)
            .map(|m| m.get_histogram().get_sample_count())
            .sum()
    }
}

fn label<'m>(m: &'m prometheus::proto::Metric, name: &str) -> Option<&'m str> {
    m.get_label().iter().find(|l| l.name() == name).map(|l| l.value())
}

/// Consumer group, topic and partition: the labels of per-partition gauges.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

/// What is known of one assigned partition; `None` fields are not exported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartitionSample {
    /// Messages received and not yet completed (delivery's out-of-order window).
    pub outstanding: Option<i64>,
    /// Age of the oldest outstanding message.
    pub head_of_line_age: Option<Duration>,
    /// librdkafka's `consumer_lag` (high watermark minus committed offset).
    pub lag: Option<i64>,
}

/// Values observed at scrape time. Roles and the sampler task write them; the observable
/// gauges read them.
#[derive(Default)]
pub struct Gauges {
    outbox_backlog: AtomicI64,
    /// f64 bits of the outbox's oldest row age in seconds.
    outbox_oldest_age: AtomicU64,
    intents_unknown: AtomicI64,
    intents_awaiting_evidence: AtomicI64,
    suppressions: AtomicI64,
    suppressions_unkeyed: AtomicI64,
    intents_awaiting_profile: AtomicI64,
    /// f64 bits of the oldest open hold's age in seconds.
    awaiting_profile_oldest_age: AtomicU64,
    deliveries_in_flight: AtomicI64,
    /// Intents the last stranded-intent check re-queued (exported once it ran).
    stranded: AtomicI64,
    stranded_checked: AtomicBool,
    ready: AtomicBool,
    /// Rows in notification_attempts_default (counted up to a cap), once sampled.
    attempts_default_rows: AtomicI64,
    attempts_default_sampled: AtomicBool,
    /// f64 bits of the Unix time of the last retention pass that completed, once one did.
    retention_last_success: AtomicU64,
    retention_succeeded: AtomicBool,
    /// Database-derived gauges are exported only once they have been measured.
    database_sampled: AtomicBool,
    partitions: Mutex<BTreeMap<PartitionKey, PartitionSample>>,
    /// Rows of each evidence table, once sampled.
    evidence_rows: Mutex<BTreeMap<&'static str, i64>>,
}

impl Gauges {
    pub fn set_database(&self, outbox_backlog: i64, outbox_oldest_age: Duration, intents_unknown: i64) {
        self.outbox_backlog.store(outbox_backlog, Relaxed);
        self.outbox_oldest_age
            .store(outbox_oldest_age.as_secs_f64().to_bits(), Relaxed);
        self.intents_unknown.store(intents_unknown, Relaxed);
        self.database_sampled.store(true, Relaxed);
    }

    /// Intents `awaiting_profile` and the oldest one's age (sampled with the database
    /// figures; exported once those are).
    /// `unknown` intents still inside their silence window, and live suppression entries
    /// (sampled with the database figures; exported once those are).
    /// Of the live entries, `unkeyed`: made before keyed digests, until retention re-keys them.
    pub fn set_evidence(&self, awaiting_evidence: i64, suppressions: i64, unkeyed: i64) {
        self.intents_awaiting_evidence.store(awaiting_evidence, Relaxed);
        self.suppressions.store(suppressions, Relaxed);
        self.suppressions_unkeyed.store(unkeyed, Relaxed);
    }

    pub fn set_holds(&self, open: i64, oldest_age: Duration) {
        self.intents_awaiting_profile.store(open, Relaxed);
        self.awaiting_profile_oldest_age
            .store(oldest_age.as_secs_f64().to_bits(), Relaxed);
    }

    pub fn set_evidence_rows(&self, rows: &[(&'static str, i64)]) {
        let mut map = self.evidence_rows.lock().expect("evidence rows");
        for (table, n) in rows {
            map.insert(table, *n);
        }
    }

    pub fn set_attempts_default_rows(&self, rows: i64) {
        self.attempts_default_rows.store(rows, Relaxed);
        self.attempts_default_sampled.store(true, Relaxed);
    }

    /// A retention pass completed at `unix_secs`.
    pub fn set_retention_success(&self, unix_secs: f64) {
        self.retention_last_success.store(unix_secs.to_bits(), Relaxed);
        self.retention_succeeded.store(true, Relaxed);
    }

    pub fn add_in_flight(&self, delta: i64) {
        self.deliveries_in_flight.fetch_add(delta, Relaxed);
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Relaxed);
    }

    /// Replaces every partition of `group` with `samples` (revoked partitions disappear).
    pub fn set_partitions(
        &self,
        group: &str,
        samples: impl IntoIterator<Item = (PartitionKey, PartitionSample)>,
    ) {
        let mut map = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|k, _| k.group != group);
        map.extend(samples);
    }

    fn partitions(&self) -> Vec<(PartitionKey, PartitionSample)> {
        let map = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

fn partition_labels(k: &PartitionKey) -> [KeyValue; 3] {
    [
        KeyValue::new("group", k.group.clone()),
        KeyValue::new("topic", k.topic.clone()),
        KeyValue::new("partition", i64::from(k.partition)),
    ]
}

fn register_gauges(meter: &Meter, gauges: &Arc<Gauges>, version: &'static str) {
    // Observable instruments live as long as the meter provider once built; the handles
    // returned here need not be kept.
    meter
        .u64_observable_counter("herald_log_routine_sampled_out")
        .with_description(
            "Routine log lines left out by log.routine_sampling_ratio (every other line is written)",
        )
        .with_callback(|o| o.observe(crate::routine_lines_sampled_out(), &[]))
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_outbox_backlog")
        .with_description("Outbox rows not yet published to the deliveries topic")
        .with_callback(move |o| {
            if g.database_sampled.load(Relaxed) {
                o.observe(g.outbox_backlog.load(Relaxed), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .f64_observable_gauge("herald_outbox_oldest_age")
        .with_unit("s")
        .with_description("Age of the oldest unpublished outbox row (0 when empty)")
        .with_callback(move |o| {
            if g.database_sampled.load(Relaxed) {
                o.observe(f64::from_bits(g.outbox_oldest_age.load(Relaxed)), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_intents_unknown")
        .with_description("Intents whose last attempt's outcome is unknown (held or awaiting retry)")
        .with_callback(move |o| {
            if g.database_sampled.load(Relaxed) {
                o.observe(g.intents_unknown.load(Relaxed), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_intents_awaiting_evidence")
        .with_description(
            "Unknown e-mail intents inside their silence window: waiting for the provider's event before on_unknown decides",
        )
        .with_callback(move |o| {
            if g.database_sampled.load(Relaxed) {
                o.observe(g.intents_awaiting_evidence.load(Relaxed), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_suppressions")
        .with_description(
            "Destinations on the suppression list (a permanent bounce or a complaint), not lifted",
        )
        .with_callback(move |o| {
            if g.database_sampled.load(Relaxed) {
                o.observe(g.suppressions.load(Relaxed), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_suppressions_unkeyed")
        .with_description(
            "Live suppression-list entries made before the digests were keyed (suppression.key): still matched, \
             re-keyed by retention from the sellers' profiles; one no profile names stays",
        )
        .with_callback(move |o| {
            if g.database_sampled.load(Relaxed) {
                o.observe(g.suppressions_unkeyed.load(Relaxed), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_intents_awaiting_profile")
        .with_description("Intents held for their seller's profile (state awaiting_profile)")
        .with_callback(move |o| {
            if g.database_sampled.load(Relaxed) {
                o.observe(g.intents_awaiting_profile.load(Relaxed), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .f64_observable_gauge("herald_intents_awaiting_profile_oldest_age")
        .with_unit("s")
        .with_description("Age of the oldest intent held for its seller's profile (0 when none)")
        .with_callback(move |o| {
            if g.database_sampled.load(Relaxed) {
                o.observe(f64::from_bits(g.awaiting_profile_oldest_age.load(Relaxed)), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_intents_stranded")
        .with_description(
            "Intents the last check found due without an outbox row (a lost delivery message or a clock step), re-queued",
        )
        .with_callback(move |o| {
            if g.stranded_checked.load(Relaxed) {
                o.observe(g.stranded.load(Relaxed), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_evidence_table_rows")
        .with_description(
            "Rows of the tables only retention bounds (conflicts, HTTP keys and mismatches, provider events and \
             rejects, suppressions): PostgreSQL's estimate as of the last ANALYZE",
        )
        .with_callback(move |o| {
            for (table, n) in g.evidence_rows.lock().expect("evidence rows").iter() {
                o.observe(*n, &[KeyValue::new("table", *table)]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_attempts_default_partition_rows")
        .with_description(
            "Attempt rows in notification_attempts_default (their month had no partition), counted up to 10001; \
             0 when partition upkeep keeps up",
        )
        .with_callback(move |o| {
            if g.attempts_default_sampled.load(Relaxed) {
                o.observe(g.attempts_default_rows.load(Relaxed), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .f64_observable_gauge("herald_retention_last_success_timestamp")
        .with_unit("s")
        .with_description(
            "Unix time of the last retention pass (partition upkeep and clocks) this process completed",
        )
        .with_callback(move |o| {
            if g.retention_succeeded.load(Relaxed) {
                o.observe(f64::from_bits(g.retention_last_success.load(Relaxed)), &[]);
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_deliveries_in_flight")
        .with_description("Delivery attempts started in this process and not yet recorded")
        .with_callback(move |o| o.observe(g.deliveries_in_flight.load(Relaxed), &[]))
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_ready")
        .with_description("1 when PostgreSQL and Kafka are reachable and every role is running")
        .with_callback(move |o| o.observe(i64::from(g.ready.load(Relaxed)), &[]))
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_partition_outstanding_offsets")
        .with_description("Messages received and not yet completed, per assigned partition")
        .with_callback(move |o| {
            for (k, s) in g.partitions() {
                if let Some(v) = s.outstanding {
                    o.observe(v, &partition_labels(&k));
                }
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .f64_observable_gauge("herald_partition_head_of_line_age")
        .with_unit("s")
        .with_description("Age of the oldest message not yet completed, per assigned partition")
        .with_callback(move |o| {
            for (k, s) in g.partitions() {
                if let Some(v) = s.head_of_line_age {
                    o.observe(v.as_secs_f64(), &partition_labels(&k));
                }
            }
        })
        .build();
    let g = gauges.clone();
    meter
        .i64_observable_gauge("herald_kafka_consumer_lag")
        .with_description("Consumer lag (high watermark minus committed offset) from librdkafka statistics")
        .with_callback(move |o| {
            for (k, s) in g.partitions() {
                if let Some(v) = s.lag {
                    o.observe(v, &partition_labels(&k));
                }
            }
        })
        .build();
    meter
        .i64_observable_gauge("herald_build_info")
        .with_description("Herald's version; always 1")
        .with_callback(move |o| o.observe(1, &[KeyValue::new("version", version)]))
        .build();
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    fn scrape(f: impl FnOnce(&Metrics)) -> String {
        let registry = prometheus::Registry::new();
        let reader = crate::prometheus_reader(&registry).expect("exporter");
        let provider = SdkMeterProvider::builder().with_reader(reader).build();
        let m = Metrics::new(&provider.meter("test"), registry.clone(), "9.9.9");
        f(&m);
        crate::render(&registry)
    }

    #[test]
    fn names_and_labels_are_the_documented_ones() {
        let text = scrape(|m| {
            m.intent_created("order.created", "email", "3");
            m.intent_suppressed("sms", "opted_out");
            m.ingest_messages(5);
            m.seller_updates(2);
            m.init_reconcile(&["Bounce"]);
            m.suppressions_added("complained", 1);
            m.attempt_finished("sms", "accepted", Duration::from_millis(40));
            m.claim_skipped("leased");
            m.attempt_not_sent("email", "lease_deadline");
            m.attempt_recorded("late_settled");
            m.intents_requeued(2);
            m.batch_retried("ingest", "connection");
            m.message_isolated("data_exception");
            m.init_delivery(&["sms"], &["shutdown"]);
            m.init_retention();
            m.retention_removed("payload_bodies", 3);
            m.retention_failed("partition_upkeep");
            m.gauges().set_attempts_default_rows(12);
            m.gauges().set_retention_success(1_700_000_000.0);
            m.gauges().set_database(7, Duration::from_secs(3), 1);
            m.gauges().set_partitions(
                "herald-delivery",
                [(
                    PartitionKey {
                        group: "herald-delivery".into(),
                        topic: "herald.deliveries".into(),
                        partition: 4,
                    },
                    PartitionSample {
                        outstanding: Some(2),
                        head_of_line_age: Some(Duration::from_secs(1)),
                        lag: Some(5),
                    },
                )],
            );
        });
        for line in [
            r#"herald_intents_created_total{channel="email",event_kind="order.created",template_revision="3"} 1"#,
            r#"herald_intents_suppressed_total{channel="sms",consent="opted_out"} 1"#,
            "herald_ingest_messages_total 5",
            "herald_seller_updates_total 2",
            r#"herald_suppressions_added_total{reason="complained"} 1"#,
            r#"herald_suppressions_added_total{reason="bounced"} 0"#,
            r#"herald_provider_events_total{outcome="duplicate",type="Bounce"} 0"#,
            r#"herald_attempts_total{channel="sms",outcome="accepted"} 1"#,
            r#"herald_attempt_duration_seconds_count{channel="sms",outcome="accepted"} 1"#,
            r#"herald_claims_skipped_total{reason="leased"} 1"#,
            r#"herald_attempts_total{channel="email",outcome="not_sent"} 1"#,
            r#"herald_attempts_not_sent_total{channel="email",reason="lease_deadline"} 1"#,
            r#"herald_attempt_records_total{result="late_settled"} 1"#,
            r#"herald_intents_requeued_total 2"#,
            r#"herald_batches_retried_total{class="connection",stage="ingest"} 1"#,
            r#"herald_ingest_messages_isolated_total{class="data_exception"} 1"#,
            "herald_intents_stranded 2",
            r#"herald_attempts_not_sent_total{channel="sms",reason="shutdown"} 0"#,
            "herald_outbox_backlog 7",
            "herald_outbox_oldest_age_seconds 3",
            "herald_intents_unknown 1",
            r#"herald_retention_removed_total{what="payload_bodies"} 3"#,
            r#"herald_retention_removed_total{what="intents"} 0"#,
            r#"herald_retention_failures_total{step="partition_upkeep"} 1"#,
            "herald_attempts_default_partition_rows 12",
            "herald_retention_last_success_timestamp_seconds 1700000000",
            r#"herald_kafka_consumer_lag{group="herald-delivery",partition="4",topic="herald.deliveries"} 5"#,
            r#"herald_partition_head_of_line_age_seconds{group="herald-delivery",partition="4",topic="herald.deliveries"} 1"#,
            r#"herald_build_info{version="9.9.9"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn a_reading_sums_what_the_scrape_serves() {
        let m = Metrics::unexported();
        m.attempt_finished("sms", "accepted", Duration::from_millis(40));
        m.attempt_finished("email", "accepted", Duration::from_millis(40));
        m.attempt_not_sent("email", "shutdown");
        m.init_delivery(&["sms"], &["revoked"]);
        m.ingest_batch(3, Duration::from_millis(2));
        m.ingest_batch(4, Duration::from_millis(2));
        let r = m.read();
        assert_eq!(r.total("herald_attempts_total", None), 3);
        assert_eq!(r.total("herald_attempts_total", Some(("channel", "email"))), 2);
        assert_eq!(
            r.by("herald_attempts_total", "outcome"),
            BTreeMap::from([("accepted".to_owned(), 2), ("not_sent".to_owned(), 1)])
        );
        // Series exported at 0 are left out of a breakdown.
        assert_eq!(
            r.by("herald_attempts_not_sent_total", "reason"),
            BTreeMap::from([("shutdown".to_owned(), 1)])
        );
        assert_eq!(r.observations("herald_ingest_batch_size"), 2);
        assert_eq!(r.total("herald_never_recorded_total", None), 0);
    }

    #[test]
    fn database_gauges_are_absent_until_measured() {
        let text = scrape(|_| {});
        assert!(!text.contains("herald_outbox_backlog"), "{text}");
        assert!(text.contains("herald_ready 0"), "{text}");
    }
}
