//! One attempt's send: the frozen payload to SES v2 or SNS, after the channel's rate
//! limiter, and the [`AttemptRecord`] that describes what happened.

use std::sync::Arc;
use std::time::Duration;

use herald_channels::{
    AwsSettings, EmailMessage, ErrorCategory, Outcome, RateLimiter, SesSender, SmsMessage, SnsSender,
    StaticCredentials,
};
use herald_core::Channel;
use herald_store::delivery::{jitter, AttemptRecord, Claimed};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::batcher::Finished;
use super::{DeliveryContext, Taken};
use crate::config::Config;

pub struct Senders {
    email: SesSender,
    sms: SnsSender,
    email_rate: RateLimiter,
    sms_rate: RateLimiter,
}

impl Senders {
    pub async fn new(config: &Config) -> Self {
        let a = &config.aws;
        let settings = AwsSettings {
            region: a.region.clone(),
            endpoint_url: a.endpoint_url.clone(),
            connect_timeout: Duration::from_millis(a.connect_timeout_ms),
            attempt_timeout: Duration::from_millis(a.attempt_timeout_ms),
            static_credentials: match (&a.access_key_id, &a.secret_access_key) {
                (Some(id), Some(secret)) => Some(StaticCredentials {
                    access_key_id: id.clone(),
                    secret_access_key: secret.clone(),
                }),
                _ => None,
            },
        };
        Self {
            email: SesSender::new(&settings).await,
            sms: SnsSender::new(&settings).await,
            email_rate: RateLimiter::per_second(config.channels.email.retry.rate_per_second),
            sms_rate: RateLimiter::per_second(config.channels.sms.retry.rate_per_second),
        }
    }
}

/// Sends one claimed attempt and hands its record to the record batcher.
#[tracing::instrument(skip_all, fields(intent_id = %c.intent_id, attempt_no = c.attempt_no, channel = c.channel.as_str()))]
pub async fn attempt(ctx: Arc<DeliveryContext>, taken: Taken, c: Claimed, records: mpsc::Sender<Finished>) {
    let outcome = send(&ctx, &c).await;
    // Failure policy: a crash here, after the send and before the record, leaves the attempt
    // `started`: when its lease expires it is recorded `unknown` (the provider may well have
    // the message), never silently failed.
    fail::fail_point!("deliver-after-send");
    let policy = ctx.policies[&c.channel];
    let attempt_outcome = outcome.attempt_outcome();
    let next = policy.next(attempt_outcome, c.attempt_no.max(1) as u32, jitter());
    let (provider_message_id, category, detail) = match &outcome {
        Outcome::Accepted { provider_message_id } => (Some(provider_message_id.clone()), None, None),
        Outcome::Rejected { category, detail }
        | Outcome::Retryable { category, detail }
        | Outcome::Unknown { category, detail } => (None, Some(category.as_str()), Some(detail.clone())),
    };
    let log_next = format!("{next:?}");
    match &outcome {
        Outcome::Accepted { .. } => info!(attempt_id = %c.attempt_id, outcome = attempt_outcome.as_str(),
            after_unknown = c.after_unknown, trace_context = c.trace_context.as_deref(), next = %log_next, "attempt finished"),
        _ => {
            warn!(attempt_id = %c.attempt_id, outcome = attempt_outcome.as_str(), category = category.unwrap_or("-"),
            detail = detail.as_deref().unwrap_or("-"), after_unknown = c.after_unknown,
            trace_context = c.trace_context.as_deref(), next = %log_next, "attempt finished")
        }
    }
    let record = AttemptRecord {
        intent_id: c.intent_id,
        attempt_id: c.attempt_id,
        outcome: attempt_outcome,
        provider_message_id,
        error_category: category,
        error_detail: detail,
        next,
    };
    // The record loop only stops once every sender has gone: this cannot fail while the
    // role runs.
    let _ = records.send(Finished { taken, record }).await;
}

async fn send(ctx: &DeliveryContext, c: &Claimed) -> Outcome {
    let s = &ctx.senders;
    let Some(destination) = c.destination.as_deref() else {
        return Outcome::Rejected {
            category: ErrorCategory::InvalidParameter,
            detail: "the frozen payload has no destination".into(),
        };
    };
    let body = c.body_text.as_deref().unwrap_or_default();
    match c.channel {
        Channel::Email => {
            let e = &ctx.config.channels.email;
            let from = e.sender_overrides.get(&c.marketplace_id).unwrap_or(&e.sender);
            let intent = c.intent_id.simple().to_string();
            let attempt = c.attempt_no.to_string();
            let tags = [
                ("herald_intent", intent.as_str()),
                ("herald_attempt", attempt.as_str()),
            ];
            s.email_rate.acquire().await;
            s.email
                .send(&EmailMessage {
                    from,
                    to: destination,
                    subject: c.subject.as_deref().unwrap_or_default(),
                    text: body,
                    html: c.body_html.as_deref(),
                    configuration_set: e.configuration_set.as_deref(),
                    tags: &tags,
                })
                .await
        }
        Channel::Sms => {
            s.sms_rate.acquire().await;
            s.sms
                .send(&SmsMessage {
                    phone: destination,
                    text: body,
                    sender_id: ctx.config.channels.sms.sender_id.as_deref(),
                })
                .await
        }
    }
}
