//! The delivery role: consumer group `herald-delivery` on `herald.deliveries`.
//!
//! The pipeline, one stage per module, each handing the next a different type:
//!
//! ```text
//! Work ─take─> Taken ─claim─> ClaimedAttempt ─send─> FinishedAttempt ─record─> offset done
//! ```
//!
//! - [`take`]: a message goes to its channel's lane, which waits for room in the channel's
//!   claim window (what its rate can send within a lease) and in the pipeline;
//! - [`claim`]: lease + fencing token + `started` attempt, many per statement;
//! - [`send`]: the channel's rate, a send slot, the lease deadline, then one provider
//!   request, or nothing and `not_sent`;
//! - [`record`]: outcome + next state, many per statement, then the offset.
//!
//! This module wires them. Bounds: `delivery.max_in_flight` provider requests at once (the
//! send slots) and twice that many attempts between take and record (the pipeline), so the
//! next attempts are claimed while the slots are busy and a slot never waits for a
//! database round trip; per channel, no more attempts claimed and not yet sent than its
//! rate sends within the lease (`herald_core::lease`). The consumer stops taking messages
//! when its own window is full ([`herald_kafka::deliver`]).

mod batch;
mod claim;
mod record;
mod send;
mod stats;
mod take;

use std::sync::Arc;
use std::time::Duration;

use herald_core::lease::LeaseBudget;
use herald_core::{Channel, NotSentReason};
use herald_kafka::deliver::{DeliveryConsumer, DeliveryHandle, FlowLimits, Work};
use herald_store::delivery::ChannelPolicies;
use herald_store::Store;
use tokio::sync::{mpsc, Semaphore};
use tracing::{info, warn};
use uuid::Uuid;

use crate::config::Config;
use crate::obs::Obs;
use crate::shutdown::Shutdown;
pub use stats::DeliveryStats;

/// Shared handles of the delivery role (Svix's `WorkerContext`).
pub struct DeliveryContext {
    pub config: Arc<Config>,
    pub store: Store,
    pub worker: String,
    pub policies: ChannelPolicies,
    pub handle: DeliveryHandle,
    pub senders: send::Senders,
    pub stats: Arc<DeliveryStats>,
    pub obs: Obs,
    /// Provider requests in flight: `delivery.max_in_flight` slots.
    pub send_slots: Semaphore,
    /// What a lease covers: each claim's send deadline.
    pub budget: LeaseBudget,
    pub shutdown: Shutdown,
    pub group: String,
}

pub async fn run(config: Arc<Config>, store: Store, mut shutdown: Shutdown, obs: Obs) -> anyhow::Result<()> {
    let d = &config.delivery;
    let group = config.group(&d.group_id);
    let topic = config.topic(&config.kafka.topics.deliveries);
    let limits = FlowLimits {
        // Received ahead of the in-flight window (intent ids only: small); the pipeline
        // bounds the attempts.
        max_outstanding: (d.max_in_flight * 8).max(1024),
        // 0: no limit of its own. (Not the window: a consumer that owns one partition
        // would then pause it whenever the window is full, which is always under load.)
        max_outstanding_per_partition: (d.max_outstanding_per_partition > 0)
            .then_some(d.max_outstanding_per_partition),
        drain_timeout: Duration::from_millis(d.drain_timeout_ms),
    };
    let mut consumer = DeliveryConsumer::subscribe(&config.kafka_settings(), &group, &topic, limits)?;
    let worker = format!(
        "{}-{}-{}",
        hostname(),
        std::process::id(),
        &Uuid::new_v4().simple().to_string()[..6]
    );
    let policies: ChannelPolicies = Channel::ALL
        .iter()
        .map(|c| (*c, config.retry_policy(*c)))
        .collect();
    let ctx = Arc::new(DeliveryContext {
        senders: send::Senders::new(&config).await,
        config: config.clone(),
        store,
        worker: worker.clone(),
        policies,
        handle: consumer.handle.clone(),
        stats: Arc::new(DeliveryStats::new(obs.metrics.clone())),
        obs,
        send_slots: Semaphore::new(d.max_in_flight),
        budget: config.lease_budget(),
        shutdown: shutdown.clone(),
        group: group.clone(),
    });
    let channels: Vec<&str> = Channel::ALL.iter().map(|c| c.as_str()).collect();
    let reasons: Vec<&'static str> = NotSentReason::ALL.iter().map(|r| r.as_str()).collect();
    ctx.obs.metrics.init_delivery(&channels, &reasons);
    let partition_gauges = tokio::spawn(crate::gauges::watch_partitions(
        ctx.obs.metrics.clone(),
        group.clone(),
        consumer.handle.lag().clone(),
        crate::gauges::Pending::Delivery(consumer.handle.clone()),
    ));

    // The stages, joined by bounded channels. The pipeline's permits are taken by the lanes
    // and given back when an attempt is recorded (or its message skipped).
    let pipeline = d.max_in_flight * 2;
    let in_flight = Arc::new(Semaphore::new(pipeline));
    let (claim_tx, claim_rx) = mpsc::channel(pipeline);
    let (claimed_tx, mut claimed_rx) = mpsc::channel::<claim::ClaimedAttempt>(pipeline);
    let (finished_tx, finished_rx) = mpsc::channel(pipeline);
    let lanes = take::Lanes::spawn(&ctx, in_flight.clone(), pipeline, claim_tx);
    info!(group = %group, topic = %topic, worker = %worker, max_in_flight = d.max_in_flight,
          claim_windows = %lanes.describe(), "delivery consuming");
    let claims = tokio::spawn(claim::run(ctx.clone(), claim_rx, claimed_tx));
    let sends = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while let Some(claimed) = claimed_rx.recv().await {
                let (ctx, finished) = (ctx.clone(), finished_tx.clone());
                tokio::spawn(async move {
                    let done = send::attempt(&ctx, claimed).await;
                    // The record stage stops only once every sender has gone: this
                    // cannot fail while the role runs.
                    let _ = finished.send(done).await;
                });
            }
        })
    };
    let records = tokio::spawn(record::run(ctx.clone(), finished_rx));
    let sweeper = tokio::spawn(sweep_loop(ctx.clone()));
    let reporter = tokio::spawn(stats::report_every(ctx.stats.clone(), Duration::from_secs(10)));

    loop {
        let work = tokio::select! {
            _ = shutdown.requested() => break,
            w = consumer.work.recv() => match w {
                Some(w) => w,
                None => break,
            },
        };
        let Work { slot, message } = work;
        match message {
            Ok(message) => lanes.route(slot, message),
            Err(e) => {
                warn!(partition = slot.partition, offset = slot.offset, error = %e,
                      "not a delivery message: acknowledged");
                ctx.stats.skipped("invalid_message");
                ctx.handle.acknowledge(slot);
            }
        }
    }

    // SIGTERM: take no more work. Attempts waiting for their turn release themselves as
    // `not_sent`; requests already at the provider finish and are recorded (bounded); then
    // commit and leave the group. Messages queued in the lanes were never started: their
    // offsets stay uncommitted and the partition's next owner takes them.
    // One deadline for the whole drain, so that shutdown stays within one drain timeout
    // (plus the consumer's own, which finds nothing left in flight).
    info!("delivery draining");
    let deadline = tokio::time::Instant::now() + Duration::from_millis(d.drain_timeout_ms);
    let _ = tokio::time::timeout_at(deadline, lanes.close()).await;
    let all = u32::try_from(pipeline).unwrap_or(u32::MAX);
    if tokio::time::timeout_at(deadline, in_flight.acquire_many(all))
        .await
        .is_err()
    {
        let (_, busy) = ctx.handle.load();
        warn!(
            in_flight = busy,
            "drain timed out; those attempts stay started and their leases will expire into unknown"
        );
    }
    let _ = tokio::time::timeout_at(deadline, claims).await;
    let _ = tokio::time::timeout_at(deadline, sends).await;
    let _ = tokio::time::timeout_at(deadline, records).await;
    sweeper.abort();
    reporter.abort();
    partition_gauges.abort();
    ctx.obs.metrics.gauges().set_partitions(&group, []);
    consumer.work.close();
    tokio::task::spawn_blocking(move || consumer.shutdown()).await?;
    ctx.stats.log_totals();
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "herald".into())
}

/// Finds attempts whose worker died or stalled past its lease and records them `unknown`.
async fn sweep_loop(ctx: Arc<DeliveryContext>) {
    let every = Duration::from_millis(ctx.config.delivery.sweep_interval_ms);
    loop {
        tokio::time::sleep(every).await;
        match ctx.store.expire_leases(&ctx.policies, 500).await {
            Ok(0) => {}
            Ok(n) => warn!(
                intents = n,
                "expired leases: attempts of dead or stalled workers recorded unknown"
            ),
            Err(e) => warn!(error = %e, "lease sweep failed"),
        }
        settle_silent(&ctx).await;
    }
}

/// `unknown` intents whose wait for the provider's evidence ran out: evidence stored
/// meanwhile settles them, else the channel's `on_unknown` policy (recorded as decided by
/// silence).
async fn settle_silent(ctx: &DeliveryContext) {
    use herald_core::retry::NextState;
    use herald_store::reconcile::Silence;
    match ctx.store.settle_silent(&ctx.policies, 500).await {
        Ok(decided) => {
            for d in decided {
                match d {
                    Silence::Evidence(intent_id, channel, verdict) => {
                        ctx.stats
                            .unknown_settled(channel.as_str(), "evidence", verdict.as_str());
                        info!(%intent_id, state = verdict.as_str(),
                              "unknown settled by a provider event that came before the outcome was recorded");
                    }
                    Silence::Policy(intent_id, channel, next) => {
                        let decided = if matches!(next, NextState::RetryAfter(_)) {
                            "retry"
                        } else {
                            "hold"
                        };
                        ctx.stats.unknown_settled(channel.as_str(), "silence", decided);
                        warn!(%intent_id, channel = channel.as_str(), decided,
                              "no provider event within the silence window: on_unknown decided");
                    }
                }
            }
        }
        Err(e) => warn!(error = %e, "silence sweep failed"),
    }
}
