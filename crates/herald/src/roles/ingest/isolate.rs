//! Runs a poll batch to completion without letting any input stall it: a transient failure
//! is retried (the retry helper); a permanent one splits the batch in halves, and halves
//! again, until the message at fault stands alone and is dead-lettered with what refused
//! it. The rest commits, in order, and the caller stores the batch's offsets.
//!
//! Parts are converged in input order (left half first), so a seller profile and an order
//! behind it keep their order. Each part is its own transaction: a crash between two parts
//! replays the batch, where the committed parts converge as duplicates and their dead
//! letters are produced again (dead letters are at least once).

use std::time::Duration;

use herald_core::event::DeadLetterReason;
use herald_core::ErrorClass;
use herald_kafka::{DeadLetter, Message, OwnedMessage};
use herald_store::StoreError;
use tracing::warn;

use super::classify::dead_letter;
use super::IngestContext;
use crate::retrying::{always, class_of, run_with_retries, GaveUp, Schedule, Stage};
use crate::shutdown::Shutdown;

/// Shutdown was requested before the batch's work was durable: its offsets must not be
/// stored (the next owner replays it).
pub struct Stopped;

pub async fn ingest_batch(
    ctx: &IngestContext,
    batch: &[OwnedMessage],
    shutdown: &mut Shutdown,
) -> Result<(), Stopped> {
    let schedule = Schedule::new(
        Duration::from_millis(100),
        Duration::from_millis(ctx.config.ingest.retry_backoff_max_ms),
    );
    let stage = Stage {
        name: "ingest",
        metrics: &ctx.obs.metrics,
    };
    // Parts still to converge, the next one last.
    let mut parts = vec![batch];
    while let Some(part) = parts.pop() {
        let converged = run_with_retries(
            stage,
            || super::converge::converge(ctx, part),
            class_of,
            schedule,
            Some(&mut *shutdown),
        )
        .await;
        let poison = match converged {
            Ok(poison) => poison,
            Err(GaveUp::Shutdown) => return Err(Stopped),
            Err(GaveUp::Permanent(e, class)) => match part {
                [message] => vec![refused(ctx, message, &e, class)],
                _ => {
                    let (left, right) = part.split_at(part.len() / 2);
                    warn!(messages = part.len(), class = class.label(), error = %format!("{e:#}"),
                          first_offset = part[0].offset(), "batch refused permanently: bisecting to find the message at fault");
                    parts.push(right);
                    parts.push(left);
                    continue;
                }
            },
        };
        produce_dead_letters(ctx, &poison, shutdown).await?;
    }
    ctx.stats.batch_done(batch.len());
    Ok(())
}

/// The dead letter of a message that failed permanently on its own.
fn refused<'m>(
    ctx: &IngestContext,
    m: &'m OwnedMessage,
    e: &anyhow::Error,
    class: ErrorClass,
) -> DeadLetter<'m> {
    let sqlstate = e
        .chain()
        .find_map(|c| c.downcast_ref::<StoreError>())
        .and_then(StoreError::sqlstate)
        .unwrap_or("none");
    ctx.stats.message_isolated(class.label());
    warn!(topic = m.topic(), partition = m.partition(), offset = m.offset(), class = class.label(), sqlstate,
          error = %format!("{e:#}"), "message refused permanently on its own: dead-lettering it");
    dead_letter(
        m,
        DeadLetterReason::StoreRejected,
        format!("SQLSTATE {sqlstate} ({}): {e:#}", class.label()),
    )
}

/// Produces `poison` to the dead-letter topic, waiting for every acknowledgement. The
/// producer falls back to a bounded prefix, then to headers only, for a record the topic
/// refuses whole; what still fails is the environment's doing (the broker down), and is
/// retried: the offsets behind these messages are not stored until they are on record.
pub(super) async fn produce_dead_letters(
    ctx: &IngestContext,
    poison: &[DeadLetter<'_>],
    shutdown: &mut Shutdown,
) -> Result<(), Stopped> {
    if poison.is_empty() {
        return Ok(());
    }
    for p in poison {
        warn!(reason = p.reason, detail = %p.detail, topic = p.message.topic(), partition = p.message.partition(),
              offset = p.message.offset(), "dead-lettering message");
    }
    let stage = Stage {
        name: "dead_letter",
        metrics: &ctx.obs.metrics,
    };
    let schedule = Schedule::new(
        Duration::from_millis(100),
        Duration::from_millis(ctx.config.ingest.retry_backoff_max_ms),
    );
    // Letters not yet acknowledged; each try produces only these (taken out for the try,
    // the failed ones put back).
    let pending = std::sync::Mutex::new(poison.iter().collect::<Vec<&DeadLetter<'_>>>());
    let take = || std::mem::take(&mut *pending.lock().unwrap_or_else(|e| e.into_inner()));
    let sent = run_with_retries(
        stage,
        || async {
            let letters = take();
            let results = ctx.dead_letters.send_each(&letters).await;
            let mut first_error = None;
            let mut left = Vec::new();
            for (letter, result) in letters.into_iter().zip(results) {
                if let Err(e) = result {
                    left.push(letter);
                    first_error.get_or_insert(e);
                }
            }
            let unacknowledged = left.len();
            *pending.lock().unwrap_or_else(|e| e.into_inner()) = left;
            match first_error {
                None => Ok(()),
                Some(e) => Err(anyhow::Error::from(e)
                    .context(format!("{unacknowledged} dead letter(s) not acknowledged"))),
            }
        },
        always(class_of),
        schedule,
        Some(shutdown),
    )
    .await;
    if sent.is_err() {
        return Err(Stopped);
    }
    ctx.stats.dead_lettered(poison.iter().map(|p| p.reason));
    Ok(())
}
