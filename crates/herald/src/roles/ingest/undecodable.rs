//! A record batch librdkafka cannot decode (`herald_kafka::undecodable`): once such errors
//! have been coming for a while, ingest looks for the partition they stall, dead-letters the
//! run of offsets (reason `undecodable`, the offsets and librdkafka's reason in its detail
//! and headers), then moves the consumer past it. Nothing else stops the partition, and
//! nothing is lost: the records stay at their offsets in the source topic.

use herald_core::event::DeadLetterReason;
use herald_kafka::undecodable::Skip;
use herald_kafka::{BatchConsumer, DeadLetter, KafkaSettings, OwnedMessage, Timestamp};
use tracing::{error, warn};

use super::isolate::{produce_dead_letters, Stopped};
use super::IngestContext;
use crate::shutdown::Shutdown;

/// Runs between batches, when every batch handed out so far is durable (so storing a
/// skipped run's end cannot commit past an earlier message that is not).
pub async fn skip_runs(
    ctx: &IngestContext,
    consumer: &BatchConsumer,
    settings: &KafkaSettings,
    shutdown: &mut Shutdown,
) -> Result<(), Stopped> {
    // Probe reads block (each waits for a fetch); on a worker thread of their own.
    let started = std::time::Instant::now();
    let found = tokio::task::block_in_place(|| consumer.find_undecodable(settings));
    let took_ms = started.elapsed().as_millis() as u64;
    let skips = match found {
        Ok(skips) => skips,
        Err(e) => {
            warn!(error = %e, "could not look for the partition an undecodable record batch stalls; trying again at the next errors");
            return Ok(());
        }
    };
    for skip in skips {
        tracing::info!(topic = %skip.topic, partition = skip.partition, reads = skip.reads, took_ms,
            "undecodable run found by probe reads");
        skip_one(ctx, consumer, &skip, shutdown).await?;
    }
    Ok(())
}

async fn skip_one(
    ctx: &IngestContext,
    consumer: &BatchConsumer,
    skip: &Skip,
    shutdown: &mut Shutdown,
) -> Result<(), Stopped> {
    // The run's stand-in: its topic, partition and first offset, no key or value.
    let first = OwnedMessage::new(
        None,
        None,
        skip.topic.clone(),
        Timestamp::NotAvailable,
        skip.partition,
        skip.first_offset,
        None,
    );
    let letter = DeadLetter {
        message: &first,
        reason: DeadLetterReason::Undecodable.as_str(),
        detail: skip.detail(),
        skipped_to: Some(skip.next_offset),
    };
    produce_dead_letters(ctx, &[letter], shutdown).await?;
    // Failure policy: a crash here (the dead letter acknowledged, the consumer not yet past
    // the run) finds the run again after the restart: a second dead letter naming the
    // same offsets, never a skip without one.
    match tokio::task::block_in_place(|| consumer.skip_past(skip)) {
        Ok(()) => error!(topic = %skip.topic, partition = skip.partition, first_offset = skip.first_offset,
            next_offset = skip.next_offset, reason = %skip.reason,
            "record batch librdkafka cannot decode: dead-lettered its offsets and moved past them"),
        Err(e) => warn!(topic = %skip.topic, partition = skip.partition, error = %e,
            "undecodable run dead-lettered but the consumer could not move past it; found again at the next errors"),
    }
    Ok(())
}
