//! Delivery measurements against the provider stand-in ([`integration_tests::standin`], a fixed 50 ms
//! answer): Herald's sends/s at a given in-flight window (Little's law bounds it at
//! `in_flight / latency`) and the sequential baseline.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use herald_channels::{
    AwsSettings, EmailMessage, Outcome, SesSender, SmsMessage, SnsSender, StaticCredentials,
};
use herald_core::retry::{NextState, RetryPolicy, UnknownPolicy};
use herald_core::{AttemptOutcome, Channel};
use herald_store::delivery::{ChannelPolicies, ClaimOutcome, ClaimRequest, ClaimTry};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::Message;
use uuid::Uuid;

use super::ingest::reader;
use super::procstat::{self, Usage};
use integration_tests::samples::UniqueSeller;
use integration_tests::{seed_orders, wait_for, EnvOptions, HeraldProcess, TestEnv};

/// A fresh namespace whose `orders` orders (two intents each) are already published to
/// `herald.deliveries`, with the AWS endpoint pointed at `endpoint`.
pub async fn prepare(name: &str, endpoint: &str, orders: usize) -> Result<(TestEnv, i64)> {
    let env = TestEnv::with_options(
        name,
        "",
        EnvOptions {
            aws_endpoint: Some(endpoint.to_owned()),
            on_unknown: "hold",
            ..EnvOptions::default()
        },
    )
    .await?;
    let feed = env.spawn_roles("ingest,relay", "feed", &[("HERALD_LOG__LEVEL", "warn")])?;
    let seller = UniqueSeller::new();
    let ids: Vec<String> = (0..orders).map(|n| format!("r{n}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    seed_orders(&env, &seller, &refs).await?;
    let intents = (orders * 2) as i64;
    let wait = Duration::from_secs(300);
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        intents,
        wait,
    )
    .await?;
    env.wait_count("outbox published", "SELECT count(*) FROM outbox", 0, wait)
        .await?;
    drop(feed);
    Ok((env, intents))
}

/// Settings that keep Herald itself from being throttled by the measurement.
pub(super) const UNTHROTTLED: [(&str, &str); 3] = [
    ("HERALD_CHANNELS__EMAIL__RATE_PER_SECOND", "100000"),
    ("HERALD_CHANNELS__SMS__RATE_PER_SECOND", "100000"),
    ("HERALD_LOG__LEVEL", "warn"),
];

/// Sends every prepared intent with `instances` delivery processes of `in_flight` each;
/// sends/s from the first claim to the last record, and the first process's resources.
pub async fn herald(
    env: &TestEnv,
    intents: i64,
    in_flight: usize,
    instances: usize,
    extra: &[(&str, &str)],
) -> Result<(f64, Usage)> {
    let window = in_flight.to_string();
    let mut vars = vec![("HERALD_DELIVERY__MAX_IN_FLIGHT", window.as_str())];
    vars.extend_from_slice(extra);
    // With several instances, one may join the group after another started: the
    // rebalance releases the first one's attempts (`not_sent`, `revoked`) and their retries
    // go out through the outbox, so each instance runs a relay too, as it would in
    // production. The rebalance is part of what scale-out costs.
    let roles = if instances > 1 { "deliver,relay" } else { "deliver" };
    let procs: Vec<HeraldProcess> = (0..instances)
        .map(|i| {
            let mut all: Vec<(&str, &str)> = UNTHROTTLED.to_vec();
            all.extend_from_slice(&vars);
            env.spawn_roles(roles, &format!("deliver-{i}"), &all)
        })
        .collect::<Result<_>>()?;
    wait_for("every intent accepted", Duration::from_secs(900), || async {
        Ok((env
            .count("SELECT count(*) FROM notification_intents WHERE state = 'accepted'")
            .await?
            == intents)
            .then_some(()))
    })
    .await?;
    let usage = procstat::usage(procs[0].pid().context("deliver exited")?)?;
    let span: f64 = env
        .db
        .query_one(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM notification_attempts",
            &[],
        )
        .await?
        .get(0);
    let unexpected = env
        .count(
            "SELECT count(*) FROM notification_attempts
             WHERE outcome <> 'accepted' AND NOT (outcome = 'not_sent' AND error_category = 'revoked')",
        )
        .await?;
    ensure!(
        unexpected == 0,
        "{unexpected} attempts neither accepted nor released by a rebalance"
    );
    let accepted = env
        .count("SELECT count(*) FROM notification_attempts WHERE outcome = 'accepted'")
        .await?;
    ensure!(
        accepted == intents,
        "{accepted} accepted attempts for {intents} intents"
    );
    for mut p in procs {
        p.terminate(Duration::from_secs(60)).await?;
    }
    Ok((intents as f64 / span, usage))
}

/// The retry policy of both channels when the bench calls Herald's claim and record
/// statements itself (the test configuration's backoffs, `unknown` held).
pub(super) fn policies() -> ChannelPolicies {
    let policy = RetryPolicy {
        max_attempts: 5,
        base_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(1),
        on_unknown: UnknownPolicy::Hold,
        evidence_window: None,
    };
    Channel::ALL.iter().map(|c| (*c, policy)).collect()
}

/// The usual at-least-once consumer loop, one attempt at a time: receive a delivery
/// message, claim its intent (Herald's statement), send it (Herald's SES/SNS senders),
/// record the outcome (Herald's statement), commit the offset synchronously, receive the
/// next. Sends/s over every prepared intent.
pub async fn sequential(env: &TestEnv, endpoint: &str, intents: i64) -> Result<f64> {
    let store = env.store(2)?;
    let settings = AwsSettings {
        region: Some("us-east-1".into()),
        endpoint_url: Some(endpoint.to_owned()),
        connect_timeout: Duration::from_millis(500),
        attempt_timeout: Duration::from_secs(2),
        static_credentials: Some(StaticCredentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        }),
    };
    let (email, sms) = (SesSender::new(&settings).await, SnsSender::new(&settings).await);
    let policies = policies();
    let consumer = reader(&env.group("bench-sequential"), &env.topic("herald.deliveries"))?;
    let lease = Duration::from_secs(60);
    let started = Instant::now();
    let mut sent = 0;
    while sent < intents {
        let m = consumer.recv().await?;
        let id: Uuid = std::str::from_utf8(m.key().context("delivery message without key")?)?.parse()?;
        let request = ClaimRequest::new(id);
        let claimed = match store
            .claim("sequential", lease, &[request], &policies, ClaimTry::First)
            .await?
            .pop()
        {
            Some(ClaimOutcome::Claimed(c)) => c,
            other => anyhow::bail!("intent {id} not claimed: {other:?}"),
        };
        let to = claimed.destination.as_deref().context("no destination")?;
        let text = claimed.body_text.as_deref().unwrap_or_default();
        let outcome = match claimed.channel {
            Channel::Email => {
                email
                    .send(&EmailMessage {
                        from: "notifications@herald.example",
                        to,
                        subject: claimed.subject.as_deref().unwrap_or_default(),
                        text,
                        html: claimed.body_html.as_deref(),
                        configuration_set: None,
                        tags: &[],
                    })
                    .await
            }
            Channel::Sms => {
                sms.send(&SmsMessage {
                    phone: to,
                    text,
                    sender_id: None,
                })
                .await
            }
        };
        let Outcome::Accepted { provider_message_id } = outcome else {
            anyhow::bail!("intent {id}: the stand-in did not accept: {outcome:?}");
        };
        let record = claimed.record(
            AttemptOutcome::Accepted,
            Some(provider_message_id),
            None,
            None,
            NextState::Accepted,
        );
        store.record(&[record]).await?;
        consumer.commit_message(&m, CommitMode::Sync)?;
        sent += 1;
    }
    Ok(sent as f64 / started.elapsed().as_secs_f64())
}
