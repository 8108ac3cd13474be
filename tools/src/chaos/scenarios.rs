//! The scenarios. Each starts its own namespace (database, topics), its own herald
//! processes, produces its plan while injecting its fault, and ends with the invariants.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use tokio::task::JoinHandle;

use super::faults::{rss_mib, stack, Throttler};
use super::fleet::Fleet;
use super::invariants::{check, settle, unsettled, Expect, Report};
use super::plan::{produce_plan, Pacing, Plan, PlanSpec, Production};
use super::rng::Rng;
use super::watch::UnknownWatch;
use super::Scale;
use integration_tests::http::request;
use integration_tests::moto::{send_email_directly, MOTO};
use integration_tests::toxiproxy::Proxy;
use integration_tests::{wait_for, EnvOptions, TestEnv};

pub const ALL: [&str; 18] = [
    "storm",
    "conflicts",
    "sigkill",
    "broker",
    "database",
    "provider",
    "churn",
    "slow",
    "ratelimit",
    "pause",
    "db-outage",
    "hostile",
    "leader",
    "paused-broker",
    "controller",
    "pg-switchover",
    "pg-failover",
    "pg-pooler",
];

/// What a run without names runs: every scenario in the long version; the short version
/// (in `make test`) has one of the three-broker cluster's, `leader`, and one of
/// PostgreSQL's, `pg-switchover`.
pub fn defaults(scale: Scale) -> Vec<&'static str> {
    ALL.iter()
        .copied()
        .filter(|n| {
            scale == Scale::Long
                || !matches!(*n, "paused-broker" | "controller" | "pg-failover" | "pg-pooler")
        })
        .collect()
}

pub async fn run(name: &str, scale: Scale, rng: &mut Rng) -> Result<Report> {
    match name {
        "storm" => storm(scale, rng).await,
        "conflicts" => conflicts(scale, rng).await,
        "sigkill" => sigkill(scale, rng).await,
        "broker" => broker(scale, rng).await,
        "database" => database(scale, rng).await,
        "provider" => provider(scale, rng).await,
        "churn" => churn(scale, rng).await,
        "slow" => slow(scale, rng).await,
        "ratelimit" => ratelimit(scale, rng).await,
        "pause" => pause(scale, rng).await,
        "db-outage" => db_outage(scale, rng).await,
        "hostile" => hostile(scale, rng).await,
        "leader" => super::cluster::leader(scale, rng).await,
        "paused-broker" => super::cluster::paused_broker(scale, rng).await,
        "controller" => super::cluster::controller(scale, rng).await,
        "pg-switchover" => super::postgres::switchover(scale, rng).await,
        "pg-failover" => super::postgres::failover(scale, rng).await,
        "pg-pooler" => super::postgres::pooler(scale, rng).await,
        other => anyhow::bail!("no scenario {other:?}; there are {}", ALL.join(", ")),
    }
}

/// One scenario's world: its namespace, its plan, and its report so far.
pub(super) struct Run {
    pub(super) env: TestEnv,
    plan: Arc<Plan>,
    pub(super) report: Report,
    started: Instant,
    scale: Scale,
    /// What the scenario's configuration promises beyond (a)-(f).
    expect: Expect,
    /// Invariant (h), sampled while the scenario runs.
    watch: UnknownWatch,
    /// Whether `finish` also proves, once, that the checks catch a duplicate.
    canary: bool,
    /// Whether `finish` also proves, once, that (g) and (h) catch what they guard.
    fencing_canary: bool,
    /// A healthy message's (topic, partition, offset): `finish` also proves that (e)
    /// catches a dead letter of valid input, forged for it.
    dead_letter_canary: Option<(String, i32, i64)>,
    /// Whether `finish` checks, from the logs, that every producer put in librdkafka's
    /// fatal state by the failpoint was replaced ([`PRODUCER_FATAL`]).
    producer_fatal: bool,
}

/// How a scenario's world is made: its name, its plan, and its configuration.
pub(super) struct Setup {
    name: &'static str,
    spec: PlanSpec,
    options: EnvOptions,
    extra_toml: &'static str,
    /// `on_unknown` of e-mail and SMS; `None`: both as `options.on_unknown`.
    policies: Option<(&'static str, &'static str)>,
    /// Settings for every process of the scenario.
    vars: Vec<(&'static str, &'static str)>,
    quiet_provider: bool,
}

impl Setup {
    pub(super) fn new(name: &'static str, orders: usize, max_copies: u64, conflict_share: f64) -> Self {
        Self {
            name,
            spec: PlanSpec {
                orders,
                max_copies,
                second_producer_share: 0.3,
                conflict_share,
            },
            options: EnvOptions::default(),
            extra_toml: "",
            policies: None,
            vars: Vec::new(),
            quiet_provider: false,
        }
    }

    /// `on_unknown` of e-mail and of SMS, set on every process of the scenario.
    fn policies(mut self, email: &'static str, sms: &'static str) -> Self {
        self.policies = Some((email, sms));
        self
    }

    /// Settings for every process of the scenario.
    pub(super) fn vars(mut self, vars: &[(&'static str, &'static str)]) -> Self {
        self.vars.extend_from_slice(vars);
        self
    }

    /// The scenario injects no fault that can lose an answer: invariant (i).
    fn quiet_provider(mut self) -> Self {
        self.quiet_provider = true;
        self
    }

    pub(super) fn options(mut self, options: EnvOptions) -> Self {
        self.options = options;
        self
    }

    /// Appends `extra_toml` to the generated configuration.
    fn config(mut self, extra_toml: &'static str) -> Self {
        self.extra_toml = extra_toml;
        self
    }

    /// A fresh namespace whose sellers are stored (by an ingest process of its own) before
    /// any order is produced, and one herald process for each entry of `roles`.
    pub(super) async fn start(
        self,
        scale: Scale,
        rng: &mut Rng,
        roles: &[&'static str],
    ) -> Result<(Run, Fleet)> {
        let (email, sms) = self
            .policies
            .unwrap_or((self.options.on_unknown, self.options.on_unknown));
        let expect = Expect {
            on_unknown: vec![("email", email), ("sms", sms)],
            // The test configuration's default.
            max_attempts: 5,
            quiet_provider: self.quiet_provider,
            refused: Vec::new(),
        };
        let mut vars = self.vars.clone();
        vars.extend([
            ("HERALD_CHANNELS__EMAIL__ON_UNKNOWN", email),
            ("HERALD_CHANNELS__SMS__ON_UNKNOWN", sms),
        ]);
        let env = TestEnv::with_options(
            &format!("chaos_{}", self.name.replace('-', "_")),
            self.extra_toml,
            self.options,
        )
        .await?;
        let watch = UnknownWatch::start(env.db_url.clone());
        let plan = Arc::new(Plan::new(&self.spec, rng));
        let mut seeder = env.spawn_roles("ingest", "seed-sellers", &[])?;
        plan.seed_sellers(&env).await?;
        seeder.terminate(Duration::from_secs(30)).await?;
        let mut report = Report::new(self.name);
        report.fig("events", plan.events());
        report.fig("duplicates", plan.duplicates());
        let mut fleet = Fleet::new(&env);
        fleet.set_common(&vars);
        for r in roles {
            fleet.spawn(r, &[])?;
        }
        fleet.wait_started().await?;
        let run = Run {
            env,
            plan,
            report,
            started: Instant::now(),
            scale,
            expect,
            watch,
            canary: false,
            fencing_canary: false,
            dead_letter_canary: None,
            producer_fatal: false,
        };
        Ok((run, fleet))
    }
}

impl Run {
    /// Proves the checks can fail: one e-mail sent to the provider behind Herald's back
    /// must come out as exactly one unexplained duplicate, naming its intent.
    async fn canary(&mut self) -> Result<()> {
        // An e-mail intent sent once and accepted, with no `unknown` attempt to explain more.
        let db = integration_tests::pg_connect(&self.env.db_url).await?;
        let row = db
            .query_one(
                "SELECT order_id FROM notification_intents i
                  WHERE channel = 'email' AND state = 'accepted' AND NOT EXISTS
                        (SELECT 1 FROM notification_attempts a WHERE a.intent_id = i.id AND a.outcome = 'unknown')
                  LIMIT 1",
                &[],
            )
            .await?;
        let order: String = row.get(0);
        let n = self
            .plan
            .orders
            .iter()
            .position(|o| *o == order)
            .context("canary order")?;
        let to = &self.plan.sellers[Plan::seller_of(n)].email;
        send_email_directly(to, &format!("New order {order} on acme")).await?;
        let mut probe = Report::new("canary");
        check(&self.env, &self.plan, &self.expect, &mut probe).await?;
        // (c) twice, naming the intent; (i), where the scenario promises it, counts the send.
        let per_intent: Vec<&String> = probe
            .violations
            .iter()
            .filter(|v| !v.starts_with("(i) "))
            .collect();
        let named = per_intent.len() == 2
            && per_intent.iter().all(|v| v.contains(&format!("({order}/email,")))
            && probe
                .line()
                .contains("unexplained_duplicate_sends=1 unbacked_sends=1 ");
        if named {
            self.report.fig("canary", "caught");
        } else {
            self.report.fig("canary", "missed");
            self.report.violation(format!(
                "the checks missed an extra e-mail for {order}: {} / {:?}",
                probe.line(),
                probe.violations
            ));
        }
        Ok(())
    }

    /// Proves (h) and (g) can fail. An accepted attempt is recorded `unknown` and then
    /// rewritten to `accepted` (what Herald did before its evidence was append-only): the
    /// watch must see the `unknown` attempts fall, once. An intent of a `retry` channel is
    /// put in `unknown` with attempts left: (g) must name it. Both are put back.
    async fn fencing_canary(&mut self) -> Result<()> {
        let channel = self
            .expect
            .on_unknown
            .iter()
            .find(|(_, p)| *p == "retry")
            .map(|(c, _)| *c)
            .context("the fencing canary needs a channel under the retry policy")?;
        let db = integration_tests::pg_connect(&self.env.db_url).await?;
        let row = db
            .query_one(
                "SELECT a.id, a.started_at, i.id, i.order_id FROM notification_attempts a
                   JOIN notification_intents i ON i.id = a.intent_id
                  WHERE i.channel = $1 AND i.state = 'accepted' AND a.outcome = 'accepted'
                  LIMIT 1",
                &[&channel],
            )
            .await?;
        let (attempt, started, intent, order): (
            uuid::Uuid,
            chrono::DateTime<chrono::Utc>,
            uuid::Uuid,
            String,
        ) = (row.get(0), row.get(1), row.get(2), row.get(3));
        let set_outcome = "UPDATE notification_attempts SET outcome = $3 WHERE id = $1 AND started_at = $2";
        self.watch.take_falls();
        db.execute(set_outcome, &[&attempt, &started, &"unknown"]).await?;
        self.watch.two_more_samples().await?;
        db.execute(set_outcome, &[&attempt, &started, &"accepted"])
            .await?;
        self.watch.two_more_samples().await?;
        let falls = self.watch.take_falls();
        let set_state = "UPDATE notification_intents SET state = $2 WHERE id = $1";
        db.execute(set_state, &[&intent, &"unknown"]).await?;
        let mut probe = Report::new("canary");
        check(&self.env, &self.plan, &self.expect, &mut probe).await?;
        db.execute(set_state, &[&intent, &"accepted"]).await?;
        let g_caught = probe
            .violations
            .iter()
            .any(|v| v.starts_with("(g)") && v.contains(&format!("({order}/{channel},")));
        for (name, caught, detail) in [
            ("canary_h", falls.len() == 1, format!("{falls:?}")),
            ("canary_g", g_caught, format!("{:?}", probe.violations)),
        ] {
            self.report.fig(name, if caught { "caught" } else { "missed" });
            if !caught {
                self.report
                    .violation(format!("{name}: the check missed its canary: {detail}"));
            }
        }
        Ok(())
    }

    /// Proves (e) can fail: a dead letter forged for a healthy message (as if Herald had
    /// refused valid input) must come out as exactly one violation naming its offset.
    async fn dead_letter_canary(&mut self, (topic, partition, offset): (String, i32, i64)) -> Result<()> {
        use herald_kafka::headers::*;
        let (p, o) = (partition.to_string(), offset.to_string());
        integration_tests::kafka::produce(
            &integration_tests::kafka::producer()?,
            &self.env.topic("herald.dead-letter"),
            None,
            Some(b"canary"),
            &[
                (DLQ_REASON, "invalid_value"),
                (DLQ_DETAIL, "canary: forged by herald-chaos"),
                (DLQ_SOURCE_TOPIC, &topic),
                (DLQ_SOURCE_PARTITION, &p),
                (DLQ_SOURCE_OFFSET, &o),
            ],
        )
        .await?;
        let mut probe = Report::new("canary");
        check(&self.env, &self.plan, &self.expect, &mut probe).await?;
        let named = format!("{topic}[{partition}]@{offset}");
        let caught = probe.violations.len() == 1
            && probe.violations[0].starts_with("(e) valid input dead-lettered: 1: ")
            && probe.violations[0].contains(&named);
        self.report
            .fig("canary_e", if caught { "caught" } else { "missed" });
        if !caught {
            self.report.violation(format!(
                "canary_e: the checks missed a dead letter of valid input {named}: {:?}",
                probe.violations
            ));
        }
        Ok(())
    }

    /// Starts producing the plan, spread over `over`, each slice waiting for its
    /// acknowledgements.
    pub(super) fn produce(&self, over: Duration) -> JoinHandle<Result<Production>> {
        self.produce_paced(over, Pacing::SliceBySlice)
    }

    /// Starts producing the plan, spread over `over`, paced as `pacing` says.
    pub(super) fn produce_paced(&self, over: Duration, pacing: Pacing) -> JoinHandle<Result<Production>> {
        tokio::spawn(produce_plan(
            self.plan.clone(),
            self.env.topic("order-events"),
            self.env.topic("seller-profiles"),
            over,
            pacing,
        ))
    }

    /// Waits for the run to settle, checks the invariants, and adds the fleet's findings.
    /// The namespace is dropped when nothing was found; kept (and named) otherwise.
    pub(super) async fn finish(
        self,
        fleet: Fleet,
        production: JoinHandle<Result<Production>>,
    ) -> Result<Report> {
        let produced = production.await.context("production task")??;
        self.finish_produced(fleet, produced).await
    }

    /// [`Run::finish`], once the plan was produced.
    async fn finish_produced(mut self, fleet: Fleet, produced: Production) -> Result<Report> {
        anyhow::ensure!(produced.messages + produced.conflicts == self.plan.events());
        let mut fleet = fleet;
        let timeout = Duration::from_secs(self.scale.pick(180, 600));
        // With every process gone there is nothing to wait for: check what is there.
        fleet.note_exits();
        let settled = !fleet.members.is_empty() && settle(&self.env, &self.plan, timeout).await?;
        check(&self.env, &self.plan, &self.expect, &mut self.report).await?;
        if self.canary && self.report.violations.is_empty() {
            self.canary().await?;
        }
        if self.fencing_canary && self.report.violations.is_empty() {
            self.fencing_canary().await?;
        }
        if let Some(source) = self.dead_letter_canary.clone() {
            if self.report.violations.is_empty() {
                self.dead_letter_canary(source).await?;
            }
        }
        // (h) The unknown attempts never fell while the scenario ran.
        let (samples, falls) = self.watch.stop();
        self.report.fig("unknown_samples", samples);
        for f in falls {
            self.report.violation(format!("(h) {f}"));
        }
        fleet.note_exits();
        for f in &fleet.failures {
            self.report.violation(format!("herald process: {f}"));
        }
        if !settled {
            let clues = unsettled(&self.env)
                .await
                .unwrap_or_else(|e| format!("(no clues: {e:#})"));
            self.report.violation(format!(
                "the run did not settle within {timeout:?}; left behind: {clues}"
            ));
        }
        if self.producer_fatal {
            // Every fatal state the failpoint raised was met by a replacement (a genuine
            // fatal state, from the broker's restart, adds a replacement of its own).
            let (mut raised, mut renewals) = (0, 0);
            for m in &fleet.members {
                let [r, n] = m.process.count_in_log([
                    "failpoint relay-producer-fatal: producer put in librdkafka's fatal state",
                    "fatal state: replaced by a new client",
                ])?;
                raised += r;
                renewals += n;
            }
            self.report.fig("producer_fatal", raised);
            self.report.fig("producer_renewals", renewals);
            if renewals < raised {
                self.report.violation(format!(
                    "producers put in librdkafka's fatal state {raised} times, replaced {renewals} times"
                ));
            }
        }
        self.report.fig("secs", self.started.elapsed().as_secs());
        drop(fleet);
        let report = self.report;
        if report.violations.is_empty() && std::env::var_os("HERALD_CHAOS_KEEP").is_none() {
            self.env.cleanup().await;
        } else {
            let e = &self.env;
            println!(
                "  kept for inspection: database {}, logs {}",
                e.database,
                e.dir.display()
            );
        }
        Ok(report)
    }
}

/// A toxiproxy proxy in front of moto named after the scenario, with a `latency` (ms)
/// toxic on the answers when given, and the options that point herald at it.
async fn provider_behind_proxy(
    scenario: &str,
    rng: &mut Rng,
    latency: Option<u64>,
    on_unknown: &'static str,
) -> Result<(Proxy, EnvOptions)> {
    let proxy = Proxy::create(&format!("chaos-{scenario}-{:08x}", rng.next_u64() as u32), MOTO).await?;
    if let Some(ms) = latency {
        proxy
            .add_toxic("slow", "latency", "downstream", json!({"latency": ms}))
            .await?;
    }
    let options = EnvOptions {
        aws_endpoint: Some(proxy.url()),
        on_unknown,
        ..EnvOptions::default()
    };
    Ok((proxy, options))
}

/// Every order event produced 1–5 times, a share of the copies by a second producer, two
/// ingest instances: each business key must converge into one intent, sent once.
async fn storm(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let roles = ["ingest", "ingest", "relay", "deliver"];
    let (mut run, fleet) = Setup::new("storm", scale.pick(400, 5000), 5, 0.0)
        .start(scale, rng, &roles)
        .await?;
    run.canary = true;
    let production = run.produce(Duration::from_secs(scale.pick(8, 60)));
    run.finish(fleet, production).await
}

/// A share of the keys re-sent later with changed content, from either producer: each is
/// recorded as a conflict against the intent, and the intent keeps its first content.
async fn conflicts(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let roles = ["ingest", "ingest", "relay", "deliver"];
    let (run, fleet) = Setup::new("conflicts", scale.pick(300, 3000), 2, 0.1)
        .start(scale, rng, &roles)
        .await?;
    let production = run.produce(Duration::from_secs(scale.pick(8, 60)));
    run.finish(fleet, production).await
}

/// A dead consumer holds its partitions until its session times out (Herald's default is
/// 10 s); the scenarios that kill consumers often shorten it as an SRE would, to the
/// broker's minimum.
const FAST_FAILOVER: &str = "[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n";

/// The named failpoints, each parking a share of the passes until the process is killed:
/// a SIGKILL then lands just before or right after the database commit (an ingest
/// transaction parked open, its row and seller locks held), the publish, the claim, the
/// send or the record.
const FAILPOINTS: [(&str, &str); 3] = [
    (
        "ingest",
        "ingest-before-db-commit=2%sleep(600000);ingest-after-db-commit=3%sleep(600000)",
    ),
    ("relay", "relay-after-publish=3%sleep(600000)"),
    (
        "deliver",
        "deliver-after-claim=1%sleep(600000);deliver-after-send=1%sleep(600000);deliver-after-record=1%sleep(600000)",
    ),
];

/// Ingest, relay and delivery processes SIGKILLed at random moments, many times in one
/// run, while their failpoints park some of them right after a commit point; each is
/// replaced at once. Afterwards the fleet restarts without failpoints and settles.
async fn sigkill(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let (mut run, mut fleet) = Setup::new("sigkill", scale.pick(300, 2000), 2, 0.05)
        .config(FAST_FAILOVER)
        .start(scale, rng, &[])
        .await?;
    for (roles, failpoints) in FAILPOINTS.iter().chain(FAILPOINTS.iter()) {
        fleet.spawn(roles, &[("FAILPOINTS", failpoints)])?;
    }
    fleet.wait_started().await?;
    // A kill every few seconds: often enough to land in the middle of work, rarely enough
    // that the group's rebalances complete in between and the replacements get work.
    let production = run.produce(Duration::from_secs(scale.pick(30, 150)));
    while !production.is_finished() {
        tokio::time::sleep(Duration::from_millis(rng.range(1500, 4000))).await;
        fleet.kill_and_replace(rng)?;
    }
    fleet.restart_clean()?;
    run.report.fig("kills", fleet.kills);
    run.finish(fleet, production).await
}

/// The relay's producer put in librdkafka's fatal state, as a broker restart can leave an
/// idempotent producer (sequence numbers out of step with the broker's): in a tenth of its
/// rounds, at most three times. Each time the client must be replaced (checked from the
/// logs), or its rows stay in the outbox for good (a run that does not settle).
const PRODUCER_FATAL: &str = "relay-producer-fatal=10%3*return";

/// The broker stopped and started mid-run (twice in the long version): producers wait,
/// consumers reconnect, nothing is lost or sent twice. The relay's producer also meets
/// librdkafka's fatal state now and then ([`PRODUCER_FATAL`]).
async fn broker(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let roles = ["ingest", "deliver", "deliver"];
    let (mut run, mut fleet) = Setup::new("broker", scale.pick(300, 2000), 2, 0.05)
        .start(scale, rng, &roles)
        .await?;
    fleet.spawn("relay", &[("FAILPOINTS", PRODUCER_FATAL)])?;
    fleet.wait_started().await?;
    let over = Duration::from_secs(scale.pick(20, 90));
    let production = run.produce(over);
    let restarts = scale.pick(1, 2);
    let mut down = Duration::ZERO;
    for _ in 0..restarts {
        tokio::time::sleep(over / (restarts + 1)).await;
        let t = Instant::now();
        stack("kafka", "stop").await?;
        tokio::time::sleep(Duration::from_secs(rng.range(3, scale.pick(6, 20)))).await;
        stack("kafka", "start").await?;
        down += t.elapsed();
    }
    run.report.fig("broker_restarts", restarts);
    run.report.fig("broker_down_s", down.as_secs());
    run.producer_fatal = true;
    run.finish(fleet, production).await
}

/// The longest a database outage is stretched waiting for every process to say
/// not-ready: readiness is refreshed every 5 s, with a 3 s timeout per check.
const OUTAGE_MAX: Duration = Duration::from_secs(30);

/// PostgreSQL stopped (fast shutdown) and started mid-run: every herald process says
/// not-ready on `/readyz` meanwhile, and is ready again afterwards without a restart.
async fn database(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let roles = ["ingest", "relay", "deliver"];
    let (mut run, fleet) = Setup::new("database", scale.pick(300, 2000), 2, 0.05)
        .start(scale, rng, &roles)
        .await?;
    let addrs = fleet.admin_addrs().await?;
    let pids = fleet.pids();
    let over = Duration::from_secs(scale.pick(20, 90));
    let production = run.produce(over);
    let restarts = scale.pick(1, 2);
    // Whether each process said not-ready in every outage.
    let (mut not_ready_seen, mut recovery) = (vec![true; addrs.len()], Duration::ZERO);
    for _ in 0..restarts {
        tokio::time::sleep(over / (restarts + 1)).await;
        stack("postgres", "stop").await?;
        let outage = Duration::from_secs(rng.range(4, scale.pick(8, 20)));
        let t = Instant::now();
        // Down for `outage`, and past it until every process has said not-ready in this
        // outage, for at most OUTAGE_MAX: readiness is refreshed every 5 s, so an outage of
        // 4 s could end before any process looked (seen once in CI, 2026-12-05). One that
        // never says it is a violation below.
        let mut seen_now = vec![false; addrs.len()];
        while t.elapsed() < outage || (seen_now.contains(&false) && t.elapsed() < OUTAGE_MAX) {
            for (i, addr) in addrs.iter().enumerate() {
                if readyz(addr).await == Some(503) {
                    seen_now[i] = true;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for (every, now) in not_ready_seen.iter_mut().zip(&seen_now) {
            *every &= *now;
        }
        stack("postgres", "start").await?;
        let t = Instant::now();
        let ready = wait_for(
            "every herald process ready again",
            Duration::from_secs(90),
            || async {
                for addr in &addrs {
                    if readyz(addr).await != Some(200) {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
        .await;
        if let Err(e) = ready {
            run.report.violation(format!("{e:#}"));
        }
        recovery = recovery.max(t.elapsed());
    }
    let seen = not_ready_seen.iter().filter(|s| **s).count();
    run.report.fig("db_restarts", restarts);
    run.report
        .fig("not_ready_seen", format!("{seen}/{}", addrs.len()));
    run.report
        .fig("ready_again_s", format!("{:.1}", recovery.as_secs_f64()));
    if seen != addrs.len() {
        run.report.violation(format!(
            "only {seen} of {} processes reported not-ready while PostgreSQL was down",
            addrs.len()
        ));
    }
    if fleet.pids() != pids {
        run.report
            .violation("a herald process was restarted or lost during the outage");
    }
    run.finish(fleet, production).await
}

/// The status of a process's `/readyz`; `None` when it does not answer.
async fn readyz(addr: &str) -> Option<u16> {
    request(addr, "GET", "/readyz", None)
        .await
        .ok()
        .map(|(status, _)| status)
}

/// Provider faults through toxiproxy and a throttling forwarder, in turns while orders
/// flow: latency spikes, responses held past the attempt timeout (the request arrived),
/// connections reset, responses cut after the request arrived, connections refused, and
/// throttling answers. `unknown` outcomes are retried here, so the sends that follow
/// them show up as the explained duplicates.
async fn provider(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let throttler = Throttler::start(MOTO).await?;
    let proxy = Proxy::create(
        &format!("chaos-provider-{:08x}", rng.next_u64() as u32),
        &throttler.addr,
    )
    .await?;
    let options = EnvOptions {
        aws_endpoint: Some(proxy.url()),
        on_unknown: "retry",
        ..EnvOptions::default()
    };
    let (mut run, fleet) = Setup::new("provider", scale.pick(200, 1500), 2, 0.0)
        .options(options)
        .start(scale, rng, &["ingest,relay", "deliver", "deliver"])
        .await?;
    // Twice the attempt timeout (PROVIDER_BUDGET), so held responses time out; and
    // orders flow through every fault of the cycle (twice in the long version).
    let hold = Duration::from_secs(scale.pick(8, 10));
    let production = run.produce((hold + Duration::from_secs(1)) * 6 * scale.pick(1, 2));
    // Every fault in turn, from a random one, until the production ends (at least once each).
    let (first, mut phases) = (rng.range(0, 5), 0);
    while phases < 6 || !production.is_finished() {
        let fault = (first + phases) % 6;
        match fault {
            0 => {
                proxy
                    .add_toxic(
                        "fault",
                        "latency",
                        "downstream",
                        json!({"latency": 800, "jitter": 400}),
                    )
                    .await?
            }
            1 => proxy.delay_responses().await?,
            2 => {
                proxy
                    .add_toxic("fault", "reset_peer", "upstream", json!({"timeout": 0}))
                    .await?
            }
            3 => {
                proxy
                    .add_toxic("fault", "limit_data", "downstream", json!({"bytes": 12}))
                    .await?
            }
            4 => proxy.set_enabled(false).await?,
            _ => throttler.throttle(0.5),
        }
        tokio::time::sleep(hold).await;
        match fault {
            1 => proxy.remove_toxic("slow-responses").await?,
            4 => proxy.set_enabled(true).await?,
            5 => throttler.throttle(0.0),
            _ => proxy.remove_toxic("fault").await?,
        }
        phases += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    run.report.fig("fault_phases", phases);
    run.report.fig(
        "throttled_answers",
        throttler.throttled.load(std::sync::atomic::Ordering::Relaxed),
    );
    let report = run.finish(fleet, production).await;
    proxy.delete().await?;
    report
}

/// Delivery instances joining and leaving every few seconds (most on SIGTERM, some
/// SIGKILLed) while orders flow: rebalances revoke partitions mid-flight.
async fn churn(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let (mut run, mut fleet) = Setup::new("churn", scale.pick(300, 2000), 2, 0.05)
        .config(FAST_FAILOVER)
        .start(scale, rng, &["ingest,relay", "deliver", "deliver"])
        .await?;
    let production = run.produce(Duration::from_secs(scale.pick(20, 120)));
    let mut joins = 0;
    while !production.is_finished() {
        tokio::time::sleep(Duration::from_millis(rng.range(1500, 3500))).await;
        let n = fleet.count("deliver");
        if n <= 1 || (n < 3 && rng.chance(0.5)) {
            fleet.spawn("deliver", &[])?;
            joins += 1;
        } else {
            let graceful = rng.chance(0.75);
            fleet.leave("deliver", rng, graceful).await?;
        }
    }
    run.report.fig("joins", joins);
    run.report.fig("graceful_leaves", fleet.graceful_leaves);
    run.report.fig("kills", fleet.kills);
    run.finish(fleet, production).await
}

/// RSS above which the slow-provider scenario fails.
const RSS_LIMIT_MIB: f64 = 256.0;

/// A provider answering after a second, a small in-flight limit and a backlog many times
/// the delivery window: the window stays full, and the process's memory must not grow
/// with the backlog (RSS sampled every 200 ms).
async fn slow(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let (proxy, options) = provider_behind_proxy("slow", rng, None, "hold").await?;
    let (mut run, mut fleet) = Setup::new("slow", scale.pick(1500, 5000), 1, 0.0)
        .options(options)
        .start(scale, rng, &["ingest,relay"])
        .await?;
    proxy
        .add_toxic("slow", "latency", "downstream", json!({"latency": 1000}))
        .await?;
    fleet.spawn("deliver", &[("HERALD_DELIVERY__MAX_IN_FLIGHT", "16")])?;
    fleet.wait_started().await?;
    let deliver_pid = fleet.pids()[1].context("delivery process")?;
    let addr = fleet.admin_addrs().await?[1].clone();
    let production = run.produce(Duration::from_secs(3));
    let window = Duration::from_secs(scale.pick(20, 90));
    let (t, mut first, mut peak, mut in_flight_max) = (Instant::now(), None, 0f64, 0i64);
    while t.elapsed() < window {
        let rss = rss_mib(deliver_pid)?;
        first.get_or_insert(rss);
        peak = peak.max(rss);
        in_flight_max = in_flight_max.max(in_flight(&addr).await.unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let backlog = integration_tests::kafka::committed_lag(
        &run.env.group("herald-delivery"),
        &[&run.env.topic("herald.deliveries")],
    )?;
    proxy.remove_toxic("slow").await?;
    run.report.fig("backlog_at_end_of_window", backlog);
    run.report.fig("in_flight_max", in_flight_max);
    run.report
        .fig("rss_first_mib", format!("{:.0}", first.unwrap_or(0.0)));
    run.report.fig("rss_peak_mib", format!("{peak:.0}"));
    if peak > RSS_LIMIT_MIB {
        run.report.violation(format!(
            "delivery RSS peaked at {peak:.0} MiB (limit {RSS_LIMIT_MIB} MiB)"
        ));
    }
    if in_flight_max < 16 {
        run.report.violation(format!(
            "the in-flight window never filled (at most {in_flight_max} of 16): the scenario did not test what it says"
        ));
    }
    let report = run.finish(fleet, production).await;
    proxy.delete().await?;
    report
}

/// `herald_deliveries_in_flight` of a process, from its `/metrics`.
async fn in_flight(addr: &str) -> Result<i64> {
    integration_tests::http::scrape(addr)
        .await?
        .lines()
        .find(|l| l.starts_with("herald_deliveries_in_flight"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as i64)
        .context("no herald_deliveries_in_flight in /metrics")
}

/// An SES sandbox account as it is: e-mail limited to 2 sends a second, 64 requests in
/// flight, `retry` after an unknown outcome, and a backlog of e-mails that takes many
/// leases to drain. Each channel claims only what its rate sends within a lease, so no
/// lease runs out before its send, and with no fault that could lose an answer, every
/// send at the provider is one accepted attempt (i).
async fn ratelimit(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let (mut run, fleet) = Setup::new("ratelimit", scale.pick(60, 150), 4, 0.0)
        .policies("retry", "hold")
        .vars(&[
            ("HERALD_CHANNELS__EMAIL__RATE_PER_SECOND", "2"),
            ("HERALD_DELIVERY__MAX_IN_FLIGHT", "64"),
        ])
        .quiet_provider()
        .start(scale, rng, &["ingest,relay,deliver"])
        .await?;
    run.canary = true;
    run.fencing_canary = true;
    let production = run.produce(Duration::from_secs(scale.pick(5, 10)));
    run.finish(fleet, production).await
}

/// The time a paused process must stay paused to outlive its lease: the lease, two sweeps
/// and a margin (the test configuration sweeps every 500 ms).
const PAST_THE_LEASE: Duration = Duration::from_secs(15 + 5);

/// A delivery process frozen (SIGSTOP) while it has attempts in flight, for longer than
/// its lease, then thawed (SIGCONT): the process pause of Jepsen's tests, or a VM frozen
/// by its host. The other process's sweeper records the frozen attempts `unknown` and
/// their intents move on; the thawed process must send nothing on its expired leases and
/// may only add its late outcomes beside the `unknown`s.
async fn pause(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let (proxy, options) = provider_behind_proxy("pause", rng, Some(500), "hold").await?;
    let (mut run, fleet) = Setup::new("pause", scale.pick(300, 1500), 2, 0.05)
        .options(options)
        .config(FAST_FAILOVER)
        .policies("retry", "hold")
        .vars(&[("HERALD_CHANNELS__EMAIL__RATE_PER_SECOND", "8")])
        .start(scale, rng, &["ingest,relay", "deliver", "deliver"])
        .await?;
    let addrs = fleet.admin_addrs().await?;
    let over = Duration::from_secs(scale.pick(30, 90));
    let production = run.produce(over);
    let pauses = scale.pick(1, 2);
    let mut in_flight_at_pause = Vec::new();
    for n in 0..pauses {
        tokio::time::sleep(over / (pauses as u32 + 2)).await;
        // One delivery process, then the other; frozen while it has requests out.
        let member = 1 + n % 2;
        let busy = requests_out(&addrs[member..=member]).await?;
        fleet.signal(member, "STOP")?;
        tokio::time::sleep(PAST_THE_LEASE + Duration::from_secs(scale.pick(0, 10))).await;
        fleet.signal(member, "CONT")?;
        in_flight_at_pause.push(busy);
    }
    run.report.fig("pauses", pauses);
    run.report
        .fig("in_flight_at_pause", format!("{in_flight_at_pause:?}"));
    let report = run.finish(fleet, production).await;
    proxy.delete().await?;
    report
}

/// Waits (up to 20 s) until one of the processes at `addrs` has attempts in flight; returns
/// how many it had.
async fn requests_out(addrs: &[String]) -> Result<i64> {
    wait_for("attempts in flight", Duration::from_secs(20), || async {
        for addr in addrs {
            let n = in_flight(addr).await.unwrap_or(0);
            if n > 0 {
                return Ok(Some(n));
            }
        }
        Ok(None)
    })
    .await
}

/// PostgreSQL stopped for longer than a lease while requests are at the provider: the
/// sends finish, their records wait; when PostgreSQL is back, sweepers and late records
/// race. Evidence must stay append-only and every send explained.
async fn db_outage(scale: Scale, rng: &mut Rng) -> Result<Report> {
    let (proxy, options) = provider_behind_proxy("dbout", rng, Some(300), "hold").await?;
    let (mut run, fleet) = Setup::new("db-outage", scale.pick(300, 1500), 2, 0.05)
        .options(options)
        .policies("retry", "hold")
        .start(scale, rng, &["ingest,relay", "deliver", "deliver"])
        .await?;
    let addrs = fleet.admin_addrs().await?;
    let over = Duration::from_secs(scale.pick(30, 90));
    let production = run.produce(over);
    let outages = scale.pick(1, 2);
    let mut down = Duration::ZERO;
    for _ in 0..outages {
        tokio::time::sleep(over / (outages as u32 + 2)).await;
        requests_out(&addrs[1..]).await?;
        let t = Instant::now();
        stack("postgres", "stop").await?;
        tokio::time::sleep(PAST_THE_LEASE + Duration::from_secs(scale.pick(0, 10))).await;
        stack("postgres", "start").await?;
        down += t.elapsed();
    }
    run.report.fig("db_outages", outages);
    run.report.fig("db_down_s", down.as_secs());
    let report = run.finish(fleet, production).await;
    proxy.delete().await?;
    report
}

/// The most batch retries the `hostile` scenario tolerates in a run: it injects no
/// transient fault, and a permanent error must be isolated, not retried.
const MAX_BATCH_RETRIES: f64 = 3.0;

/// Mutations of valid order events and seller profiles ([`super::hostile`]: bytes that are
/// not UTF-8, truncations, U+0000 and other control characters, lone surrogate escapes,
/// numbers beyond f64, deep nesting, wrong types, ids and values over the limits, some
/// beyond the dead-letter topic's own `max.message.bytes`), interleaved with healthy
/// orders and profiles on the same keys. Beyond (a)-(f): every mutation is dead-lettered
/// with its reason (e), the ingest group's lag returns to 0 within a bound once the
/// stream stops (j), no batch is retried more than [`MAX_BATCH_RETRIES`] times (k), and no
/// herald process restarts (l).
async fn hostile(scale: Scale, rng: &mut Rng) -> Result<Report> {
    use super::hostile::{produce_stream, HostileStream, DEAD_LETTER_TOPIC_LIMIT, MAX_MESSAGE_BYTES_SETTING};
    let options = EnvOptions {
        topic_configs: vec![(
            "herald.dead-letter",
            "max.message.bytes",
            DEAD_LETTER_TOPIC_LIMIT.to_string(),
        )],
        ..EnvOptions::default()
    };
    let (mut run, mut fleet) = Setup::new("hostile", scale.pick(100, 1500), 2, 0.0)
        .options(options)
        .vars(&[MAX_MESSAGE_BYTES_SETTING])
        .start(scale, rng, &["ingest", "relay", "deliver"])
        .await?;
    let plan = Arc::get_mut(&mut run.plan).context("the plan is not shared before production")?;
    let stream = HostileStream::new(plan, rng);
    run.report.fig("refused_produced", stream.refused());
    run.report.fig("padded_orders", stream.padded_orders);
    let addrs = fleet.admin_addrs().await?;
    let pids = fleet.pids();
    let produced = produce_stream(&run.env, &stream, Duration::from_secs(scale.pick(8, 60))).await?;

    // (j) Nothing holds a partition: the lag is gone soon after the stream stops.
    let bound = Duration::from_secs(scale.pick(60, 120));
    let (group, topics) = (
        run.env.group("herald-ingest"),
        [run.env.topic("order-events"), run.env.topic("seller-profiles")],
    );
    let lag = || integration_tests::kafka::committed_lag(&group, &[&topics[0], &topics[1]]);
    let t = Instant::now();
    let drained = wait_for("the ingest lag to return to 0", bound, || async {
        Ok((lag()? == 0).then_some(()))
    })
    .await;
    run.report
        .fig("ingest_lag0_s", format!("{:.1}", t.elapsed().as_secs_f64()));
    if drained.is_err() {
        run.report.violation(format!(
            "(j) the ingest group is still {} behind {bound:?} after the stream stopped",
            lag()?
        ));
    }

    // (k) Batches retried, by the metric and by the log.
    let metrics = integration_tests::http::scrape(&addrs[0]).await?;
    let retried = metric_sum(&metrics, "herald_batches_retried_total", "stage=\"ingest\"");
    let isolated = metric_sum(&metrics, "herald_ingest_messages_isolated_total", "");
    let logged = fleet.members[0]
        .process
        .log()
        .lines()
        .filter(|l| l.contains("retrying"))
        .count() as f64;
    run.report.fig("batches_retried", retried);
    run.report.fig("retries_logged", logged);
    run.report.fig("isolated", isolated);
    if retried.max(logged) > MAX_BATCH_RETRIES {
        run.report.violation(format!(
            "(k) ingest batches retried {} times (metric {retried}, log {logged}), at most {MAX_BATCH_RETRIES} \
             allowed; last: {}",
            retried.max(logged),
            fleet.members[0]
                .process
                .log()
                .lines()
                .rfind(|l| l.contains("retrying"))
                .unwrap_or("-")
        ));
    }

    // (l) No herald process restarted.
    fleet.note_exits();
    if fleet.pids() != pids {
        run.report
            .violation("(l) a herald process exited or was replaced during the stream");
    }

    // Healthy profile re-emissions on the mutated keys were applied.
    let db = integration_tests::pg_connect(&run.env.db_url).await?;
    let stored: std::collections::BTreeMap<String, (i64, Option<String>)> = db
        .query("SELECT seller_id, version, email FROM sellers", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    for (i, version) in stream.seller_versions.iter().enumerate() {
        let id = Plan::seller_id(i);
        let expected = (*version, Some(run.plan.sellers[i].email.clone()));
        if stored.get(&id) != Some(&expected) {
            run.report.violation(format!(
                "(e) seller {id}: stored {:?}, the newest healthy profile is {expected:?}",
                stored.get(&id)
            ));
        }
    }

    run.dead_letter_canary = produced.healthy.first().cloned();
    run.expect.refused = produced.refused;
    let production = Production {
        messages: run.plan.messages.len(),
        conflicts: 0,
    };
    run.finish_produced(fleet, production).await
}

/// The sum of a metric's series whose labels contain `label` (any when empty) in a
/// Prometheus text scrape; 0 when it has none.
fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
                && l.contains(label)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, v| sum + v)
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    #[test]
    fn a_metric_is_summed_over_its_series_with_the_label_asked_for() {
        let text = "# TYPE herald_batches_retried_total counter
herald_batches_retried_total{class=\"connection\",stage=\"ingest\"} 2
herald_batches_retried_total{class=\"timeout\",stage=\"ingest\"} 1
herald_batches_retried_total{class=\"connection\",stage=\"relay\"} 5
herald_batches_retried_total_other 9
";
        assert_eq!(
            metric_sum(text, "herald_batches_retried_total", "stage=\"ingest\""),
            3.0
        );
        assert_eq!(metric_sum(text, "herald_batches_retried_total", ""), 8.0);
        assert_eq!(
            metric_sum(text, "herald_batches_retried", ""),
            0.0,
            "a whole name only"
        );
    }
}
