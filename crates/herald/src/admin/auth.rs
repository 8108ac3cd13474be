//! Bearer-token check for the mutating admin endpoints. Tokens are compared through their
//! BLAKE3 digests byte by byte without early exit, so the time taken says nothing about
//! how much of a guess was right (nor about the token's length).

use axum::http::HeaderMap;

/// Whether `headers` carry `Authorization: Bearer <expected>`. Without a configured token
/// nothing is authorised.
pub fn authorised(headers: &HeaderMap, expected: Option<&str>) -> bool {
    let Some(expected) = expected else {
        return false;
    };
    let Some(given) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (
        blake3::hash(given.trim().as_bytes()),
        blake3::hash(expected.as_bytes()),
    );
    a.as_bytes()
        .iter()
        .zip(b.as_bytes())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn only_the_configured_token_passes() {
        assert!(authorised(&with("Bearer s3cret"), Some("s3cret")));
        assert!(!authorised(&with("Bearer s3cre"), Some("s3cret")));
        assert!(!authorised(&with("Basic s3cret"), Some("s3cret")));
        assert!(!authorised(&HeaderMap::new(), Some("s3cret")));
        assert!(
            !authorised(&with("Bearer "), None),
            "no configured token: nothing passes"
        );
    }
}
