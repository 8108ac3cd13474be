//! The claim stage: batches of taken messages become claimed attempts (lease, fencing
//! token, `started` attempt, frozen payload), each with the deadline by which its send
//! must start; messages whose intent is not claimable are acknowledged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_store::delivery::{ClaimOutcome, ClaimRequest, ClaimTry, Claimed};
use tokio::sync::mpsc;

use super::batch::{pipelined, until_ok};
use super::take::Taken;
use super::DeliveryContext;
use crate::retrying::Stage;

/// An attempt whose claim is committed: its lease is held by `claim.attempt_id`.
pub struct ClaimedAttempt {
    pub taken: Taken,
    pub claim: Claimed,
    /// The last moment the provider request may start (the lease, less one attempt timeout
    /// and the margin, on this process's monotonic clock).
    pub send_by: Instant,
}

pub async fn run(ctx: Arc<DeliveryContext>, rx: mpsc::Receiver<Taken>, out: mpsc::Sender<ClaimedAttempt>) {
    let d = &ctx.config.delivery;
    let linger = Duration::from_millis(d.db_batch_linger_ms);
    pipelined(rx, d.db_batch_max, linger, |batch| {
        let (ctx, out) = (ctx.clone(), out.clone());
        async move { claim_batch(&ctx, batch, &out).await }
    })
    .await;
}

async fn claim_batch(ctx: &DeliveryContext, batch: Vec<Taken>, out: &mpsc::Sender<ClaimedAttempt>) {
    let lease = Duration::from_secs(ctx.config.delivery.lease_secs);
    // One attempt id per message, made once: a claim retried after a lost reply finds its
    // own attempts instead of leaving orphans.
    let requests: Vec<ClaimRequest> = batch.iter().map(|t| ClaimRequest::new(t.intent_id)).collect();
    let first_try = Instant::now();
    let mut attempt = ClaimTry::First;
    let (outcomes, this_try) = until_ok(
        Stage {
            name: "claim",
            metrics: &ctx.obs.metrics,
        },
        || {
            let this = attempt;
            attempt = ClaimTry::Again;
            let requests = &requests;
            async move {
                let sent = Instant::now();
                ctx.store
                    .claim(&ctx.worker, lease, requests, &ctx.policies, this)
                    .await
                    .map(|o| (o, sent))
            }
        },
    )
    .await;
    ctx.stats.batch("claim", requests.len(), first_try.elapsed());
    // Failure policy: a crash here, after the claim committed and before the sends,
    // leaves `started` attempts under leases that expire into `unknown`: honest, if
    // pessimistic (nothing was sent).
    fail::fail_point!("deliver-after-claim");
    for (mut taken, outcome) in batch.into_iter().zip(outcomes) {
        match outcome {
            ClaimOutcome::Claimed(claim) => {
                // PostgreSQL started the lease during the try that made the claim, so
                // no earlier than that try left; a claim found again was made by an
                // earlier try, no earlier than the first.
                let granted_after = if claim.reclaimed { first_try } else { this_try };
                ctx.stats.claimed(claim.channel.as_str());
                tracing::info!(intent_id = %claim.intent_id, attempt_id = %claim.attempt_id,
                    attempt_no = claim.attempt_no, channel = claim.channel.as_str(),
                    template_revision = %claim.template_revision, outcome = "started",
                    after_unknown = claim.after_unknown, reclaimed = claim.reclaimed,
                    // Sampled by log.routine_sampling_ratio: a first try; a retry, a claim
                    // after an unknown outcome or one found again is always logged.
                    routine = claim.attempt_no == 1 && !claim.after_unknown && !claim.reclaimed,
                    trace_id = claim.trace_context.as_deref().and_then(herald_telemetry::propagation::trace_id),
                    "attempt started");
                if !taken.permits.claimed_as(claim.channel) {
                    // Every writer of an outbox row copies the intent's frozen channel
                    // (V14), so only a hand-made row or message gets here. The send goes on,
                    // under its channel's rate but outside its claim window.
                    tracing::warn!(intent_id = %claim.intent_id, channel = claim.channel.as_str(),
                        "the delivery message named another channel than its intent's; sent outside the channel's claim window");
                }
                let claimed = ClaimedAttempt {
                    send_by: ctx.budget.send_deadline(granted_after),
                    taken,
                    claim: *claim,
                };
                // The send stage reads until every claim batch is done.
                let _ = out.send(claimed).await;
            }
            ClaimOutcome::Skipped(reason) => {
                ctx.stats.skipped(reason.as_str());
                tracing::debug!(intent_id = %taken.intent_id, reason = reason.as_str(),
                                "delivery message acknowledged without sending");
                ctx.handle.complete(taken.work);
            }
        }
    }
}
