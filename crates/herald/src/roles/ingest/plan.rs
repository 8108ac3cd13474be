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
use herald_kafka::DeadLetter;
use herald_store::NewIntent;
use tracing::field::Empty;
use tracing::{info_span, Span};

use super::classify::{dead_letter, Origin, Routed};
use crate::obs;

/// The intents to converge, each with its span (`intent created` / `reused` / `conflict`
/// once known), kept together by [`Plan::push`].
#[derive(Default)]
pub struct Plan<'c> {
    intents: Vec<NewIntent<'c>>,
    spans: Vec<Option<Span>>,
    /// Orders with a channel that did not render, by their index in the input.
    pub unrendered: Vec<Unrendered>,
}

/// An order with channels that did not render: one dead letter (or HTTP answer) for all.
pub struct Unrendered {
    pub order: usize,
    pub reason: DeadLetterReason,
    pub detail: String,
}

impl Unrendered {
    /// The dead letter of a Kafka order (`orders` is the plan's input).
    pub fn dead_letter<'m>(&self, orders: &[Routed<'m>]) -> Option<DeadLetter<'m>> {
        match orders[self.order].origin {
            Origin::Kafka(m) => Some(dead_letter(m, self.reason, self.detail.clone())),
            Origin::Http(_) => None,
        }
    }
}

impl<'c> Plan<'c> {
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

pub fn plan<'c>(
    renderer: &Renderer,
    profiles: &HashMap<(String, String), SellerProfile>,
    orders: &'c [Routed<'_>],
    hold: Option<Duration>,
) -> Plan<'c> {
    let mut plan = Plan::default();
    for (n, o) in orders.iter().enumerate() {
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
                    let intent = NewIntent::new(&o.event, channel, payload, trace_context, o.origin.source());
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
            plan.unrendered.push(Unrendered {
                order: n,
                reason,
                detail,
            });
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
            origin: Origin::Kafka(&message),
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
        let poison: Vec<_> = p
            .unrendered
            .iter()
            .filter_map(|u| u.dead_letter(&orders))
            .collect();
        assert_eq!(poison.len(), 1);
        assert_eq!(poison[0].reason, "template_missing");
        assert!(poison[0].detail.contains("sms"), "{}", poison[0].detail);
        assert!(p.with_spans().all(|(_, span)| span.is_none()));
        assert!(p.intents()[0].hold_for.is_none());

        // Held: the same intent, its payload rendered without a profile (the fallback).
        let held = plan(&renderer, &HashMap::new(), &orders, Some(Duration::from_secs(60)));
        assert_eq!(held.intents()[0].hold_for, Some(Duration::from_secs(60)));
        assert_eq!(held.intents()[0].payload, p.intents()[0].payload);
        assert_eq!(held.intents()[0].payload.consent.as_str(), "no_seller_profile");
    }
}
