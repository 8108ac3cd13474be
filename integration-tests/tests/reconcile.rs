//! The provider's own evidence (issue 15): SES event records, through a real SNS topic and
//! SQS queue on moto, settle `unknown` e-mail attempts, and bounces feed the suppression
//! list. What a user checks: the intent's state and resolution rows, the provider events
//! stored, the messages moto received, the queue drained.

use std::time::Duration;

use anyhow::{Context, Result};
use integration_tests::moto::emails_to;
use integration_tests::samples::UniqueSeller;
use integration_tests::ses_events::{ses_event, About, EventQueue, SmsStatusLogs};
use integration_tests::toxiproxy::Proxy;
use integration_tests::{seed_orders, wait_for, TestEnv};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

/// (order, event type, matched by, price, detail) of a stored SMS status.
type StatusRow = (String, String, Option<String>, Option<f64>, Option<String>);

/// The reconcile role reads SQS straight from moto; the senders may sit behind a proxy.
const DIRECT_TO_MOTO: (&str, &str) = ("HERALD_AWS__ENDPOINT_URL", "http://127.0.0.1:14566");

/// A test's world whose senders reach SES through a proxy holding its answers (an e-mail
/// attempt ends `unknown`), with an event queue and a silence window of `silence_secs`.
async fn held_answers(
    name: &str,
    on_unknown: &'static str,
    silence_secs: u64,
) -> Result<(TestEnv, Proxy, EventQueue, UniqueSeller)> {
    let queue = EventQueue::create(name).await?;
    let (env, proxy) = TestEnv::behind_proxy(name, &queue.config(silence_secs), on_unknown).await?;
    proxy.delay_responses().await?;
    Ok((env, proxy, queue, UniqueSeller::new()))
}

/// Removes what [`held_answers`] made.
async fn clean_up(env: TestEnv, proxy: Proxy, queue: EventQueue) -> Result<()> {
    queue.delete().await;
    proxy.delete().await?;
    env.cleanup().await;
    Ok(())
}

/// The e-mail intent of `order`: (id in simple form, state, consent).
async fn email_intent(env: &TestEnv, order: &str) -> Result<(String, String, Option<String>)> {
    let r = env
        .db
        .query_one(
            "SELECT id, state, consent FROM notification_intents WHERE order_id = $1 AND channel = 'email'",
            &[&order],
        )
        .await?;
    Ok((r.get::<_, uuid::Uuid>(0).simple().to_string(), r.get(1), r.get(2)))
}

/// (resolved_as, settled_by, has a provider event) of the e-mail intent's resolutions.
async fn resolutions(env: &TestEnv) -> Result<Vec<(String, String, bool)>> {
    Ok(env
        .db
        .query(
            "SELECT r.resolved_as, r.settled_by, r.provider_event_id IS NOT NULL FROM intent_resolutions r
             JOIN notification_intents i ON i.id = r.intent_id WHERE i.channel = 'email' ORDER BY r.id",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// (outcome, after_unknown) of the e-mail attempts.
async fn email_attempts(env: &TestEnv) -> Result<Vec<(String, bool)>> {
    Ok(env
        .db
        .query(
            "SELECT a.outcome, a.after_unknown FROM notification_attempts a
             JOIN notification_intents i ON i.id = a.intent_id WHERE i.channel = 'email'
             ORDER BY i.order_id, a.attempt_no",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

async fn wait_drained(queue: &EventQueue) -> Result<()> {
    wait_for("the event queue drained", WAIT, || async {
        Ok((queue.depth().await? == (0, 0)).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_email_is_settled_by_the_providers_events_and_sent_once() -> Result<()> {
    // `retry`, and a silence window longer than the test: only evidence can settle the
    // intent, and without it the policy would send again.
    let (env, proxy, queue, seller) = held_answers("evidence", "retry", 3600).await?;
    // As production runs it: the runtime role, with only the privileges it is granted.
    let rt = env.as_runtime_role().await?;
    let rt: Vec<(&str, &str)> = rt.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &rt)?;
    seed_orders(&env, &seller, &["8301"]).await?;
    env.wait_count(
        "the e-mail intent unknown, waiting for evidence",
        "SELECT count(*) FROM notification_intents
          WHERE channel = 'email' AND state = 'unknown' AND next_attempt_at > now() + interval '30 minutes'",
        1,
        WAIT,
    )
    .await?;
    let (intent, _, _) = email_intent(&env, "8301").await?;
    let sent = emails_to(&seller.email).await?;
    assert_eq!(sent.len(), 1, "the request reached the provider");
    let message_id = sent[0]["id"].as_str().context("moto message id")?.to_owned();
    // The provider is answering again: a resend would now succeed, so a second message
    // would show.
    proxy.remove_toxic("slow-responses").await?;

    let about = About {
        message_id: &message_id,
        tags: Some((&intent, 1)),
        recipient: &seller.email,
    };
    queue.publish(&ses_event("send", &about)?, true).await?;
    queue.publish(&ses_event("delivery", &about)?, false).await?;
    let _reconcile = env.spawn_roles("reconcile", "reconcile", &[&rt[..], &[DIRECT_TO_MOTO]].concat())?;
    env.wait_count(
        "the intent accepted",
        "SELECT count(*) FROM notification_intents WHERE channel = 'email' AND state = 'accepted'",
        1,
        WAIT,
    )
    .await?;
    assert_eq!(
        resolutions(&env).await?,
        vec![("accepted".into(), "evidence".into(), true)],
        "settled by evidence, which the resolution names"
    );
    wait_drained(&queue).await?;
    let events = env
        .db
        .query(
            "SELECT event_type, matched_by, effect FROM provider_events ORDER BY event_type",
            &[],
        )
        .await?;
    let events: Vec<(String, Option<String>, String)> =
        events.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events.iter().all(|e| e.1.as_deref() == Some("tags")),
        "{events:?}"
    );
    assert_eq!(
        events.iter().filter(|e| e.2 == "settled").count(),
        1,
        "the first of the two settled it: {events:?}"
    );

    // Duplicates (SNS and SQS deliver at least once), an event for no intent of this
    // ledger, and messages that are not events: nothing stalls, nothing counts twice.
    queue.publish(&ses_event("delivery", &about)?, false).await?;
    queue.publish(&ses_event("delivery", &about)?, true).await?;
    let stranger = uuid::Uuid::new_v4().simple().to_string();
    queue
        .publish(
            &ses_event(
                "delivery",
                &About {
                    message_id: "0100-not-ours",
                    tags: Some((&stranger, 1)),
                    recipient: "someone@else.example",
                },
            )?,
            true,
        )
        .await?;
    queue.send_raw_body("not json at all").await?;
    queue
        .send_raw_body(
            r#"{"Type":"Notification","MessageId":"m-1","Message":"{\"eventType\":\"Delivery\"}"}"#,
        )
        .await?;
    wait_drained(&queue).await?;
    env.wait_count(
        "both malformed messages kept with their reason",
        "SELECT count(*) FROM provider_event_rejects WHERE reason <> ''",
        2,
        WAIT,
    )
    .await?;
    assert_eq!(
        env.count("SELECT count(*) FROM provider_events").await?,
        3,
        "the duplicates stored nothing; the stranger's event is stored unmatched"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM provider_events WHERE intent_id IS NULL AND effect = 'recorded'")
            .await?,
        1
    );
    assert_eq!(resolutions(&env).await?.len(), 1, "settled once");
    assert_eq!(
        email_attempts(&env).await?,
        vec![("unknown".into(), false)],
        "one attempt, which stays unknown on record"
    );
    assert_eq!(emails_to(&seller.email).await?.len(), 1, "no second message");

    // `intent show` lists the attempt's events and the resolution.
    let shown = env.herald(&["intent", "show", "acme", "8301", "order.created", "email"])?;
    assert!(
        shown.contains("provider event") && shown.contains("delivery"),
        "{shown}"
    );
    assert!(shown.contains("accepted by evidence"), "{shown}");
    let json: Value = serde_json::from_str(&env.herald(&[
        "intent",
        "show",
        "acme",
        "8301",
        "order.created",
        "email",
        "--json",
    ])?)?;
    assert_eq!(
        json["attempts"][0]["provider_events"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(json["resolutions"][0]["settled_by"], "evidence");
    let stored = env
        .count(
            "SELECT count(*) FROM provider_events WHERE detail LIKE '%@%' OR provider_message_id LIKE '%@%'",
        )
        .await?;
    assert_eq!(stored, 0, "no address is stored with the evidence");
    clean_up(env, proxy, queue).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_arrives_before_the_attempt_is_unknown_settles_it_as_soon_as_it_is() -> Result<()> {
    // Attempts that wait 15 s for SES's answer: the event arrives while the worker still
    // waits, before the attempt is recorded unknown. A window longer than the test: the
    // stored event settles the intent, not the window's end.
    let (env, proxy, queue, seller) = held_answers("early", "retry", 3600).await?;
    let slow = [
        ("HERALD_AWS__ATTEMPT_TIMEOUT_MS", "15000"),
        ("HERALD_DELIVERY__LEASE_SECS", "60"),
    ];
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &slow)?;
    let _reconcile = env.spawn_roles("reconcile", "reconcile", &[DIRECT_TO_MOTO])?;
    seed_orders(&env, &seller, &["8351"]).await?;
    let message_id = wait_for("SES received the e-mail", WAIT, || async {
        Ok(emails_to(&seller.email)
            .await?
            .first()
            .and_then(|m| m["id"].as_str().map(str::to_owned)))
    })
    .await?;
    let (intent, state, _) = email_intent(&env, "8351").await?;
    assert_eq!(state, "sending", "the worker still waits for SES's answer");
    let about = About {
        message_id: &message_id,
        tags: Some((&intent, 1)),
        recipient: &seller.email,
    };
    queue.publish(&ses_event("delivery", &about)?, false).await?;
    env.wait_count(
        "the event stored while the attempt is still started",
        "SELECT count(*) FROM provider_events e JOIN notification_attempts a ON a.id = e.attempt_id
          WHERE e.effect = 'recorded' AND a.outcome = 'started'",
        1,
        WAIT,
    )
    .await?;
    env.wait_count(
        "the intent accepted once its attempt is unknown",
        "SELECT count(*) FROM notification_intents WHERE channel = 'email' AND state = 'accepted'",
        1,
        WAIT,
    )
    .await?;
    assert_eq!(
        resolutions(&env).await?,
        vec![("accepted".into(), "evidence".into(), true)],
        "settled by the event that came first, not by the retry policy"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM provider_events WHERE effect = 'settled'")
            .await?,
        1,
        "the event says it settled the intent"
    );
    assert_eq!(email_attempts(&env).await?, vec![("unknown".into(), false)]);
    proxy.remove_toxic("slow-responses").await?;
    assert_eq!(emails_to(&seller.email).await?.len(), 1, "no resend");
    clean_up(env, proxy, queue).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_after_the_silence_scheduled_a_resend_cancels_the_resend() -> Result<()> {
    let (env, proxy, queue, seller) = held_answers("lateevent", "retry", 2).await?;
    // The resend waits at least 6 s (full jitter over a 60 s backoff): time for SES's event.
    let slow_resend = [
        ("HERALD_CHANNELS__EMAIL__BASE_BACKOFF_MS", "60000"),
        ("HERALD_CHANNELS__EMAIL__MAX_BACKOFF_MS", "60000"),
    ];
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &slow_resend)?;
    seed_orders(&env, &seller, &["8361"]).await?;
    env.wait_count(
        "the silence sweep scheduled a resend",
        "SELECT count(*) FROM notification_intents i JOIN intent_resolutions r ON r.intent_id = i.id
          WHERE i.channel = 'email' AND i.state = 'retry_scheduled' AND r.settled_by = 'silence'",
        1,
        WAIT,
    )
    .await?;
    let (intent, _, _) = email_intent(&env, "8361").await?;
    let sent = emails_to(&seller.email).await?;
    let message_id = sent[0]["id"].as_str().context("moto message id")?.to_owned();
    let about = About {
        message_id: &message_id,
        tags: Some((&intent, 1)),
        recipient: &seller.email,
    };
    queue.publish(&ses_event("delivery", &about)?, true).await?;
    let _reconcile = env.spawn_roles("reconcile", "reconcile", &[DIRECT_TO_MOTO])?;
    env.wait_count(
        "the intent accepted before the resend",
        "SELECT count(*) FROM notification_intents WHERE channel = 'email' AND state = 'accepted'",
        1,
        WAIT,
    )
    .await?;
    assert_eq!(
        resolutions(&env).await?,
        vec![
            ("retry".into(), "silence".into(), false),
            ("accepted".into(), "evidence".into(), true)
        ]
    );
    proxy.remove_toxic("slow-responses").await?;
    // The resend's outbox row is still published: its claim finds the intent accepted.
    env.wait_count(
        "the resend's outbox row published and skipped",
        "SELECT count(*) FROM outbox",
        0,
        WAIT,
    )
    .await?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;
    assert_eq!(
        email_attempts(&env).await?,
        vec![("unknown".into(), false)],
        "no resend"
    );
    assert_eq!(emails_to(&seller.email).await?.len(), 1);
    clean_up(env, proxy, queue).await
}

/// No event within the silence window: the channel's policy decides, and says so.
async fn silence(on_unknown: &'static str) -> Result<(TestEnv, Proxy, EventQueue, UniqueSeller)> {
    held_answers(&format!("silence{on_unknown}"), on_unknown, 2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_event_the_hold_policy_holds_after_the_silence_window_and_says_so() -> Result<()> {
    let (env, proxy, queue, seller) = silence("hold").await?;
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    seed_orders(&env, &seller, &["8311"]).await?;
    wait_for("a resolution by silence", WAIT, || async {
        Ok((!resolutions(&env).await?.is_empty()).then_some(()))
    })
    .await?;
    assert_eq!(
        resolutions(&env).await?,
        vec![("hold".into(), "silence".into(), false)]
    );
    let (_, state, _) = email_intent(&env, "8311").await?;
    assert_eq!(state, "unknown", "held for an operator");
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE channel = 'email' AND next_attempt_at IS NOT NULL")
            .await?,
        0,
        "no longer waiting"
    );
    let reason: String = env
        .db
        .query_one("SELECT reason FROM intent_resolutions", &[])
        .await?
        .get(0);
    assert!(reason.contains("no provider event"), "{reason}");
    assert_eq!(email_attempts(&env).await?, vec![("unknown".into(), false)]);
    // An operator's resolution is still possible, and wins.
    env.herald(&[
        "intent",
        "resolve",
        "acme",
        "8311",
        "order.created",
        "email",
        "--as",
        "accepted",
        "--reason",
        "the seller confirmed",
    ])?;
    assert_eq!(email_intent(&env, "8311").await?.1, "accepted");
    assert_eq!(
        resolutions(&env).await?.last().map(|r| r.1.clone()),
        Some("operator".into())
    );
    clean_up(env, proxy, queue).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_event_the_retry_policy_sends_again_after_the_silence_window() -> Result<()> {
    let (env, proxy, queue, seller) = silence("retry").await?;
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    seed_orders(&env, &seller, &["8321"]).await?;
    wait_for("a first e-mail attempt unknown", WAIT, || async {
        Ok(email_attempts(&env)
            .await?
            .first()
            .is_some_and(|a| a.0 == "unknown")
            .then_some(()))
    })
    .await?;
    proxy.remove_toxic("slow-responses").await?;
    env.wait_count(
        "the e-mail accepted after the retry",
        "SELECT count(*) FROM notification_intents WHERE channel = 'email' AND state = 'accepted'",
        1,
        WAIT,
    )
    .await?;
    let r = resolutions(&env).await?;
    assert_eq!(r[0], ("retry".into(), "silence".into(), false), "{r:?}");
    let attempts = email_attempts(&env).await?;
    assert_eq!(attempts.first(), Some(&("unknown".into(), false)), "{attempts:?}");
    assert_eq!(
        attempts.last(),
        Some(&("accepted".into(), true)),
        "the resend is flagged as following an unknown: {attempts:?}"
    );
    // Every attempt but not_sent ones reached the provider: the duplicate is on record.
    let reached = attempts.iter().filter(|a| a.0 != "not_sent").count();
    assert_eq!(emails_to(&seller.email).await?.len(), reached);
    clean_up(env, proxy, queue).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_bounce_suppresses_the_address_until_an_operator_lifts_it() -> Result<()> {
    let queue = EventQueue::create("bounce").await?;
    let env = TestEnv::new("bounce", &queue.config(600)).await?;
    let rt = env.as_runtime_role().await?;
    let rt: Vec<(&str, &str)> = rt.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let _herald = env.spawn_roles("ingest,relay,deliver,reconcile", "herald", &rt)?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["8331"]).await?;
    env.wait_count(
        "order 8331 e-mailed",
        "SELECT count(*) FROM notification_intents WHERE order_id = '8331' AND state = 'accepted'",
        2,
        WAIT,
    )
    .await?;
    let message_id: String = env
        .db
        .query_one(
            "SELECT a.provider_message_id FROM notification_attempts a
             JOIN notification_intents i ON i.id = a.intent_id WHERE i.channel = 'email'",
            &[],
        )
        .await?
        .get(0);
    // A transient bounce (mailbox full) suppresses nothing; a permanent one does. Neither
    // carries Herald's tags here (a configuration set's notifications may not): matched by
    // the message id. The bounce names the address in other letter case.
    let shouting = seller.email.to_uppercase();
    let about = About {
        message_id: &message_id,
        tags: None,
        recipient: &shouting,
    };
    queue
        .publish(&ses_event("bounce-transient", &about)?, false)
        .await?;
    queue.publish(&ses_event("bounce", &about)?, true).await?;
    env.wait_count(
        "the address on the suppression list",
        "SELECT count(*) FROM suppressions WHERE channel = 'email' AND reason = 'bounced' AND lifted_at IS NULL",
        1,
        WAIT,
    )
    .await?;
    wait_drained(&queue).await?;
    assert_eq!(
        env.count("SELECT count(*) FROM provider_events WHERE matched_by = 'message_id'")
            .await?,
        2
    );
    assert_eq!(env.count("SELECT count(*) FROM suppressions").await?, 1);
    // Keyed with suppression.key: the address's public (unkeyed) digest is not what the
    // list holds, so a dictionary of addresses tells nothing.
    let key = integration_tests::destination_key();
    let r = env
        .db
        .query_one(
            "SELECT destination_digest, digest_version, digest_key,
                    destination_digest = herald_destination_digest('email', $1)
               FROM suppressions",
            &[&seller.email],
        )
        .await?;
    let (digest, version, key_id, public): (String, i16, String, bool) =
        (r.get(0), r.get(1), r.get(2), r.get(3));
    assert_eq!(
        (digest, version, key_id.as_str(), public),
        (key.digest("email", &seller.email), 2, key.id(), false)
    );

    seed_orders(&env, &seller, &["8332"]).await?;
    env.wait_count(
        "order 8332: e-mail suppressed, SMS sent",
        "SELECT count(*) FROM notification_intents WHERE order_id = '8332'
           AND ((channel = 'email' AND state = 'suppressed' AND consent = 'bounced')
             OR (channel = 'sms' AND state = 'accepted'))",
        2,
        WAIT,
    )
    .await?;
    let listed = env.herald(&["suppression", "list"])?;
    assert!(listed.contains("bounced"), "{listed}");
    assert!(
        !listed.contains(&seller.email),
        "the list shows digests only: {listed}"
    );
    env.herald(&[
        "suppression",
        "remove",
        "--channel",
        "email",
        "--address",
        &seller.email,
        "--reason",
        "the seller fixed the mailbox",
    ])?;
    seed_orders(&env, &seller, &["8333"]).await?;
    env.wait_count(
        "order 8333 e-mailed again",
        "SELECT count(*) FROM notification_intents WHERE order_id = '8333' AND channel = 'email'
           AND state = 'accepted' AND consent = 'granted'",
        1,
        WAIT,
    )
    .await?;
    assert_eq!(emails_to(&seller.email).await?.len(), 2, "orders 8331 and 8333");
    let again = env.herald_output(&[
        "suppression",
        "remove",
        "--channel",
        "email",
        "--address",
        &seller.email,
        "--reason",
        "twice",
    ])?;
    assert!(!again.status.success(), "nothing left to lift");
    queue.delete().await;
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sms_delivery_status_from_cloudwatch_logs_is_stored_with_the_accepted_attempt() -> Result<()> {
    let logs = SmsStatusLogs::create("sms").await?;
    // No event queue: the role reads the SMS delivery status alone.
    let env = TestEnv::new("smsstatus", &format!("[reconcile]\n{}", logs.config())).await?;
    let rt = env.as_runtime_role().await?;
    let rt: Vec<(&str, &str)> = rt.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let _herald = env.spawn_roles("ingest,relay,deliver,reconcile", "herald", &rt)?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["8341", "8342"]).await?;
    env.wait_count(
        "both SMS accepted",
        "SELECT count(*) FROM notification_intents WHERE channel = 'sms' AND state = 'accepted'",
        2,
        WAIT,
    )
    .await?;
    let ids: Vec<String> = env
        .db
        .query(
            "SELECT a.provider_message_id FROM notification_attempts a
             JOIN notification_intents i ON i.id = a.intent_id WHERE i.channel = 'sms' ORDER BY i.order_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    logs.put(&ids[0], &seller.phone, true).await?;
    logs.put(&ids[1], &seller.phone, false).await?;
    logs.put("not-one-of-ours", "+15550000000", true).await?;
    logs.put_raw(false, "not a delivery status").await?;
    env.wait_count(
        "three statuses stored, one record kept aside",
        "SELECT (SELECT count(*) FROM provider_events WHERE channel = 'sms')
              + (SELECT count(*) FROM provider_event_rejects WHERE source LIKE 'cloudwatch_logs:%')",
        4,
        WAIT,
    )
    .await?;
    let rows = env
        .db
        .query(
            "SELECT i.order_id, e.event_type, e.matched_by, e.price_usd, e.detail
               FROM provider_events e JOIN notification_intents i ON i.id = e.intent_id ORDER BY i.order_id",
            &[],
        )
        .await?;
    let got: Vec<StatusRow> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "8341".into(),
                "delivered".into(),
                Some("message_id".into()),
                Some(0.00645),
                Some("Message has been accepted by phone carrier".into())
            ),
            (
                "8342".into(),
                "failed".into(),
                Some("message_id".into()),
                Some(0.00645),
                Some("Unknown error attempting to reach phone".into())
            ),
        ]
    );
    assert_eq!(
        env.count("SELECT count(*) FROM provider_events WHERE channel = 'sms' AND intent_id IS NULL")
            .await?,
        1,
        "a stranger's status is stored unmatched"
    );
    // Later polls read the same records again (the overlap): they converge.
    let t0: String = env.db.query_one("SELECT now()::text", &[]).await?.get(0);
    env.wait_count(
        "both groups read again after everything was stored",
        &format!("SELECT count(*) FROM provider_log_cursors WHERE updated_at > '{t0}'::timestamptz + interval '1 second'"),
        2,
        WAIT,
    )
    .await?;
    assert_eq!(env.count("SELECT count(*) FROM provider_events").await?, 3);
    assert_eq!(env.count("SELECT count(*) FROM provider_event_rejects").await?, 1);
    assert_eq!(
        env.count("SELECT count(*) FROM provider_events WHERE detail LIKE '%555%'")
            .await?,
        0,
        "no phone number is stored"
    );
    let shown = env.herald(&["intent", "show", "acme", "8342", "order.created", "sms"])?;
    assert!(
        shown.contains("provider event") && shown.contains("failed"),
        "{shown}"
    );
    assert_eq!(
        env.count("SELECT count(*) FROM notification_intents WHERE channel = 'sms' AND state = 'accepted'")
            .await?,
        2,
        "a delivery status is evidence beside the attempt; it changes no state"
    );
    logs.delete().await;
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_event_type_travels_both_envelope_forms_and_is_stored_once() -> Result<()> {
    let queue = EventQueue::create("types").await?;
    let env = TestEnv::new("eventtypes", &queue.config(600)).await?;
    let _reconcile = env.spawn_roles("reconcile", "reconcile", &[])?;
    // (fixture, the type it is stored as): AWS's documented examples, one per type, a
    // transient bounce, and a bounce as a configuration-set-less feedback notification.
    let fixtures = [
        ("send", "send"),
        ("delivery", "delivery"),
        ("bounce", "bounce"),
        ("bounce-transient", "bounce"),
        ("notification-bounce", "bounce"),
        ("complaint", "complaint"),
        ("reject", "reject"),
        ("rendering-failure", "rendering_failure"),
        ("delivery-delay", "delivery_delay"),
        ("open", "open"),
        ("click", "click"),
        ("subscription", "subscription"),
    ];
    for (i, (fixture, _)) in fixtures.iter().enumerate() {
        for raw in [false, true] {
            let message_id = format!("0100-types-{i}-{raw}");
            let record = ses_event(
                fixture,
                &About {
                    message_id: &message_id,
                    tags: None,
                    recipient: &format!("r{i}@types.example"),
                },
            )?;
            queue.publish(&record, raw).await?;
            // SNS and SQS deliver at least once: a copy converges.
            if i == 0 {
                queue.publish(&record, raw).await?;
            }
        }
    }
    env.wait_count(
        "every record stored once",
        "SELECT count(*) FROM provider_events",
        (fixtures.len() * 2) as i64,
        WAIT,
    )
    .await?;
    wait_drained(&queue).await?;
    for (fixture, stored_as) in fixtures {
        let n = env
            .count(&format!(
                "SELECT count(*) FROM provider_events WHERE event_type = '{stored_as}'"
            ))
            .await?;
        let expected = fixtures.iter().filter(|f| f.1 == stored_as).count() as i64 * 2;
        assert_eq!(n, expected, "{fixture} stored as {stored_as}");
    }
    assert_eq!(
        env.count("SELECT count(*) FROM provider_events").await?,
        24,
        "the copies converged"
    );
    assert_eq!(env.count("SELECT count(*) FROM provider_event_rejects").await?, 0);
    // The permanent bounces (event and feedback notification) and the complaint are about
    // no attempt of this ledger: stored, and nobody is suppressed (evidence suppresses only
    // the destination of an attempt it matched; a_permanent_bounce_suppresses_... shows it).
    assert_eq!(env.count("SELECT count(*) FROM suppressions").await?, 0);
    let verdicts = env
        .count("SELECT count(*) FROM provider_events WHERE verdict IS NULL")
        .await?;
    assert_eq!(
        verdicts, 6,
        "open, click and subscription say nothing of the attempt"
    );
    queue.delete().await;
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_database_refuses_is_kept_aside_and_the_rest_are_stored() -> Result<()> {
    let queue = EventQueue::create("refused").await?;
    let env = TestEnv::new("refusedevent", &queue.config(600)).await?;
    // A constraint of this test's own database refuses one event's data (SQLSTATE 23514),
    // as a value PostgreSQL cannot take would.
    env.db
        .batch_execute(
            "ALTER TABLE provider_events ADD CONSTRAINT it_refuses_one
                 CHECK (provider_message_id <> '0100-refused')",
        )
        .await?;
    for id in ["0100-before", "0100-refused", "0100-after"] {
        let about = About {
            message_id: id,
            tags: None,
            recipient: "someone@refused.example",
        };
        queue.publish(&ses_event("delivery", &about)?, true).await?;
    }
    let _reconcile = env.spawn_roles("reconcile", "reconcile", &[DIRECT_TO_MOTO])?;
    wait_drained(&queue).await?;
    env.wait_count(
        "the refused event kept with its reason",
        "SELECT count(*) FROM provider_event_rejects WHERE reason LIKE 'PostgreSQL refused%'
            AND body_prefix LIKE '%0100-refused%'",
        1,
        WAIT,
    )
    .await?;
    assert_eq!(
        env.count(
            "SELECT count(*) FROM provider_events WHERE provider_message_id IN ('0100-before', '0100-after')"
        )
        .await?,
        2,
        "the healthy events around it are stored"
    );
    queue.delete().await;
    env.cleanup().await;
    Ok(())
}
