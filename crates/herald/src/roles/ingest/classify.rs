//! The first step of a batch, with no I/O: each message becomes a seller record, a routed
//! order event, a dead letter (it cannot be decoded, or holds what PostgreSQL cannot store)
//! or nothing (an event kind without a route).

use herald_core::event::DeadLetterReason;
use herald_core::{OrderEvent, SellerRecord};
use herald_kafka::headers::{header_str, valid_traceparent, TRACEPARENT};
use herald_kafka::{DeadLetter, Message, OwnedMessage};
use herald_store::ingest::SourceRef;
use tracing::Span;

use crate::config::{Config, Route};

/// Where a routed order came from.
pub enum Origin<'m> {
    Kafka(&'m OwnedMessage),
    /// A request to the HTTP ingest listener, by its Idempotency-Key.
    Http(&'m str),
}

impl Origin<'_> {
    /// What the intent and a conflict record as its source.
    pub fn source(&self) -> SourceRef {
        match self {
            Origin::Kafka(m) => SourceRef {
                topic: m.topic().to_owned(),
                partition: m.partition(),
                offset: m.offset(),
            },
            Origin::Http(key) => SourceRef::http(key),
        }
    }
}

/// An order event that has a route, with where it came from.
pub struct Routed<'m> {
    pub origin: Origin<'m>,
    pub event: OrderEvent,
    pub route: &'m Route,
    /// The producer's `traceparent` header, when well-formed.
    pub trace_context: Option<String>,
    /// `process order-events`, child of the producer's span, when spans are exported; set
    /// after classification and ended once the batch is committed.
    pub span: Option<Span>,
}

/// A batch sorted by what is to become of each message, in input order within each kind.
#[derive(Default)]
pub struct Classified<'m> {
    pub sellers: Vec<SellerRecord>,
    pub orders: Vec<Routed<'m>>,
    pub poison: Vec<DeadLetter<'m>>,
    pub no_route: u64,
}

pub fn classify<'m>(config: &'m Config, seller_topic: &str, batch: &'m [OwnedMessage]) -> Classified<'m> {
    let max_bytes = config.ingest.max_message_bytes;
    let mut out = Classified::default();
    for m in batch {
        if m.topic() == seller_topic {
            match SellerRecord::decode(m.key(), m.payload(), max_bytes) {
                Ok(r) => out.sellers.push(r),
                Err(e) => out.poison.push(dead_letter(m, e.reason, e.detail)),
            }
            continue;
        }
        match OrderEvent::decode(m.payload().unwrap_or_default(), max_bytes) {
            Ok(event) => match config.route(&event.event_kind) {
                Some(route) => out.orders.push(Routed {
                    origin: Origin::Kafka(m),
                    trace_context: header_str(m, TRACEPARENT)
                        .and_then(valid_traceparent)
                        .map(str::to_owned),
                    event,
                    route,
                    span: None,
                }),
                None => {
                    tracing::debug!(event_kind = %event.event_kind, "no route for event kind: skipped");
                    out.no_route += 1;
                }
            },
            Err(e) => out.poison.push(dead_letter(m, e.reason, e.detail)),
        }
    }
    out
}

pub fn dead_letter(m: &OwnedMessage, reason: DeadLetterReason, detail: String) -> DeadLetter<'_> {
    DeadLetter {
        message: m,
        reason: reason.as_str(),
        detail,
        skipped_to: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_kafka::Timestamp;

    const ORDER: &str = r#"{"event_id":"evt-1","event_kind":"order.created","marketplace_id":"acme","order_id":"8042","seller_id":"seller-19","occurred_at":"2026-09-21T10:00:00Z","order":{"total":"129.90","currency":"EUR","item_count":3}}"#;

    fn message(topic: &str, offset: i64, key: &str, value: &str) -> OwnedMessage {
        OwnedMessage::new(
            Some(value.as_bytes().to_vec()),
            Some(key.as_bytes().to_vec()),
            topic.to_owned(),
            Timestamp::NotAvailable,
            0,
            offset,
            None,
        )
    }

    #[test]
    fn each_message_goes_to_one_kind_in_order() {
        let mut config = Config::defaults();
        config.routes.push(Route {
            event_kind: "order.created".into(),
            template: "order-created".into(),
            channels: vec![herald_core::Channel::Email],
            mode: Default::default(),
            deliver_from: None,
        });
        let batch = vec![
            message("order-events", 0, "acme:8042", ORDER),
            message(
                "order-events",
                1,
                "acme:8042",
                &ORDER.replace("\"EUR\"", "\"E\\u0000\""),
            ),
            message(
                "seller-profiles",
                0,
                "acme:seller-19",
                r#"{"marketplace_id":"acme","seller_id":"seller-19","email":"a\u0000@b","version":1}"#,
            ),
            message(
                "order-events",
                2,
                "acme:8042",
                &ORDER.replace("order.created", "order.unrouted"),
            ),
            message(
                "seller-profiles",
                1,
                "acme:seller-19",
                r#"{"marketplace_id":"acme","seller_id":"seller-19","email":"a@b","version":2}"#,
            ),
            message("order-events", 3, "acme:8042", &ORDER.replace("evt-1", "evt-2")),
        ];
        let c = classify(&config, "seller-profiles", &batch);
        let offsets: Vec<i64> = c.orders.iter().map(|o| o.origin.source().offset).collect();
        assert_eq!(offsets, [0, 3]);
        assert_eq!(c.sellers.len(), 1);
        assert_eq!(c.no_route, 1);
        let poison: Vec<(&str, i64, &str)> = c
            .poison
            .iter()
            .map(|p| (p.message.topic(), p.message.offset(), p.reason))
            .collect();
        assert_eq!(
            poison,
            [
                ("order-events", 1, "invalid_value"),
                ("seller-profiles", 0, "invalid_value")
            ]
        );
        assert!(
            c.poison[0].detail.contains("order.currency"),
            "{}",
            c.poison[0].detail
        );
        assert!(c.poison[1].detail.contains("email"), "{}", c.poison[1].detail);
    }
}
