//! The delivery role: consumer group `herald-delivery` on `herald.deliveries`.
//!
//! Per message: claim (lease + `started` attempt, committed) -> send (one request, SDK
//! retries off) -> record (outcome + next state + retry outbox row, committed) -> only
//! then mark the offset done. Claims and records of many attempts are grouped into one
//! statement each ([`batcher`]). Two bounds: `delivery.max_in_flight` provider requests
//! at once (the send slots), and twice that many attempts between claim and record (the
//! pipeline), so that the next attempts are claimed while the slots are busy and a slot
//! never waits for a database round trip. The consumer stops taking messages when its
//! own window is full ([`herald_kafka::delivery_consumer`]).

mod batcher;
mod send;
mod stats;

use std::sync::Arc;
use std::time::Duration;

use herald_core::Channel;
use herald_kafka::delivery_consumer::{DeliveryConsumer, DeliveryHandle, FlowLimits, Work};
use herald_store::delivery::ChannelPolicies;
use herald_store::Store;
use tokio::sync::{mpsc, Semaphore};
use tracing::{info, warn};
use uuid::Uuid;

use crate::config::Config;
use crate::obs::{self, Obs};
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
}

/// A message taken on: its work item, its intent, and the pipeline permit it holds until
/// its offset is marked done.
pub struct Taken {
    pub work: Work,
    pub intent_id: Uuid,
    pub _permit: tokio::sync::OwnedSemaphorePermit,
    /// `process herald.deliveries`, child of the relay's `send` span; ends when the
    /// message is done (dropped with this).
    pub span: tracing::Span,
}

pub async fn run(config: Arc<Config>, store: Store, mut shutdown: Shutdown, obs: Obs) -> anyhow::Result<()> {
    let d = &config.delivery;
    let group = config.group(&d.group_id);
    let topic = config.topic(&config.kafka.topics.deliveries);
    let limits = FlowLimits {
        // Received ahead of the in-flight window (intent ids only: small); the semaphore
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
    });
    let partition_gauges = tokio::spawn(crate::gauges::watch_partitions(
        ctx.obs.metrics.clone(),
        group.clone(),
        consumer.handle.lag().clone(),
        Some(consumer.handle.clone()),
    ));
    info!(group = %group, topic = %topic, worker = %worker, max_in_flight = d.max_in_flight, "delivery consuming");

    // The pipeline: attempts between claim and record (or skip). Twice the send slots, so
    // that claims run ahead of the sends and records behind them.
    let pipeline = d.max_in_flight * 2;
    let in_flight = Arc::new(Semaphore::new(pipeline));
    let (claim_tx, claim_rx) = mpsc::channel::<Taken>(pipeline);
    let (record_tx, record_rx) = mpsc::channel(pipeline);
    let claims = tokio::spawn(batcher::claim_loop(ctx.clone(), claim_rx, record_tx.clone()));
    let records = tokio::spawn(batcher::record_loop(ctx.clone(), record_rx));
    drop(record_tx);
    let sweeper = tokio::spawn(sweep_loop(ctx.clone()));
    let reporter = tokio::spawn(stats::report_every(ctx.stats.clone(), Duration::from_secs(10)));

    loop {
        let permit = tokio::select! {
            _ = shutdown.requested() => break,
            p = in_flight.clone().acquire_owned() => p?,
        };
        let work = tokio::select! {
            _ = shutdown.requested() => break,
            w = consumer.work.recv() => match w {
                Some(w) => w,
                None => break,
            },
        };
        let Some(intent_id) = parse_intent_id(&work) else {
            warn!(
                partition = work.partition,
                offset = work.offset,
                "delivery message without a valid intent id: acknowledged"
            );
            ctx.stats.skipped("invalid_message");
            ctx.handle.complete(&work, false);
            continue;
        };
        if !ctx.handle.try_start(&work) {
            continue; // its partition was revoked: the next owner takes it
        }
        let span = if ctx.obs.tracing {
            let key = intent_id.to_string();
            obs::process_span(
                &topic,
                &group,
                work.partition,
                work.offset,
                Some(&key),
                work.traceparent.as_deref(),
            )
        } else {
            tracing::Span::none()
        };
        if claim_tx
            .send(Taken {
                work,
                intent_id,
                _permit: permit,
                span,
            })
            .await
            .is_err()
        {
            break;
        }
    }

    // SIGTERM: take no more work; let every attempt in flight be recorded (bounded), then
    // commit and leave the group.
    info!("delivery draining");
    drop(claim_tx);
    let drain = Duration::from_millis(d.drain_timeout_ms);
    let all = u32::try_from(pipeline).unwrap_or(u32::MAX);
    if tokio::time::timeout(drain, in_flight.acquire_many(all))
        .await
        .is_err()
    {
        let (_, busy) = ctx.handle.load();
        warn!(
            in_flight = busy,
            "drain timed out; those attempts stay started and their leases will expire into unknown"
        );
    }
    let _ = tokio::time::timeout(drain, claims).await;
    let _ = tokio::time::timeout(drain, records).await;
    sweeper.abort();
    reporter.abort();
    partition_gauges.abort();
    ctx.obs.metrics.gauges().set_partitions(&group, []);
    consumer.work.close();
    tokio::task::spawn_blocking(move || consumer.shutdown()).await?;
    ctx.stats.log_totals();
    Ok(())
}

fn parse_intent_id(w: &Work) -> Option<Uuid> {
    let raw = w.key.as_deref().or(w.payload.as_deref())?;
    std::str::from_utf8(raw).ok()?.trim().parse().ok()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "herald".into())
}

/// Finds attempts whose worker died (lease expired) and records them `unknown`.
async fn sweep_loop(ctx: Arc<DeliveryContext>) {
    let every = Duration::from_millis(ctx.config.delivery.sweep_interval_ms);
    loop {
        tokio::time::sleep(every).await;
        match ctx.store.expire_leases(&ctx.policies, 500).await {
            Ok(0) => {}
            Ok(n) => warn!(
                intents = n,
                "expired leases: attempts of dead workers recorded unknown"
            ),
            Err(e) => warn!(error = %e, "lease sweep failed"),
        }
    }
}
