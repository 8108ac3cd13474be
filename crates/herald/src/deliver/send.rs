//! One attempt's send: the frozen payload to SES v2 or SNS, after the channel's rate
//! limiter, and the [`AttemptRecord`] that describes what happened.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_channels::{
    AwsSettings, EmailMessage, ErrorCategory, Outcome, RateLimiter, SesSender, SmsMessage, SnsSender,
    StaticCredentials,
};
use herald_core::Channel;
use herald_store::delivery::{jitter, AttemptRecord, Claimed};
use herald_store::inspect::mask_destination;
use herald_telemetry::propagation::trace_id;
use tokio::sync::mpsc;
use tracing::field::Empty;
use tracing::{info, info_span, warn, Instrument};

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
    /// Waits for the channel's rate limiter (not part of the attempt's measured latency).
    pub async fn rate_limit(&self, channel: Channel) {
        match channel {
            Channel::Email => self.email_rate.acquire().await,
            Channel::Sms => self.sms_rate.acquire().await,
        }
    }

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

/// Sends one claimed attempt and hands its record to the record batcher, under an
/// `attempt` span (child of the message's `process` span) with the provider call as a
/// CLIENT span inside it.
pub async fn attempt(ctx: Arc<DeliveryContext>, taken: Taken, c: Claimed, records: mpsc::Sender<Finished>) {
    let span = info_span!(parent: &taken.span, "attempt",
        herald.intent.id = %c.intent_id, herald.attempt.id = %c.attempt_id, herald.attempt.number = c.attempt_no,
        herald.channel = c.channel.as_str(), herald.template.revision = %c.template_revision,
        herald.after_unknown = c.after_unknown, herald.outcome = Empty);
    attempt_in_span(ctx, taken, c, records, span.clone())
        .instrument(span)
        .await
}

async fn attempt_in_span(
    ctx: Arc<DeliveryContext>,
    taken: Taken,
    c: Claimed,
    records: mpsc::Sender<Finished>,
    span: tracing::Span,
) {
    let channel = c.channel.as_str();
    // A send slot, then the channel's rate: claimed attempts wait here (their leases run,
    // but a slot frees within one attempt timeout), never in front of the database.
    let Ok(slot) = ctx.send_slots.acquire().await else {
        return; // never closed
    };
    ctx.senders.rate_limit(c.channel).await;
    let call = match c.channel {
        Channel::Email => info_span!(
            "SES SendEmail",
            otel.kind = "client",
            rpc.system = "aws-api",
            rpc.service = "SESv2",
            rpc.method = "SendEmail",
            herald.outcome = Empty
        ),
        Channel::Sms => info_span!(
            "SNS Publish",
            otel.kind = "client",
            rpc.system = "aws-api",
            rpc.service = "SNS",
            rpc.method = "Publish",
            herald.outcome = Empty
        ),
    };
    let started = Instant::now();
    let outcome = send(&ctx, &c).instrument(call.clone()).await;
    let took = started.elapsed();
    // Failure policy: a crash here, after the send and before the record, leaves the attempt
    // `started`: when its lease expires it is recorded `unknown` (the provider may well have
    // the message), never silently failed.
    fail::fail_point!("deliver-after-send");
    let policy = ctx.policies[&c.channel];
    let attempt_outcome = outcome.attempt_outcome();
    call.record("herald.outcome", attempt_outcome.as_str());
    span.record("herald.outcome", attempt_outcome.as_str());
    drop(call);
    drop(slot);
    ctx.obs
        .metrics
        .attempt_finished(channel, attempt_outcome.as_str(), took);
    let next = policy.next(attempt_outcome, c.attempt_no.max(1) as u32, jitter());
    let (provider_message_id, category, detail) = match &outcome {
        Outcome::Accepted { provider_message_id } => (Some(provider_message_id.clone()), None, None),
        Outcome::Rejected { category, detail }
        | Outcome::Retryable { category, detail }
        | Outcome::Unknown { category, detail } => (None, Some(category.as_str()), Some(detail.clone())),
    };
    let log_next = format!("{next:?}");
    let trace_id = c.trace_context.as_deref().and_then(trace_id);
    let took_ms = took.as_millis() as u64;
    match &outcome {
        Outcome::Accepted { .. } => {
            info!(intent_id = %c.intent_id, attempt_id = %c.attempt_id, attempt_no = c.attempt_no,
            channel, outcome = attempt_outcome.as_str(), after_unknown = c.after_unknown, took_ms, trace_id,
            next = %log_next, "attempt finished")
        }
        _ => {
            // Provider messages can quote the address: never log it.
            let detail = redact(detail.as_deref().unwrap_or("-"), c.destination.as_deref());
            warn!(intent_id = %c.intent_id, attempt_id = %c.attempt_id, attempt_no = c.attempt_no, channel,
            template_revision = %c.template_revision, outcome = attempt_outcome.as_str(), category = category.unwrap_or("-"), detail = %detail,
            after_unknown = c.after_unknown, took_ms, trace_id, next = %log_next, "attempt finished")
        }
    }
    let record = AttemptRecord {
        intent_id: c.intent_id,
        attempt_id: c.attempt_id,
        started_at: c.started_at,
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

/// `detail` with every occurrence of `destination` masked.
fn redact(detail: &str, destination: Option<&str>) -> String {
    match destination.filter(|d| !d.is_empty()) {
        Some(d) => detail.replace(d, &mask_destination(d)),
        None => detail.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn provider_details_never_carry_the_destination() {
        assert_eq!(
            redact(
                "Email address is not verified: s19@example.com",
                Some("s19@example.com")
            ),
            "Email address is not verified: s***@example.com"
        );
        assert_eq!(redact("throttled", None), "throttled");
    }
}
