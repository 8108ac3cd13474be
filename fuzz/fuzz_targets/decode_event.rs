//! The order-event decoder on arbitrary bytes: never panics; a decoded event's
//! fingerprint is stable (the canonical form, decoded again, gives the same fingerprint);
//! and whatever it accepts PostgreSQL can store: no U+0000 in any string or object key of
//! the document (text and jsonb refuse it, which once stalled ingest).
#![no_main]

use herald_core::event::fingerprint;
use herald_core::OrderEvent;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Checked here, by its own walk, not by the decoder's.
fn storable(v: &Value) -> bool {
    match v {
        Value::String(s) => !s.contains('\0'),
        Value::Array(items) => items.iter().all(storable),
        Value::Object(map) => map.iter().all(|(k, v)| !k.contains('\0') && storable(v)),
        _ => true,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(event) = OrderEvent::decode(data, 64 * 1024) else {
        return;
    };
    assert_eq!(fingerprint(&event.document), event.fingerprint);
    let document = Value::Object(event.document.clone());
    assert!(storable(&document), "accepted a document PostgreSQL cannot store");
    let canonical = serde_json::to_vec(&event.document).expect("a decoded document serialises");
    let again = OrderEvent::decode(&canonical, usize::MAX).expect("the canonical form decodes");
    assert_eq!(again.fingerprint, event.fingerprint, "canonicalisation is stable");
    assert_eq!(
        again.business_key(herald_core::Channel::Email),
        event.business_key(herald_core::Channel::Email)
    );
});
