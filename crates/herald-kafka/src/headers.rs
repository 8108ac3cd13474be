//! Header names Herald reads and writes on Kafka messages.

use rdkafka::message::{Headers, Message};

/// W3C trace context of the producer of an order event.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// Dead-letter headers: why, and where the message came from.
pub const DLQ_REASON: &str = "herald-dlq-reason";
pub const DLQ_DETAIL: &str = "herald-dlq-detail";
pub const DLQ_SOURCE_TOPIC: &str = "herald-dlq-source-topic";
pub const DLQ_SOURCE_PARTITION: &str = "herald-dlq-source-partition";
pub const DLQ_SOURCE_OFFSET: &str = "herald-dlq-source-offset";
/// Set on the dead letter of a run of offsets that could not be decoded: one past the last
/// offset skipped (`herald-dlq-source-offset` is the first).
pub const DLQ_SOURCE_OFFSET_END: &str = "herald-dlq-source-offset-end";
pub const DLQ_SOURCE_TIMESTAMP: &str = "herald-dlq-source-timestamp";
pub const DLQ_CONSUMER_GROUP: &str = "herald-dlq-consumer-group";
/// Set when the dead letter does not carry the original value whole: `prefix` (a bounded
/// prefix of it) or `omitted` (headers only), because the dead-letter topic refused more.
pub const DLQ_PAYLOAD: &str = "herald-dlq-payload";
/// With `herald-dlq-payload`: the original value's size in bytes and its blake3 digest
/// (hex), so the whole message can be found again at its source offset and checked.
pub const DLQ_ORIGINAL_SIZE: &str = "herald-dlq-original-size";
pub const DLQ_ORIGINAL_BLAKE3: &str = "herald-dlq-original-blake3";

/// The first value of header `name`, if present and UTF-8.
pub fn header_str<'a, M: Message>(msg: &'a M, name: &str) -> Option<&'a str> {
    let headers = msg.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// A `traceparent` header value, if it is well-formed W3C trace context
/// (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero). Anything else is ignored: a bad
/// trace header must never cost an order its notification.
pub fn valid_traceparent(v: &str) -> Option<&str> {
    let parts: Vec<&str> = v.trim().split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    match parts.as_slice() {
        [version, trace, span, flags]
            if hex(version, 2)
                && *version != "ff"
                && hex(trace, 32)
                && hex(span, 16)
                && hex(flags, 2)
                && trace.bytes().any(|b| b != b'0')
                && span.bytes().any(|b| b != b'0') =>
        {
            Some(v.trim())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_validation() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(valid_traceparent(ok), Some(ok));
        assert_eq!(
            valid_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            None
        );
        assert_eq!(
            valid_traceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
            None
        );
        assert_eq!(valid_traceparent("garbage"), None);
        assert_eq!(
            valid_traceparent("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            None
        );
    }
}
