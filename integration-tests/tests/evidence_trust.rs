//! Provider evidence is believed only from SNS (issue 43). Whoever can write to the SES
//! event queue tries to forge it: a bare record, another account's topic, a signature by a
//! key SNS never had, a certificate URL off SNS's hosts, a signed message altered after
//! signing, a genuine bounce about an intent Herald never sent. What a user checks: the
//! `unknown` intent stays `unknown`, nobody is suppressed, each forgery is kept with its
//! reason and counted; then genuine signed messages (SignatureVersion 1 and 2, from a
//! stand-in signing certificate served over HTTPS) still settle the intent and suppress
//! its destination, and only its destination.

use std::time::Duration;

use anyhow::{Context, Result};
use integration_tests::http::{metric, scrape};
use integration_tests::moto::emails_to;
use integration_tests::samples::UniqueSeller;
use integration_tests::ses_events::{ses_event, About, EventQueue};
use integration_tests::sns_signer::{notification, SnsSigner};
use integration_tests::toxiproxy::Proxy;
use integration_tests::{seed_orders, wait_for, HeraldProcess, TestEnv};

const WAIT: Duration = Duration::from_secs(90);
/// The reconcile role reads SQS straight from moto; the senders sit behind a proxy.
const DIRECT_TO_MOTO: (&str, &str) = ("HERALD_AWS__ENDPOINT_URL", "http://127.0.0.1:14566");

/// A world with one `unknown` e-mail intent (the provider's answer was held, `hold` and a
/// silence window longer than the test: only evidence can settle it) and a reconcile role
/// reading `queue` with `reconcile` (the section's trust settings).
struct World {
    env: TestEnv,
    proxy: Proxy,
    queue: EventQueue,
    seller: UniqueSeller,
    /// The e-mail intent (simple form) and the message id moto gave its attempt.
    intent: String,
    message_id: String,
    reconcile: HeraldProcess,
    _herald: HeraldProcess,
}

async fn world(name: &str, trust: &str) -> Result<World> {
    let queue = EventQueue::create(name).await?;
    let section = format!(
        "[reconcile]\nqueue_url = \"{}\"\nsilence_secs = 3600\nwait_secs = 1\nvisibility_timeout_secs = 10\n{trust}",
        queue.queue_url
    );
    let (env, proxy) = TestEnv::behind_proxy(name, &section, "hold").await?;
    proxy.delay_responses().await?;
    let seller = UniqueSeller::new();
    let herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    seed_orders(&env, &seller, &["8401"]).await?;
    env.wait_count(
        "the e-mail intent unknown, waiting for evidence",
        "SELECT count(*) FROM notification_intents
          WHERE channel = 'email' AND state = 'unknown' AND next_attempt_at > now() + interval '30 minutes'",
        1,
        WAIT,
    )
    .await?;
    let intent: uuid::Uuid = env
        .db
        .query_one(
            "SELECT id FROM notification_intents WHERE order_id = '8401' AND channel = 'email'",
            &[],
        )
        .await?
        .get(0);
    let sent = emails_to(&seller.email).await?;
    let message_id = sent[0]["id"].as_str().context("moto message id")?.to_owned();
    let reconcile = env.spawn_roles("reconcile", "reconcile", &[DIRECT_TO_MOTO])?;
    Ok(World {
        env,
        proxy,
        queue,
        seller,
        intent: intent.simple().to_string(),
        message_id,
        reconcile,
        _herald: herald,
    })
}

impl World {
    async fn drained(&self) -> Result<()> {
        wait_for("the event queue drained", WAIT, || async {
            Ok((self.queue.depth().await? == (0, 0)).then_some(()))
        })
        .await
    }

    async fn intent_state(&self) -> Result<String> {
        Ok(self
            .env
            .db
            .query_one(
                "SELECT state FROM notification_intents WHERE order_id = '8401' AND channel = 'email'",
                &[],
            )
            .await?
            .get(0))
    }

    async fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        let scraped = scrape(&self.reconcile.admin_addr(WAIT).await?).await?;
        Ok(metric(&scraped, name, labels))
    }

    async fn clean_up(self) -> Result<()> {
        self.queue.delete().await;
        self.proxy.delete().await?;
        self.env.cleanup().await;
        Ok(())
    }
}

/// The topic the configuration names (moto's account and region; nothing publishes to it:
/// the test writes envelopes to the queue as SNS would deliver them).
fn topic(unique: &str) -> String {
    format!("arn:aws:sns:us-east-1:123456789012:herald-ses-events-{unique}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_provider_evidence_changes_nothing_and_genuine_evidence_still_settles() -> Result<()> {
    let signer = SnsSigner::start("trust")?;
    let unique = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let topic = topic(unique);
    let trust = format!(
        "sns_topic_arns = [\"{topic}\"]\nsns_signatures = \"verify\"\nraw_delivery = false\n\
         sns_certificate_endpoint = \"{}\"\nsns_certificate_ca_file = \"{}\"\n",
        signer.endpoint,
        signer.ca_file.display()
    );
    let w = world("trust", &trust).await?;
    let ours = About {
        message_id: &w.message_id,
        tags: Some((&w.intent, 1)),
        recipient: &w.seller.email,
    };
    let bounce = ses_event("bounce", &ours)?;
    let delivery = ses_event("delivery", &ours)?;
    let other_account = "arn:aws:sns:us-east-1:999999999999:herald-ses-events";

    // The forgeries, each of which would settle the intent or suppress its address if
    // believed.
    let bare = bounce.to_string();
    let wrong_topic = signer.notification(other_account, &delivery, 2)?.to_string();
    let forged_signature = notification(
        &topic,
        &delivery,
        2,
        &SnsSigner::cert_url("us-east-1"),
        &signer.forger_key,
    )?
    .to_string();
    let off_host = notification(
        &topic,
        &bounce,
        1,
        "https://sns.us-east-1.amazonaws.com.evil.example/SimpleNotificationService-x.pem",
        &signer.forger_key,
    )?
    .to_string();
    let mut altered = signer.notification(&topic, &ses_event("bounce-transient", &ours)?, 2)?;
    altered["Message"] = serde_json::Value::String(bounce.to_string());
    let altered = altered.to_string();
    for body in [&bare, &wrong_topic, &forged_signature, &off_host, &altered] {
        w.queue.send_raw_body(body).await?;
    }
    // Genuine, signed by SNS's stand-in, but about no attempt of this ledger: stored,
    // settles nothing, suppresses no one (the address was never mailed by it).
    let stranger = uuid::Uuid::new_v4().simple().to_string();
    let unmatched = ses_event(
        "bounce",
        &About {
            message_id: "0100-never-sent-by-herald",
            tags: Some((&stranger, 1)),
            recipient: &w.seller.email,
        },
    )?;
    w.queue
        .send_raw_body(&signer.notification(&topic, &unmatched, 2)?.to_string())
        .await?;
    w.drained().await?;
    w.env
        .wait_count(
            "the five forgeries kept, with their reasons",
            "SELECT count(*) FROM provider_event_rejects WHERE reason LIKE 'not authenticated:%'",
            5,
            WAIT,
        )
        .await?;
    let reasons: Vec<String> = w
        .env
        .db
        .query("SELECT reason FROM provider_event_rejects ORDER BY id", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for expected in [
        "raw_delivery is off",
        "is not one of reconcile.sns_topic_arns",
        "the signature does not verify",
        "the host is not sns.<region>.amazonaws.com",
        "the signature does not verify",
    ] {
        assert!(
            reasons.iter().any(|r| r.contains(expected)),
            "{expected:?} in {reasons:#?}"
        );
    }
    w.env
        .wait_count(
            "the genuine unmatched bounce stored",
            "SELECT count(*) FROM provider_events WHERE intent_id IS NULL",
            1,
            WAIT,
        )
        .await?;
    assert_eq!(w.intent_state().await?, "unknown", "no forgery settled it");
    assert_eq!(w.env.count("SELECT count(*) FROM suppressions").await?, 0);
    assert_eq!(
        w.env
            .count("SELECT count(*) FROM provider_events WHERE intent_id IS NOT NULL")
            .await?,
        0
    );
    assert_eq!(
        w.metric("herald_provider_messages_total", &["result=\"unauthenticated\""])
            .await?,
        5.0
    );
    assert_eq!(
        w.metric("herald_suppressions_refused_total", &["reason=\"bounced\""])
            .await?,
        1.0
    );

    // Genuine, SignatureVersion 1: a permanent bounce of the attempt that names another
    // address. It settles the intent (the provider had the message); it suppresses no one,
    // the address not being the intent's destination.
    let elsewhere = ses_event(
        "bounce",
        &About {
            message_id: &w.message_id,
            tags: Some((&w.intent, 1)),
            recipient: "victim@elsewhere.example",
        },
    )?;
    w.queue
        .send_raw_body(&signer.notification(&topic, &elsewhere, 1)?.to_string())
        .await?;
    w.env
        .wait_count(
            "the intent accepted by the genuine event",
            "SELECT count(*) FROM notification_intents WHERE order_id = '8401' AND channel = 'email'
               AND state = 'accepted'",
            1,
            WAIT,
        )
        .await?;
    assert_eq!(w.env.count("SELECT count(*) FROM suppressions").await?, 0);
    // Genuine, SignatureVersion 2: a complaint about the destination (in other letter case):
    // suppressed. (By its tags: the attempt's answer was held, so Herald never learnt the
    // message id.)
    let complaint = ses_event(
        "complaint",
        &About {
            message_id: &w.message_id,
            tags: Some((&w.intent, 1)),
            recipient: &w.seller.email.to_uppercase(),
        },
    )?;
    w.queue
        .send_raw_body(&signer.notification(&topic, &complaint, 2)?.to_string())
        .await?;
    w.env
        .wait_count(
            "the destination suppressed by the genuine complaint",
            "SELECT count(*) FROM suppressions WHERE reason = 'complained' AND lifted_at IS NULL",
            1,
            WAIT,
        )
        .await?;
    w.drained().await?;
    assert_eq!(
        w.metric("herald_suppressions_refused_total", &["reason=\"bounced\""])
            .await?,
        2.0
    );
    assert_eq!(
        w.metric("herald_provider_messages_total", &["result=\"unauthenticated\""])
            .await?,
        5.0,
        "the genuine ones were believed"
    );
    drop(signer);
    w.clean_up().await
}

/// The canary of the test above: the same forged signature, with signatures unchecked,
/// settles the intent. The checks, not the forgery's shape, are what stopped it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_signatures_unchecked_a_forged_envelope_settles_an_unknown_intent() -> Result<()> {
    let signer = SnsSigner::start("unchecked")?;
    let unique = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let topic = topic(unique);
    let trust = format!("sns_topic_arns = [\"{topic}\"]\nsns_signatures = \"unchecked\"\n");
    let w = world("unchecked", &trust).await?;
    let ours = About {
        message_id: &w.message_id,
        tags: Some((&w.intent, 1)),
        recipient: &w.seller.email,
    };
    let forged = notification(
        &topic,
        &ses_event("delivery", &ours)?,
        2,
        &SnsSigner::cert_url("us-east-1"),
        &signer.forger_key,
    )?;
    w.queue.send_raw_body(&forged.to_string()).await?;
    w.env
        .wait_count(
            "the intent accepted by the forgery",
            "SELECT count(*) FROM notification_intents WHERE order_id = '8401' AND channel = 'email'
               AND state = 'accepted'",
            1,
            WAIT,
        )
        .await?;
    w.clean_up().await
}
