//! The send stage: one claimed attempt waits for its channel's rate and a send slot, checks
//! that its lease still covers a send, then makes one provider request (SES v2 or SNS) and
//! becomes a [`FinishedAttempt`] that says what happened. An attempt released before its
//! request (shutdown, partition revoked) or too late for its lease sends nothing and is
//! finished `not_sent`.

use std::time::{Duration, Instant};

use herald_channels::{
    EmailMessage, ErrorCategory, Outcome, RateLimiter, Reservation, SesSender, SmsMessage, SnsSender,
};
use herald_core::destination::mask as mask_destination;
use herald_core::retry::jitter;
use herald_core::{AttemptOutcome, Channel, NotSentReason};
use herald_kafka::deliver::InFlight;
use herald_store::delivery::Claimed;
use herald_telemetry::propagation::trace_id;
use tokio::sync::SemaphorePermit;
use tracing::field::Empty;
use tracing::{info, info_span, warn, Instrument};

use super::claim::ClaimedAttempt;
use super::record::FinishedAttempt;
use super::DeliveryContext;
use crate::config::Config;

pub struct Senders {
    email: SesSender,
    sms: SnsSender,
    email_rate: RateLimiter,
    sms_rate: RateLimiter,
}

impl Senders {
    fn rate(&self, channel: Channel) -> &RateLimiter {
        match channel {
            Channel::Email => &self.email_rate,
            Channel::Sms => &self.sms_rate,
        }
    }

    /// Reserves the channel's next send: the moment it may go (`None`: no limit).
    fn reserve(&self, channel: Channel) -> Option<Reservation> {
        self.rate(channel).reserve(Instant::now())
    }

    /// Gives back a reservation whose send will not happen.
    fn cancel(&self, channel: Channel, reservation: Option<Reservation>) {
        if let Some(r) = reservation {
            self.rate(channel).cancel(r);
        }
    }

    pub async fn new(config: &Config) -> Self {
        let settings = config.aws_settings();
        Self {
            email: SesSender::new(&settings).await,
            sms: SnsSender::new(&settings).await,
            email_rate: RateLimiter::per_second(config.rate_per_second(Channel::Email)),
            sms_rate: RateLimiter::per_second(config.rate_per_second(Channel::Sms)),
        }
    }
}

/// Sends one claimed attempt, under an `attempt` span (child of the message's `process`
/// span) with the provider call as a CLIENT span inside it.
pub async fn attempt(ctx: &DeliveryContext, claimed: ClaimedAttempt) -> FinishedAttempt {
    let c = &claimed.claim;
    let span = info_span!(parent: &claimed.taken.span, "attempt",
        herald.intent.id = %c.intent_id, herald.attempt.id = %c.attempt_id, herald.attempt.number = c.attempt_no,
        herald.channel = c.channel.as_str(), herald.template.revision = %c.template_revision,
        herald.after_unknown = c.after_unknown, herald.outcome = Empty);
    attempt_in_span(ctx, claimed, span.clone()).instrument(span).await
}

async fn attempt_in_span(
    ctx: &DeliveryContext,
    claimed: ClaimedAttempt,
    span: tracing::Span,
) -> FinishedAttempt {
    let ClaimedAttempt {
        mut taken,
        claim: c,
        send_by,
    } = claimed;
    // The channel's rate (a reserved moment, first come first served), then a send slot.
    // Claimed attempts wait here, their leases running: the claim window and the slots are
    // sized so that the wait fits (herald_core::lease). A reservation past the deadline, or
    // an attempt released while it waits, sends nothing and gives its moment back.
    if Instant::now() >= send_by {
        return not_sent(ctx, taken, c, NotSentReason::LeaseDeadline);
    }
    let reservation = ctx.senders.reserve(c.channel);
    if reservation.is_some_and(|r| r.at() >= send_by) {
        ctx.senders.cancel(c.channel, reservation);
        return not_sent(ctx, taken, c, NotSentReason::LeaseDeadline);
    }
    let turn = async {
        if let Some(r) = reservation {
            tokio::time::sleep_until(r.at().into()).await;
        }
        ctx.send_slots.acquire().await
    };
    let waited: Result<SemaphorePermit<'_>, NotSentReason> = tokio::select! {
        reason = released(ctx, &taken.work) => Err(reason),
        // The slots are never closed.
        slot = turn => slot.map_err(|_| NotSentReason::Shutdown),
    };
    let slot = match waited {
        Ok(slot) => slot,
        Err(reason) => {
            ctx.senders.cancel(c.channel, reservation);
            return not_sent(ctx, taken, c, reason);
        }
    };
    if let Some(stall) = stall_before_send() {
        tokio::time::sleep(stall).await;
    }
    // The last check before the request: a send that starts now must end (one attempt
    // timeout) inside the lease, with the margin to spare. Too late: nothing is sent, and
    // the attempt says so; it is never left to expire into `unknown`.
    if Instant::now() >= send_by {
        return not_sent(ctx, taken, c, NotSentReason::LeaseDeadline);
    }
    taken.permits.release_window();
    let channel = c.channel.as_str();
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
    let outcome = send(ctx, &c).instrument(call.clone()).await;
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
    ctx.stats.sent(channel, attempt_outcome.as_str(), took);
    let next = policy.next(attempt_outcome, c.tries, jitter());
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
            next = %log_next, routine = c.attempt_no == 1 && !c.after_unknown && !c.reclaimed, "attempt finished")
        }
        _ => {
            // Provider messages can quote the address: never log it.
            let detail = redact(detail.as_deref().unwrap_or("-"), c.destination.as_deref());
            warn!(intent_id = %c.intent_id, attempt_id = %c.attempt_id, attempt_no = c.attempt_no, channel,
            template_revision = %c.template_revision, outcome = attempt_outcome.as_str(), category = category.unwrap_or("-"), detail = %detail,
            after_unknown = c.after_unknown, took_ms, trace_id, next = %log_next, "attempt finished")
        }
    }
    FinishedAttempt {
        taken,
        channel: c.channel,
        record: c.record(attempt_outcome, provider_message_id, category, detail, next),
    }
}

/// Resolves when the attempt is released before its request: the process is shutting
/// down, or the message's partition was revoked (the drain is waiting for it).
async fn released(ctx: &DeliveryContext, work: &InFlight) -> NotSentReason {
    let mut shutdown = ctx.shutdown.clone();
    // Subscribed before the check: a revocation after it still wakes the wait below.
    let mut revocations = ctx.handle.revocations();
    loop {
        if shutdown.is_requested() {
            return NotSentReason::Shutdown;
        }
        if !ctx.handle.is_current(work) {
            return NotSentReason::Revoked;
        }
        tokio::select! {
            _ = shutdown.requested() => return NotSentReason::Shutdown,
            changed = revocations.changed() => {
                if changed.is_err() {
                    // The consumer is gone; shutdown follows.
                    shutdown.requested().await;
                }
            }
        }
    }
}

/// A claimed attempt that sends nothing: finished `not_sent` with its reason; the intent
/// comes back soon, and the attempt does not count against `max_attempts`.
fn not_sent(
    ctx: &DeliveryContext,
    taken: super::take::Taken,
    c: Claimed,
    reason: NotSentReason,
) -> FinishedAttempt {
    let channel = c.channel.as_str();
    tracing::Span::current().record("herald.outcome", AttemptOutcome::NotSent.as_str());
    ctx.stats.not_sent(channel, reason.as_str());
    let next = ctx.policies[&c.channel].next(AttemptOutcome::NotSent, c.tries, jitter());
    warn!(intent_id = %c.intent_id, attempt_id = %c.attempt_id, attempt_no = c.attempt_no, channel,
          outcome = AttemptOutcome::NotSent.as_str(), category = reason.as_str(), next = ?next,
          "attempt finished without a send");
    FinishedAttempt {
        taken,
        channel: c.channel,
        record: c.record(
            AttemptOutcome::NotSent,
            None,
            Some(reason.as_str()),
            Some(reason.detail().to_owned()),
            next,
        ),
    }
}

/// The `deliver-before-send` failpoint (`return(MS)`): a stall of MS milliseconds after the
/// attempt's turn came and before its lease is checked, as a paused process or a starved
/// runtime would cause. Without the `failpoints` feature, never.
fn stall_before_send() -> Option<Duration> {
    fail::fail_point!("deliver-before-send", |ms| ms
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis));
    None
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
