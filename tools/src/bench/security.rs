//! The cost of TLS and SASL, a figure rather than a guess (issue 41): `herald run --roles
//! ingest` and `--roles deliver` through the local broker's SASL_SSL listener (SCRAM-SHA-512,
//! TLS verified against the local CA) against its plaintext listener, the same workload,
//! alternating in one run so that the machine's drift falls on both alike. Each side's
//! rate and Herald's CPU in ms per 1,000 (events for ingest, sends for delivery), and the
//! ratio of each pair of runs beside the ratio of the medians (the pairs show the spread).

use anyhow::Result;

use super::ingest::{self, Workload};
use super::{delivery, Figure};
use integration_tests::secure_kafka::scram_env;
use integration_tests::TestEnv;

/// Delivery's window in the comparison: the production default's (256).
const IN_FLIGHT: usize = 256;

pub struct Comparison {
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

    /// SASL_SSL against plaintext, per figure pair: `(name, ratio of the medians, ratio of
    /// each run to the plaintext run beside it)`.
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

const SIDES: [&str; 2] = ["plaintext", "SASL_SSL (SCRAM-SHA-512)"];

fn pair(what: &str, unit: &'static str, note: &str) -> [Figure; 2] {
    SIDES.map(|side| Figure::new(format!("{what}, {side}"), unit, note))
}

/// `runs` alternations of each side, ingest then delivery.
pub async fn run(
    w: &Workload,
    endpoint: &str,
    delivery_orders: usize,
    runs: usize,
    say: &impl Fn(&str),
) -> Result<Comparison> {
    let sasl: Vec<(&'static str, String)> = scram_env();
    let sasl: Vec<(&str, &str)> = sasl.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sides: [&[(&str, &str)]; 2] = [&[], &sasl];
    let mut c = Comparison {
        ingest: pair("herald ingest", "events/s", "start to lag 0"),
        ingest_cpu: pair("herald ingest CPU", "ms per 1k events", "Herald's process"),
        deliver: pair(
            &format!("herald deliver {IN_FLIGHT}"),
            "sends/s",
            "50 ms provider stand-in",
        ),
        deliver_cpu: pair("herald deliver CPU", "ms per 1k sends", "Herald's process"),
    };
    for n in 0..runs {
        for (i, vars) in sides.iter().enumerate() {
            say(&format!("security: ingest {}, run {}/{runs}", SIDES[i], n + 1));
            let env = TestEnv::new("bench_security_ingest", "").await?;
            ingest::fill(&env, w).await?;
            let r = ingest::herald_with(&env, w, 1, vars).await?;
            c.ingest[i].runs.push(r.rate);
            c.ingest_cpu[i]
                .runs
                .push(r.usage.cpu_seconds / w.events as f64 * 1_000_000.0);
            env.cleanup().await;
        }
        for (i, vars) in sides.iter().enumerate() {
            say(&format!("security: delivery {}, run {}/{runs}", SIDES[i], n + 1));
            let (env, intents) =
                delivery::prepare("bench_security_deliver", endpoint, delivery_orders).await?;
            let (rate, usage) = delivery::herald(&env, intents, IN_FLIGHT, 1, vars).await?;
            c.deliver[i].runs.push(rate);
            c.deliver_cpu[i]
                .runs
                .push(usage.cpu_seconds / intents.max(1) as f64 * 1_000_000.0);
            env.cleanup().await;
        }
    }
    Ok(c)
}
