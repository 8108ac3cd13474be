//! `herald.deliveries`, both ways: the wire form of [`DeliveryMessage`] (encoded by the
//! relay, decoded by the delivery consumer, here and only here). The relay's producer is
//! [`crate::relay`].
//!
//! One message per intent to deliver: key = value = the intent id (text), so every
//! message of one intent lands on one partition. Headers: `traceparent` (the relay's send
//! span) and `herald-channel` (`email` or `sms`), which tells a delivery worker which
//! channel's claim window the intent takes before it claims it. Messages written before
//! the channel header existed decode with no channel.

use herald_core::Channel;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use uuid::Uuid;

use crate::headers::{valid_traceparent, TRACEPARENT};

/// The channel of the intent a delivery message names.
pub const CHANNEL: &str = "herald-channel";

/// One intent to deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryMessage {
    pub intent_id: Uuid,
    /// `None` for a message from a relay older than the header.
    pub channel: Option<Channel>,
    pub traceparent: Option<String>,
}

/// Why a message of `herald.deliveries` was not a delivery message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryDecodeError {
    #[error("no key and no value")]
    Empty,
    #[error("the intent id is not a UUID")]
    InvalidIntentId,
    #[error("the {CHANNEL} header names no channel Herald knows")]
    InvalidChannel,
}

impl DeliveryMessage {
    /// The key (and value) and headers to produce.
    pub fn encode(&self) -> (String, OwnedHeaders) {
        let mut headers = OwnedHeaders::new();
        if let Some(tc) = &self.traceparent {
            headers = headers.insert(Header {
                key: TRACEPARENT,
                value: Some(tc.as_str()),
            });
        }
        if let Some(c) = self.channel {
            headers = headers.insert(Header {
                key: CHANNEL,
                value: Some(c.as_str()),
            });
        }
        (self.intent_id.to_string(), headers)
    }

    /// Reads a consumed message. A malformed `traceparent` is dropped (a bad trace header
    /// must never cost a notification); a malformed id or channel is an error.
    pub fn decode<H: Headers>(
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: Option<&H>,
    ) -> Result<Self, DeliveryDecodeError> {
        let raw = key.or(payload).ok_or(DeliveryDecodeError::Empty)?;
        let intent_id = std::str::from_utf8(raw)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or(DeliveryDecodeError::InvalidIntentId)?;
        let header = |name: &str| {
            headers.and_then(|h| {
                h.iter()
                    .find(|x| x.key == name)
                    .and_then(|x| x.value)
                    .map(|v| std::str::from_utf8(v).ok())
            })
        };
        let channel = match header(CHANNEL) {
            None => None,
            Some(text) => Some(
                text.and_then(|t| t.parse().ok())
                    .ok_or(DeliveryDecodeError::InvalidChannel)?,
            ),
        };
        let traceparent = header(TRACEPARENT)
            .flatten()
            .and_then(valid_traceparent)
            .map(str::to_owned);
        Ok(Self {
            intent_id,
            channel,
            traceparent,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn round_trip(m: &DeliveryMessage) -> Result<DeliveryMessage, DeliveryDecodeError> {
        let (key, headers) = m.encode();
        DeliveryMessage::decode(Some(key.as_bytes()), Some(key.as_bytes()), Some(&headers))
    }

    #[test]
    fn a_delivery_message_survives_the_round_trip() {
        for channel in [Some(Channel::Email), Some(Channel::Sms), None] {
            for traceparent in [Some(TP.to_owned()), None] {
                let m = DeliveryMessage {
                    intent_id: Uuid::now_v7(),
                    channel,
                    traceparent,
                };
                assert_eq!(round_trip(&m), Ok(m.clone()));
            }
        }
    }

    #[test]
    fn a_message_from_an_older_relay_has_no_channel_and_still_decodes() {
        let id = Uuid::now_v7().to_string();
        let m = DeliveryMessage::decode::<OwnedHeaders>(Some(id.as_bytes()), None, None).unwrap();
        assert_eq!((m.intent_id.to_string(), m.channel), (id, None));
    }

    #[test]
    fn malformed_ids_and_channels_are_errors_and_bad_trace_headers_are_dropped() {
        let none: Option<&OwnedHeaders> = None;
        assert_eq!(
            DeliveryMessage::decode(None, None, none),
            Err(DeliveryDecodeError::Empty)
        );
        assert_eq!(
            DeliveryMessage::decode(Some(b"not-a-uuid"), None, none),
            Err(DeliveryDecodeError::InvalidIntentId)
        );
        let id = Uuid::now_v7().to_string();
        let fax = OwnedHeaders::new().insert(Header {
            key: CHANNEL,
            value: Some("fax"),
        });
        assert_eq!(
            DeliveryMessage::decode(Some(id.as_bytes()), None, Some(&fax)),
            Err(DeliveryDecodeError::InvalidChannel)
        );
        let junk = OwnedHeaders::new().insert(Header {
            key: TRACEPARENT,
            value: Some("junk"),
        });
        let m = DeliveryMessage::decode(Some(id.as_bytes()), None, Some(&junk)).unwrap();
        assert_eq!(m.traceparent, None);
    }
}
