//! Log sampling at production volume (`log.routine_sampling_ratio`): routine lines are
//! written for the chosen share of intents, whole (an intent's routine lines are all there
//! or none), and every rare line is written whatever the ratio: conflicts, rejected
//! attempts. Read from Herald's own log and `/metrics`, against the
//! intents in PostgreSQL.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use integration_tests::http::scrape;
use integration_tests::kafka::{produce, producer};
use integration_tests::mixed::{order_id, produce_mix, wait_settled, Mix, UNVERIFIED_SENDER};
use integration_tests::samples::order_event;
use integration_tests::TestEnv;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);
const RATIO: f64 = 0.5;
/// Every order twice (each intent is also reused), the first one also with another total.
const MIX: Mix = Mix {
    orders: 40,
    rejected: 4,
    duplicate_every: 1,
    conflict_every: 40,
};

/// Herald's JSON log lines.
fn lines(log: &str) -> Vec<Value> {
    log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn message(line: &Value) -> &str {
    line["message"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routine_lines_are_sampled_by_intent_and_rare_ones_always_written() -> Result<()> {
    let env = TestEnv::new("logsampling", "").await?;
    let ratio = RATIO.to_string();
    let herald = env.spawn_roles(
        "ingest,relay,deliver",
        "herald",
        &[
            ("HERALD_LOG__ROUTINE_SAMPLING_RATIO", ratio.as_str()),
            UNVERIFIED_SENDER,
        ],
    )?;
    let admin = herald.admin_addr(WAIT).await?;
    produce_mix(&env, MIX).await?;
    wait_settled(&env, MIX, WAIT).await?;
    // A seller whose address is malformed: that suppression is not routine (the SMS one,
    // opted out, is).
    let p = producer()?;
    let profile = json!({"seller_id": "seller-bad", "marketplace_id": "acme", "email": "not-an-address",
        "phone": "+15555550123", "locale": "en", "email_opt_in": true, "sms_opt_in": false, "version": 1});
    let profiles = env.topic("seller-profiles");
    produce(
        &p,
        &profiles,
        Some(b"acme:seller-bad"),
        Some(profile.to_string().as_bytes()),
        &[],
    )
    .await?;
    env.wait_count(
        "the seller stored",
        "SELECT count(*) FROM sellers",
        (MIX.orders + MIX.rejected + 1) as i64,
        WAIT,
    )
    .await?;
    let event = order_event(
        "evt-bad-1",
        "order.created",
        "acme",
        "bad-1",
        "seller-bad",
        "12.00",
    );
    produce(&p, &env.topic("order-events"), Some(b"bad-1"), Some(&event), &[]).await?;
    env.wait_count(
        "both intents suppressed",
        "SELECT count(*) FROM notification_intents WHERE order_id = 'bad-1' AND state = 'suppressed'",
        2,
        WAIT,
    )
    .await?;

    // Each intent's state and consent, and whether its order was produced twice (every acme
    // order of the mix).
    let states: BTreeMap<String, (String, String, bool)> = env
        .db
        .query(
            "SELECT id::text, state, consent, marketplace_id = 'acme' AND order_id <> 'bad-1'
             FROM notification_intents",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    let log = lines(&herald.log());
    let of = |id: &str, what: &str| -> Vec<&Value> {
        log.iter()
            .filter(|l| l["intent_id"].as_str() == Some(id) && message(l).starts_with(what))
            .collect()
    };

    // The lines each intent has when all are written: created, reused (the second copy),
    // attempt started and finished for a sent or rejected one.
    let mut expected_out = 0u64;
    let mut kept = BTreeSet::new();
    let mut not_opted_out = 0;
    for (id, (state, consent, duplicated)) in &states {
        let keep = herald_telemetry::routine_kept(RATIO, id);
        let n = usize::from(keep);
        let created = of(id, "intent created");
        let reused = of(id, "intent reused");
        let started = of(id, "attempt started");
        let finished = of(id, "attempt finished");
        assert_eq!(
            reused.len(),
            n * usize::from(*duplicated),
            "intent {id} (kept: {keep}): the reuse follows the decision"
        );
        assert!(
            reused.iter().all(|l| l["routine"] == true),
            "a reuse is marked routine"
        );
        expected_out += u64::from(!keep && *duplicated);
        match state.as_str() {
            "suppressed" if consent != "opted_out" => {
                // A malformed address: always written, whatever the decision.
                not_opted_out += 1;
                assert_eq!(
                    created.len(),
                    1,
                    "suppressed intent {id} ({consent}): its creation is logged"
                );
                assert_eq!(created[0]["routine"], false);
            }
            "suppressed" => {
                // As for every order of an opted-out seller: routine.
                assert_eq!(
                    created.len(),
                    n,
                    "suppressed intent {id}: created follows the decision"
                );
                assert!(created
                    .iter()
                    .all(|l| l["state"] == "suppressed" && l["routine"] == true));
                expected_out += u64::from(!keep);
            }
            "accepted" => {
                for (what, found) in [
                    ("created", &created),
                    ("started", &started),
                    ("finished", &finished),
                ] {
                    assert_eq!(
                        found.len(),
                        n,
                        "accepted intent {id} (kept: {keep}): {what} lines"
                    );
                    assert!(
                        found.iter().all(|l| l["routine"] == true),
                        "{what} is marked routine"
                    );
                }
                expected_out += 3 * u64::from(!keep);
            }
            "rejected" => {
                assert_eq!(
                    created.len(),
                    n,
                    "rejected intent {id}: created follows the decision"
                );
                assert_eq!(
                    started.len(),
                    n,
                    "rejected intent {id}: a first try's start is routine"
                );
                // The rejection itself is always written.
                assert_eq!(finished.len(), 1, "rejected intent {id}: the rejection is logged");
                assert_eq!(finished[0]["outcome"], "rejected");
                assert_eq!(finished[0]["level"], "WARN");
                expected_out += 2 * u64::from(!keep);
            }
            other => panic!("intent {id} in state {other}"),
        }
        if keep {
            kept.insert(id.clone());
        }
    }
    assert_eq!(not_opted_out, 1, "the malformed address's e-mail intent was seen");
    // The hash splits this world both ways (otherwise the test would prove nothing).
    assert!(
        !kept.is_empty() && kept.len() < states.len(),
        "kept {} of {} intents",
        kept.len(),
        states.len()
    );
    // The conflict names the existing intents (e-mail and SMS) and is written whatever their
    // decision.
    let conflicted: BTreeSet<&str> = log
        .iter()
        .filter(|l| message(l).starts_with("business key reused") && l["level"] == "WARN")
        .filter_map(|l| l["intent_id"].as_str())
        .collect();
    let acme_0: BTreeSet<String> = env
        .db
        .query(
            "SELECT id::text FROM notification_intents WHERE order_id = $1",
            &[&order_id("acme", 0)],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        conflicted,
        acme_0.iter().map(String::as_str).collect(),
        "a conflict line for each intent of the reused key"
    );
    // No routine line of an intent left out got through; the metric counts what was left out.
    let leaked: Vec<&Value> = log
        .iter()
        .filter(|l| l["routine"] == true)
        .filter(|l| l["intent_id"].as_str().is_some_and(|id| !kept.contains(id)))
        .collect();
    assert!(
        leaked.is_empty(),
        "routine lines of unsampled intents: {leaked:#?}"
    );
    let metrics = scrape(&admin).await?;
    let sampled_out: u64 = metrics
        .lines()
        .find(|l| l.starts_with("herald_log_routine_sampled_out_total"))
        .and_then(|l| l.rsplit_once(' '))
        .context("herald_log_routine_sampled_out_total on /metrics")?
        .1
        .parse()?;
    assert_eq!(
        sampled_out, expected_out,
        "lines left out, as counted by the metric"
    );
    drop(herald);
    env.cleanup().await;
    Ok(())
}
