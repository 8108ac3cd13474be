//! The seller-profile decoder on an arbitrary key and value (the input is `key NUL value`;
//! without a NUL, a tombstone for that key): never panics; a decoded record's ids are the
//! key's; and every text it accepts PostgreSQL can store (no U+0000).
#![no_main]

use herald_core::SellerRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (key, value) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    if let Ok(record) = SellerRecord::decode(Some(key), value, 64 * 1024) {
        let (marketplace, seller) = record.ids();
        assert_eq!(format!("{marketplace}:{seller}").as_bytes(), key);
        if let SellerRecord::Upsert(p) = &record {
            let texts = [Some(&p.marketplace_id), Some(&p.seller_id), p.email.as_ref(), p.phone.as_ref(), p.locale.as_ref()];
            for t in texts.into_iter().flatten() {
                assert!(!t.contains('\0'), "accepted {t:?}, which PostgreSQL cannot store");
            }
        }
    }
});
