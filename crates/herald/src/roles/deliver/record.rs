//! The record stage: batches of finished attempts are recorded (outcome, the intent's next
//! state while the attempt still holds its lease, an outbox row for a retry), then their
//! messages are marked done so that the offsets can be stored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::Channel;
use herald_store::delivery::{AttemptRecord, Recorded};
use tokio::sync::mpsc;
use tracing::{error, warn};

use super::batch::{pipelined, until_ok};
use super::take::Taken;
use super::DeliveryContext;
use crate::retrying::Stage;

/// An attempt that has its outcome, waiting to be recorded.
pub struct FinishedAttempt {
    pub taken: Taken,
    pub channel: Channel,
    pub record: AttemptRecord,
}

pub async fn run(ctx: Arc<DeliveryContext>, rx: mpsc::Receiver<FinishedAttempt>) {
    let d = &ctx.config.delivery;
    let linger = Duration::from_millis(d.db_batch_linger_ms);
    pipelined(rx, d.db_batch_max, linger, |batch| {
        let ctx = ctx.clone();
        async move { record_batch(&ctx, batch).await }
    })
    .await;
}

async fn record_batch(ctx: &DeliveryContext, batch: Vec<FinishedAttempt>) {
    let records: Vec<AttemptRecord> = batch.iter().map(|f| f.record.clone()).collect();
    let started = Instant::now();
    let results = until_ok(
        Stage {
            name: "record",
            metrics: &ctx.obs.metrics,
        },
        || ctx.store.record(&records),
    )
    .await;
    ctx.stats.batch("record", records.len(), started.elapsed());
    // Failure policy: a crash here, after the record committed and before the offsets
    // are stored, replays these messages: each finds its intent terminal (or retry not
    // due) and is acknowledged without sending.
    fail::fail_point!("deliver-after-record");
    for (f, result) in batch.into_iter().zip(results) {
        let r = &f.record;
        let label = match result {
            Recorded::OnTime { moved: true } => "on_time",
            Recorded::OnTime { moved: false } => {
                warn!(intent_id = %r.intent_id, attempt_id = %r.attempt_id, channel = f.channel.as_str(),
                      outcome = r.outcome.as_str(),
                      "attempt recorded, but its lease had been lost: the intent was left as it was");
                "fenced"
            }
            Recorded::Late { settled } => {
                warn!(intent_id = %r.intent_id, attempt_id = %r.attempt_id, channel = f.channel.as_str(),
                      late_outcome = r.outcome.as_str(), settled,
                      "attempt had been recorded unknown (lease expired): its outcome is stored beside it");
                if settled {
                    "late_settled"
                } else {
                    "late_kept"
                }
            }
            Recorded::AlreadyRecorded => "already_recorded",
            Recorded::Missing => {
                error!(intent_id = %r.intent_id, attempt_id = %r.attempt_id, outcome = r.outcome.as_str(),
                       "no such attempt to record (its partition of notification_attempts was dropped?)");
                "missing"
            }
        };
        ctx.stats.recorded(label);
        ctx.handle.complete(f.taken.work);
    }
}
