//! How the SES and SNS clients reach AWS: [`AwsSettings`] and the one function that turns
//! them into an SDK configuration with SDK retries off, explicit timeouts and a rustls/ring
//! HTTPS client. Both senders are built from it, so they behave alike on the wire.

use std::fmt;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::stalled_stream_protection::StalledStreamProtectionConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::Credentials;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

/// Pinned rather than `latest()`: an SDK upgrade must not change defaults silently.
fn behavior_version() -> BehaviorVersion {
    BehaviorVersion::v2026_01_12()
}

/// Idle pooled connections are dropped after this. Writing a request onto a connection the
/// server is closing at that moment makes an `unknown` attempt, so keep them short-lived.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// Where and how to call AWS. `None` fields fall back to the standard AWS chain
/// (`AWS_REGION`, `AWS_ENDPOINT_URL`, environment / profile / web identity / ECS / IMDS
/// credentials). SSO profiles and `credential_process` are not compiled in.
#[derive(Debug, Clone)]
pub struct AwsSettings {
    pub region: Option<String>,
    /// Endpoint override, e.g. `http://127.0.0.1:14566` for the local moto server.
    pub endpoint_url: Option<String>,
    /// Time allowed to establish a connection (TCP and TLS). A send that fails within it is
    /// `Retryable(connect_failed)`; keep it shorter than `attempt_timeout`.
    pub connect_timeout: Duration,
    /// Time allowed for one whole attempt. A send that runs out of it is `Unknown(timeout)`.
    pub attempt_timeout: Duration,
    /// Fixed credentials instead of the chain: for the local stack and tests.
    pub static_credentials: Option<StaticCredentials>,
}

impl Default for AwsSettings {
    fn default() -> Self {
        Self {
            region: None,
            endpoint_url: None,
            connect_timeout: Duration::from_secs(3),
            attempt_timeout: Duration::from_secs(10),
            static_credentials: None,
        }
    }
}

/// An access key pair; `Debug` does not show the secret.
#[derive(Clone)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"** redacted **")
            .finish()
    }
}

/// The SDK configuration every client is built from (the senders, the queue reader, and
/// the test harness's own SQS and SNS clients).
pub async fn sdk_config(settings: &AwsSettings) -> SdkConfig {
    let http_client = aws_smithy_http_client::Builder::new()
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    // One attempt = one request: neither SendEmail nor Publish to a phone number takes an
    // idempotency token, so an SDK retry after a lost response would be an unrecorded
    // duplicate. Retries are scheduled by the delivery worker, with an attempt row each.
    let mut loader = aws_config::defaults(behavior_version())
        .http_client(http_client)
        .retry_config(RetryConfig::disabled())
        // The attempt timeout bounds every request and its response; the SDK's stalled-
        // stream watchdog (a throughput check on every body poll) is made for large
        // uploads and downloads, and was about 3% of Herald's CPU for bodies of a few KB.
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(settings.connect_timeout)
                .operation_attempt_timeout(settings.attempt_timeout)
                .build(),
        );
    if let Some(region) = &settings.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(url) = &settings.endpoint_url {
        loader = loader.endpoint_url(url.clone());
    }
    if let Some(creds) = &settings.static_credentials {
        loader = loader.credentials_provider(Credentials::new(
            creds.access_key_id.clone(),
            creds.secret_access_key.clone(),
            None,
            None,
            "herald-static",
        ));
    }
    loader.load().await
}
