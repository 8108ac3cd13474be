//! One request's transaction: claim the Idempotency-Key, then the same convergence as a
//! Kafka batch (profiles, plan, intents, payloads, outbox), store the answer with the key,
//! commit. A crash or an error before the commit rolls back the key with everything else:
//! the client's retry starts afresh and converges.

use std::time::Duration;

use anyhow::Context;
use herald_store::http_ingest::KeyClaim;
use herald_store::IngestTx;
use tracing::Span;

use super::answer::Answer;
use super::request::OrderRequest;
use crate::config::Route;
use crate::roles::ingest::{plan_orders, renderer, report_convergence, IngestContext, Origin, Routed};

/// What the request asked, decided before any I/O.
pub struct Accepted {
    pub key: String,
    pub request: OrderRequest,
    /// The event kind's route, narrowed to the requested channel.
    pub route: Route,
    pub trace_context: Option<String>,
    /// `POST /v1/order-events`, parent of the intents' spans, when spans are exported.
    pub span: Option<Span>,
}

pub async fn converge(
    ctx: &IngestContext,
    retention: Duration,
    wait: Duration,
    accepted: Accepted,
) -> anyhow::Result<Answer> {
    let Accepted {
        key: owned_key,
        request,
        route,
        trace_context,
        span,
    } = accepted;
    let key = owned_key.as_str();
    let OrderRequest {
        fingerprint,
        document,
        event,
        ..
    } = request;

    let mut conn = ctx.store.conn().await?;
    let tx = IngestTx::begin(&mut conn).await?;
    match tx
        .claim_request_key(key, &fingerprint, retention, wait)
        .await
        .context("claiming the Idempotency-Key")?
    {
        KeyClaim::Claimed => {}
        // Dropping `tx` rolls it back: nothing was written.
        KeyClaim::InProgress => return Ok(Answer::in_progress(key)),
        KeyClaim::Answered {
            fingerprint: stored,
            status,
            response,
        } if stored == fingerprint => return Ok(Answer::replay(status, response)),
        KeyClaim::Answered {
            fingerprint: stored, ..
        } => {
            let new = tx
                .record_request_mismatch(key, &stored, &fingerprint, &document)
                .await
                .context("recording the reused Idempotency-Key")?;
            // A crash before this commit loses only the evidence row; the client's retry
            // records it again.
            tx.commit().await.context("committing the mismatch")?;
            tracing::warn!(idempotency_key = key, stored_fingerprint = %stored, request_fingerprint = %fingerprint,
                           newly_recorded = new, "Idempotency-Key reused with another request: refused, kept as evidence");
            return Ok(Answer::key_reused(key, &stored, &fingerprint));
        }
    }

    let orders = [Routed {
        origin: Origin::Http(key),
        event,
        route: &route,
        trace_context,
        span,
    }];
    let renderer = renderer(ctx, &tx).await?;
    let plan = plan_orders(ctx, &tx, &renderer, &orders).await?;
    if let Some(u) = plan.unrendered.first() {
        // All or nothing, unlike a Kafka event (whose rendered channels converge and whose
        // event is dead-lettered): the client hears of it now and retries with the key.
        return Ok(Answer::unrendered(u));
    }
    let results = tx.converge(plan.intents()).await.context("converging intents")?;
    let ids: Vec<_> = results.iter().map(|r| r.intent_id()).collect();
    let states = tx.intent_states(&ids).await.context("reading intent states")?;
    let answer = Answer::converged(key, &fingerprint, plan.intents(), &results, &states);
    tx.answer_request(key, answer.status.as_u16(), &answer.body)
        .await
        .context("storing the answer")?;
    // Failure policy: a crash before this commit rolls back the key, the intents and their
    // outbox rows together; the client sees no answer and its retry converges afresh (on
    // intents a Kafka copy may have created meanwhile). After it, the client may still see
    // no answer: its retry gets this answer again, marked as a replay.
    fail::fail_point!("http-ingest-before-commit");
    tx.commit().await.context("committing the request")?;
    fail::fail_point!("http-ingest-after-commit");
    drop(conn);
    report_convergence(ctx, &plan, &results);
    Ok(answer)
}
