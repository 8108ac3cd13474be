//! Groups the database work of many attempts: the claims of the attempts about to start go
//! in one transaction, the records of the attempts just finished in another, each gathered
//! for at most `delivery.db_batch_linger_ms` or `delivery.db_batch_max` attempts. So
//! PostgreSQL sees a few hundred transactions a second, not two per send.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_store::delivery::{AttemptRecord, ClaimOutcome};
use tokio::sync::{mpsc, Semaphore};
use tracing::warn;

use super::{send, DeliveryContext, Taken};

/// An attempt that has its outcome, waiting to be recorded.
pub struct Finished {
    pub taken: Taken,
    pub record: AttemptRecord,
}

/// Receives one item, then whatever else arrives within the linger time, up to `max`.
async fn gather<T>(rx: &mut mpsc::Receiver<T>, max: usize, linger: Duration) -> Option<Vec<T>> {
    let first = rx.recv().await?;
    let mut batch = vec![first];
    let deadline = tokio::time::Instant::now() + linger;
    while batch.len() < max {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(item)) => batch.push(item),
            Ok(None) | Err(_) => break,
        }
    }
    Some(batch)
}

/// Runs `op` until it succeeds, backing off up to 5 s. Used where giving up would lose
/// the truth: a claim already holds permits, a record describes a send that happened.
async fn until_ok<T, E: std::fmt::Display, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "{what} failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Database transactions of one kind (claims, or records) running at once: batches are
/// pipelined, so one commit in progress does not hold up the attempts gathering behind it.
const CONCURRENT_BATCHES: usize = 4;

/// Gathers batches from `rx` and runs `work` on each, up to [`CONCURRENT_BATCHES`] at once.
/// Returns once `rx` is closed and every batch has finished.
async fn pipelined<T, F, Fut>(rx: &mut mpsc::Receiver<T>, max: usize, linger: Duration, work: F)
where
    T: Send + 'static,
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(CONCURRENT_BATCHES));
    while let Some(batch) = gather(rx, max, linger).await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let job = work(batch);
        tokio::spawn(async move {
            job.await;
            drop(slot);
        });
    }
    let _ = slots.acquire_many(CONCURRENT_BATCHES as u32).await;
}

pub async fn claim_loop(
    ctx: Arc<DeliveryContext>,
    mut rx: mpsc::Receiver<Taken>,
    records: mpsc::Sender<Finished>,
) {
    let d = &ctx.config.delivery;
    let linger = Duration::from_millis(d.db_batch_linger_ms);
    pipelined(&mut rx, d.db_batch_max, linger, |batch| {
        let (ctx, records) = (ctx.clone(), records.clone());
        async move { claim_batch(&ctx, batch, &records).await }
    })
    .await;
}

async fn claim_batch(ctx: &Arc<DeliveryContext>, batch: Vec<Taken>, records: &mpsc::Sender<Finished>) {
    let lease = Duration::from_secs(ctx.config.delivery.lease_secs);
    let ids: Vec<_> = batch.iter().map(|t| t.intent_id).collect();
    let started = Instant::now();
    let outcomes = until_ok("claim", || {
        ctx.store.claim(&ctx.worker, lease, &ids, &ctx.policies)
    })
    .await;
    ctx.obs
        .metrics
        .delivery_batch("claim", ids.len(), started.elapsed());
    // Failure policy: a crash here, after the claim committed and before the sends,
    // leaves `started` attempts under leases that expire into `unknown`: honest, if
    // pessimistic (nothing was sent).
    fail::fail_point!("deliver-after-claim");
    for (taken, outcome) in batch.into_iter().zip(outcomes) {
        match outcome {
            ClaimOutcome::Claimed(claimed) => {
                ctx.stats.claimed(claimed.channel.as_str());
                tracing::info!(intent_id = %claimed.intent_id, attempt_id = %claimed.attempt_id,
                    attempt_no = claimed.attempt_no, channel = claimed.channel.as_str(),
                    template_revision = %claimed.template_revision, outcome = "started",
                    after_unknown = claimed.after_unknown,
                    trace_id = claimed.trace_context.as_deref().and_then(herald_telemetry::propagation::trace_id),
                    "attempt started");
                tokio::spawn(send::attempt(ctx.clone(), taken, *claimed, records.clone()));
            }
            ClaimOutcome::Skipped(reason) => {
                ctx.stats.skipped(reason.as_str());
                tracing::debug!(intent_id = %taken.intent_id, reason = reason.as_str(), "delivery message acknowledged without sending");
                ctx.handle.complete(&taken.work, true);
            }
        }
    }
}

pub async fn record_loop(ctx: Arc<DeliveryContext>, mut rx: mpsc::Receiver<Finished>) {
    let d = &ctx.config.delivery;
    let linger = Duration::from_millis(d.db_batch_linger_ms);
    pipelined(&mut rx, d.db_batch_max, linger, |batch| {
        let ctx = ctx.clone();
        async move { record_batch(&ctx, batch).await }
    })
    .await;
}

async fn record_batch(ctx: &DeliveryContext, batch: Vec<Finished>) {
    let records: Vec<AttemptRecord> = batch.iter().map(|f| f.record.clone()).collect();
    let started = Instant::now();
    until_ok("record", || ctx.store.record(&ctx.worker, &records)).await;
    ctx.obs
        .metrics
        .delivery_batch("record", records.len(), started.elapsed());
    // Failure policy: a crash here, after the record committed and before the offsets
    // are stored, replays these messages: each finds its intent terminal (or retry not
    // due) and is acknowledged without sending.
    fail::fail_point!("deliver-after-record");
    for f in batch {
        ctx.stats.recorded(f.record.outcome.as_str());
        ctx.handle.complete(&f.taken.work, true);
    }
}
