//! The order-event decoder on arbitrary bytes: never panics, and a decoded event's
//! fingerprint is stable: the canonical form, decoded again, gives the same fingerprint.
#![no_main]

use herald_core::event::fingerprint;
use herald_core::OrderEvent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(event) = OrderEvent::decode(data, 64 * 1024) else {
        return;
    };
    assert_eq!(fingerprint(&event.document), event.fingerprint);
    let canonical = serde_json::to_vec(&event.document).expect("a decoded document serialises");
    let again = OrderEvent::decode(&canonical, usize::MAX).expect("the canonical form decodes");
    assert_eq!(again.fingerprint, event.fingerprint, "canonicalisation is stable");
    assert_eq!(
        again.business_key(herald_core::Channel::Email),
        event.business_key(herald_core::Channel::Email)
    );
});
