//! Seller profile v1, read from the compacted `seller-profiles` topic.
//!
//! Key `{marketplace_id}:{seller_id}`; a JSON value is an upsert applied only when its
//! `version` is newer than the stored one; an empty value (tombstone) deletes the seller.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{check_id, decode_object, json_type, required_id, DeadLetterReason, DecodeError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SellerProfile {
    pub marketplace_id: String,
    pub seller_id: String,
    pub email: Option<String>,
    pub phone: Option<String>,
    pub locale: Option<String>,
    pub email_opt_in: bool,
    pub sms_opt_in: bool,
    pub version: i64,
    /// Suppression-list entries of the email address and phone number, read with the
    /// stored profile (never part of the topic's record).
    #[serde(skip)]
    pub suppressed: crate::consent::Suppressed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SellerRecord {
    Upsert(SellerProfile),
    Delete {
        marketplace_id: String,
        seller_id: String,
    },
}

impl SellerRecord {
    pub fn ids(&self) -> (&str, &str) {
        match self {
            SellerRecord::Upsert(p) => (&p.marketplace_id, &p.seller_id),
            SellerRecord::Delete {
                marketplace_id,
                seller_id,
            } => (marketplace_id, seller_id),
        }
    }

    /// Decodes a `seller-profiles` message. `value = None` is a tombstone.
    pub fn decode(key: Option<&[u8]>, value: Option<&[u8]>, max_bytes: usize) -> Result<Self, DecodeError> {
        let key =
            key.ok_or_else(|| DecodeError::new(DeadLetterReason::BadKey, "seller profile without a key"))?;
        let key = std::str::from_utf8(key)
            .map_err(|_| DecodeError::new(DeadLetterReason::BadKey, "key is not UTF-8"))?;
        let (marketplace_id, seller_id) = key.split_once(':').ok_or_else(|| {
            DecodeError::new(
                DeadLetterReason::BadKey,
                format!("key {key:?} is not of the form {{marketplace_id}}:{{seller_id}}"),
            )
        })?;
        check_id("key marketplace_id", marketplace_id)
            .and_then(|_| check_id("key seller_id", seller_id))
            .map_err(|e| DecodeError::new(DeadLetterReason::BadKey, e.detail))?;
        let Some(value) = value else {
            return Ok(SellerRecord::Delete {
                marketplace_id: marketplace_id.to_owned(),
                seller_id: seller_id.to_owned(),
            });
        };
        let doc = decode_object(value, max_bytes)?;
        let body_marketplace = required_id(&doc, "marketplace_id")?;
        let body_seller = required_id(&doc, "seller_id")?;
        if body_marketplace != marketplace_id || body_seller != seller_id {
            return Err(DecodeError::new(
                DeadLetterReason::InvalidValue,
                format!("key {key:?} does not match the value's {body_marketplace}:{body_seller}"),
            ));
        }
        let opt_text = |name: &str| -> Result<Option<String>, DecodeError> {
            match doc.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.trim().to_owned())),
                Some(other) => Err(DecodeError::new(
                    DeadLetterReason::WrongType,
                    format!("field {name:?} must be a string, found {}", json_type(other)),
                )),
            }
        };
        let flag = |name: &str| -> Result<bool, DecodeError> {
            match doc.get(name) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(other) => Err(DecodeError::new(
                    DeadLetterReason::WrongType,
                    format!("field {name:?} must be a boolean, found {}", json_type(other)),
                )),
            }
        };
        let version = match doc.get("version") {
            Some(Value::Number(n)) => n.as_i64().filter(|v| *v >= 0).ok_or_else(|| {
                DecodeError::new(
                    DeadLetterReason::InvalidValue,
                    format!("field \"version\" must be a non-negative integer, found {n}"),
                )
            })?,
            None | Some(Value::Null) => {
                return Err(DecodeError::new(
                    DeadLetterReason::MissingField,
                    "field \"version\" is missing",
                ))
            }
            Some(other) => {
                return Err(DecodeError::new(
                    DeadLetterReason::WrongType,
                    format!("field \"version\" must be an integer, found {}", json_type(other)),
                ))
            }
        };
        Ok(SellerRecord::Upsert(SellerProfile {
            marketplace_id: body_marketplace,
            seller_id: body_seller,
            email: opt_text("email")?,
            phone: opt_text("phone")?,
            locale: opt_text("locale")?,
            email_opt_in: flag("email_opt_in")?,
            sms_opt_in: flag("sms_opt_in")?,
            version,
            suppressed: Default::default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUE: &str = r#"{"seller_id":"seller-19","marketplace_id":"acme","email":"s19@example.com","phone":"+15555550100","locale":"fr-FR","email_opt_in":true,"sms_opt_in":true,"version":3}"#;

    #[test]
    fn sample_profile_decodes() {
        let r = SellerRecord::decode(Some(b"acme:seller-19"), Some(VALUE.as_bytes()), 4096).unwrap();
        let SellerRecord::Upsert(p) = r else {
            panic!("expected an upsert")
        };
        assert_eq!(p.email.as_deref(), Some("s19@example.com"));
        assert_eq!(p.locale.as_deref(), Some("fr-FR"));
        assert_eq!(p.version, 3);
    }

    #[test]
    fn tombstone_deletes() {
        let r = SellerRecord::decode(Some(b"acme:seller-19"), None, 4096).unwrap();
        assert_eq!(r.ids(), ("acme", "seller-19"));
        assert!(matches!(r, SellerRecord::Delete { .. }));
    }

    #[test]
    fn key_must_match_value() {
        let e = SellerRecord::decode(Some(b"acme:seller-20"), Some(VALUE.as_bytes()), 4096).unwrap_err();
        assert_eq!(e.reason, DeadLetterReason::InvalidValue);
        let e = SellerRecord::decode(Some(b"acme-seller-19"), Some(VALUE.as_bytes()), 4096).unwrap_err();
        assert_eq!(e.reason, DeadLetterReason::BadKey);
        let e = SellerRecord::decode(None, Some(VALUE.as_bytes()), 4096).unwrap_err();
        assert_eq!(e.reason, DeadLetterReason::BadKey);
    }

    #[test]
    fn mistyped_fields_are_rejected() {
        let v = VALUE.replace("\"version\":3", "\"version\":\"3\"");
        let e = SellerRecord::decode(Some(b"acme:seller-19"), Some(v.as_bytes()), 4096).unwrap_err();
        assert_eq!(e.reason, DeadLetterReason::WrongType);
        let v = VALUE.replace("\"email_opt_in\":true", "\"email_opt_in\":\"yes\"");
        let e = SellerRecord::decode(Some(b"acme:seller-19"), Some(v.as_bytes()), 4096).unwrap_err();
        assert_eq!(e.reason, DeadLetterReason::WrongType);
    }
}
