//! OAUTHBEARER tokens. librdkafka asks a client for one before its first connection and
//! again when 80% of the last one's lifetime has passed; rust-rdkafka turns the request into
//! a call of the client context's `generate_oauth_token` on the thread that polls the client
//! (see `context`), so a [`TokenSource`] answers synchronously and quickly: anything slow
//! (fetching AWS credentials) is done ahead, in the background, by the source itself.
//!
//! Two sources: AWS MSK IAM (`msk_iam`), and [`UnsecuredJwt`] for a development broker that
//! runs Kafka's unsecured validator (the local stack's SASL_SSL listener), which tests the
//! same path end to end.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// A token and what librdkafka is told about it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    pub value: String,
    /// The principal librdkafka records with the token (it is not sent to the broker).
    pub principal: String,
    pub expires_at: SystemTime,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("principal", &self.principal)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Why no token could be given: librdkafka is told (it asks again after a while and keeps
/// the client unconnected meanwhile), and the client's context logs it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{source_name}: {detail}")]
pub struct TokenError {
    pub source_name: &'static str,
    pub detail: String,
}

/// Where OAUTHBEARER tokens come from.
pub trait TokenSource: Send + Sync + 'static {
    /// A valid token, now. Called on a client's poll thread: must not block for long.
    fn token(&self) -> Result<Token, TokenError>;

    /// Its name in configuration and logs (`aws_msk_iam`).
    fn describe(&self) -> &'static str;
}

/// An unsecured JWT (`alg: none`) naming `principal`, valid for `lifetime`: what Kafka's
/// `OAuthBearerUnsecuredValidatorCallbackHandler` accepts. For development brokers only: any
/// client can claim any principal with it.
#[derive(Debug, Clone)]
pub struct UnsecuredJwt {
    pub principal: String,
    pub lifetime: Duration,
}

impl UnsecuredJwt {
    /// The token as of `now`.
    pub fn at(&self, now: SystemTime) -> Token {
        let iat = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let exp = iat + self.lifetime.as_secs().max(1);
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#);
        let claims = serde_json::json!({ "sub": self.principal, "iat": iat, "exp": exp });
        let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
        Token {
            // Header, claims and an empty signature.
            value: format!("{header}.{claims}."),
            principal: self.principal.clone(),
            expires_at: UNIX_EPOCH + Duration::from_secs(exp),
        }
    }
}

impl TokenSource for UnsecuredJwt {
    fn token(&self) -> Result<Token, TokenError> {
        Ok(self.at(SystemTime::now()))
    }

    fn describe(&self) -> &'static str {
        "oauthbearer_unsecured_jwt"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsecured_jwt_carries_sub_and_exp_and_no_signature() {
        let source = UnsecuredJwt {
            principal: "herald".into(),
            lifetime: Duration::from_secs(3600),
        };
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let token = source.at(now);
        let parts: Vec<&str> = token.value.split('.').collect();
        assert_eq!(parts.len(), 3, "{}", token.value);
        assert_eq!(parts[2], "", "alg none has an empty signature");
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header, serde_json::json!({"alg": "none"}));
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["sub"], "herald");
        assert_eq!(claims["exp"], 1_800_003_600u64);
        assert_eq!(token.expires_at, UNIX_EPOCH + Duration::from_secs(1_800_003_600));
        assert!(
            !format!("{token:?}").contains(parts[1]),
            "Debug leaves the token out"
        );
    }
}
