//! blake3 digests over length-prefixed fields, so that `("ab","c")` and `("a","bc")` never
//! hash alike. Every content address and key in Herald goes through here.

/// Hashes the fields in order, each prefixed with its length, and returns lowercase hex.
pub fn fields_hex(fields: &[&[u8]]) -> String {
    let mut hasher = blake3::Hasher::new();
    for field in fields {
        hasher.update(&(field.len() as u64).to_le_bytes());
        hasher.update(field);
    }
    hasher.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_boundaries_change_the_digest() {
        assert_ne!(fields_hex(&[b"ab", b"c"]), fields_hex(&[b"a", b"bc"]));
        assert_eq!(fields_hex(&[b"ab", b"c"]), fields_hex(&[b"ab", b"c"]));
        assert_eq!(fields_hex(&[b"x"]).len(), 64);
    }
}
