//! Identity of a notification: the business key (enforced unique in PostgreSQL), the
//! idempotency key derived from it, and the request fingerprint of an event's content.

use std::fmt;

use serde::Serialize;

use crate::channel::Channel;
use crate::digest::fields_hex;

/// `(marketplace_id, order_id, event_kind, channel)`: one notification intent at most per
/// key. The template revision is deliberately not part of it (DESIGN.md, Identity).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct BusinessKey {
    pub marketplace_id: String,
    pub order_id: String,
    pub event_kind: String,
    pub channel: Channel,
}

impl BusinessKey {
    pub fn idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey(fields_hex(&[
            self.marketplace_id.as_bytes(),
            self.order_id.as_bytes(),
            self.event_kind.as_bytes(),
            self.channel.as_str().as_bytes(),
        ]))
    }
}

impl fmt::Display for BusinessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.marketplace_id, self.order_id, self.event_kind, self.channel
        )
    }
}

/// blake3 of the business key, hex: an opaque, stable id for the notification.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct IdempotencyKey(pub String);

impl IdempotencyKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// blake3 of an event's canonical business content (see [`crate::event`]): equal for
/// re-emissions of the same event, different when a caller reused a key with other content.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Fingerprint(pub String);

impl Fingerprint {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(order: &str, channel: Channel) -> BusinessKey {
        BusinessKey {
            marketplace_id: "acme".into(),
            order_id: order.into(),
            event_kind: "order.created".into(),
            channel,
        }
    }

    #[test]
    fn idempotency_key_depends_on_every_part_of_the_business_key() {
        let a = key("8042", Channel::Email).idempotency_key();
        assert_eq!(a, key("8042", Channel::Email).idempotency_key());
        assert_ne!(a, key("8042", Channel::Sms).idempotency_key());
        assert_ne!(a, key("8043", Channel::Email).idempotency_key());
        assert_eq!(a.as_str().len(), 64);
    }
}
