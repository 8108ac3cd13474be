//! Order event v1: decoding from Kafka bytes, validation, and the request fingerprint.
//!
//! A message that cannot become an [`OrderEvent`] yields a [`DecodeError`] whose
//! [`DeadLetterReason`] is a bounded code (it names the dead-letter header and a metric
//! label) and whose detail says what was wrong, for the operator reading the dead letter.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::channel::Channel;
use crate::digest::fields_hex;
use crate::keys::{BusinessKey, Fingerprint};

/// Fields that describe the transport of an event, not its business content: a
/// re-emission may change them without being a conflict.
pub const TRANSPORT_FIELDS: [&str; 2] = ["event_id", "produced_at"];

/// Longest accepted id or kind, in bytes.
pub const MAX_ID_LEN: usize = 200;

/// Why a message went to the dead-letter topic. A bounded set: used as a header value and
/// as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterReason {
    TooLarge,
    NotUtf8,
    NotJson,
    MissingField,
    WrongType,
    InvalidValue,
    BadKey,
    TemplateMissing,
    RenderFailed,
    /// Decoded and planned, but PostgreSQL refused to store it (a data exception or a
    /// constraint the decoder does not know of): found by bisecting its batch. The detail
    /// names the SQLSTATE.
    StoreRejected,
    /// A record batch librdkafka could not decode (a codec the build lacks, corrupt data):
    /// the dead letter names the offsets skipped, which stay in the source topic.
    Undecodable,
}

impl DeadLetterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::TooLarge => "too_large",
            DeadLetterReason::NotUtf8 => "not_utf8",
            DeadLetterReason::NotJson => "not_json",
            DeadLetterReason::MissingField => "missing_field",
            DeadLetterReason::WrongType => "wrong_type",
            DeadLetterReason::InvalidValue => "invalid_value",
            DeadLetterReason::BadKey => "bad_key",
            DeadLetterReason::TemplateMissing => "template_missing",
            DeadLetterReason::RenderFailed => "render_failed",
            DeadLetterReason::StoreRejected => "store_rejected",
            DeadLetterReason::Undecodable => "undecodable",
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {detail}", reason.as_str())]
pub struct DecodeError {
    pub reason: DeadLetterReason,
    pub detail: String,
}

impl DecodeError {
    pub fn new(reason: DeadLetterReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

/// A validated order event. `document` is the whole JSON object as received (minus
/// nothing): it is the rendering context and the evidence kept with a conflict.
#[derive(Debug, Clone)]
pub struct OrderEvent {
    pub event_id: String,
    pub event_kind: String,
    pub marketplace_id: String,
    pub order_id: String,
    pub seller_id: String,
    pub occurred_at: DateTime<Utc>,
    pub fingerprint: Fingerprint,
    pub document: Map<String, Value>,
}

impl OrderEvent {
    /// Decodes and validates one Kafka message value of at most `max_bytes`.
    pub fn decode(bytes: &[u8], max_bytes: usize) -> Result<Self, DecodeError> {
        Self::from_document(decode_object(bytes, max_bytes)?)
    }

    /// Validates a decoded JSON object (from [`decode_object`]) as an order event.
    pub fn from_document(document: Map<String, Value>) -> Result<Self, DecodeError> {
        let text = |name: &str| required_id(&document, name);
        let event_kind = text("event_kind")?;
        if !event_kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(DecodeError::new(
                DeadLetterReason::InvalidValue,
                format!("event_kind {event_kind:?} may hold only ASCII letters, digits, '.', '_' and '-'"),
            ));
        }
        let occurred_at_text = required_str(&document, "occurred_at")?;
        let occurred_at = DateTime::parse_from_rfc3339(occurred_at_text)
            .map_err(|e| {
                DecodeError::new(
                    DeadLetterReason::InvalidValue,
                    format!("occurred_at {occurred_at_text:?} is not an RFC 3339 timestamp: {e}"),
                )
            })?
            .with_timezone(&Utc);
        match document.get("order") {
            Some(Value::Object(_)) => {}
            Some(_) => {
                return Err(DecodeError::new(
                    DeadLetterReason::WrongType,
                    "field \"order\" must be a JSON object",
                ))
            }
            None => {
                return Err(DecodeError::new(
                    DeadLetterReason::MissingField,
                    "field \"order\" is missing",
                ))
            }
        }
        if let Some(v) = document.get("produced_at") {
            if !v.is_string() {
                return Err(DecodeError::new(
                    DeadLetterReason::WrongType,
                    "field \"produced_at\" must be a string",
                ));
            }
        }
        Ok(OrderEvent {
            event_id: text("event_id")?,
            marketplace_id: text("marketplace_id")?,
            order_id: text("order_id")?,
            seller_id: text("seller_id")?,
            fingerprint: fingerprint(&document),
            event_kind,
            occurred_at,
            document,
        })
    }

    pub fn business_key(&self, channel: Channel) -> BusinessKey {
        BusinessKey {
            marketplace_id: self.marketplace_id.clone(),
            order_id: self.order_id.clone(),
            event_kind: self.event_kind.clone(),
            channel,
        }
    }
}

/// The fingerprint covers every field but the transport ones, in canonical form: object
/// keys sorted (serde_json's map is ordered), no insignificant white space.
pub fn fingerprint(document: &Map<String, Value>) -> Fingerprint {
    let business: Map<String, Value> = document
        .iter()
        .filter(|(k, _)| !TRANSPORT_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let canonical =
        serde_json::to_vec(&Value::Object(business)).expect("serialising a serde_json value cannot fail");
    Fingerprint(fields_hex(&[b"order-event-v1", &canonical]))
}

/// Size, UTF-8 and JSON-object checks shared by every JSON message Herald reads.
pub fn decode_object(bytes: &[u8], max_bytes: usize) -> Result<Map<String, Value>, DecodeError> {
    if bytes.len() > max_bytes {
        return Err(DecodeError::new(
            DeadLetterReason::TooLarge,
            format!("message is {} bytes, limit is {max_bytes}", bytes.len()),
        ));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| DecodeError::new(DeadLetterReason::NotUtf8, format!("value is not UTF-8: {e}")))?;
    let mut parser = serde_json::Deserializer::from_str(text);
    let parsed = serde::de::DeserializeSeed::deserialize(strict::Unique, &mut parser).and_then(|v| {
        parser.end()?;
        Ok(v)
    });
    match parsed {
        // JSON strings hold no raw control character, so U+0000 can only have come in as
        // the escape `\u0000`: a byte search spares the hot path the document walk (and
        // its path strings) for every event that has none.
        Ok(Value::Object(map)) => match text.contains("\\u0000").then(|| unstorable(&map)).flatten() {
            None => Ok(map),
            Some(path) => Err(DecodeError::new(
                DeadLetterReason::InvalidValue,
                format!("field {path} holds U+0000, which PostgreSQL cannot store in text or jsonb"),
            )),
        },
        Ok(_) => Err(DecodeError::new(
            DeadLetterReason::NotJson,
            "value is JSON but not an object",
        )),
        Err(e) if e.to_string().starts_with(strict::DUPLICATE) => Err(DecodeError::new(
            DeadLetterReason::InvalidValue,
            format!("value has {e}: producers' parsers disagree on which one counts"),
        )),
        Err(e) => Err(DecodeError::new(
            DeadLetterReason::NotJson,
            format!("value is not JSON: {e}"),
        )),
    }
}

/// The path (`order.items[2].name`) of the first string or object key holding U+0000:
/// the one code point valid JSON and UTF-8 carry that PostgreSQL's text and jsonb refuse
/// (SQLSTATE 22021 / 22P05). Refused here, at decode, the event is dead-lettered with the
/// field named instead of failing the database transaction of its whole batch.
pub fn unstorable(document: &Map<String, Value>) -> Option<String> {
    fn key_path(parent: &str, key: &str) -> String {
        let plain = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match (parent.is_empty(), plain) {
            (true, true) => key.to_owned(),
            (true, false) => format!("{key:?}"),
            (false, true) => format!("{parent}.{key}"),
            (false, false) => format!("{parent}.{key:?}"),
        }
    }
    fn walk_object(parent: &str, map: &Map<String, Value>) -> Option<String> {
        map.iter().find_map(|(k, v)| {
            let path = key_path(parent, k);
            if k.contains('\0') {
                return Some(path);
            }
            walk(&path, v)
        })
    }
    fn walk(path: &str, v: &Value) -> Option<String> {
        match v {
            Value::String(s) if s.contains('\0') => Some(path.to_owned()),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| walk(&format!("{path}[{i}]"), item)),
            Value::Object(map) => walk_object(path, map),
            _ => None,
        }
    }
    walk_object("", document)
}

/// JSON into a [`Value`], refusing an object that holds the same key twice: serde_json
/// alone keeps the last one silently, while the producer's reader may have kept the first,
/// so the two would disagree on the event's content.
mod strict {
    use std::fmt;

    use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Value};

    pub const DUPLICATE: &str = "duplicate key";

    pub struct Unique;

    impl<'de> DeserializeSeed<'de> for Unique {
        type Value = Value;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Unique {
        type Value = Value;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_bool<E: Error>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }

        fn visit_i64<E: Error>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }

        fn visit_u64<E: Error>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }

        fn visit_f64<E: Error>(self, v: f64) -> Result<Value, E> {
            Ok(Value::from(v))
        }

        fn visit_str<E: Error>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }

        fn visit_string<E: Error>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }

        fn visit_unit<E: Error>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element_seed(Unique)? {
                items.push(item);
            }
            Ok(Value::Array(items))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut object = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                let value = map.next_value_seed(Unique)?;
                if object.contains_key(&key) {
                    return Err(A::Error::custom(format_args!("{DUPLICATE} {key:?}")));
                }
                object.insert(key, value);
            }
            Ok(Value::Object(object))
        }
    }
}

pub(crate) fn required_str<'a>(doc: &'a Map<String, Value>, name: &str) -> Result<&'a str, DecodeError> {
    match doc.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(Value::Null) | None => Err(DecodeError::new(
            DeadLetterReason::MissingField,
            format!("field {name:?} is missing"),
        )),
        Some(other) => Err(DecodeError::new(
            DeadLetterReason::WrongType,
            format!("field {name:?} must be a string, found {}", json_type(other)),
        )),
    }
}

/// An identifier: a non-empty string of at most [`MAX_ID_LEN`] bytes without control
/// characters (they would corrupt logs, headers and psql output).
pub(crate) fn required_id(doc: &Map<String, Value>, name: &str) -> Result<String, DecodeError> {
    let s = required_str(doc, name)?;
    check_id(name, s)?;
    Ok(s.to_owned())
}

pub(crate) fn check_id(name: &str, s: &str) -> Result<(), DecodeError> {
    if s.trim().is_empty() {
        return Err(DecodeError::new(
            DeadLetterReason::InvalidValue,
            format!("field {name:?} is empty"),
        ));
    }
    if s.len() > MAX_ID_LEN {
        return Err(DecodeError::new(
            DeadLetterReason::InvalidValue,
            format!("field {name:?} is {} bytes long, limit is {MAX_ID_LEN}", s.len()),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(DecodeError::new(
            DeadLetterReason::InvalidValue,
            format!("field {name:?} contains control characters"),
        ));
    }
    Ok(())
}

pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"event_id":"evt-1","event_kind":"order.created","marketplace_id":"acme","order_id":"8042","seller_id":"seller-19","occurred_at":"2026-09-21T10:00:00Z","order":{"total":"129.90","currency":"EUR","item_count":3}}"#;

    fn decode(s: &str) -> Result<OrderEvent, DecodeError> {
        OrderEvent::decode(s.as_bytes(), 65536)
    }

    fn reason(s: &str) -> DeadLetterReason {
        decode(s).unwrap_err().reason
    }

    #[test]
    fn sample_event_decodes() {
        let e = decode(SAMPLE).unwrap();
        assert_eq!(e.event_kind, "order.created");
        assert_eq!(e.order_id, "8042");
        assert_eq!(e.occurred_at.to_rfc3339(), "2026-09-21T10:00:00+00:00");
    }

    #[test]
    fn fingerprint_ignores_transport_fields_and_key_order() {
        let a = decode(SAMPLE).unwrap();
        let b = decode(r#"{"order":{"item_count":3,"currency":"EUR","total":"129.90"},"seller_id":"seller-19","event_id":"evt-2","produced_at":"2026-09-21T10:00:05Z","event_kind":"order.created","marketplace_id":"acme","order_id":"8042","occurred_at":"2026-09-21T10:00:00Z"}"#).unwrap();
        assert_eq!(a.fingerprint, b.fingerprint);
    }

    #[test]
    fn fingerprint_changes_with_business_content() {
        let a = decode(SAMPLE).unwrap();
        let b = decode(&SAMPLE.replace("129.90", "139.90")).unwrap();
        let c = decode(&SAMPLE.replace("}}", "},\"note\":\"x\"}")).unwrap();
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_ne!(
            a.fingerprint, c.fingerprint,
            "unknown fields are business content"
        );
    }

    #[test]
    fn poison_kinds_are_named() {
        assert_eq!(
            OrderEvent::decode(SAMPLE.as_bytes(), 10).unwrap_err().reason,
            DeadLetterReason::TooLarge
        );
        assert_eq!(
            OrderEvent::decode(b"{\"event_id\":\"\xff\"}", 100)
                .unwrap_err()
                .reason,
            DeadLetterReason::NotUtf8
        );
        assert_eq!(reason("not json"), DeadLetterReason::NotJson);
        // Found by fuzzing: without correctly rounded float parsing, the canonical form of
        // this number decoded to another f64, and so to another fingerprint.
        let precise = SAMPLE.replace("\"item_count\":3", "\"item_count\":12.584888888888888888");
        let event = decode(&precise).unwrap();
        let canonical = serde_json::to_string(&event.document).unwrap();
        assert_eq!(decode(&canonical).unwrap().fingerprint, event.fingerprint);
        assert_eq!(
            reason(&SAMPLE.replace(
                "\"order_id\":\"8042\",",
                "\"order_id\":\"8042\",\"order_id\":\"1\","
            )),
            DeadLetterReason::InvalidValue,
            "a key given twice"
        );
        let nested = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(
            reason(&SAMPLE.replace("\"item_count\":3", &format!("\"item_count\":{nested}"))),
            DeadLetterReason::NotJson,
            "nesting beyond the parser's depth limit"
        );
        assert_eq!(reason("[1,2]"), DeadLetterReason::NotJson);
        for (input, path) in [
            (SAMPLE.replace("\"EUR\"", "\"EU\\u0000R\""), "order.currency"),
            (
                SAMPLE.replace("\"item_count\":3", "\"items\":[\"a\",\"\\u0000\"]"),
                "order.items[1]",
            ),
            (
                SAMPLE.replace("\"item_count\":3", "\"it\\u0000em\":3"),
                "order.\"it\\0em\"",
            ),
            (SAMPLE.replace("}}", "},\"note\":\"\\u0000\"}"), "note"),
        ] {
            let e = decode(&input).unwrap_err();
            assert_eq!(e.reason, DeadLetterReason::InvalidValue, "{input}");
            assert!(
                e.detail.starts_with(&format!("field {path} holds U+0000")),
                "{}",
                e.detail
            );
        }
        assert_eq!(
            reason(&SAMPLE.replace("\"EUR\"", "\"\\ud800\"")),
            DeadLetterReason::NotJson,
            "a lone surrogate escape"
        );
        assert!(
            decode(&SAMPLE.replace("\"EUR\"", "\"\\\\u0000\"")).is_ok(),
            "an escaped backslash followed by the text u0000 is storable"
        );
        assert_eq!(
            reason(&SAMPLE.replace("\"order_id\":\"8042\",", "")),
            DeadLetterReason::MissingField
        );
        assert_eq!(
            reason(&SAMPLE.replace("\"8042\"", "8042")),
            DeadLetterReason::WrongType
        );
        assert_eq!(
            reason(&SAMPLE.replace("2026-09-21T10:00:00Z", "yesterday")),
            DeadLetterReason::InvalidValue
        );
        assert_eq!(
            reason(&SAMPLE.replace("\"8042\"", "\"80\\n42\"")),
            DeadLetterReason::InvalidValue
        );
        assert_eq!(
            reason(&SAMPLE.replace("order.created", "order created")),
            DeadLetterReason::InvalidValue
        );
        assert_eq!(
            reason(&SAMPLE.replace(
                "{\"total\":\"129.90\",\"currency\":\"EUR\",\"item_count\":3}",
                "3"
            )),
            DeadLetterReason::WrongType
        );
    }
}
