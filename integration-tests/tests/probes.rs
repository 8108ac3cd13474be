//! The admin listener's exposure in a pod: probes and metrics on a listener of their own
//! (`admin.probe_listen`) that serves nothing of the ledger; `/readyz` answered from the
//! background checks instead of a database and Kafka round trip per probe; dead-letter
//! lists bounded; the intent views' outbox lookup indexed.

use std::time::Duration;

use anyhow::Result;
use integration_tests::http::{admin_request, request};
use integration_tests::kafka::{produce, producer};
use integration_tests::{wait_for, TestEnv};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_from_the_background_and_lists_are_bounded() -> Result<()> {
    let env = TestEnv::new("probes", "").await?;
    let herald = env.spawn_roles(
        "ingest",
        "herald",
        &[("HERALD_ADMIN__PROBE_LISTEN", "127.0.0.1:0")],
    )?;
    let (admin, probes) = (herald.admin_addr(WAIT).await?, herald.probe_addr(WAIT).await?);

    // Ready, from a check made in the background: two probes in a row see the same check.
    let first = wait_for("GET /readyz answers 200 on the probe listener", WAIT, || async {
        let (status, r) = request(&probes, "GET", "/readyz", None).await?;
        Ok((status == 200).then_some(r))
    })
    .await?;
    // Two probes in a row may straddle a refresh (every 5 s): then the next two may not.
    let (_, second) = request(&probes, "GET", "/readyz", None).await?;
    let (status, third) = request(&probes, "GET", "/readyz", None).await?;
    assert_eq!(status, 200);
    assert!(first["checked_at"].is_string(), "{first}");
    assert!(
        first["checked_at"] == second["checked_at"] || second["checked_at"] == third["checked_at"],
        "one background check answers several probes: {first} {second} {third}"
    );
    let (status, _) = request(&probes, "GET", "/healthz", None).await?;
    assert_eq!(status, 200);
    let (status, _) = request(&probes, "GET", "/metrics", None).await?;
    assert_eq!(status, 200);
    for path in [
        "/v1/intents?marketplace_id=acme&order_id=1",
        "/v1/dead-letters",
        "/openapi.json",
    ] {
        let (status, _) = request(&probes, "GET", path, None).await?;
        assert_eq!(status, 404, "the probe listener serves {path}");
    }

    // Three dead letters; a list of two says there are more.
    let p = producer()?;
    for n in 0..3 {
        produce(
            &p,
            &env.topic("order-events"),
            Some(format!("poison-{n}").as_bytes()),
            Some(b"{not json"),
            &[],
        )
        .await?;
    }
    wait_for("three dead letters listed", WAIT, || async {
        let (_, list) = admin_request(&admin, "GET", "/v1/dead-letters", None).await?;
        Ok((list["records"].as_array().map(Vec::len) == Some(3)).then_some(()))
    })
    .await?;
    let (status, all) = admin_request(&admin, "GET", "/v1/dead-letters?limit=5000", None).await?;
    assert_eq!((status, all["truncated"].as_bool()), (200, Some(false)), "{all}");
    let (status, two) = admin_request(&admin, "GET", "/v1/dead-letters?limit=2", None).await?;
    assert_eq!(status, 200);
    assert_eq!(two["records"].as_array().map(Vec::len), Some(2), "{two}");
    assert_eq!(two["truncated"], true);

    // The intent views count an intent's outbox rows through an index.
    env.db.batch_execute("SET enable_seqscan = off").await?;
    let plan = env
        .db
        .query(
            "EXPLAIN SELECT count(*) FROM outbox WHERE intent_id = '01a2429a-76a5-7023-8423-496b436004eb'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("outbox_intent_id_idx"), "{plan}");
    drop(herald);
    env.cleanup().await;
    Ok(())
}
