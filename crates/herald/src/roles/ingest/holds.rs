//! The hold sweeper of the ingest role: holds past `ingest.profile_wait_secs` become
//! `suppressed` / `no_seller_profile` (frozen with the payload rendered without a profile
//! when they were held), and open holds whose seller has a profile are released (a profile
//! written by another path than ingest). Every ingest instance runs one; `SKIP LOCKED`
//! gives each its own holds.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_store::IngestTx;
use tracing::{info, warn};

use super::converge::{renderer, IngestContext};
use super::release::{release, Released};

/// Holds decided per round and statement.
const ROUND_LIMIT: i64 = 500;

/// How often the sweeper looks: a fifth of the wait, between 1 and 5 seconds.
pub fn period(wait: Duration) -> Duration {
    (wait / 5).clamp(Duration::from_secs(1), Duration::from_secs(5))
}

/// Sweeps every `period(wait)` until dropped (the role aborts it when it stops). A failed
/// round is logged and the next one tries again: holds stay open meanwhile, nothing is lost.
pub async fn sweep_every(ctx: Arc<IngestContext>, wait: Duration) {
    let mut tick = tokio::time::interval(period(wait));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        loop {
            match round(&ctx).await {
                // A full round: more may be due at once.
                Ok(n) if n as i64 >= ROUND_LIMIT => continue,
                Ok(_) => break,
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "hold sweep failed; trying again next round");
                    break;
                }
            }
        }
    }
}

/// One round in one transaction; returns how many holds it decided.
async fn round(ctx: &IngestContext) -> anyhow::Result<usize> {
    let mut conn = ctx.store.conn().await?;
    let tx = IngestTx::begin(&mut conn).await?;
    let expired = tx.expire_holds(ROUND_LIMIT).await.context("expiring holds")?;
    let held = tx
        .open_holds_with_profile(ROUND_LIMIT)
        .await
        .context("reading held intents with a profile")?;
    let released = if held.is_empty() {
        Released::default()
    } else {
        let renderer = renderer(ctx, &tx).await?;
        release(&tx, &renderer, held).await?
    };
    // Failure policy: a crash before this commit leaves every hold open (the next round, of
    // this instance or another, decides them); after it, only the logs below are lost.
    tx.commit().await.context("committing the hold sweep")?;
    for d in &expired {
        info!(intent_id = %d.intent_id, held_secs = d.held_for.as_secs_f64(), state = %d.state,
              "held intent expired: no seller profile within the wait, frozen without one (no_seller_profile)");
        super::release::count_observed(&ctx.stats, d);
    }
    ctx.stats.holds("expired", expired.len());
    released.report(&ctx.stats, "sweep");
    Ok(expired.len() + released.decided.len() + released.failed.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_period_follows_the_wait_within_bounds() {
        assert_eq!(period(Duration::from_secs(300)), Duration::from_secs(5));
        assert_eq!(period(Duration::from_secs(10)), Duration::from_secs(2));
        assert_eq!(period(Duration::from_secs(2)), Duration::from_secs(1));
    }
}
