//! Sample order events and seller profiles, in the v1 wire format.

use serde_json::json;

pub fn order_event(
    event_id: &str,
    kind: &str,
    marketplace: &str,
    order_id: &str,
    seller_id: &str,
    total: &str,
) -> Vec<u8> {
    json!({
        "event_id": event_id,
        "event_kind": kind,
        "marketplace_id": marketplace,
        "order_id": order_id,
        "seller_id": seller_id,
        "occurred_at": "2026-09-21T10:00:00Z",
        "produced_at": format!("2026-09-21T10:00:0{}Z", event_id.len() % 10),
        "order": {"total": total, "currency": "EUR", "item_count": 3}
    })
    .to_string()
    .into_bytes()
}

pub struct Seller<'a> {
    pub marketplace: &'a str,
    pub seller_id: &'a str,
    pub email: Option<&'a str>,
    pub phone: Option<&'a str>,
    pub locale: &'a str,
    pub email_opt_in: bool,
    pub sms_opt_in: bool,
    pub version: i64,
}

impl Seller<'_> {
    pub fn key(&self) -> Vec<u8> {
        format!("{}:{}", self.marketplace, self.seller_id).into_bytes()
    }

    pub fn value(&self) -> Vec<u8> {
        json!({
            "seller_id": self.seller_id,
            "marketplace_id": self.marketplace,
            "email": self.email,
            "phone": self.phone,
            "locale": self.locale,
            "email_opt_in": self.email_opt_in,
            "sms_opt_in": self.sms_opt_in,
            "version": self.version,
        })
        .to_string()
        .into_bytes()
    }
}

/// A seller opted in on both channels, with valid destinations.
pub fn opted_in_seller<'a>(marketplace: &'a str, seller_id: &'a str, locale: &'a str) -> Seller<'a> {
    Seller {
        marketplace,
        seller_id,
        email: Some("seller@example.com"),
        phone: Some("+15555550100"),
        locale,
        email_opt_in: true,
        sms_opt_in: true,
        version: 1,
    }
}

/// A seller with an address and phone number of its own, so that what moto received can
/// be attributed to one test alone.
pub struct UniqueSeller {
    pub email: String,
    pub phone: String,
}

impl Default for UniqueSeller {
    fn default() -> Self {
        Self::new()
    }
}

impl UniqueSeller {
    pub fn new() -> Self {
        let n = uuid::Uuid::new_v4().as_u128();
        Self {
            email: format!("s{:x}@seller.example", n >> 64),
            phone: format!("+1555{:07}", n % 10_000_000),
        }
    }

    pub fn profile<'a>(&'a self, seller_id: &'a str) -> Seller<'a> {
        Seller {
            marketplace: "acme",
            seller_id,
            email: Some(&self.email),
            phone: Some(&self.phone),
            locale: "en",
            email_opt_in: true,
            sms_opt_in: true,
            version: 1,
        }
    }
}
