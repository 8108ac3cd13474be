//! The dead-letter producer: poison input goes to `herald.dead-letter` with headers that
//! name the reason and the source topic, partition and offset, and the original key, value
//! and trace headers, so nothing is lost and it can be replayed once fixed.
//!
//! The dead-letter topic always takes the record. A message Herald consumed can be too
//! large to copy whole (librdkafka's `message.max.bytes` is 1,000,000 by default, a topic
//! accepts 1,048,588; the dead-letter topic may be configured smaller still). When the
//! whole copy is refused permanently, the dead letter carries less, in two steps:
//!
//! 1. `prefix`: the value's first [`PREFIX_BYTES`] bytes, the key only if it is at most
//!    [`MAX_FALLBACK_KEY`] bytes (else none), of the original headers only a valid
//!    `traceparent` and a bounded `tracestate`, plus [`DLQ_PAYLOAD`]`=prefix`,
//!    [`DLQ_ORIGINAL_SIZE`] and [`DLQ_ORIGINAL_BLAKE3`] (of the whole value);
//! 2. `omitted`: Herald's own dead-letter headers only, with the size and the digest.
//!
//! The whole message stays at its source offset (until the source topic's retention),
//! where the size and digest identify it. Transient errors are never retried here: they
//! are returned, and the caller retries the dead letters with backoff (the offsets behind
//! them stay unstored meanwhile).

use futures::future::join_all;
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::Message;
use tracing::warn;

use crate::headers::*;
use crate::producer::AckedProducer;
use crate::{KafkaError, KafkaSettings, Result};

/// One message to dead-letter, with its bounded reason code and a human detail.
pub struct DeadLetter<'a> {
    pub message: &'a OwnedMessage,
    pub reason: &'static str,
    pub detail: String,
    /// For a run of offsets that could not be decoded (`message` then stands for its first
    /// offset, with no key or value): one past the last offset skipped, in
    /// [`DLQ_SOURCE_OFFSET_END`].
    pub skipped_to: Option<i64>,
}

#[derive(Clone)]
pub struct DeadLetterProducer {
    producer: AckedProducer,
    topic: String,
    group: String,
}

/// Longest detail kept in a header; details quote input, which may be huge.
const MAX_DETAIL: usize = 1024;

/// Bytes of the original value a `prefix` dead letter keeps: enough to read the event's
/// kind, ids and first fields; with the key, Herald's headers and the trace headers the
/// record stays under 20,000 bytes, far below any topic's plausible `max.message.bytes`.
pub const PREFIX_BYTES: usize = 16 * 1024;

/// Longest key a `prefix` dead letter keeps; a longer key is left out rather than cut
/// (a cut key would name another record).
pub const MAX_FALLBACK_KEY: usize = 1024;

/// Longest `tracestate` a `prefix` dead letter keeps (W3C's own limit is 512 characters).
const MAX_TRACESTATE: usize = 512;

/// How much of the original a dead letter carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Key, value and every header as they were.
    Whole,
    /// Bounded: see the module documentation.
    Prefix,
    /// Herald's headers only.
    Omitted,
}

/// The original value's size and digest, for the bounded forms.
struct Original {
    size: String,
    blake3: String,
}

impl DeadLetterProducer {
    pub fn new(settings: &KafkaSettings, topic: &str, group: &str) -> Result<Self> {
        let mut config = settings.producer();
        // One record per produce batch: the broker judges a batch against the topic's
        // `max.message.bytes` as a whole and librdkafka does not split a refused batch,
        // so two dead letters that each fit could otherwise be refused together.
        config.set("batch.num.messages", "1");
        Ok(Self {
            producer: AckedProducer::create(&config, settings.hooks())?,
            topic: topic.to_owned(),
            group: group.to_owned(),
        })
    }

    /// Produces all at once and waits for every answer: one result per letter, in order.
    /// The caller retries only the letters that failed (transiently), so a dead letter is
    /// produced once per acknowledged try, not once per retry of its batch.
    pub async fn send_each(&self, letters: &[&DeadLetter<'_>]) -> Vec<Result<()>> {
        join_all(letters.iter().map(|l| self.send(l))).await
    }

    /// Whole, else `prefix`, else `omitted`; the next form only after a permanent refusal.
    /// A transient error is returned as it is. A permanent refusal of the headers-only
    /// record is returned too: it needs a dead-letter topic whose `max.message.bytes` is
    /// below a few kilobytes (or that refuses keyless records), a deployment to fix.
    async fn send(&self, l: &DeadLetter<'_>) -> Result<()> {
        let refused = match self.produce(l, Form::Whole, None).await {
            Ok(()) => return Ok(()),
            Err(e) if e.class().is_transient() => return Err(e),
            Err(e) => e,
        };
        let value = l.message.payload().unwrap_or_default();
        let original = Original {
            size: value.len().to_string(),
            blake3: blake3::hash(value).to_hex().to_string(),
        };
        warn!(topic = %self.topic, source_topic = l.message.topic(), partition = l.message.partition(),
              offset = l.message.offset(), bytes = value.len(), refused = refused.class().label(),
              "dead-letter topic refused the whole message; producing a bounded prefix");
        let refused = match self.produce(l, Form::Prefix, Some(&original)).await {
            Ok(()) => return Ok(()),
            Err(e) if e.class().is_transient() => return Err(e),
            Err(e) => e,
        };
        warn!(topic = %self.topic, source_topic = l.message.topic(), partition = l.message.partition(),
              offset = l.message.offset(), refused = refused.class().label(),
              "dead-letter topic refused the prefix; producing Herald's headers only");
        self.produce(l, Form::Omitted, Some(&original)).await
    }

    async fn produce(&self, l: &DeadLetter<'_>, form: Form, original: Option<&Original>) -> Result<()> {
        let m = l.message;
        let detail = bounded(&l.detail, MAX_DETAIL);
        let partition = m.partition().to_string();
        let offset = m.offset().to_string();
        let timestamp = m.timestamp().to_millis().map(|t| t.to_string());
        let skipped_to = l.skipped_to.map(|o| o.to_string());
        let mut own: Vec<(&str, &str)> = vec![
            (DLQ_REASON, l.reason),
            (DLQ_DETAIL, detail.as_str()),
            (DLQ_SOURCE_TOPIC, m.topic()),
            (DLQ_SOURCE_PARTITION, partition.as_str()),
            (DLQ_SOURCE_OFFSET, offset.as_str()),
            (DLQ_CONSUMER_GROUP, self.group.as_str()),
        ];
        if let Some(ts) = &timestamp {
            own.push((DLQ_SOURCE_TIMESTAMP, ts.as_str()));
        }
        if let Some(end) = &skipped_to {
            own.push((DLQ_SOURCE_OFFSET_END, end.as_str()));
        }
        if let Some(o) = original {
            let payload = if form == Form::Prefix { "prefix" } else { "omitted" };
            own.extend([
                (DLQ_PAYLOAD, payload),
                (DLQ_ORIGINAL_SIZE, o.size.as_str()),
                (DLQ_ORIGINAL_BLAKE3, o.blake3.as_str()),
            ]);
        }
        let mut headers = OwnedHeaders::new_with_capacity(own.len() + 2);
        for (key, value) in own {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let original_headers = m.headers().into_iter().flat_map(|h| h.iter());
        match form {
            Form::Whole => {
                for h in original_headers {
                    headers = headers.insert(Header {
                        key: h.key,
                        value: h.value,
                    });
                }
            }
            Form::Prefix => {
                // The first valid one of each, at most: a producer repeating a header a
                // thousand times must not unbound the prefix record.
                let (mut parent_kept, mut state_kept) = (false, false);
                for h in original_headers {
                    let value = h.value.and_then(|v| std::str::from_utf8(v).ok());
                    let keep = match (h.key, value) {
                        (TRACEPARENT, Some(v)) if !parent_kept && valid_traceparent(v).is_some() => {
                            parent_kept = true;
                            true
                        }
                        (TRACESTATE, Some(v)) if !state_kept && v.len() <= MAX_TRACESTATE => {
                            state_kept = true;
                            true
                        }
                        _ => false,
                    };
                    if keep {
                        headers = headers.insert(Header {
                            key: h.key,
                            value: h.value,
                        });
                    }
                }
            }
            Form::Omitted => {}
        }
        let value = m.payload();
        let (key, payload) = match form {
            Form::Whole => (m.key(), value),
            Form::Prefix => {
                let v = value.unwrap_or_default();
                (
                    m.key().filter(|k| k.len() <= MAX_FALLBACK_KEY),
                    Some(&v[..v.len().min(PREFIX_BYTES)]),
                )
            }
            Form::Omitted => (None, None),
        };
        self.producer
            .send(&self.topic, key, payload, headers)
            .await
            .map_err(KafkaError::Client)
    }
}

/// `s` cut to at most `max` bytes at a character boundary, with an ellipsis when cut.
fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

#[cfg(test)]
mod tests {
    use super::bounded;

    #[test]
    fn details_are_cut_at_a_character_boundary() {
        assert_eq!(bounded("abc", 3), "abc");
        assert_eq!(bounded("abcd", 3), "abc…");
        // 'é' is two bytes: a cut inside it moves back.
        assert_eq!(bounded("aéb", 2), "a…");
    }
}
