//! What a `POST /v1/order-events` asks for, with no I/O: its Idempotency-Key, its request
//! fingerprint, and the order event with the channels it names. Every refusal carries the
//! reason code the dead-letter topic uses for the same fault.

use herald_core::digest::fields_hex;
use herald_core::event::{decode_object, DeadLetterReason, DecodeError};
use herald_core::{Channel, OrderEvent};
use serde_json::{Map, Value};

/// Longest Idempotency-Key, in characters (Stripe's limit).
pub const MAX_KEY_LEN: usize = 255;

/// The body field that narrows the route to one of its channels; not part of the event.
pub const CHANNEL_FIELD: &str = "channel";

/// The key of `Idempotency-Key: <value>`: a Structured Field string (`"…"`, with `\"`
/// and `\\` escapes), as draft-ietf-httpapi-idempotency-key-header writes it, or a bare
/// token, as Stripe's clients send it. 1 to 255 printable ASCII characters either way.
pub fn idempotency_key(value: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(value).map_err(|_| "Idempotency-Key is not ASCII".to_owned())?;
    let key = match text.strip_prefix('"') {
        Some(quoted) => {
            let inner = quoted
                .strip_suffix('"')
                .ok_or("Idempotency-Key opens a quoted string it does not close")?;
            let mut key = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some(e @ ('"' | '\\')) => key.push(e),
                        _ => {
                            return Err(
                                "Idempotency-Key: only \\\" and \\\\ are escapes in a quoted key".into()
                            )
                        }
                    },
                    '"' => return Err("Idempotency-Key: a '\"' inside a quoted key must be escaped".into()),
                    c => key.push(c),
                }
            }
            key
        }
        None => {
            if text.contains([' ', '"']) {
                return Err("Idempotency-Key: quote a key that holds spaces or '\"'".into());
            }
            text.to_owned()
        }
    };
    if key.is_empty() || key.chars().count() > MAX_KEY_LEN {
        return Err(format!(
            "Idempotency-Key must be 1 to {MAX_KEY_LEN} characters, not {}",
            key.chars().count()
        ));
    }
    if !key.chars().all(|c| (' '..='~').contains(&c)) {
        return Err("Idempotency-Key may hold printable ASCII only".into());
    }
    Ok(key)
}

/// A decoded request body.
#[derive(Debug)]
pub struct OrderRequest {
    /// blake3 of the whole body in canonical form (keys sorted, no white space): equal for a
    /// retry of the same request, whatever its formatting.
    pub fingerprint: String,
    /// The body as received, `channel` included: the evidence kept when a key is reused.
    pub document: Map<String, Value>,
    pub event: OrderEvent,
    /// The one channel asked for, if any.
    pub channel: Option<Channel>,
}

/// Decodes a body of at most `max_bytes` as an order event plus an optional `channel`.
pub fn order_request(body: &[u8], max_bytes: usize) -> Result<OrderRequest, DecodeError> {
    let document = decode_object(body, max_bytes)?;
    let canonical = serde_json::to_vec(&Value::Object(document.clone()))
        .expect("serialising a serde_json value cannot fail");
    let fingerprint = fields_hex(&[b"http-order-event-v1", &canonical]);
    let mut event_document = document.clone();
    let channel = match event_document.remove(CHANNEL_FIELD) {
        None => None,
        Some(Value::String(c)) => Some(c.parse::<Channel>().map_err(|e| {
            DecodeError::new(DeadLetterReason::InvalidValue, format!("field \"channel\": {e}"))
        })?),
        Some(_) => {
            return Err(DecodeError::new(
                DeadLetterReason::WrongType,
                "field \"channel\" must be a string",
            ))
        }
    };
    // Without `channel` the event is the one Kafka would carry: the same fingerprint, so a
    // request and a message of the same event converge as duplicates.
    let event = OrderEvent::from_document(event_document)?;
    Ok(OrderRequest {
        fingerprint,
        document,
        event,
        channel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"event_id":"evt-1","event_kind":"order.created","marketplace_id":"acme","order_id":"8042","seller_id":"seller-19","occurred_at":"2026-09-21T10:00:00Z","order":{"total":"129.90","currency":"EUR","item_count":3}}"#;

    #[test]
    fn keys_are_bare_or_quoted_printable_ascii() {
        assert_eq!(idempotency_key(b"8e03978e-40d5").unwrap(), "8e03978e-40d5");
        assert_eq!(idempotency_key(b"\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
        assert_eq!(idempotency_key(br#""a \"b\" \\c""#).unwrap(), r#"a "b" \c"#);
        assert_eq!(idempotency_key(&[b'k'; 255]).unwrap().len(), 255);
        for bad in [
            &b""[..],
            b"\"\"",
            &[b'k'; 256],
            b"two words",
            b"\"open",
            b"\"a\"b\"",
            b"\"a\\nb\"",
            b"caf\xc3\xa9",
            b"tab\tkey",
        ] {
            assert!(
                idempotency_key(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_fingerprint_ignores_formatting_and_the_event_ignores_the_channel() {
        let a = order_request(ORDER.as_bytes(), 65536).unwrap();
        let spaced = ORDER.replace(',', " ,\n ");
        let b = order_request(spaced.as_bytes(), 65536).unwrap();
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(a.channel, None);

        let with_channel = ORDER.replacen('{', r#"{"channel":"sms","#, 1);
        let c = order_request(with_channel.as_bytes(), 65536).unwrap();
        assert_eq!(c.channel, Some(Channel::Sms));
        assert_ne!(c.fingerprint, a.fingerprint, "the channel is part of the request");
        assert_eq!(
            c.event.fingerprint, a.event.fingerprint,
            "but not of the event: Kafka's copy converges on the same intent"
        );
        assert!(c.document.contains_key("channel"), "kept as sent, for evidence");

        let other_total = ORDER.replace("129.90", "130.00");
        assert_ne!(
            order_request(other_total.as_bytes(), 65536).unwrap().fingerprint,
            a.fingerprint
        );
        let other_id = ORDER.replace("evt-1", "evt-2");
        assert_ne!(
            order_request(other_id.as_bytes(), 65536).unwrap().fingerprint,
            a.fingerprint,
            "a retry of the same request carries the same event id"
        );
    }

    #[test]
    fn refusals_use_the_dead_letter_reasons() {
        let reason = |body: &str| order_request(body.as_bytes(), 65536).unwrap_err().reason.as_str();
        assert_eq!(reason("{"), "not_json");
        assert_eq!(reason("[]"), "not_json");
        assert_eq!(
            reason(&ORDER.replacen('{', r#"{"channel":"fax","#, 1)),
            "invalid_value"
        );
        assert_eq!(reason(&ORDER.replacen('{', r#"{"channel":7,"#, 1)), "wrong_type");
        assert_eq!(
            reason(&ORDER.replace(r#""order_id":"8042","#, "")),
            "missing_field"
        );
        assert_eq!(reason(&ORDER.replace("EUR", "E\\u0000")), "invalid_value");
        assert_eq!(
            order_request(ORDER.as_bytes(), 10).unwrap_err().reason.as_str(),
            "too_large"
        );
    }
}
