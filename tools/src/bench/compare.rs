//! Two ways of running Herald against each other, a figure rather than a guess: the same
//! workload through `herald run --roles ingest` and `--roles deliver`, alternating the two
//! sides in one run so that the machine's drift falls on both alike. Each side's rate and
//! Herald's CPU in ms per 1,000 (events for ingest, sends for delivery), and the ratio of
//! each pair of runs beside the ratio of the medians (the pairs show the spread). The
//! sides: [`super::security`] (SASL_SSL against plaintext Kafka), [`super::pooler`]
//! (PgBouncer in transaction mode against a direct PostgreSQL).

use anyhow::Result;

use super::ingest::{self, Workload};
use super::{delivery, Figure};
use integration_tests::TestEnv;

/// Delivery's window in the comparison: the production default's (256).
const IN_FLIGHT: usize = 256;

/// What is compared: the two sides' names (the first is the reference), the name of the
/// namespaces, and the settings of the second side's Herald process for a namespace.
pub struct Sides {
    pub names: [&'static str; 2],
    pub namespace: &'static str,
    pub second: fn(&TestEnv) -> Vec<(&'static str, String)>,
    /// Starts what the second side needs beyond the stack (a no-op when it runs).
    pub prepare: fn() -> Result<()>,
}

pub struct Comparison {
    pub names: [&'static str; 2],
    pub ingest: [Figure; 2],
    pub ingest_cpu: [Figure; 2],
    pub deliver: [Figure; 2],
    pub deliver_cpu: [Figure; 2],
}

impl Comparison {
    pub fn figures(&self) -> Vec<&Figure> {
        [&self.ingest, &self.ingest_cpu, &self.deliver, &self.deliver_cpu]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The second side against the first, per figure pair: `(name, ratio of the medians,
    /// ratio of each run to the first side's run beside it)`.
    pub fn ratios(&self) -> Vec<(&'static str, f64, Vec<f64>)> {
        let ratio = |pair: &[Figure; 2]| {
            let paired = pair[1]
                .runs
                .iter()
                .zip(&pair[0].runs)
                .map(|(s, p)| s / p)
                .collect();
            (pair[1].median() / pair[0].median(), paired)
        };
        [
            ("ingest rate", &self.ingest),
            ("ingest CPU per event", &self.ingest_cpu),
            ("delivery rate", &self.deliver),
            ("delivery CPU per send", &self.deliver_cpu),
        ]
        .into_iter()
        .map(|(what, pair)| {
            let (median, paired) = ratio(pair);
            (what, median, paired)
        })
        .collect()
    }
}

/// `runs` alternations of each side, ingest then delivery.
pub async fn run(
    sides: &Sides,
    w: &Workload,
    endpoint: &str,
    delivery_orders: usize,
    runs: usize,
    say: &impl Fn(&str),
) -> Result<Comparison> {
    (sides.prepare)()?;
    let pair = |what: &str, unit: &'static str, note: &str| -> [Figure; 2] {
        sides
            .names
            .map(|side| Figure::new(format!("{what}, {side}"), unit, note))
    };
    let mut c = Comparison {
        names: sides.names,
        ingest: pair("herald ingest", "events/s", "start to lag 0"),
        ingest_cpu: pair("herald ingest CPU", "ms per 1k events", "Herald's process"),
        deliver: pair(
            &format!("herald deliver {IN_FLIGHT}"),
            "sends/s",
            "50 ms provider stand-in",
        ),
        deliver_cpu: pair("herald deliver CPU", "ms per 1k sends", "Herald's process"),
    };
    let vars_of = |i: usize, env: &TestEnv| if i == 0 { Vec::new() } else { (sides.second)(env) };
    for n in 0..runs {
        for (i, name) in sides.names.iter().enumerate() {
            say(&format!(
                "{}: ingest {name}, run {}/{runs}",
                sides.namespace,
                n + 1
            ));
            let env = TestEnv::new(&format!("bench_{}_ingest", sides.namespace), "").await?;
            ingest::fill(&env, w).await?;
            let vars = vars_of(i, &env);
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let r = ingest::herald_with(&env, w, 1, &vars).await?;
            c.ingest[i].runs.push(r.rate);
            c.ingest_cpu[i]
                .runs
                .push(r.usage.cpu_seconds / w.events as f64 * 1_000_000.0);
            env.cleanup().await;
        }
        for (i, name) in sides.names.iter().enumerate() {
            say(&format!(
                "{}: delivery {name}, run {}/{runs}",
                sides.namespace,
                n + 1
            ));
            let (env, intents) = delivery::prepare(
                &format!("bench_{}_deliver", sides.namespace),
                endpoint,
                delivery_orders,
            )
            .await?;
            let vars = vars_of(i, &env);
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (rate, usage) = delivery::herald(&env, intents, IN_FLIGHT, 1, &vars).await?;
            c.deliver[i].runs.push(rate);
            c.deliver_cpu[i]
                .runs
                .push(usage.cpu_seconds / intents.max(1) as f64 * 1_000_000.0);
            env.cleanup().await;
        }
    }
    Ok(c)
}
