//! The `hostile` scenario's input: mutations of valid order events and seller profiles, each
//! invalid by construction and with the dead-letter reason it must get, interleaved with
//! the healthy messages on the same keys. Every mutation is made from the seeded
//! generator, so a run is repeated with its seed.
//!
//! Each mutation changes one thing, so its reason is certain: bytes that never occur in
//! UTF-8 (`not_utf8`); a strict prefix of the JSON text, a lone surrogate escape, a number
//! beyond f64 (1e400, 400 digits), nesting deeper than the parser's limit (`not_json`);
//! U+0000 in any string or object key, another control character in an id, an id longer
//! than Herald's limit (`invalid_value`); a string field given another type
//! (`wrong_type`); a value over `ingest.max_message_bytes` (`too_large`), some also over
//! the dead-letter topic's own `max.message.bytes`. Healthy messages include orders padded
//! to just under Herald's limit and seller profiles re-sent with a newer version.

use std::time::{Duration, Instant};

use anyhow::Result;
use futures::future::try_join_all;
use serde_json::{json, Value};

use super::invariants::RefusedInput;
use super::plan::{Plan, LATE_SELLER};
use super::rng::Rng;
use integration_tests::kafka::{produce, producer};
use integration_tests::samples::Seller;
use integration_tests::TestEnv;

/// Herald's default `ingest.max_message_bytes`, which the scenario runs with (the test
/// configuration's is smaller).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
pub const MAX_MESSAGE_BYTES_SETTING: (&str, &str) = ("HERALD_INGEST__MAX_MESSAGE_BYTES", "65536");

/// The dead-letter topic's `max.message.bytes` in the scenario: above Herald's limit, so
/// a value a little over it is dead-lettered whole, and below the largest values produced.
pub const DEAD_LETTER_TOPIC_LIMIT: usize = 100_000;

/// Which topic a message goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    Orders,
    Sellers,
}

impl Topic {
    fn name(self) -> &'static str {
        match self {
            Topic::Orders => "order-events",
            Topic::Sellers => "seller-profiles",
        }
    }
}

/// One message of the hostile stream.
pub struct Outgoing {
    pub topic: Topic,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// `None`: healthy. Otherwise what was done to it and the reason it must get.
    pub refused: Option<(String, &'static str)>,
}

/// The stream: the plan's order events, and mutations of them and of the sellers'
/// profiles on the same keys, in the order they are produced.
pub struct HostileStream {
    pub messages: Vec<Outgoing>,
    /// Per seller, the newest version of its healthy profile produced (1: the seeded one).
    pub seller_versions: Vec<i64>,
    /// Orders padded to just under Herald's limit.
    pub padded_orders: usize,
}

/// Share of the orders padded to just under Herald's limit (healthy).
const PADDED_SHARE: f64 = 0.05;
/// Mutations of an order's event produced before its healthy copy, and after it.
const BEFORE_SHARE: f64 = 0.6;
const AFTER_SHARE: f64 = 0.4;
/// Share of the order events followed by a seller-profile mutation (and, half of the
/// time, a healthy re-emission of that profile with a newer version).
const SELLER_SHARE: f64 = 0.15;

impl HostileStream {
    /// Pads a share of the plan's orders to just under Herald's limit (every copy alike),
    /// then interleaves mutations with the plan's messages.
    pub fn new(plan: &mut Plan, rng: &mut Rng) -> Self {
        let mut padded = Vec::new();
        for n in 0..plan.orders.len() {
            if rng.chance(PADDED_SHARE) {
                padded.push(n);
            }
        }
        for &n in &padded {
            let target = MAX_MESSAGE_BYTES - rng.range(0, 256) as usize;
            let Some(first) = plan.messages.iter().find(|m| m.order == n) else {
                continue;
            };
            let value = pad_to(&first.value, target);
            for m in plan.messages.iter_mut().filter(|m| m.order == n) {
                m.value = value.clone();
            }
        }
        let mut seller_versions = vec![1; plan.sellers.len()];
        let mut messages = Vec::new();
        for m in &plan.messages {
            let key = plan.orders[m.order].as_bytes().to_vec();
            let order = |rng: &mut Rng| {
                let (kind, reason, value) = mutate_order(&m.value, rng);
                Outgoing {
                    topic: Topic::Orders,
                    key: key.clone(),
                    value,
                    refused: Some((kind, reason)),
                }
            };
            if rng.chance(BEFORE_SHARE) {
                for _ in 0..rng.range(1, 2) {
                    messages.push(order(rng));
                }
            }
            messages.push(Outgoing {
                topic: Topic::Orders,
                key: key.clone(),
                value: m.value.clone(),
                refused: None,
            });
            if rng.chance(AFTER_SHARE) {
                messages.push(order(rng));
            }
            if rng.chance(SELLER_SHARE) {
                let s = rng.range(0, plan.sellers.len() as u64 - 1) as usize;
                let id = Plan::seller_id(s);
                let version = seller_versions[s];
                let profile = |version| Seller {
                    version,
                    ..plan.sellers[s].profile(&id)
                };
                let (kind, reason, value) = mutate_seller(&profile(version).value(), rng);
                messages.push(Outgoing {
                    topic: Topic::Sellers,
                    key: profile(version).key(),
                    value,
                    refused: Some((kind, reason)),
                });
                if rng.chance(0.5) {
                    seller_versions[s] += 1;
                    let healthy = profile(seller_versions[s]);
                    messages.push(Outgoing {
                        topic: Topic::Sellers,
                        key: healthy.key(),
                        value: healthy.value(),
                        refused: None,
                    });
                }
            }
        }
        // The late seller's profile comes halfway, among the hostile messages.
        let late = Plan::seller_id(LATE_SELLER);
        let profile = plan.sellers[LATE_SELLER].profile(&late);
        messages.insert(
            messages.len() / 2,
            Outgoing {
                topic: Topic::Sellers,
                key: profile.key(),
                value: profile.value(),
                refused: None,
            },
        );
        Self {
            messages,
            seller_versions,
            padded_orders: padded.len(),
        }
    }

    pub fn refused(&self) -> usize {
        self.messages.iter().filter(|m| m.refused.is_some()).count()
    }
}

/// Where the stream's messages landed.
pub struct Produced {
    pub refused: Vec<RefusedInput>,
    /// (topic, partition, offset) of each healthy message.
    pub healthy: Vec<(String, i32, i64)>,
}

/// Produces the stream evenly over `over` (ten slices a second) from one producer, so each
/// key's messages land in the order of the stream.
pub async fn produce_stream(env: &TestEnv, stream: &HostileStream, over: Duration) -> Result<Produced> {
    let p = producer()?;
    let slices = (over.as_millis() / 100).max(1) as usize;
    let per_slice = stream.messages.len().div_ceil(slices).max(1);
    let chunks = stream.messages.len().div_ceil(per_slice).max(1);
    let topics = [env.topic(Topic::Orders.name()), env.topic(Topic::Sellers.name())];
    let topic = |t: Topic| &topics[usize::from(t == Topic::Sellers)];
    let start = Instant::now();
    let (mut refused, mut healthy) = (Vec::new(), Vec::new());
    for (n, chunk) in stream.messages.chunks(per_slice).enumerate() {
        let sent = try_join_all(
            chunk
                .iter()
                .map(|m| produce(&p, topic(m.topic), Some(&m.key), Some(&m.value), &[])),
        )
        .await?;
        for (m, (partition, offset)) in chunk.iter().zip(sent) {
            let Some((kind, reason)) = &m.refused else {
                healthy.push((topic(m.topic).clone(), partition, offset));
                continue;
            };
            refused.push(RefusedInput {
                topic: topic(m.topic).clone(),
                partition,
                offset,
                kind: kind.clone(),
                reason,
                size: m.value.len(),
                blake3: blake3::hash(&m.value).to_hex().to_string(),
                beyond_dead_letter_limit: m.value.len() > DEAD_LETTER_TOPIC_LIMIT,
            });
        }
        let due = start + over.mul_f64((n + 1) as f64 / chunks as f64);
        tokio::time::sleep_until(due.into()).await;
    }
    Ok(Produced { refused, healthy })
}

/// `value` (a JSON object) with an `order.note` (or top-level `note`) that makes it
/// `target` bytes long.
fn pad_to(value: &[u8], target: usize) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(value).expect("a sample value is JSON");
    let slot = |v: &mut Value, note: String| match v.get_mut("order") {
        Some(Value::Object(o)) => {
            o.insert("note".into(), Value::String(note));
        }
        _ => v["note"] = Value::String(note),
    };
    slot(&mut v, String::new());
    let base = v.to_string().len();
    slot(&mut v, "p".repeat(target.saturating_sub(base)));
    let out = v.to_string().into_bytes();
    debug_assert_eq!(out.len(), target.max(base));
    out
}

/// Control characters other than U+0000 that an id may not hold, C0 and C1.
const CONTROLS: [char; 8] = ['\u{1}', '\u{7}', '\t', '\n', '\r', '\u{1b}', '\u{7f}', '\u{85}'];

/// Bytes that never occur in UTF-8.
const NOT_UTF8: [u8; 6] = [0xC0, 0xC1, 0xF5, 0xF8, 0xFE, 0xFF];

/// String fields of an order event, as (path, how to reach it).
const ORDER_STRINGS: [&str; 10] = [
    "event_id",
    "event_kind",
    "marketplace_id",
    "order_id",
    "seller_id",
    "occurred_at",
    "produced_at",
    "order.total",
    "order.currency",
    "order.tags",
];

const ORDER_IDS: [&str; 5] = [
    "event_id",
    "event_kind",
    "marketplace_id",
    "order_id",
    "seller_id",
];

/// One mutation of a valid order event: (kind, reason, value). The padding of an order
/// padded to just under the limit is left out first: one change, one reason.
pub fn mutate_order(value: &[u8], rng: &mut Rng) -> (String, &'static str, Vec<u8>) {
    let mut v: Value = serde_json::from_slice(value).expect("a sample order event is JSON");
    if let Some(Value::Object(o)) = v.get_mut("order") {
        o.remove("note");
    }
    let value = &bytes(&v);
    // Every kind of field for the string mutations to hit.
    v["order"]["tags"] = json!(["gift", "express"]);
    v["order"]["extras"] = json!({"gift_wrap": true});
    match rng.range(0, 11) {
        0 => flip_bytes(value, rng),
        1 => truncate(value, rng, 0),
        2 | 3 => {
            let path = *rng.pick(&ORDER_STRINGS);
            insert_in_string(&mut v, path, '\u{0}', rng);
            (format!("nul:{path}"), "invalid_value", bytes(&v))
        }
        4 => {
            v["order"]["extras"] = json!({"gift\u{0}wrap": true});
            ("nul:order.extras key".into(), "invalid_value", bytes(&v))
        }
        5 => {
            let path = *rng.pick(&ORDER_IDS);
            let c = *rng.pick(&CONTROLS);
            insert_in_string(&mut v, path, c, rng);
            (format!("control:{path}"), "invalid_value", bytes(&v))
        }
        6 => {
            let path = *rng.pick(&["order_id", "order.currency", "event_kind"]);
            set(&mut v, path, json!("@@LONE@@"));
            let escape = *rng.pick(&["\\ud800", "\\udbff", "\\udc00", "\\udfff"]);
            let text = v.to_string().replace("@@LONE@@", &format!("x{escape}y"));
            (format!("lone_surrogate:{path}"), "not_json", text.into_bytes())
        }
        7 => {
            v["order"]["item_count"] = json!("@@NUMBER@@");
            let number = match rng.range(0, 2) {
                0 => "1e400".to_owned(),
                1 => "-1e400".to_owned(),
                _ => format!("1{}", "0".repeat(399)),
            };
            let text = v.to_string().replace("\"@@NUMBER@@\"", &number);
            (
                "huge_number:order.item_count".into(),
                "not_json",
                text.into_bytes(),
            )
        }
        8 => {
            let depth = rng.range(200, 3000) as usize;
            v["order"]["total"] = json!("@@DEEP@@");
            let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let text = v.to_string().replace("\"@@DEEP@@\"", &deep);
            (format!("deep_nesting:{depth}"), "not_json", text.into_bytes())
        }
        9 => {
            let (path, wrong) = match rng.range(0, 5) {
                0 => ("order_id", json!(8042)),
                1 => ("order", json!("12.00 EUR")),
                2 => ("occurred_at", json!(1_790_000_000)),
                3 => ("produced_at", json!({"at": "2026-09-21T10:00:01Z"})),
                4 => ("event_kind", json!(true)),
                _ => ("seller_id", json!(["seller-1"])),
            };
            v[path] = wrong;
            (format!("wrong_type:{path}"), "wrong_type", bytes(&v))
        }
        10 => {
            let len = rng.range(201, 60_000) as usize;
            v["order_id"] = json!("o".repeat(len));
            (format!("long_id:{len}"), "invalid_value", bytes(&v))
        }
        _ => oversize(&v, rng),
    }
}

/// One mutation of a valid seller profile: (kind, reason, value).
pub fn mutate_seller(value: &[u8], rng: &mut Rng) -> (String, &'static str, Vec<u8>) {
    let mut v: Value = serde_json::from_slice(value).expect("a sample profile is JSON");
    match rng.range(0, 7) {
        0 => flip_bytes(value, rng),
        1 => truncate(value, rng, 1),
        2 | 3 => {
            let path = *rng.pick(&["email", "phone", "locale", "marketplace_id", "seller_id"]);
            insert_in_string(&mut v, path, '\u{0}', rng);
            (format!("profile nul:{path}"), "invalid_value", bytes(&v))
        }
        4 => {
            let path = *rng.pick(&["marketplace_id", "seller_id"]);
            let c = *rng.pick(&CONTROLS);
            insert_in_string(&mut v, path, c, rng);
            (format!("profile control:{path}"), "invalid_value", bytes(&v))
        }
        5 => {
            v["version"] = json!("@@NUMBER@@");
            let text = v.to_string().replace("\"@@NUMBER@@\"", "1e400");
            (
                "profile huge_number:version".into(),
                "not_json",
                text.into_bytes(),
            )
        }
        6 => {
            let (path, wrong) = match rng.range(0, 2) {
                0 => ("version", json!("3")),
                1 => ("email_opt_in", json!("yes")),
                _ => ("email", json!(42)),
            };
            v[path] = wrong;
            (format!("profile wrong_type:{path}"), "wrong_type", bytes(&v))
        }
        _ => {
            let (kind, reason, value) = oversize(&v, rng);
            (format!("profile {kind}"), reason, value)
        }
    }
}

/// Over Herald's limit: a little, or past the dead-letter topic's own limit too.
fn oversize(v: &Value, rng: &mut Rng) -> (String, &'static str, Vec<u8>) {
    let target = if rng.chance(0.5) {
        MAX_MESSAGE_BYTES + rng.range(1, 2_000) as usize
    } else {
        DEAD_LETTER_TOPIC_LIMIT + rng.range(1, 2 * DEAD_LETTER_TOPIC_LIMIT as u64) as usize
    };
    let value = pad_to(&bytes(v), target);
    (format!("too_large:{target}"), "too_large", value)
}

/// 1–3 bytes replaced by bytes that never occur in UTF-8.
fn flip_bytes(value: &[u8], rng: &mut Rng) -> (String, &'static str, Vec<u8>) {
    let mut out = value.to_vec();
    for _ in 0..rng.range(1, 3) {
        let at = rng.range(0, out.len() as u64 - 1) as usize;
        out[at] = *rng.pick(&NOT_UTF8);
    }
    ("byte_flip".into(), "not_utf8", out)
}

/// A strict prefix, at least `min` bytes long (an empty seller profile is a tombstone).
fn truncate(value: &[u8], rng: &mut Rng, min: u64) -> (String, &'static str, Vec<u8>) {
    let len = rng.range(min, value.len() as u64 - 1) as usize;
    (format!("truncated:{len}"), "not_json", value[..len].to_vec())
}

/// Inserts `c` at a random place of the string at `path` (for an array, its second item).
fn insert_in_string(v: &mut Value, path: &str, c: char, rng: &mut Rng) {
    let mut target = v;
    for part in path.split('.') {
        target = &mut target[part];
    }
    if let Value::Array(items) = target {
        target = &mut items[1];
    }
    let s = target.as_str().unwrap_or_default().to_owned();
    let chars: Vec<char> = s.chars().collect();
    let at = rng.range(0, chars.len() as u64) as usize;
    let mut out: String = chars[..at].iter().collect();
    out.push(c);
    out.extend(&chars[at..]);
    *target = Value::String(out);
}

fn set(v: &mut Value, path: &str, to: Value) {
    let mut target = v;
    for part in path.split('.') {
        target = &mut target[part];
    }
    *target = to;
}

fn bytes(v: &Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use herald_core::{OrderEvent, SellerRecord};

    use super::*;
    use integration_tests::samples::{order_event, UniqueSeller};

    /// The decoder refuses each mutation with the reason the generator gives (U+0000
    /// anywhere included).
    #[test]
    fn each_mutation_is_refused_with_the_reason_it_is_given() {
        let order = order_event("evt-c1-7", "order.created", "acme", "c1-7", "seller-3", "12.00");
        // Also an order padded to just under the limit, as the stream has some.
        let padded = pad_to(&order, MAX_MESSAGE_BYTES);
        let seller = UniqueSeller::new();
        let profile = seller.profile("seller-3").value();
        let mut rng = Rng::new(7);
        let mut kinds = std::collections::BTreeSet::new();
        for n in 0..4000 {
            let base = if n % 2 == 0 { &order } else { &padded };
            let (kind, reason, value) = mutate_order(base, &mut rng);
            let outcome = OrderEvent::decode(&value, MAX_MESSAGE_BYTES).map(|_| ());
            check(&kind, reason, outcome);
            kinds.insert(kind.split(':').next().unwrap_or_default().to_owned());
            let (kind, reason, value) = mutate_seller(&profile, &mut rng);
            let outcome =
                SellerRecord::decode(Some(b"acme:seller-3"), Some(&value), MAX_MESSAGE_BYTES).map(|_| ());
            check(&kind, reason, outcome);
        }
        assert_eq!(
            kinds.len(),
            10,
            "every kind of order mutation turns up: {kinds:?}"
        );
    }

    fn check(kind: &str, reason: &str, outcome: Result<(), herald_core::event::DecodeError>) {
        match outcome {
            Err(e) => assert_eq!(e.reason.as_str(), reason, "{kind}: {e}"),
            Ok(()) => panic!("{kind} was accepted"),
        }
    }

    #[test]
    fn the_setting_is_the_limit_the_mutations_are_sized_by() {
        assert_eq!(
            MAX_MESSAGE_BYTES_SETTING.1.parse::<usize>().ok(),
            Some(MAX_MESSAGE_BYTES)
        );
    }

    #[test]
    fn padding_hits_the_size_asked_for() {
        let order = order_event("evt-1", "order.created", "acme", "1", "seller-3", "12.00");
        assert_eq!(pad_to(&order, MAX_MESSAGE_BYTES).len(), MAX_MESSAGE_BYTES);
        assert_eq!(pad_to(&order, 70_000).len(), 70_000);
    }
}
