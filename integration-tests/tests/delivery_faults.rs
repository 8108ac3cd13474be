//! Delivery under provider faults (toxiproxy between herald and moto) and crashes
//! (failpoints, then SIGKILL): every attempt ends with an honest outcome, and the only
//! duplicate sends are the ones the ledger shows after an `unknown`.

use std::time::Duration;

use anyhow::Result;
use integration_tests::kafka::committed_lag;
use integration_tests::moto::{emails_to, sms_to};
use integration_tests::samples::UniqueSeller;
use integration_tests::toxiproxy::Proxy;
use integration_tests::{seed_orders, wait_for, TestEnv};

const WAIT: Duration = Duration::from_secs(90);

async fn env_behind_proxy(name: &str, on_unknown: &'static str) -> Result<(TestEnv, Proxy)> {
    TestEnv::behind_proxy(name, "", on_unknown).await
}

/// (outcome, after_unknown, error_category) of the attempts of one channel's intent.
async fn attempts(env: &TestEnv, channel: &str) -> Result<Vec<(String, bool, Option<String>)>> {
    Ok(env
        .db
        .query(
            "SELECT a.outcome, a.after_unknown, a.error_category FROM notification_attempts a
             JOIN notification_intents i ON i.id = a.intent_id WHERE i.channel = $1 ORDER BY a.attempt_no",
            &[&channel],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// An attempt whose request reached the provider but whose answer never came back: the
/// proxy holds the response until the attempt times out, or passes on the provider's close.
fn assert_unknown_after_send(a: &(String, bool, Option<String>)) {
    assert_eq!((a.0.as_str(), a.1), ("unknown", false), "{a:?}");
    assert!(
        matches!(a.2.as_deref(), Some("timeout" | "connection_broken")),
        "category says the outcome was not observed: {a:?}"
    );
}

async fn wait_state(env: &TestEnv, channel: &str, state: &str) -> Result<()> {
    env.wait_count(
        &format!("{channel} intent {state}"),
        &format!(
            "SELECT count(*) FROM notification_intents WHERE channel = '{channel}' AND state = '{state}'"
        ),
        1,
        WAIT,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_the_request_arrived_is_unknown_and_held_until_an_operator_resolves_it() -> Result<()>
{
    let (env, proxy) = env_behind_proxy("unknownhold", "hold").await?;
    proxy.delay_responses().await?;
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["8101"]).await?;
    wait_state(&env, "email", "unknown").await?;
    wait_state(&env, "sms", "unknown").await?;
    assert_eq!(
        attempts(&env, "email").await?,
        vec![("unknown".into(), false, Some("timeout".into()))]
    );
    assert_eq!(
        emails_to(&seller.email).await?.len(),
        1,
        "the request did reach the provider"
    );
    assert_eq!(sms_to(&seller.phone).await?.len(), 1);

    // The provider is reachable again; held intents stay held until an operator decides.
    proxy.remove_toxic("slow-responses").await?;
    env.herald(&[
        "intent",
        "resolve",
        "acme",
        "8101",
        "order.created",
        "email",
        "--as",
        "retry",
        "--reason",
        "SES shows no delivery for the first message-id",
    ])?;
    env.herald(&[
        "intent",
        "resolve",
        "acme",
        "8101",
        "order.created",
        "sms",
        "--as",
        "accepted",
        "--reason",
        "seller confirmed receipt",
        "--operator",
        "oncall",
    ])?;
    wait_state(&env, "email", "accepted").await?;
    wait_state(&env, "sms", "accepted").await?;
    let email = attempts(&env, "email").await?;
    assert_eq!(email.len(), 2);
    assert_eq!(
        email[1],
        ("accepted".into(), true, None),
        "the send after an unknown is flagged"
    );
    assert_eq!(
        attempts(&env, "sms").await?.len(),
        1,
        "resolved as accepted: not sent again"
    );
    assert_eq!(
        emails_to(&seller.email).await?.len(),
        2,
        "the second e-mail is the one the ledger explains"
    );
    assert_eq!(sms_to(&seller.phone).await?.len(), 1);
    assert_eq!(
        env.count("SELECT count(*) FROM intent_resolutions WHERE reason <> ''")
            .await?,
        2
    );
    let refused = env.herald_output(&[
        "intent",
        "resolve",
        "acme",
        "8101",
        "order.created",
        "sms",
        "--as",
        "retry",
        "--reason",
        "x",
    ])?;
    assert!(!refused.status.success(), "only unknown intents can be resolved");
    proxy.delete().await?;
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_retry_policy_the_send_after_an_unknown_is_flagged() -> Result<()> {
    let (env, proxy) = env_behind_proxy("unknownretry", "retry").await?;
    proxy.delay_responses().await?;
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["8201"]).await?;
    wait_for("a first unknown e-mail attempt", WAIT, || async {
        Ok(attempts(&env, "email")
            .await?
            .iter()
            .any(|a| a.0 == "unknown")
            .then_some(()))
    })
    .await?;
    proxy.remove_toxic("slow-responses").await?;
    wait_state(&env, "email", "accepted").await?;
    let email = attempts(&env, "email").await?;
    assert_unknown_after_send(&email[0]);
    assert!(
        email[1..].iter().all(|a| a.1),
        "every attempt after the unknown is flagged: {email:?}"
    );
    assert_eq!(email.last().unwrap().0, "accepted");
    assert_eq!(email.iter().filter(|a| a.0 == "accepted").count(), 1);
    assert_eq!(
        emails_to(&seller.email).await?.len(),
        email.len(),
        "each attempt reached the provider; every duplicate follows an unknown in the ledger"
    );
    proxy.delete().await?;
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retryable_backs_off_and_is_sent_once_the_provider_is_back() -> Result<()> {
    let (env, proxy) = env_behind_proxy("refused", "hold").await?;
    proxy.set_enabled(false).await?;
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["8301"]).await?;
    // A retry is scheduled in the database, after a backoff, with its own outbox row.
    let backoff_ok = wait_for("a retry scheduled after a refused connection", WAIT, || async {
        let row = env
            .db
            .query_opt(
                "SELECT i.next_attempt_at > a.finished_at FROM notification_intents i
                 JOIN notification_attempts a ON a.intent_id = i.id
                 WHERE i.channel = 'email' AND i.state = 'retry_scheduled' AND a.outcome = 'retryable'
                   AND a.error_category = 'connect_failed' AND a.attempt_no = i.attempt_count",
                &[],
            )
            .await?;
        Ok(row.map(|r| r.get::<_, bool>(0)))
    })
    .await?;
    assert!(
        backoff_ok,
        "the next attempt is due after the failed one finished"
    );
    proxy.set_enabled(true).await?;
    wait_state(&env, "email", "accepted").await?;
    wait_state(&env, "sms", "accepted").await?;
    let email = attempts(&env, "email").await?;
    assert!(email.len() >= 2);
    assert!(
        email[..email.len() - 1]
            .iter()
            .all(|a| a.0 == "retryable" && !a.1),
        "{email:?}"
    );
    assert_eq!(email.last().unwrap().0, "accepted");
    assert_eq!(
        emails_to(&seller.email).await?.len(),
        1,
        "refused connections sent nothing"
    );
    proxy.delete().await?;
    env.cleanup().await;
    Ok(())
}

/// How a test knows the process reached its failpoint.
#[derive(Clone, Copy)]
enum Reached {
    /// This count is above zero.
    Sql(&'static str),
    /// moto received the e-mail.
    EmailAtProvider,
}

/// Kills the delivery process at `failpoint` (it sleeps there until killed), restarts it,
/// and checks the invariants once everything settled.
async fn crash_at(failpoint: &str, reached: Reached) -> Result<()> {
    let env = TestEnv::new(&failpoint.replace('-', ""), "").await?;
    let _feed = env.spawn_roles("ingest,relay", "feed", &[])?;
    let seller = UniqueSeller::new();
    let fp = format!("{failpoint}=sleep(600000)");
    let mut first = env.spawn_roles("deliver", "deliver-1", &[("FAILPOINTS", &fp)])?;
    seed_orders(&env, &seller, &["8401"]).await?;
    wait_for(&format!("reached {failpoint}"), WAIT, || async {
        Ok(match reached {
            Reached::Sql(sql) => env.count(sql).await? > 0,
            Reached::EmailAtProvider => !emails_to(&seller.email).await?.is_empty(),
        }
        .then_some(()))
    })
    .await?;
    first.kill()?;

    let _second = env.spawn_roles("deliver", "deliver-2", &[])?;
    let group = env.group("herald-delivery");
    let deliveries = env.topic("herald.deliveries");
    wait_for("every intent settled and delivery lag 0", WAIT, || async {
        let unsettled = env
            .count("SELECT count(*) FROM notification_intents WHERE state NOT IN ('accepted', 'unknown')")
            .await?;
        let started = env
            .count("SELECT count(*) FROM notification_attempts WHERE outcome = 'started'")
            .await?;
        let lag = committed_lag(&group, &[&deliveries])?;
        Ok((unsettled == 0 && started == 0 && lag == 0).then_some(()))
    })
    .await?;
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents").await?,
        2,
        "no intent lost"
    );
    for (channel, sends) in [
        ("email", emails_to(&seller.email).await?.len()),
        ("sms", sms_to(&seller.phone).await?.len()),
    ] {
        let a = attempts(&env, channel).await?;
        let accepted = a.iter().filter(|x| x.0 == "accepted").count();
        let unknown = a.iter().filter(|x| x.0 == "unknown").count();
        assert!(accepted <= 1, "{channel}: at most one accepted attempt: {a:?}");
        assert!(
            sends <= accepted + unknown,
            "{channel}: every send is backed by an accepted or unknown attempt: {a:?}, {sends} sends"
        );
        assert!(
            sends <= 1 || unknown > 0,
            "{channel}: a duplicate send only after an unknown: {a:?}"
        );
    }
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_killed_after_the_claim_leaves_an_honest_ledger() -> Result<()> {
    crash_at(
        "deliver-after-claim",
        Reached::Sql("SELECT count(*) FROM notification_attempts WHERE outcome = 'started'"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_killed_after_the_send_leaves_an_honest_ledger() -> Result<()> {
    crash_at("deliver-after-send", Reached::EmailAtProvider).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_killed_after_the_record_before_the_offset_commit_sends_nothing_twice() -> Result<()> {
    crash_at(
        "deliver-after-record",
        Reached::Sql("SELECT count(*) FROM notification_intents WHERE state = 'accepted'"),
    )
    .await
}
