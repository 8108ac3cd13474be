//! The digests that name a destination on the suppression list (and a purged payload's
//! destination, V16), never the address itself.
//!
//! - Version 1 (V8, `herald_destination_digest` in SQL): SHA-256 of a public prefix and the
//!   address. Anyone who reads the list and holds a list of addresses can tell who is on it.
//!   Entries made before V17 carry it; they are still matched, and retention re-keys them.
//! - Version 2 (issue 43): HMAC-SHA-256 keyed with `suppression.key`, computed here and only
//!   here. The key never reaches PostgreSQL: a statement's parameters are written to the
//!   server's log with a slow statement (`log_min_duration_statement`), and a digest
//!   computed in SQL would need the key as one.
//!
//! Both normalize the address alike: an e-mail address is trimmed of spaces and lowercased
//! (providers do not tell addresses apart by case); a phone number is trimmed. Lowercasing
//! differs for some non-ASCII letters: version 1 uses PostgreSQL's `lower` (the database's
//! locale), version 2 Unicode's rules (Rust's, the same everywhere). Retention's re-keying
//! follows version 2 (see `RetentionSession::rekey_suppressions`).

use std::fmt;

use ring::hmac;

/// The shortest key accepted: 32 bytes (HMAC-SHA-256's own output length).
pub const KEY_MIN_BYTES: usize = 32;

/// The entries written before V17 (`suppressions.digest_version`).
pub const UNKEYED: i16 = 1;
/// The entries keyed with [`DestinationKey`].
pub const KEYED: i16 = 2;

/// The key of version 2 digests. Its [`fmt::Debug`] shows the key's id, never the key.
#[derive(Clone)]
pub struct DestinationKey {
    key: hmac::Key,
    id: String,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "suppression.key is {0} bytes: at least {KEY_MIN_BYTES} are required (`openssl rand -hex 32` makes one)"
)]
pub struct KeyTooShort(pub usize);

impl DestinationKey {
    pub fn new(secret: &[u8]) -> Result<Self, KeyTooShort> {
        if secret.len() < KEY_MIN_BYTES {
            return Err(KeyTooShort(secret.len()));
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        // 64 bits of a MAC over a fixed text: names the key, tells nothing of it.
        let id = hex(&hmac::sign(&key, b"herald suppression key id").as_ref()[..8]);
        Ok(Self { key, id })
    }

    /// Names the key in `suppressions.digest_key`, `suppression_key` (the key the list is
    /// keyed with, see `Store::check_destination_key`) and logs.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The version 2 digest of `address` on `channel` ("email" or "sms").
    pub fn digest(&self, channel: &str, address: &str) -> String {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"destination-v2:");
        ctx.update(channel.as_bytes());
        ctx.update(b":");
        ctx.update(normalize(channel, address).as_bytes());
        hex(ctx.sign().as_ref())
    }
}

impl fmt::Debug for DestinationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestinationKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// `Ok` if `recorded` (`suppression_key.key_id`) names `key`.
pub(crate) fn same_key(key: &DestinationKey, recorded: String) -> crate::Result<()> {
    if recorded == key.id() {
        return Ok(());
    }
    Err(crate::StoreError::DestinationKeyChanged {
        configured: key.id().to_owned(),
        recorded,
    })
}

/// Whether two addresses are the same destination on `channel` (equal once normalized).
pub fn same_address(channel: &str, a: &str, b: &str) -> bool {
    normalize(channel, a) == normalize(channel, b)
}

/// The address as version 2 digests see it: spaces trimmed (as SQL's `btrim`), an e-mail
/// address lowercased by Unicode's rules.
fn normalize(channel: &str, address: &str) -> String {
    let trimmed = address.trim_matches(' ');
    if channel == "email" {
        trimmed.to_lowercase()
    } else {
        trimmed.to_owned()
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_key_shorter_than_32_bytes_is_refused() {
        assert_eq!(DestinationKey::new(&KEY[..31]).unwrap_err().0, 31);
        assert!(DestinationKey::new(KEY).is_ok());
    }

    #[test]
    fn digests_depend_on_the_key_and_the_normalized_address() {
        let k = DestinationKey::new(KEY).unwrap();
        let other = DestinationKey::new(b"another key, another key, another").unwrap();
        let d = k.digest("email", "Seller@Example.com");
        assert_eq!(d.len(), 64);
        assert_eq!(d, k.digest("email", "  seller@example.com "));
        assert_ne!(d, other.digest("email", "seller@example.com"));
        assert_ne!(d, k.digest("sms", "seller@example.com"));
        // Phone numbers are trimmed, not lowercased.
        assert_eq!(k.digest("sms", " +15550001 "), k.digest("sms", "+15550001"));
        assert_ne!(k.digest("sms", "A"), k.digest("sms", "a"));
        // RFC 4231-style check that this is HMAC-SHA-256 over the documented text.
        let mac = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, KEY),
            b"destination-v2:email:seller@example.com",
        );
        assert_eq!(d, hex(mac.as_ref()));
    }

    #[test]
    fn the_key_is_never_printed() {
        let k = DestinationKey::new(KEY).unwrap();
        let shown = format!("{k:?}");
        assert!(shown.contains(k.id()), "{shown}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert_eq!(k.id().len(), 16);
    }
}
