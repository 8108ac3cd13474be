//! What a batch's routed orders become, with no I/O: one intent per (event, channel) that
//! renders, frozen here with the seller profile and templates the transaction read; and one
//! dead letter per event that has a channel which did not render. With `hold` set, the
//! intents of an order whose seller has no profile are held (`awaiting_profile`) instead of
//! frozen: what they render to without a profile is what the wait running out freezes.

use std::collections::HashMap;
use std::time::Duration;

use herald_core::event::DeadLetterReason;
use herald_core::render::{RenderError, Renderer};
use herald_core::SellerProfile;
use herald_kafka::{DeadLetter, Message};
use herald_store::ingest::SourceRef;
use herald_store::NewIntent;
use tracing::field::Empty;
use tracing::{info_span, Span};

use super::classify::{dead_letter, Routed};
use crate::obs;

/// The intents to converge, each with its span (`intent created` / `reused` / `conflict`
/// once known), kept together by [`Plan::push`].
#[derive(Default)]
pub struct Plan<'c, 'm> {
    intents: Vec<NewIntent<'c>>,
    spans: Vec<Option<Span>>,
    pub poison: Vec<DeadLetter<'m>>,
}

impl<'c, 'm> Plan<'c, 'm> {
    fn push(&mut self, intent: NewIntent<'c>, span: Option<Span>) {
        self.intents.push(intent);
        self.spans.push(span);
    }

    /// In the order [`IngestTx::converge`](herald_store::IngestTx::converge) answers.
    pub fn intents(&self) -> &[NewIntent<'c>] {
        &self.intents
    }

    /// Each intent with its span, in order.
    pub fn with_spans(&self) -> impl Iterator<Item = (&NewIntent<'c>, Option<&Span>)> {
        self.intents.iter().zip(self.spans.iter().map(Option::as_ref))
    }
}

pub fn plan<'c, 'm>(
    renderer: &Renderer,
    profiles: &HashMap<(String, String), SellerProfile>,
    orders: &'c [Routed<'m>],
    hold: Option<Duration>,
) -> Plan<'c, 'm> {
    let mut plan = Plan::default();
    for o in orders {
        let seller = profiles.get(&(o.event.marketplace_id.clone(), o.event.seller_id.clone()));
        let mut failures = Vec::new();
        for &channel in &o.route.channels {
            match renderer.render(&o.route.template, channel, &o.event, seller) {
                Ok(payload) => {
                    // Child of the message's span; its context is what the intent and its
                    // outbox row carry on to the relay.
                    let span = o.span.as_ref().map(|parent| {
                        info_span!(parent: parent, "intent", otel.name = "converge intent",
                            herald.intent.id = Empty, herald.channel = channel.as_str(),
                            herald.event_kind = %o.event.event_kind,
                            herald.template.revision = %payload.template_revision, herald.outcome = Empty)
                    });
                    let trace_context = match &span {
                        Some(s) => obs::traceparent_or(s, o.trace_context.as_deref()),
                        None => o.trace_context.clone(),
                    };
                    let source = SourceRef {
                        topic: o.message.topic().to_owned(),
                        partition: o.message.partition(),
                        offset: o.message.offset(),
                    };
                    let intent = NewIntent::new(&o.event, channel, payload, trace_context, source);
                    let intent = match (seller, hold) {
                        (None, Some(wait)) => intent.held(wait),
                        _ => intent,
                    };
                    let intent = if o.route.observes(o.event.occurred_at) {
                        intent.observed()
                    } else {
                        intent
                    };
                    plan.push(intent, span);
                }
                Err(e) => failures.push(e),
            }
        }
        // Channels that rendered still converge; the event is dead-lettered once, naming
        // the channels that did not, so a replay after the fix creates only those.
        if !failures.is_empty() {
            let reason = if failures.iter().all(|f| matches!(f, RenderError::Missing { .. })) {
                DeadLetterReason::TemplateMissing
            } else {
                DeadLetterReason::RenderFailed
            };
            let detail = failures
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            plan.poison.push(dead_letter(o.message, reason, detail));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Route;
    use herald_core::render::{RenderOptions, TemplateRevision};
    use herald_core::{Channel, OrderEvent};
    use herald_kafka::OwnedMessage;
    use herald_kafka::Timestamp;

    const ORDER: &str = r#"{"event_id":"evt-1","event_kind":"order.created","marketplace_id":"acme","order_id":"8042","seller_id":"seller-19","occurred_at":"2026-09-21T10:00:00Z","order":{"total":"129.90","currency":"EUR","item_count":3}}"#;

    #[test]
    fn channels_that_render_become_intents_and_the_rest_one_dead_letter() {
        let renderer = Renderer::new(
            vec![TemplateRevision {
                template: "order-created".into(),
                channel: Channel::Email,
                locale: "en".into(),
                revision: "1".into(),
                subject: Some("Order {{ order_id }}".into()),
                body_text: "Total {{ order.total }}".into(),
                body_html: None,
            }],
            RenderOptions {
                default_locale: "en".into(),
                sms_max_segments: 3,
            },
        );
        let route = Route {
            event_kind: "order.created".into(),
            template: "order-created".into(),
            channels: vec![Channel::Email, Channel::Sms],
            mode: Default::default(),
            deliver_from: None,
        };
        let message = OwnedMessage::new(
            Some(ORDER.as_bytes().to_vec()),
            None,
            "order-events".into(),
            Timestamp::NotAvailable,
            2,
            7,
            None,
        );
        let orders = vec![Routed {
            message: &message,
            event: OrderEvent::decode(ORDER.as_bytes(), 65536).unwrap(),
            route: &route,
            trace_context: None,
            span: None,
        }];
        let p = plan(&renderer, &HashMap::new(), &orders, None);
        let intents: Vec<(Channel, i32, i64)> = p
            .intents()
            .iter()
            .map(|i| (i.key.channel, i.source.partition, i.source.offset))
            .collect();
        assert_eq!(intents, [(Channel::Email, 2, 7)]);
        assert_eq!(p.poison.len(), 1);
        assert_eq!(p.poison[0].reason, "template_missing");
        assert!(p.poison[0].detail.contains("sms"), "{}", p.poison[0].detail);
        assert!(p.with_spans().all(|(_, span)| span.is_none()));
        assert!(p.intents()[0].hold_for.is_none());

        // Held: the same intent, its payload rendered without a profile (the fallback).
        let held = plan(&renderer, &HashMap::new(), &orders, Some(Duration::from_secs(60)));
        assert_eq!(held.intents()[0].hold_for, Some(Duration::from_secs(60)));
        assert_eq!(held.intents()[0].payload, p.intents()[0].payload);
        assert_eq!(held.intents()[0].payload.consent.as_str(), "no_seller_profile");
    }
}
