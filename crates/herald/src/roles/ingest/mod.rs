//! The ingest role: consumer group `herald-ingest` on `order-events` and
//! `seller-profiles`. One poll batch = one PostgreSQL transaction (more while a permanent
//! failure is narrowed down, see `isolate`); the batch's offsets are stored only after its
//! work committed and its dead letters were acknowledged.
//!
//! Stages: `classify` (decode and route, pure), `plan` (render, pure), `converge` (the
//! transaction and what follows its commit), `isolate` (retries and bisection). Orders
//! whose seller has no profile yet are held: `release` renders them when the profile
//! arrives, `holds` expires them after the wait.

mod classify;
mod converge;
mod head;
mod holds;
mod isolate;
mod plan;
mod release;
mod stats;
mod undecodable;

use std::sync::Arc;
use std::time::Duration;

use herald_kafka::ingest::positions_after;
use herald_kafka::{BatchConsumer, DeadLetterProducer};
use herald_store::Store;
use tracing::{info, warn};

use crate::config::Config;
use crate::obs::Obs;
use crate::shutdown::Shutdown;
pub use classify::{Origin, Routed};
pub use converge::{plan_orders, renderer, report_convergence, IngestContext};
pub use head::HeadOfLine;
pub use plan::Unrendered;
pub use stats::IngestStats;

/// How long shutdown waits for HTTP ingest's open requests and connections.
const HTTP_DRAIN: Duration = Duration::from_secs(15);

pub async fn run(config: Arc<Config>, store: Store, mut shutdown: Shutdown, obs: Obs) -> anyhow::Result<()> {
    let group = config.group(&config.ingest.group_id);
    let order_topic = config.topic(&config.kafka.topics.order_events);
    let seller_topic = config.topic(&config.kafka.topics.seller_profiles);
    let settings = config.kafka_settings();
    let consumer = BatchConsumer::subscribe(
        &settings,
        &group,
        &[&order_topic, &seller_topic],
        config.ingest.prefetch_max_kbytes,
    )?;
    let dead_letters =
        DeadLetterProducer::new(&settings, &config.topic(&config.kafka.topics.dead_letter), &group)?;
    let stats = Arc::new(IngestStats::new(obs.metrics.clone()));
    let head = head::HeadOfLine::default();
    let partition_gauges = tokio::spawn(crate::gauges::watch_partitions(
        obs.metrics.clone(),
        group.clone(),
        consumer.lag().clone(),
        crate::gauges::Pending::Ingest(head.clone()),
    ));
    let ctx = Arc::new(IngestContext {
        config: config.clone(),
        store,
        dead_letters,
        seller_topic,
        order_topic,
        group: group.clone(),
        stats: stats.clone(),
        obs,
    });
    let sweeper = config
        .ingest
        .profile_wait()
        .map(|wait| tokio::spawn(holds::sweep_every(ctx.clone(), wait)));
    let http = match config.http_ingest.listen.is_empty() {
        true => None,
        false => Some(crate::roles::http_ingest::start(ctx.clone(), shutdown.clone()).await?),
    };
    let reporter = tokio::spawn(stats::report_every(stats.clone(), Duration::from_secs(10)));
    info!(group = %group, "ingest consuming");

    let max = config.ingest.batch_max_messages;
    let linger = Duration::from_millis(config.ingest.batch_linger_ms);
    'poll: loop {
        // A batch librdkafka cannot decode stalls its partition until it is skipped.
        if consumer.undecodable_due()
            && undecodable::skip_runs(&ctx, &consumer, &settings, &mut shutdown)
                .await
                .is_err()
        {
            break 'poll;
        }
        let batch = tokio::select! {
            _ = shutdown.requested() => break 'poll,
            b = consumer.next_batch(max, config.ingest.batch_max_bytes, linger) => b,
        };
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "consumer error; polling again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        // Until its work is durable: transient failures retried, permanent ones isolated.
        // Its offsets stay unstored meanwhile, so a crash or shutdown here replays it,
        // which converges.
        head.begin(&batch);
        if isolate::ingest_batch(&ctx, &batch, &mut shutdown).await.is_err() {
            break 'poll;
        }
        // Failure policy: a crash between the commit in `ingest_batch` and here loses only
        // the offset store; the batch is read again and converges on the same intents.
        fail::fail_point!("ingest-after-db-commit");
        consumer.store(&positions_after(&batch));
        head.done(&batch);
    }

    info!("ingest draining: committing stored offsets");
    if let Err(e) = consumer.commit_stored() {
        warn!(error = %e, "final offset commit failed; the last batches will be replayed and converge");
    }
    if let Some(mut http) = http {
        // Requests in flight finish (graceful shutdown), for a while: each commits or rolls
        // back whole, so one cut off by the deadline loses nothing (its client retries).
        match tokio::time::timeout(HTTP_DRAIN, &mut http).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %format!("{e:#}"), "HTTP ingest stopped with an error"),
            Ok(Err(e)) => warn!(error = %e, "HTTP ingest task failed"),
            Err(_) => {
                warn!(
                    "HTTP ingest requests still open after {} s; closing them",
                    HTTP_DRAIN.as_secs()
                );
                http.abort();
            }
        }
    }
    consumer.unsubscribe();
    reporter.abort();
    partition_gauges.abort();
    if let Some(s) = sweeper {
        s.abort();
    }
    ctx.obs.metrics.gauges().set_partitions(&group, []);
    stats.log_totals();
    Ok(())
}
