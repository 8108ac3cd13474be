//! AWS MSK IAM: OAUTHBEARER with a token that is a SigV4-presigned request for the action
//! `kafka-cluster:Connect`, what AWS's MSK IAM SASL signers (Java, Python, Go, JavaScript)
//! make: the URL `https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect`
//! presigned for the service `kafka-cluster`, valid 900 s, with a `User-Agent` parameter
//! added after signing, the whole URL in base64url without padding.
//!
//! Credentials come from the AWS chain Herald already uses for SES (`[aws]`: static keys
//! for the local stack, else the environment, web identity, ECS or instance roles). Fetching
//! them may take a network call, which librdkafka's synchronous token request cannot wait
//! for: [`MskIam::start`] fetches them first, and a background task fetches them again
//! before they expire. Signing itself is local, so each token is signed when librdkafka
//! asks, valid for the full 900 s from then.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SignatureLocation, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::token::{Token, TokenError, TokenSource};

/// How long a token is valid: what AWS's signers use, and the most MSK accepts.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(900);
/// Credentials are fetched again this long before they expire.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// How often credentials without an expiry (static keys) are fetched again anyway.
const REFRESH_UNEXPIRING: Duration = Duration::from_secs(900);
/// Wait before trying again after a failed fetch.
const RETRY: Duration = Duration::from_secs(10);

const NAME: &str = "aws_msk_iam";

/// AWS's unreserved characters (RFC 3986): everything else is percent-encoded in a query.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A token source for MSK IAM, its credentials kept fresh in the background.
pub struct MskIam {
    region: String,
    credentials: Mutex<Option<Credentials>>,
}

impl std::fmt::Debug for MskIam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MskIam")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl MskIam {
    /// Fetches the first credentials from `provider` (an error if there are none: start-up
    /// stops, naming the chain's reason), then keeps them fresh on the current runtime
    /// until the returned source is dropped.
    pub async fn start(provider: SharedCredentialsProvider, region: &str) -> Result<Arc<Self>, TokenError> {
        let first = provider.provide_credentials().await.map_err(|e| TokenError {
            source_name: NAME,
            detail: format!("no AWS credentials for MSK IAM from the AWS chain: {e}"),
        })?;
        let source = Arc::new(Self {
            region: region.to_owned(),
            credentials: Mutex::new(Some(first)),
        });
        tokio::spawn(refresh(Arc::downgrade(&source), provider));
        Ok(source)
    }

    /// A source with fixed credentials, never refreshed: for tests.
    pub fn with_credentials(region: &str, credentials: Credentials) -> Self {
        Self {
            region: region.to_owned(),
            credentials: Mutex::new(Some(credentials)),
        }
    }

    fn current(&self) -> Option<Credentials> {
        self.credentials.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The token for `credentials` signed at `now`.
    pub fn token_at(&self, credentials: &Credentials, now: SystemTime) -> Result<Token, TokenError> {
        let failed = |detail: String| TokenError {
            source_name: NAME,
            detail,
        };
        let host = format!("kafka.{}.amazonaws.com", self.region);
        let url = format!("https://{host}/?Action=kafka-cluster%3AConnect");
        let identity: Identity = credentials.clone().into();
        let mut settings = SigningSettings::default();
        settings.signature_location = SignatureLocation::QueryParams;
        settings.expires_in = Some(TOKEN_LIFETIME);
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("kafka-cluster")
            .time(now)
            .settings(settings)
            .build()
            .map_err(|e| failed(format!("signing parameters: {e}")))?
            .into();
        let request = SignableRequest::new("GET", url.as_str(), std::iter::empty(), SignableBody::Bytes(&[]))
            .map_err(|e| failed(format!("request to sign: {e}")))?;
        let (instructions, _signature) = sign(request, &params)
            .map_err(|e| failed(format!("signing: {e}")))?
            .into_parts();
        let mut presigned = url;
        // The signature last, as AWS's signers put it (the order is not signed).
        let mut params: Vec<_> = instructions.params().iter().collect();
        params.sort_by_key(|(name, _)| *name == "X-Amz-Signature");
        for (name, value) in params {
            presigned.push('&');
            presigned.push_str(name);
            presigned.push('=');
            presigned.extend(utf8_percent_encode(value, QUERY));
        }
        // Not signed (AWS's signers add it after signing, too).
        presigned.push_str("&User-Agent=");
        presigned.extend(utf8_percent_encode(
            concat!("herald/", env!("CARGO_PKG_VERSION")),
            QUERY,
        ));
        // The signing time has whole seconds (X-Amz-Date); so has the expiry. A token is
        // no better than its credentials: it is told to librdkafka as expiring with them
        // (less the refresh margin), so that librdkafka asks for a new one, signed with the
        // refreshed credentials, before a reconnection would present a dead one.
        let signed =
            UNIX_EPOCH + Duration::from_secs(now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs());
        let mut expires_at = signed + TOKEN_LIFETIME;
        if let Some(creds_expire) = credentials.expiry() {
            let usable = creds_expire
                .checked_sub(REFRESH_MARGIN / 2)
                .unwrap_or(creds_expire);
            expires_at = expires_at.min(usable.max(signed + Duration::from_secs(60)));
        }
        Ok(Token {
            value: URL_SAFE_NO_PAD.encode(presigned),
            principal: NAME.to_owned(),
            expires_at,
        })
    }
}

impl TokenSource for MskIam {
    fn token(&self) -> Result<Token, TokenError> {
        let credentials = self.current().ok_or_else(|| TokenError {
            source_name: NAME,
            detail: "no AWS credentials yet".into(),
        })?;
        let now = SystemTime::now();
        if credentials.expiry().is_some_and(|e| e <= now) {
            return Err(TokenError {
                source_name: NAME,
                detail: "the AWS credentials expired and none newer could be fetched yet".into(),
            });
        }
        self.token_at(&credentials, now)
    }

    fn describe(&self) -> &'static str {
        NAME
    }
}

/// Fetches credentials again before they expire, for as long as the source lives. A failed
/// fetch keeps the old credentials (valid until their expiry) and tries again shortly.
async fn refresh(source: std::sync::Weak<MskIam>, provider: SharedCredentialsProvider) {
    loop {
        let wait = match source.upgrade() {
            None => return,
            Some(s) => match s.current().and_then(|c| c.expiry()) {
                Some(expiry) => expiry
                    .checked_sub(REFRESH_MARGIN)
                    .and_then(|at| at.duration_since(SystemTime::now()).ok())
                    .unwrap_or(Duration::ZERO),
                None => REFRESH_UNEXPIRING,
            },
        };
        tokio::time::sleep(wait.max(Duration::from_secs(1))).await;
        let fetched = provider.provide_credentials().await;
        let Some(s) = source.upgrade() else { return };
        match fetched {
            Ok(c) => {
                let old_expiry = s.current().and_then(|o| o.expiry());
                let same = old_expiry.is_some() && c.expiry() <= old_expiry;
                *s.credentials.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
                if same {
                    // The chain gave the same credentials (an instance role before its
                    // rotation): ask again in a while, not at once.
                    tokio::time::sleep(RETRY).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in_s = RETRY.as_secs(),
                    "could not refresh the AWS credentials for MSK IAM; the current ones are used until they expire");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(token: &Token) -> String {
        assert!(!token.value.contains('='), "no padding");
        String::from_utf8(URL_SAFE_NO_PAD.decode(&token.value).unwrap()).unwrap()
    }

    fn query(url: &str) -> Vec<(String, String)> {
        let q = url.split_once('?').unwrap().1;
        q.split('&')
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                let v = percent_encoding::percent_decode_str(v).decode_utf8().unwrap();
                (k.to_owned(), v.into_owned())
            })
            .collect()
    }

    #[test]
    fn a_token_is_a_presigned_connect_url_valid_900_s() {
        let creds = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "test",
        );
        let source = MskIam::with_credentials("eu-west-1", creds.clone());
        let now = UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01T00:00:00Z
        let token = source.token_at(&creds, now).unwrap();
        assert_eq!(token.expires_at, now + Duration::from_secs(900));
        let url = decode(&token);
        assert!(
            url.starts_with("https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&"),
            "{url}"
        );
        let q = query(&url);
        let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("Action"), Some("kafka-cluster:Connect"));
        assert_eq!(get("X-Amz-Algorithm"), Some("AWS4-HMAC-SHA256"));
        assert_eq!(
            get("X-Amz-Credential"),
            Some("AKIDEXAMPLE/20260101/eu-west-1/kafka-cluster/aws4_request")
        );
        assert_eq!(get("X-Amz-Date"), Some("20260101T000000Z"));
        assert_eq!(get("X-Amz-Expires"), Some("900"));
        assert_eq!(get("X-Amz-SignedHeaders"), Some("host"));
        assert_eq!(
            get("X-Amz-Security-Token"),
            None,
            "no session token, none in the URL"
        );
        let signature = get("X-Amz-Signature").unwrap();
        assert!(
            signature.len() == 64 && signature.bytes().all(|b| b.is_ascii_hexdigit()),
            "{signature}"
        );
        assert_eq!(q.last().unwrap().0, "User-Agent", "added after the signature");
        assert!(
            !url.contains("wJalrXUtnFEMI"),
            "the secret key never leaves the signer"
        );
    }

    /// Byte for byte what AWS's own signer (aws-msk-iam-sasl-signer-python 1.0.2, on
    /// botocore, its clock fixed) makes for the same credentials, region and time, but for
    /// the unsigned User-Agent parameter.
    #[test]
    fn the_url_is_the_one_aws_s_signer_makes() {
        let now = UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01T00:00:00Z
        let expected = [
            (
                None,
                "fef899747e0ddf7df33939adbb3e315eda8ddd55c0bcadcea3bccf3fbbbe7351",
            ),
            (
                Some("session/token+value="),
                "74970a96bee1dd39b812890b7342813d8b1cfd910f3b99f49d1f2f6bbb9d9e1d",
            ),
        ];
        for (session, signature) in expected {
            let creds = Credentials::new(
                "AKIDEXAMPLE",
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                session.map(str::to_owned),
                None,
                "test",
            );
            let source = MskIam::with_credentials("eu-west-1", creds.clone());
            let url = decode(&source.token_at(&creds, now).unwrap());
            let token_param = match session {
                Some(_) => "&X-Amz-Security-Token=session%2Ftoken%2Bvalue%3D",
                None => "",
            };
            let aws = format!(
                "https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&X-Amz-Algorithm=AWS4-HMAC-SHA256\
                 &X-Amz-Credential=AKIDEXAMPLE%2F20260101%2Feu-west-1%2Fkafka-cluster%2Faws4_request\
                 &X-Amz-Date=20260101T000000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host{token_param}\
                 &X-Amz-Signature={signature}&User-Agent="
            );
            assert!(url.starts_with(&aws), "ours: {url}\naws's: {aws}");
        }
    }

    #[test]
    fn a_token_expires_no_later_than_its_credentials() {
        let now = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let soon = Credentials::new(
            "A",
            "s",
            Some("t".into()),
            Some(now + Duration::from_secs(400)),
            "test",
        );
        let source = MskIam::with_credentials("eu-west-1", soon.clone());
        let token = source.token_at(&soon, now).unwrap();
        assert_eq!(
            token.expires_at,
            now + Duration::from_secs(400) - REFRESH_MARGIN / 2
        );
        let later = Credentials::new(
            "A",
            "s",
            Some("t".into()),
            Some(now + Duration::from_secs(7200)),
            "test",
        );
        assert_eq!(
            source.token_at(&later, now).unwrap().expires_at,
            now + TOKEN_LIFETIME,
            "long-lived credentials: the token's own 900 s"
        );
    }

    #[test]
    fn a_session_token_is_signed_into_the_url_and_expired_credentials_give_no_token() {
        let creds = Credentials::new(
            "ASIAEXAMPLE",
            "secret",
            Some("session/token+value=".into()),
            Some(SystemTime::now() - Duration::from_secs(1)),
            "test",
        );
        let source = MskIam::with_credentials("us-east-1", creds.clone());
        let token = source.token_at(&creds, SystemTime::now()).unwrap();
        let q = query(&decode(&token));
        assert!(q
            .iter()
            .any(|(k, v)| k == "X-Amz-Security-Token" && v == "session/token+value="));
        let e = source.token().unwrap_err();
        assert!(e.to_string().contains("expired"), "{e}");
    }
}
