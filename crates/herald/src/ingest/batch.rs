//! One poll batch: decode, route, render, converge in one transaction, dead-letter the
//! poison. Returns once the batch's work is durable; the caller then stores its offsets.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use herald_core::event::DeadLetterReason;
use herald_core::render::{RenderError, RenderOptions, Renderer};
use herald_core::{IntentState, OrderEvent, SellerRecord};
use herald_kafka::headers::{header_str, valid_traceparent, TRACEPARENT};
use herald_kafka::{DeadLetter, DeadLetterProducer, Message, OwnedMessage};
use herald_store::ingest::SourceRef;
use herald_store::{Convergence, IngestTx, NewIntent, Store};
use herald_telemetry::propagation::{self, trace_id};
use tracing::field::Empty;
use tracing::{debug, info, info_span, warn, Instrument, Span};

use super::IngestStats;
use crate::config::{Config, Route};
use crate::obs::{self, Obs};

/// Shared handles of the ingest role.
pub struct IngestContext {
    pub config: Arc<Config>,
    pub store: Store,
    pub dead_letters: DeadLetterProducer,
    pub seller_topic: String,
    pub order_topic: String,
    pub group: String,
    pub stats: Arc<IngestStats>,
    pub obs: Obs,
}

/// An order event that has a route, with where it came from.
struct Routed<'m> {
    message: &'m OwnedMessage,
    event: OrderEvent,
    route: &'m Route,
    /// The producer's `traceparent` header, when well-formed.
    trace_context: Option<String>,
}

/// Processes one poll batch under a `receive` span linked to every producer context in it.
pub async fn process(ctx: &IngestContext, batch: &[OwnedMessage]) -> anyhow::Result<()> {
    let parents: Vec<&str> = if ctx.obs.tracing {
        batch
            .iter()
            .filter_map(|m| header_str(m, TRACEPARENT).and_then(valid_traceparent))
            .collect()
    } else {
        Vec::new()
    };
    let span = obs::receive_span(&ctx.order_topic, &ctx.group, batch.len(), parents);
    converge_batch(ctx, batch).instrument(span).await
}

async fn converge_batch(ctx: &IngestContext, batch: &[OwnedMessage]) -> anyhow::Result<()> {
    let max_bytes = ctx.config.ingest.max_message_bytes;
    let mut sellers = Vec::new();
    let mut orders = Vec::new();
    // Per routed message, `process order-events` (child of the producer's span) when
    // spans are exported; ended once the batch is committed.
    let mut message_spans: Vec<Option<Span>> = Vec::new();
    // The `receive` span's context, linked from each message's span (once per batch).
    let batch_context = if ctx.obs.tracing {
        propagation::traceparent_of(&Span::current())
    } else {
        None
    };
    let mut poison: Vec<DeadLetter<'_>> = Vec::new();
    let mut no_route = 0u64;
    for m in batch {
        if m.topic() == ctx.seller_topic {
            match SellerRecord::decode(m.key(), m.payload(), max_bytes) {
                Ok(r) => sellers.push(r),
                Err(e) => poison.push(dead_letter(m, e.reason, e.detail)),
            }
            continue;
        }
        match OrderEvent::decode(m.payload().unwrap_or_default(), max_bytes) {
            Ok(event) => match ctx.config.route(&event.event_kind) {
                Some(route) => {
                    let trace_context = header_str(m, TRACEPARENT)
                        .and_then(valid_traceparent)
                        .map(str::to_owned);
                    let span = ctx.obs.tracing.then(|| {
                        let key = m.key().and_then(|k| std::str::from_utf8(k).ok());
                        let span = obs::process_span(
                            m.topic(),
                            &ctx.group,
                            m.partition(),
                            m.offset(),
                            key,
                            trace_context.as_deref(),
                        );
                        // The poll batch it arrived in.
                        if let Some(batch) = &batch_context {
                            propagation::add_link(&span, batch);
                        }
                        span
                    });
                    message_spans.push(span);
                    orders.push(Routed {
                        message: m,
                        trace_context,
                        event,
                        route,
                    })
                }
                None => {
                    debug!(event_kind = %event.event_kind, "no route for event kind: skipped");
                    no_route += 1;
                }
            },
            Err(e) => poison.push(dead_letter(m, e.reason, e.detail)),
        }
    }

    let seller_count = sellers.len() as u64;
    let mut conn = ctx.store.conn().await?;
    let tx = IngestTx::begin(&mut conn).await?;
    if !sellers.is_empty() {
        tx.apply_sellers(sellers)
            .await
            .context("applying seller profiles")?;
    }
    let seller_keys: Vec<(String, String)> = orders
        .iter()
        .map(|o| (o.event.marketplace_id.clone(), o.event.seller_id.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let profiles = tx
        .sellers(&seller_keys)
        .await
        .context("reading seller profiles")?;
    let renderer = Renderer::new(
        tx.active_templates().await.context("reading active templates")?,
        RenderOptions {
            default_locale: ctx.config.rendering.default_locale.clone(),
            sms_max_segments: ctx.config.rendering.sms_max_segments,
        },
    );

    let mut intents = Vec::new();
    // One span per intent (`intent created` / `intent reused` / `intent conflict` once
    // known), child of its message's span; its context is what the intent and its outbox
    // row carry on to the relay.
    let mut intent_spans: Vec<Option<Span>> = Vec::new();
    for (o, message_span) in orders.iter().zip(&message_spans) {
        let seller = profiles.get(&(o.event.marketplace_id.clone(), o.event.seller_id.clone()));
        let mut failures = Vec::new();
        for &channel in &o.route.channels {
            match renderer.render(&o.route.template, channel, &o.event, seller) {
                Ok(payload) => {
                    let span = message_span.as_ref().map(|parent| {
                        info_span!(parent: parent, "intent", otel.name = "converge intent",
                            herald.intent.id = Empty, herald.channel = channel.as_str(),
                            herald.event_kind = %o.event.event_kind,
                            herald.template.revision = %payload.template_revision, herald.outcome = Empty)
                    });
                    let trace_context = match &span {
                        Some(s) => obs::traceparent_or(s, o.trace_context.as_deref()),
                        None => o.trace_context.clone(),
                    };
                    intent_spans.push(span);
                    let source = SourceRef {
                        topic: o.message.topic().to_owned(),
                        partition: o.message.partition(),
                        offset: o.message.offset(),
                    };
                    intents.push(NewIntent::new(&o.event, channel, payload, trace_context, source));
                }
                Err(e) => failures.push(e),
            }
        }
        // Channels that rendered still converge; the event is dead-lettered once, naming
        // the channels that did not, so a replay after the fix creates only those.
        if !failures.is_empty() {
            let reason = if failures.iter().all(|f| matches!(f, RenderError::Missing { .. })) {
                DeadLetterReason::TemplateMissing
            } else {
                DeadLetterReason::RenderFailed
            };
            let detail = failures
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            poison.push(dead_letter(o.message, reason, detail));
        }
    }

    let started = Instant::now();
    let results = tx.converge(&intents).await.context("converging intents")?;
    // Failure policy: a crash before this commit leaves nothing behind (the batch is read
    // again); after it, the dead letters below and the offset store may be lost, and the
    // replay converges on the rows just written and re-sends the dead letters.
    tx.commit().await.context("committing the ingest transaction")?;
    drop(conn);
    ctx.obs.metrics.ingest_batch(batch.len(), started.elapsed());

    let s = &ctx.stats;
    for ((intent, result), span) in intents.iter().zip(&results).zip(&intent_spans) {
        log_convergence(intent, result, s);
        if let Some(span) = span {
            record_convergence(span, result);
        }
    }
    drop(intent_spans);
    drop(message_spans);
    if !poison.is_empty() {
        for p in &poison {
            warn!(reason = p.reason, detail = %p.detail, topic = p.message.topic(), partition = p.message.partition(),
                  offset = p.message.offset(), "dead-lettering message");
        }
        ctx.dead_letters
            .send_all(&poison)
            .await
            .context("producing dead letters")?;
    }
    s.messages.fetch_add(batch.len() as u64, Relaxed);
    s.batches.fetch_add(1, Relaxed);
    s.no_route.fetch_add(no_route, Relaxed);
    s.metrics.events_ignored("no_route", no_route);
    s.dead_letters.fetch_add(poison.len() as u64, Relaxed);
    for p in &poison {
        s.metrics.dead_lettered("ingest", p.reason);
    }
    s.seller_updates.fetch_add(seller_count, Relaxed);
    debug!(
        messages = batch.len(),
        intents = intents.len(),
        dead_letters = poison.len(),
        "ingest batch committed"
    );
    Ok(())
}

fn dead_letter(m: &OwnedMessage, reason: DeadLetterReason, detail: String) -> DeadLetter<'_> {
    DeadLetter {
        message: m,
        reason: reason.as_str(),
        detail,
    }
}

fn record_convergence(span: &Span, result: &Convergence) {
    let (id, name) = match result {
        Convergence::Created { intent_id, .. } => (intent_id, "intent created"),
        Convergence::Duplicate { intent_id } => (intent_id, "intent reused"),
        Convergence::Conflict { intent_id, .. } => (intent_id, "intent conflict"),
    };
    span.record("herald.intent.id", tracing::field::display(id));
    span.record("herald.outcome", name.trim_start_matches("intent "));
    propagation::rename(span, name);
}

fn log_convergence(intent: &NewIntent<'_>, result: &Convergence, s: &IngestStats) {
    let channel = intent.key.channel.as_str();
    let kind = intent.key.event_kind.as_str();
    let revision = intent.payload.template_revision.as_str();
    let trace_id = intent.trace_context.as_deref().and_then(trace_id);
    match result {
        Convergence::Created { intent_id, state } => {
            s.intents_created.fetch_add(1, Relaxed);
            s.metrics.intent_created(kind, channel, revision);
            if *state == IntentState::Suppressed {
                s.intents_suppressed.fetch_add(1, Relaxed);
            }
            info!(intent_id = %intent_id, channel, template_revision = revision, state = state.as_str(),
                  consent = intent.payload.consent.as_str(), trace_id, "intent created");
        }
        Convergence::Duplicate { intent_id } => {
            s.duplicates.fetch_add(1, Relaxed);
            s.metrics.duplicate_converged(kind, channel);
            info!(intent_id = %intent_id, channel, template_revision = revision, event_id = %intent.event_id,
                  trace_id, "intent reused: duplicate converged on existing intent");
        }
        Convergence::Conflict {
            intent_id,
            existing_fingerprint,
            newly_recorded,
        } => {
            if *newly_recorded {
                s.conflicts.fetch_add(1, Relaxed);
                s.metrics.fingerprint_conflict(kind, channel);
            }
            warn!(intent_id = %intent_id, channel, template_revision = revision, event_id = %intent.event_id, trace_id,
                  existing_fingerprint = %existing_fingerprint, offending_fingerprint = %intent.fingerprint,
                  source_partition = intent.source.partition, source_offset = intent.source.offset,
                  newly_recorded, "business key reused with different content: conflict recorded, not sent");
        }
    }
}
