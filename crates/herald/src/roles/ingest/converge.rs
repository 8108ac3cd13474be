//! One part of a poll batch (the whole batch, or a half of it while a permanent failure is
//! being narrowed down): classify, then one PostgreSQL transaction (seller profiles, the
//! profiles and templates to render with, the plan, the convergence), then what follows
//! the commit (logs, spans, counters). Returns the part's dead letters, still to be
//! produced: the caller does that with its own retries, so a broker hiccup does not run the
//! transaction again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use herald_core::consent::ConsentDecision;
use herald_core::render::{RenderOptions, Renderer};
use herald_core::seller::SellerRecord;
use herald_core::IntentState;
use herald_kafka::headers::{header_str, valid_traceparent, TRACEPARENT};
use herald_kafka::{DeadLetter, DeadLetterProducer, Message, OwnedMessage};
use herald_store::{Convergence, IngestTx, NewIntent, Store};
use herald_telemetry::propagation::{self, trace_id};
use tracing::{info, warn, Instrument, Span};

use super::classify::{classify, Origin, Routed};
use super::plan::{plan, Plan};
use super::release::{release, Released};
use super::IngestStats;
use crate::config::Config;
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

/// Converges `part` under a `receive` span linked to every producer context in it.
pub async fn converge<'m>(
    ctx: &'m IngestContext,
    part: &'m [OwnedMessage],
) -> anyhow::Result<Vec<DeadLetter<'m>>> {
    let parents: Vec<&str> = if ctx.obs.tracing {
        part.iter()
            .filter_map(|m| header_str(m, TRACEPARENT).and_then(valid_traceparent))
            .collect()
    } else {
        Vec::new()
    };
    let span = obs::receive_span(&ctx.order_topic, &ctx.group, part.len(), parents);
    converge_part(ctx, part).instrument(span).await
}

async fn converge_part<'m>(
    ctx: &'m IngestContext,
    part: &'m [OwnedMessage],
) -> anyhow::Result<Vec<DeadLetter<'m>>> {
    let mut classified = classify(&ctx.config, &ctx.seller_topic, part);
    attach_spans(ctx, &mut classified.orders);
    let seller_count = classified.sellers.len() as u64;

    let stage = |name| obs::ingest_stage(&ctx.obs, name);
    let mut conn = ctx.store.conn().instrument(stage("connection")).await?;
    let tx = IngestTx::begin(&mut conn).instrument(stage("begin")).await?;
    let renderer = renderer(ctx, &tx).instrument(stage("templates")).await?;
    let mut released = Released::default();
    if !classified.sellers.is_empty() {
        released = apply_profiles(ctx, &tx, &renderer, std::mem::take(&mut classified.sellers))
            .instrument(stage("profiles"))
            .await?;
    }
    let plan = plan_orders(ctx, &tx, &renderer, &classified.orders).await?;
    let started = Instant::now();
    let results = tx
        .converge(plan.intents())
        .instrument(stage("converge"))
        .await
        .context("converging intents")?;
    // Failure policy: a crash before this commit leaves nothing behind (the batch is read
    // again); after it, the dead letters and the offset store may be lost, and the replay
    // converges on the rows just written and produces the dead letters again. Held intents
    // released here are frozen with their outbox rows by this same commit.
    fail::fail_point!("ingest-before-db-commit");
    tx.commit()
        .instrument(stage("commit"))
        .await
        .context("committing the ingest transaction")?;
    drop(conn);
    let _report = stage("report").entered();
    ctx.stats
        .batch_committed(part.len(), started.elapsed(), classified.no_route, seller_count);
    released.report(&ctx.stats, "profile");

    report_convergence(ctx, &plan, &results);
    tracing::debug!(
        messages = part.len(),
        intents = results.len(),
        "ingest batch committed"
    );
    let mut poison = classified.poison;
    poison.extend(
        plan.unrendered
            .iter()
            .filter_map(|u| u.dead_letter(&classified.orders)),
    );
    Ok(poison)
}

/// Within `tx`: stores the batch's seller profiles and renders the orders held for them
/// with the profiles just stored.
async fn apply_profiles(
    ctx: &IngestContext,
    tx: &IngestTx<'_>,
    renderer: &Renderer,
    sellers: Vec<SellerRecord>,
) -> anyhow::Result<Released> {
    let updated: Vec<(String, String)> = sellers
        .iter()
        .map(|r| {
            let (m, s) = r.ids();
            (m.to_owned(), s.to_owned())
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let updated: Vec<(&str, &str)> = updated.iter().map(|(m, s)| (m.as_str(), s.as_str())).collect();
    if ctx.config.ingest.profile_wait().is_some() {
        tx.lock_sellers(&updated).await.context("locking sellers")?;
    }
    tx.apply_sellers(sellers)
        .await
        .context("applying seller profiles")?;
    // Orders held for these sellers are rendered now, with the profiles just stored.
    let held = tx.open_holds_of(&updated).await.context("reading held intents")?;
    release(tx, renderer, held).await
}

/// Within `tx`: the seller profiles of `orders` (with holds on, sellers without one are
/// locked and looked up again), then what the orders become ([`plan`]).
pub async fn plan_orders<'c>(
    ctx: &IngestContext,
    tx: &IngestTx<'_>,
    renderer: &Renderer,
    orders: &'c [Routed<'_>],
) -> anyhow::Result<Plan<'c>> {
    let hold = ctx.config.ingest.profile_wait();
    let seller_keys: Vec<(String, String)> = orders
        .iter()
        .map(|o| (o.event.marketplace_id.clone(), o.event.seller_id.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let profiles = async {
        let mut profiles = tx
            .sellers(&seller_keys)
            .await
            .context("reading seller profiles")?;
        if hold.is_some() {
            // Sellers without a profile: lock, then look again. A profile committed
            // meanwhile is used now; one committed after this transaction finds the holds it
            // creates.
            let missing: Vec<(String, String)> = seller_keys
                .into_iter()
                .filter(|k| !profiles.contains_key(k))
                .collect();
            if !missing.is_empty() {
                let keys: Vec<(&str, &str)> = missing.iter().map(|(m, s)| (m.as_str(), s.as_str())).collect();
                tx.lock_sellers(&keys).await.context("locking sellers")?;
                profiles.extend(tx.sellers(&missing).await.context("reading seller profiles")?);
            }
        }
        anyhow::Ok(profiles)
    }
    .instrument(obs::ingest_stage(&ctx.obs, "sellers"))
    .await?;
    Ok(obs::ingest_stage(&ctx.obs, "render").in_scope(|| plan(renderer, &profiles, orders, hold)))
}

/// After the commit: each intent's log line, counters and span outcome.
pub fn report_convergence(ctx: &IngestContext, plan: &Plan<'_>, results: &[Convergence]) {
    for ((intent, span), result) in plan.with_spans().zip(results) {
        log_convergence(intent, result, &ctx.stats);
        if let Some(span) = span {
            record_convergence(span, result);
        }
    }
}

/// The active templates, compiled, as `tx` reads them.
pub async fn renderer(ctx: &IngestContext, tx: &IngestTx<'_>) -> anyhow::Result<Renderer> {
    Ok(Renderer::new(
        tx.active_templates().await.context("reading active templates")?,
        RenderOptions {
            default_locale: ctx.config.rendering.default_locale.clone(),
            sms_max_segments: ctx.config.rendering.sms_max_segments,
        },
    ))
}

/// Gives each routed order its `process order-events` span (child of the producer's,
/// linked to the batch's `receive` span) when spans are exported.
fn attach_spans(ctx: &IngestContext, orders: &mut [Routed<'_>]) {
    if !ctx.obs.tracing {
        return;
    }
    let batch_context = propagation::traceparent_of(&Span::current());
    for o in orders {
        let Origin::Kafka(m) = o.origin else {
            continue;
        };
        let key = m.key().and_then(|k| std::str::from_utf8(k).ok());
        let span = obs::process_span(
            m.topic(),
            &ctx.group,
            m.partition(),
            m.offset(),
            key,
            o.trace_context.as_deref(),
        );
        if let Some(batch) = &batch_context {
            propagation::add_link(&span, batch);
        }
        o.span = Some(span);
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
            s.intent_created(kind, channel, revision, *state, intent.payload.consent.as_str());
            // A held intent's consent and revision are decided when the profile arrives.
            let (consent, revision) = match state {
                IntentState::AwaitingProfile => ("undecided", "undecided"),
                _ => (intent.payload.consent.as_str(), revision),
            };
            // Routine (sampled by log.routine_sampling_ratio): an intent to be sent, observed,
            // or suppressed because the seller opted out (every order of such a seller is).
            // Always logged: a held intent (no profile yet) and every other suppression (no
            // or a malformed destination, no profile, a bounced or complaining address).
            let routine = match state {
                IntentState::Pending | IntentState::Observed => true,
                IntentState::Suppressed => intent.payload.consent == ConsentDecision::OptedOut,
                _ => false,
            };
            info!(intent_id = %intent_id, channel, template_revision = revision, state = state.as_str(),
                  consent, trace_id, routine, "intent created");
        }
        Convergence::Duplicate { intent_id } => {
            s.duplicate_converged(kind, channel);
            info!(intent_id = %intent_id, channel, template_revision = revision, event_id = %intent.event_id,
                  trace_id, routine = true, "intent reused: duplicate converged on existing intent");
        }
        Convergence::Conflict {
            intent_id,
            existing_fingerprint,
            newly_recorded,
        } => {
            if *newly_recorded {
                s.conflict_recorded(kind, channel);
            }
            warn!(intent_id = %intent_id, channel, template_revision = revision, event_id = %intent.event_id, trace_id,
                  existing_fingerprint = %existing_fingerprint, offending_fingerprint = %intent.fingerprint,
                  source_partition = intent.source.partition, source_offset = intent.source.offset,
                  newly_recorded, "business key reused with different content: conflict recorded, not sent");
        }
    }
}
