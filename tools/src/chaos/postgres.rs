//! PostgreSQL as production runs it (issue 42), while orders flow:
//!
//! - `pg-switchover`: on the primary/standby pair of `deploy/local/postgres-ha.sh`, the
//!   primary fenced read-only (`default_transaction_read_only` and a reload: Herald's
//!   pooled connections stay, and their writes fail with 25006), the standby promoted, the
//!   old node still first in Herald's URL;
//! - `pg-failover` (long): the primary SIGKILLed and the synchronous standby promoted;
//! - `pg-pooler` (long): the stack's PostgreSQL behind PgBouncer in transaction mode
//!   (`database.pooler = "transaction"`, a direct session URL for LISTEN), PgBouncer
//!   restarted once (every client connection closed).
//!
//! Every invariant of the other scenarios holds on the node that is primary at the end
//! (the checks connect through the same two-host URL). Reported: the rate during the fault
//! beside the rate before it, and for the pair, the time from the promotion to the first
//! intent committed on the new primary and to the first attempt accepted there.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};

use super::cluster::{report_window, Progress};
use super::faults::script;
use super::invariants::Report;
use super::plan::Pacing;
use super::rng::Rng;
use super::scenarios::{Run, Setup};
use super::Scale;
use integration_tests::{pg_connect, wait_for, Database, EnvOptions, HA_PORTS};

/// The window whose rate is reported for a fault, from its start.
const WINDOW: Duration = Duration::from_secs(5);

async fn pair(args: &[&str]) -> Result<()> {
    script("postgres-ha", args).await.map(|_| ())
}

async fn setup(
    name: &'static str,
    database: Database,
    scale: Scale,
    rng: &mut Rng,
) -> Result<(Run, super::fleet::Fleet)> {
    Setup::new(name, scale.pick(300, 1500), 2, 0.05)
        .options(EnvOptions {
            database,
            ..EnvOptions::default()
        })
        .start(scale, rng, &["ingest", "relay", "deliver", "deliver"])
        .await
}

/// The promoted node's clock when its promotion had finished.
async fn promoted(node: &str) -> Result<DateTime<Utc>> {
    pair(&["promote", node]).await?;
    let db = pg_connect(&format!("postgres://postgres@127.0.0.1:{}/postgres", HA_PORTS[1])).await?;
    Ok(db.query_one("SELECT clock_timestamp()", &[]).await?.get(0))
}

/// From the promotion (on the promoted node's clock) to the first intent committed there
/// and the first attempt accepted there, in seconds, waiting up to a minute for both.
async fn after_promotion(run: &mut Run, at: DateTime<Utc>) -> Result<()> {
    let url = run.env.db_url.clone();
    let (intent, accepted): (f64, f64) = wait_for("work on the new primary", Duration::from_secs(60), || {
        let url = url.clone();
        async move {
            let db = pg_connect(&url).await?;
            let row = db
                .query_one(
                    "SELECT extract(epoch FROM (SELECT min(created_at) FROM notification_intents WHERE created_at > $1) - $1)::float8,
                            extract(epoch FROM (SELECT min(finished_at) FROM notification_attempts
                                                 WHERE outcome = 'accepted' AND finished_at > $1) - $1)::float8",
                    &[&at],
                )
                .await?;
            Ok(match (row.get::<_, Option<f64>>(0), row.get::<_, Option<f64>>(1)) {
                (Some(i), Some(a)) => Some((i, a)),
                _ => None,
            })
        }
    })
    .await
    .context("nothing committed on the promoted node within a minute")?;
    run.report
        .fig("promotion_to_first_intent_s", format!("{intent:.2}"));
    run.report
        .fig("promotion_to_first_accepted_s", format!("{accepted:.2}"));
    Ok(())
}

/// How node a stops being the primary before node b is promoted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Fenced read-only, Herald's connections left on it (a switchover).
    Fenced,
    /// SIGKILLed (a failover).
    Crashed,
}

/// The pair made again, orders flowing, node a lost as `loss` says, node b promoted.
async fn promotion(name: &'static str, loss: Loss, scale: Scale, rng: &mut Rng) -> Result<Report> {
    pair(&["reset"]).await?;
    let (mut run, fleet) = setup(name, Database::HighlyAvailable, scale, rng).await?;
    let progress = Progress::start(&run.env.db_url).await?;
    let production = run.produce_paced(Duration::from_secs(scale.pick(40, 90)), Pacing::Pipelined);
    tokio::time::sleep(Duration::from_secs(scale.pick(12, 20))).await;
    let t0 = Instant::now();
    match loss {
        // Between the fence and the promotion no node takes writes: what an orderly
        // switchover costs, whatever the client.
        Loss::Fenced => pair(&["fence", "a"]).await?,
        Loss::Crashed => {
            pair(&["crash", "a"]).await?;
            // What an HA manager takes to decide (Patroni's loop is 10 s): a moment here.
            tokio::time::sleep(Duration::from_millis(rng.range(500, 3000))).await;
        }
    }
    let at = promoted("b").await?;
    run.report.fig(
        "loss_to_promotion_s",
        format!("{:.1}", t0.elapsed().as_secs_f64()),
    );
    after_promotion(&mut run, at).await?;
    // The rate is sampled every 250 ms: a window of a few seconds from the loss, however
    // quick the promotion and the first commit after it were.
    tokio::time::sleep_until((t0 + WINDOW).into()).await;
    report_window(&mut run.report, &progress, "fault", t0, Instant::now());
    let report = run.finish(fleet, production).await;
    pair(&["reset"]).await?;
    report
}

/// The primary fenced read-only with Herald's connections on it, then the standby promoted.
pub async fn switchover(scale: Scale, rng: &mut Rng) -> Result<Report> {
    promotion("pg-switchover", Loss::Fenced, scale, rng).await
}

/// The primary SIGKILLed under load, the synchronous standby promoted.
pub async fn failover(scale: Scale, rng: &mut Rng) -> Result<Report> {
    promotion("pg-failover", Loss::Crashed, scale, rng).await
}

/// Through PgBouncer in transaction mode, PgBouncer restarted once.
pub async fn pooler(scale: Scale, rng: &mut Rng) -> Result<Report> {
    script("pgbouncer", &["start"]).await?;
    let database = Database::PgBouncer {
        pooler: "transaction",
        session: true,
    };
    let (mut run, fleet) = setup("pg-pooler", database, scale, rng).await?;
    let progress = Progress::start(&run.env.db_url).await?;
    let production = run.produce_paced(Duration::from_secs(scale.pick(40, 90)), Pacing::Pipelined);
    tokio::time::sleep(Duration::from_secs(scale.pick(12, 20))).await;
    let t0 = Instant::now();
    script("pgbouncer", &["restart"]).await?;
    // As long as a few relay rounds and delivery batches after the restart.
    tokio::time::sleep_until((t0 + WINDOW).into()).await;
    report_window(&mut run.report, &progress, "restart", t0, Instant::now());
    run.finish(fleet, production).await
}
