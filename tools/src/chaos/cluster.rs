//! Broker faults of a replicated cluster (issue 41), on the three-node KRaft cluster of
//! `deploy/local/kafka-cluster.sh`: Herald's topics with three replicas and
//! `min.insync.replicas = 2`, its producers idempotent with `acks=all`. While orders flow:
//!
//! - `leader`: the leader of a partition of `order-events` SIGKILLed (in the long version
//!   also the deliveries topic's), and started again once the cluster has moved on;
//! - `paused-broker` (long): a leader frozen (SIGSTOP) past its session timeout, so the
//!   controller fences it and elects new leaders while it cannot tell, then thawed;
//! - `controller` (long): the active KRaft controller (a broker too) SIGKILLed.
//!
//! Every invariant of the other scenarios holds, and progress continues during the fault:
//! the notifications accepted per second while the broker is down (or frozen) are reported
//! beside the rate in as long a window just before it, and a fault during which none was
//! accepted is a violation. The fault windows are inside the production of the plan, so
//! the rate before is the steady rate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::faults::{script, stack};
use super::invariants::Report;
use super::plan::Pacing;
use super::rng::Rng;
use super::scenarios::{Run, Setup};
use super::Scale;
use integration_tests::{use_brokers, BROKERS, CLUSTER_BROKERS};

/// Runs `deploy/local/kafka-cluster.sh ARGS…`; its standard output, trimmed.
pub async fn cluster(args: &[&str]) -> Result<String> {
    Ok(script("kafka-cluster", args).await?.0)
}

/// The test clients on the cluster for as long as it lives, then back on the single broker.
struct OnCluster;

impl OnCluster {
    async fn enter() -> Result<Self> {
        stack("kafka-cluster", "start").await?;
        use_brokers(CLUSTER_BROKERS);
        Ok(Self)
    }
}

impl Drop for OnCluster {
    fn drop(&mut self) {
        use_brokers(BROKERS);
    }
}

/// What each stage has done, counted every 250 ms from PostgreSQL: intents created
/// (ingest), outbox rows waiting (the relay's backlog) and attempts accepted (delivery).
/// The connection is made again after an error or on a node that stopped taking writes:
/// through a failover (`super::postgres`) the URL finds the new primary.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    intents: i64,
    outbox: i64,
    accepted: i64,
}

pub(super) struct Progress {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

/// The counts, and whether the node answering takes writes (a fenced or demoted node
/// answers reads with what it had: the sampler then connects again, to the primary).
const PROGRESS: &str = "SELECT (SELECT count(*) FROM notification_intents),
        (SELECT count(*) FROM outbox),
        (SELECT count(*) FROM notification_attempts WHERE outcome = 'accepted'),
        current_setting('transaction_read_only') = 'off'";

impl Progress {
    pub(super) async fn start(db_url: &str) -> Result<Self> {
        let mut db = Some(integration_tests::pg_connect(db_url).await?);
        let db_url = db_url.to_owned();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let kept = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                if db.is_none() {
                    db = integration_tests::pg_connect(&db_url).await.ok();
                }
                if let Some(client) = &db {
                    match client.query_one(PROGRESS, &[]).await {
                        Ok(row) if !row.get::<_, bool>(3) => db = None,
                        Ok(row) => {
                            let sample = Sample {
                                at: Instant::now(),
                                intents: row.get(0),
                                outbox: row.get(1),
                                accepted: row.get(2),
                            };
                            kept.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
                        }
                        Err(_) => db = None,
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Ok(Self { samples, task })
    }

    /// The samples nearest `from` and `to`.
    fn window(&self, from: Instant, to: Instant) -> Option<(Sample, Sample)> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let at = |t: Instant| {
            samples
                .iter()
                .min_by_key(|s| if s.at > t { s.at - t } else { t - s.at })
                .copied()
        };
        match (at(from), at(to)) {
            (Some(a), Some(b)) if b.at > a.at => Some((a, b)),
            _ => None,
        }
    }

    /// Per second between `from` and `to`: intents created and attempts accepted; and the
    /// most outbox rows waiting at any sample in between.
    fn rates(&self, from: Instant, to: Instant) -> (f64, f64, i64) {
        let Some((a, b)) = self.window(from, to) else {
            return (0.0, 0.0, 0);
        };
        let secs = (b.at - a.at).as_secs_f64();
        let backlog = self
            .samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| s.at >= a.at && s.at <= b.at)
            .map(|s| s.outbox)
            .max()
            .unwrap_or(0);
        (
            (b.intents - a.intents) as f64 / secs,
            (b.accepted - a.accepted) as f64 / secs,
            backlog,
        )
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One fault's window: reports, for as long a window before it and for the fault, the
/// intents created and the notifications accepted per second and the largest outbox
/// backlog; a violation when no notification was accepted during the fault.
pub(super) fn report_window(
    report: &mut Report,
    progress: &Progress,
    name: &str,
    from: Instant,
    to: Instant,
) {
    let length = to - from;
    let (ingest_before, accepted_before, backlog_before) =
        progress.rates(from.checked_sub(length).unwrap_or(from), from);
    let (ingest_during, accepted_during, backlog_during) = progress.rates(from, to);
    report.fig(&format!("{name}_s"), format!("{:.1}", length.as_secs_f64()));
    report.fig(
        &format!("{name}_accepted_per_s"),
        format!("{accepted_before:.1}->{accepted_during:.1}"),
    );
    report.fig(
        &format!("{name}_intents_per_s"),
        format!("{ingest_before:.1}->{ingest_during:.1}"),
    );
    report.fig(
        &format!("{name}_outbox_max"),
        format!("{backlog_before}->{backlog_during}"),
    );
    if accepted_during <= 0.0 {
        report.violation(format!(
            "no notification accepted during {name} ({:.1} s; {accepted_before:.1}/s before it)",
            length.as_secs_f64()
        ));
    }
}

/// The id of the broker leading `topic`'s partition 0 (unprefixed name).
async fn leader_of(run: &Run, topic: &str) -> Result<String> {
    let leader = cluster(&["leader", &run.env.topic(topic), "0"]).await?;
    leader
        .parse::<u32>()
        .with_context(|| format!("leader of {topic}/0: {leader:?}"))?;
    Ok(leader)
}

/// The cluster's world: a namespace on it and the fleet, orders produced over `over`.
/// Herald as production runs it: the consumer session timeout of its defaults (the tests'
/// configuration shortens it), see `herald_kafka::client::DEFAULT_SESSION_TIMEOUT_MS`.
const PRODUCTION_SESSION: (&str, &str) = ("HERALD_KAFKA__CONSUMER_SESSION_TIMEOUT_MS", "45000");

async fn setup(name: &'static str, scale: Scale, rng: &mut Rng) -> Result<(Run, super::fleet::Fleet)> {
    Setup::new(name, scale.pick(300, 1500), 2, 0.05)
        .vars(&[PRODUCTION_SESSION])
        .start(scale, rng, &["ingest", "relay", "deliver", "deliver"])
        .await
}

/// SIGKILL of a partition leader, while orders flow: `order-events`'s (the ingest
/// consumers' and the test's producers'), and in the long version then the deliveries
/// topic's (the relay's producer and the delivery consumers').
pub async fn leader(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let _cluster = OnCluster::enter().await?;
    let (mut run, fleet) = setup("leader", scale, rng).await?;
    let progress = Progress::start(&run.env.db_url).await?;
    let over = Duration::from_secs(scale.pick(45, 120));
    let production = run.produce_paced(over, Pacing::Pipelined);
    let topics: &[&str] = scale.pick(&["order-events"], &["order-events", "herald.deliveries"]);
    let down = Duration::from_secs(scale.pick(12, 20));
    for (i, topic) in topics.iter().enumerate() {
        // A steady rate first (and between two faults).
        tokio::time::sleep(Duration::from_secs(scale.pick(12, 20))).await;
        let node = leader_of(&run, topic).await?;
        let t0 = Instant::now();
        cluster(&["kill", &node]).await?;
        tokio::time::sleep(down + Duration::from_millis(rng.range(0, 3000))).await;
        // Started again; `start-node` waits until it has rejoined.
        cluster(&["start-node", &node]).await?;
        let t1 = Instant::now();
        let moved = leader_of(&run, topic).await.unwrap_or_default();
        run.report
            .fig(&format!("killed_{i}"), format!("{topic}/0@{node}->{moved}"));
        report_window(&mut run.report, &progress, &format!("fault_{i}"), t0, t1);
    }
    run.finish(fleet, production).await
}

/// How long a frozen broker stays frozen: past its session timeout (the broker's
/// `broker.session.timeout.ms`, 9 s), so that the controller fences it and moves its
/// leaders while it cannot tell.
const FROZEN: Duration = Duration::from_secs(20);

/// A broker frozen (SIGSTOP) past its session timeout and thawed (SIGCONT): the deliveries
/// topic's leader, whose clients' connections to it stay open and silent meanwhile.
pub async fn paused_broker(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let _cluster = OnCluster::enter().await?;
    let (mut run, fleet) = setup("paused-broker", scale, rng).await?;
    let progress = Progress::start(&run.env.db_url).await?;
    let production = run.produce_paced(Duration::from_secs(scale.pick(50, 90)), Pacing::Pipelined);
    tokio::time::sleep(Duration::from_secs(scale.pick(12, 20))).await;
    let node = leader_of(&run, "herald.deliveries").await?;
    let t0 = Instant::now();
    cluster(&["pause", &node]).await?;
    tokio::time::sleep(FROZEN + Duration::from_millis(rng.range(0, 3000))).await;
    cluster(&["resume", &node]).await?;
    let t1 = Instant::now();
    let moved = leader_of(&run, "herald.deliveries").await.unwrap_or_default();
    run.report
        .fig("paused", format!("herald.deliveries/0@{node}->{moved}"));
    report_window(&mut run.report, &progress, "pause", t0, t1);
    run.finish(fleet, production).await
}

/// The active KRaft controller SIGKILLed (a broker too: its partitions' leaders move as
/// well), and started again once another controller has taken over.
pub async fn controller(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let _cluster = OnCluster::enter().await?;
    let (mut run, fleet) = setup("controller", scale, rng).await?;
    let progress = Progress::start(&run.env.db_url).await?;
    let production = run.produce_paced(Duration::from_secs(scale.pick(45, 90)), Pacing::Pipelined);
    tokio::time::sleep(Duration::from_secs(scale.pick(12, 20))).await;
    let active = cluster(&["controller"]).await?;
    let t0 = Instant::now();
    cluster(&["kill", &active]).await?;
    let elected =
        integration_tests::wait_for("another active controller", Duration::from_secs(60), || async {
            let now = cluster(&["controller"]).await?;
            Ok((!now.is_empty() && now != active).then_some(now))
        })
        .await?;
    let election = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(10) + Duration::from_millis(rng.range(0, 3000))).await;
    cluster(&["start-node", &active]).await?;
    let t1 = Instant::now();
    run.report.fig("controller", format!("{active}->{elected}"));
    run.report
        .fig("election_s", format!("{:.1}", election.as_secs_f64()));
    report_window(&mut run.report, &progress, "fault", t0, t1);
    run.finish(fleet, production).await
}
