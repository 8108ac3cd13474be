//! Who may speak for the provider: the authentication of what arrives on the SES event
//! queue, before a word of it is believed.
//!
//! A queue message is evidence only if it is an SNS envelope
//! - from a topic the configuration names (`reconcile.sns_topic_arns`),
//! - signed by SNS: `SignatureVersion` 1 (SHA1withRSA) or 2 (SHA256withRSA) over the
//!   canonical fields AWS documents for its `Type`, checked against the certificate at
//!   `SigningCertURL`, which must be `https://sns.<region>.amazonaws.com/
//!   SimpleNotificationService-*.pem` in the topic's own region (fetched once, cached);
//!
//! or a bare SES record when `reconcile.raw_delivery` says the queue is fed by SNS raw
//! message delivery, which carries no signature: then the queue's policy is the only gate
//! (README, "Provider evidence"). Anything else is refused with its reason and never read
//! as evidence: whoever can write to the queue cannot settle an intent or suppress an
//! address by it.
//!
//! `reconcile.sns_signatures = "unchecked"` skips the signature (the topic is still
//! checked): for a local stack whose stand-in SNS (moto) signs nothing verifiable.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ring::signature::{UnparsedPublicKey, VerificationAlgorithm};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde::Deserialize;
use serde_json::Value;
use x509_cert::der::Decode;

/// Whether envelope signatures are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SignatureCheck {
    /// Every envelope's signature is verified (the default, and the only production setting).
    Verify,
    /// Signatures are not checked: a local stand-in SNS signs nothing verifiable.
    Unchecked,
}

/// How the queue's messages are authenticated (`[reconcile]`).
#[derive(Debug, Clone)]
pub struct TrustSettings {
    /// The topics whose envelopes are evidence (ARNs, compared exactly).
    pub topic_arns: Vec<String>,
    pub signatures: SignatureCheck,
    /// The queue is fed by SNS raw message delivery: bare SES records are accepted.
    pub raw_delivery: bool,
    /// Fetch signing certificates from this HTTPS base instead of the URL's host (the URL
    /// is still checked and its path kept): a private endpoint, or a test's stand-in.
    pub certificate_endpoint: Option<String>,
    /// Trusted roots for the certificate fetch (PEM); else the system's.
    pub certificate_ca_file: Option<PathBuf>,
    /// Bound on one certificate fetch.
    pub fetch_timeout: Duration,
}

/// Why a queue message is not believed. The text is kept with the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not authenticated: {0}")]
pub struct Untrusted(pub String);

/// Why a queue message cannot be judged now (its signing certificate could not be
/// fetched: a timeout, a refused connection, a 5xx, the fetch budget spent). It is neither
/// believed nor refused: left on the queue, it comes back after its visibility timeout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot be authenticated now: {0}")]
pub struct Unavailable(pub String);

/// What [`EvidenceTrust::authenticate`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Untrusted(#[from] Untrusted),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}

fn untrusted(why: impl Into<String>) -> Untrusted {
    Untrusted(why.into())
}

/// An SNS envelope's fields, as SNS names them.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(rename = "Type")]
    kind: String,
    #[serde(rename = "MessageId")]
    message_id: Option<String>,
    #[serde(rename = "TopicArn")]
    topic_arn: Option<String>,
    #[serde(rename = "Subject")]
    subject: Option<String>,
    #[serde(rename = "Message")]
    message: Option<String>,
    #[serde(rename = "Timestamp")]
    timestamp: Option<String>,
    #[serde(rename = "SignatureVersion")]
    signature_version: Option<String>,
    #[serde(rename = "Signature")]
    signature: Option<String>,
    #[serde(rename = "SigningCertURL")]
    signing_cert_url: Option<String>,
    #[serde(rename = "Token")]
    token: Option<String>,
    #[serde(rename = "SubscribeURL")]
    subscribe_url: Option<String>,
}

impl Envelope {
    /// The string SNS signs: `name\nvalue\n` for each field of the type's list, in that
    /// order; `Subject` only when the notification has one.
    fn canonical(&self) -> Result<String, Untrusted> {
        let need = |name: &str, v: &Option<String>| -> Result<String, Untrusted> {
            v.clone()
                .ok_or_else(|| untrusted(format!("an SNS {} without {name}", self.kind)))
        };
        let mut fields: Vec<(&str, String)> = vec![("Message", need("Message", &self.message)?)];
        fields.push(("MessageId", need("MessageId", &self.message_id)?));
        match self.kind.as_str() {
            "Notification" => {
                if let Some(subject) = &self.subject {
                    fields.push(("Subject", subject.clone()));
                }
                fields.push(("Timestamp", need("Timestamp", &self.timestamp)?));
            }
            "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
                fields.push(("SubscribeURL", need("SubscribeURL", &self.subscribe_url)?));
                fields.push(("Timestamp", need("Timestamp", &self.timestamp)?));
                fields.push(("Token", need("Token", &self.token)?));
            }
            other => return Err(untrusted(format!("an SNS message of type {other:?}"))),
        }
        fields.push(("TopicArn", need("TopicArn", &self.topic_arn)?));
        fields.push(("Type", self.kind.clone()));
        let mut s = String::new();
        for (name, value) in fields {
            s.push_str(name);
            s.push('\n');
            s.push_str(&value);
            s.push('\n');
        }
        Ok(s)
    }
}

/// A signing certificate's public key, and when the certificate stops being valid.
struct SigningKey {
    /// The RSAPublicKey DER (what ring verifies with).
    rsa: Vec<u8>,
    not_before: std::time::SystemTime,
    not_after: std::time::SystemTime,
}

/// A certificate that could not be had for good (HTTP 4xx, not a usable certificate): not
/// fetched again for this long. A flood of forged envelopes naming one made-up certificate
/// costs one fetch, not one each.
const FAILED_FETCH_HOLD: Duration = Duration::from_secs(60);
/// Good keys kept (SNS signs with one or two certificates per region; a key is never
/// evicted by failures).
const KEYS_MAX: usize = 64;
/// Failed certificate URLs remembered (the oldest go first).
const FAILURES_MAX: usize = 256;
/// Fetches of certificates not yet known, per minute: names are the sender's choice, and
/// a flood of fresh ones must not turn the reconcile loop into a fetcher. Past it, a
/// message waits on the queue (its visibility timeout) and is tried again.
const FETCHES_PER_MINUTE: usize = 10;
/// Longest certificate read.
const CERTIFICATE_MAX_BYTES: usize = 64 * 1024;

type Https =
    Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Empty<Bytes>>;

/// What is known of certificate URLs: their keys, the failures held, the recent fetches.
#[derive(Default)]
struct Certificates {
    keys: HashMap<String, Arc<SigningKey>>,
    failures: HashMap<String, (Instant, String)>,
    fetches: std::collections::VecDeque<Instant>,
}

/// Authenticates queue messages ([`EvidenceTrust::authenticate`]). Cheap to share.
#[derive(Clone)]
pub struct EvidenceTrust {
    topics: Arc<HashSet<String>>,
    settings: Arc<TrustSettings>,
    client: Https,
    certificates: Arc<Mutex<Certificates>>,
}

impl std::fmt::Debug for EvidenceTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvidenceTrust")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl EvidenceTrust {
    /// Fails if the CA file cannot be read.
    pub fn new(settings: TrustSettings) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        match &settings.certificate_ca_file {
            Some(path) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .and_then(|it| it.collect::<Result<_, _>>())
                    .map_err(|e| format!("reconcile.sns_certificate_ca_file {}: {e}", path.display()))?;
                if certs.is_empty() {
                    return Err(format!(
                        "reconcile.sns_certificate_ca_file {}: no certificate in it",
                        path.display()
                    ));
                }
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| format!("reconcile.sns_certificate_ca_file {}: {e}", path.display()))?;
                }
            }
            None => {
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            }
        }
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        Ok(Self {
            topics: Arc::new(settings.topic_arns.iter().cloned().collect()),
            settings: Arc::new(settings),
            client: Client::builder(TokioExecutor::new()).build(connector),
            certificates: Arc::default(),
        })
    }

    /// Whether `body` may be read as the provider's word. `Ok` for what is not JSON or not
    /// an envelope-shaped object either: decoding refuses it next, with its own reason.
    pub async fn authenticate(&self, body: &str) -> Result<(), Refusal> {
        let Ok(value) = serde_json::from_str::<Value>(body) else {
            return Ok(());
        };
        let is_envelope = value.get("Type").is_some()
            && value.get("eventType").is_none()
            && value.get("notificationType").is_none();
        if !is_envelope {
            if value.get("eventType").is_some() || value.get("notificationType").is_some() {
                if self.settings.raw_delivery {
                    return Ok(());
                }
                return Err(untrusted(
                    "a bare SES record, which carries no signature, and reconcile.raw_delivery is off: \
                     only signed SNS envelopes are evidence",
                )
                .into());
            }
            return Ok(());
        }
        let envelope: Envelope = serde_json::from_value(value)
            .map_err(|e| untrusted(format!("an SNS envelope without the expected fields: {e}")))?;
        let topic = envelope
            .topic_arn
            .as_deref()
            .ok_or_else(|| untrusted("an SNS envelope without TopicArn"))?;
        if !self.topics.contains(topic) {
            return Err(untrusted(format!(
                "TopicArn {:?} is not one of reconcile.sns_topic_arns",
                short(topic)
            ))
            .into());
        }
        if self.settings.signatures == SignatureCheck::Unchecked {
            return Ok(());
        }
        let algorithm: &'static dyn VerificationAlgorithm = match envelope.signature_version.as_deref() {
            Some("1") => &ring::signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
            Some("2") => &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            Some(v) => {
                return Err(untrusted(format!("SignatureVersion {:?} is not 1 or 2", short(v))).into())
            }
            None => return Err(untrusted("an SNS envelope without SignatureVersion").into()),
        };
        let signature = envelope
            .signature
            .as_deref()
            .ok_or_else(|| untrusted("an SNS envelope without Signature"))
            .and_then(|s| {
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_err(|e| untrusted(format!("Signature is not base64: {e}")))
            })?;
        let url = envelope
            .signing_cert_url
            .as_deref()
            .ok_or_else(|| untrusted("an SNS envelope without SigningCertURL"))?;
        let path = certificate_path(url, topic)?;
        let canonical = envelope.canonical()?;
        let key = self.key(url, path).await?;
        let now = std::time::SystemTime::now();
        if key.not_after < now || key.not_before > now {
            return Err(untrusted(format!("the signing certificate {url} is not valid now")).into());
        }
        UnparsedPublicKey::new(algorithm, &key.rsa)
            .verify(canonical.as_bytes(), &signature)
            .map_err(|_| {
                untrusted(format!(
                    "the signature does not verify with the certificate {url}"
                ))
                .into()
            })
    }

    /// The key of the certificate at `url` (its `path` on the host, or on the configured
    /// endpoint): cached. A definitive failure is held for [`FAILED_FETCH_HOLD`]; one that
    /// may pass later (a timeout, a 5xx, the fetch budget spent) is [`Unavailable`].
    async fn key(&self, url: &str, path: &str) -> Result<Arc<SigningKey>, Refusal> {
        {
            let mut known = self.certificates.lock().expect("certificates");
            if let Some(key) = known.keys.get(url) {
                return Ok(key.clone());
            }
            if let Some((at, why)) = known.failures.get(url) {
                if at.elapsed() < FAILED_FETCH_HOLD {
                    return Err(untrusted(format!("the signing certificate {url}: {why} (held)")).into());
                }
            }
            let minute_ago = Instant::now() - Duration::from_secs(60);
            while known.fetches.front().is_some_and(|t| *t < minute_ago) {
                known.fetches.pop_front();
            }
            if known.fetches.len() >= FETCHES_PER_MINUTE {
                return Err(Unavailable(format!(
                    "{FETCHES_PER_MINUTE} certificate fetches in the last minute: {url} waits"
                ))
                .into());
            }
            known.fetches.push_back(Instant::now());
        }
        let from = match &self.settings.certificate_endpoint {
            Some(base) => format!("{}{path}", base.trim_end_matches('/')),
            None => url.to_owned(),
        };
        let fetched = match tokio::time::timeout(self.settings.fetch_timeout, self.fetch(&from)).await {
            Ok(Ok(pem)) => signing_key(&pem).map_err(Fetch::Definitive),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Fetch::Transient(format!(
                "no answer from {from} within {:?}",
                self.settings.fetch_timeout
            ))),
        };
        let mut known = self.certificates.lock().expect("certificates");
        match fetched {
            Ok(key) => {
                let key = Arc::new(key);
                if known.keys.len() < KEYS_MAX {
                    known.keys.insert(url.to_owned(), key.clone());
                }
                known.failures.remove(url);
                Ok(key)
            }
            Err(Fetch::Definitive(why)) => {
                if known.failures.len() >= FAILURES_MAX {
                    known
                        .failures
                        .retain(|_, (at, _)| at.elapsed() < FAILED_FETCH_HOLD);
                    if known.failures.len() >= FAILURES_MAX {
                        if let Some(oldest) = known
                            .failures
                            .iter()
                            .min_by_key(|(_, (at, _))| *at)
                            .map(|(u, _)| u.clone())
                        {
                            known.failures.remove(&oldest);
                        }
                    }
                }
                known
                    .failures
                    .insert(url.to_owned(), (Instant::now(), why.clone()));
                Err(untrusted(format!("the signing certificate {url}: {why}")).into())
            }
            Err(Fetch::Transient(why)) => {
                Err(Unavailable(format!("the signing certificate {url}: {why}")).into())
            }
        }
    }

    async fn fetch(&self, from: &str) -> Result<Vec<u8>, Fetch> {
        let uri: hyper::Uri = from
            .parse()
            .map_err(|e| Fetch::Definitive(format!("{from}: {e}")))?;
        // A refused connection, a TLS failure, a reset: may pass later.
        let response = self
            .client
            .get(uri)
            .await
            .map_err(|e| Fetch::Transient(format!("GET {from}: {e}")))?;
        let status = response.status();
        if status.is_client_error() {
            return Err(Fetch::Definitive(format!("GET {from}: HTTP {status}")));
        }
        if !status.is_success() {
            return Err(Fetch::Transient(format!("GET {from}: HTTP {status}")));
        }
        let body = Limited::new(response.into_body(), CERTIFICATE_MAX_BYTES)
            .collect()
            .await
            .map_err(|e| Fetch::Transient(format!("GET {from}: {e}")))?;
        Ok(body.to_bytes().to_vec())
    }
}

/// How a certificate fetch failed.
enum Fetch {
    /// For good: not fetched again for a while, and the message refused.
    Definitive(String),
    /// Perhaps not next time: the message is left on the queue.
    Transient(String),
}

/// The certificate URL's path, if the URL is one SNS signs with: HTTPS, no port or user,
/// host `sns.<region>.amazonaws.com` (or `.com.cn`) in the topic's region, path
/// `/SimpleNotificationService-<name>.pem`.
fn certificate_path<'a>(url: &'a str, topic_arn: &str) -> Result<&'a str, Untrusted> {
    let refuse = |why: &str| untrusted(format!("SigningCertURL {:?}: {why}", short(url)));
    let rest = url.strip_prefix("https://").ok_or_else(|| refuse("not HTTPS"))?;
    let (host, path) = rest.split_at(rest.find('/').ok_or_else(|| refuse("no path"))?);
    let region = host
        .strip_prefix("sns.")
        .and_then(|h| {
            h.strip_suffix(".amazonaws.com")
                .or_else(|| h.strip_suffix(".amazonaws.com.cn"))
        })
        .filter(|r| {
            !r.is_empty()
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        .ok_or_else(|| refuse("the host is not sns.<region>.amazonaws.com"))?;
    // arn:<partition>:sns:<region>:<account>:<topic>
    let topic_region = topic_arn.split(':').nth(3).unwrap_or_default();
    if region != topic_region {
        return Err(refuse(&format!(
            "region {region} is not the topic's ({topic_region})"
        )));
    }
    let name = path
        .strip_prefix("/SimpleNotificationService-")
        .and_then(|n| n.strip_suffix(".pem"))
        .ok_or_else(|| refuse("the path is not /SimpleNotificationService-<name>.pem"))?;
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(refuse("the certificate's name has characters SNS does not use"));
    }
    Ok(path)
}

/// The RSA key and expiry of a PEM certificate.
fn signing_key(pem: &[u8]) -> Result<SigningKey, String> {
    let der = CertificateDer::from_pem_slice(pem).map_err(|e| format!("not a PEM certificate: {e}"))?;
    let cert =
        x509_cert::Certificate::from_der(&der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let spki = &cert.tbs_certificate.subject_public_key_info;
    const RSA_ENCRYPTION: &str = "1.2.840.113549.1.1.1";
    if spki.algorithm.oid.to_string() != RSA_ENCRYPTION {
        return Err(format!("the key is not RSA ({})", spki.algorithm.oid));
    }
    let rsa = spki
        .subject_public_key
        .as_bytes()
        .ok_or("the public key's bits are not whole bytes")?
        .to_vec();
    Ok(SigningKey {
        rsa,
        not_before: cert.tbs_certificate.validity.not_before.to_system_time(),
        not_after: cert.tbs_certificate.validity.not_after.to_system_time(),
    })
}

fn short(s: &str) -> String {
    let mut end = s.len().min(200);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:herald-ses-events";

    #[test]
    fn only_sns_certificate_urls_of_the_topics_region_are_fetched() {
        let ok = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-01d088a6f77103d0fe307c0069e40ed6.pem";
        assert_eq!(
            certificate_path(ok, TOPIC).unwrap(),
            "/SimpleNotificationService-01d088a6f77103d0fe307c0069e40ed6.pem"
        );
        for bad in [
            "http://sns.eu-west-1.amazonaws.com/SimpleNotificationService-x.pem",
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem",
            "https://sns.eu-west-1.amazonaws.com.evil.example/SimpleNotificationService-x.pem",
            "https://evil.example/sns.eu-west-1.amazonaws.com/SimpleNotificationService-x.pem",
            "https://sns.eu-west-1.amazonaws.com:8443/SimpleNotificationService-x.pem",
            "https://user@sns.eu-west-1.amazonaws.com/SimpleNotificationService-x.pem",
            "https://sns.eu-west-1.amazonaws.com/other.pem",
            "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-../../x.pem",
            "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-x.pem?y=1",
            "https://sns..amazonaws.com/SimpleNotificationService-x.pem",
        ] {
            assert!(certificate_path(bad, TOPIC).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_canonical_string_is_the_documented_fields_in_order() {
        let n: Envelope = serde_json::from_value(serde_json::json!({
            "Type": "Notification", "MessageId": "m", "TopicArn": TOPIC, "Subject": "s",
            "Message": "{}", "Timestamp": "2026-12-07T10:00:00.000Z", "SignatureVersion": "2",
            "Signature": "x", "SigningCertURL": "u", "UnsubscribeURL": "ignored"
        }))
        .unwrap();
        assert_eq!(
            n.canonical().unwrap(),
            format!("Message\n{{}}\nMessageId\nm\nSubject\ns\nTimestamp\n2026-12-07T10:00:00.000Z\nTopicArn\n{TOPIC}\nType\nNotification\n")
        );
        let c: Envelope = serde_json::from_value(serde_json::json!({
            "Type": "SubscriptionConfirmation", "MessageId": "m", "TopicArn": TOPIC, "Token": "t",
            "Message": "hello", "SubscribeURL": "https://x", "Timestamp": "T"
        }))
        .unwrap();
        assert_eq!(
            c.canonical().unwrap(),
            format!("Message\nhello\nMessageId\nm\nSubscribeURL\nhttps://x\nTimestamp\nT\nToken\nt\nTopicArn\n{TOPIC}\nType\nSubscriptionConfirmation\n")
        );
    }

    /// A notification SNS signed (2015, SignatureVersion 1, with a Subject) and its
    /// certificate (expired since: the signature alone is checked): Herald's canonical
    /// string is the one SNS signs. Canary: a changed Subject does not verify.
    #[test]
    fn a_notification_sns_signed_verifies_and_a_changed_one_does_not() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sns");
        let text = std::fs::read_to_string(dir.join("aws-notification.json")).unwrap();
        let key = signing_key(&std::fs::read(dir.join("aws-signing-cert.pem")).unwrap()).unwrap();
        let verifies = |envelope: &Envelope| {
            let signature = base64::engine::general_purpose::STANDARD
                .decode(envelope.signature.as_deref().unwrap())
                .unwrap();
            UnparsedPublicKey::new(
                &ring::signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
                &key.rsa,
            )
            .verify(envelope.canonical().unwrap().as_bytes(), &signature)
            .is_ok()
        };
        let mut envelope: Envelope = serde_json::from_str(&text).unwrap();
        assert!(verifies(&envelope), "SNS's own signature");
        envelope.subject = Some("this is not raw".into());
        assert!(!verifies(&envelope), "a changed subject");
        envelope.subject = None;
        assert!(!verifies(&envelope), "the subject left out");
    }

    fn trust(raw_delivery: bool, signatures: SignatureCheck) -> EvidenceTrust {
        trust_fetching_from(raw_delivery, signatures, None)
    }

    fn trust_fetching_from(
        raw_delivery: bool,
        signatures: SignatureCheck,
        certificate_endpoint: Option<String>,
    ) -> EvidenceTrust {
        EvidenceTrust::new(TrustSettings {
            topic_arns: vec![TOPIC.into()],
            signatures,
            raw_delivery,
            certificate_endpoint,
            certificate_ca_file: None,
            fetch_timeout: Duration::from_millis(500),
        })
        .unwrap()
    }

    /// A signed-looking envelope of the configured topic whose certificate is `pem`.
    fn envelope_with_certificate(pem: &str) -> String {
        serde_json::json!({
            "Type": "Notification", "MessageId": "m-1", "TopicArn": TOPIC,
            "Message": "{}", "Timestamp": "2026-12-07T10:00:00.000Z",
            "SignatureVersion": "1", "Signature": "AA==",
            "SigningCertURL": format!("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-{pem}.pem"),
        })
        .to_string()
    }

    /// Evidence whose certificate cannot be fetched now (the host refuses connections,
    /// or accepts and never answers) is neither believed nor refused: Unavailable, so the
    /// reconcile role leaves it on the queue, and it is not held as a failure (the next
    /// try fetches again). The eleventh new certificate in a minute waits too.
    #[tokio::test]
    async fn evidence_whose_certificate_cannot_be_fetched_now_waits() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refused_at = format!("https://{}", closed.local_addr().unwrap());
        drop(closed);
        let t = trust_fetching_from(false, SignatureCheck::Verify, Some(refused_at));
        for _ in 0..2 {
            match t.authenticate(&envelope_with_certificate("refused")).await {
                Err(Refusal::Unavailable(why)) => assert!(why.0.contains("GET https://127.0.0.1"), "{why}"),
                other => panic!("a refused connection: {other:?}"),
            }
        }

        // Accepts, reads, never answers: the fetch timeout.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_at = format!("https://{}", silent.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = silent.accept().await {
                open.push(stream);
            }
        });
        let t = trust_fetching_from(false, SignatureCheck::Verify, Some(silent_at));
        match t.authenticate(&envelope_with_certificate("silent")).await {
            Err(Refusal::Unavailable(why)) => assert!(why.0.contains("no answer from"), "{why}"),
            other => panic!("a silent host: {other:?}"),
        }
        // Nine more certificates fetch (and time out); the eleventh waits for the budget.
        for n in 0..9 {
            let r = t
                .authenticate(&envelope_with_certificate(&format!("other-{n}")))
                .await;
            assert!(matches!(r, Err(Refusal::Unavailable(_))), "{r:?}");
        }
        match t.authenticate(&envelope_with_certificate("eleventh")).await {
            Err(Refusal::Unavailable(why)) => {
                assert!(why.0.contains("certificate fetches in the last minute"), "{why}")
            }
            other => panic!("past the budget: {other:?}"),
        }
        held.abort();
    }

    #[tokio::test]
    async fn bare_records_and_other_topics_are_refused_before_any_fetch() {
        let bare = r#"{"eventType":"Bounce","mail":{}}"#;
        let t = trust(false, SignatureCheck::Verify);
        let why = t.authenticate(bare).await.unwrap_err();
        assert!(why.to_string().contains("raw_delivery is off"), "{why}");
        assert!(trust(true, SignatureCheck::Verify)
            .authenticate(bare)
            .await
            .is_ok());
        let other = r#"{"Type":"Notification","MessageId":"m","TopicArn":"arn:aws:sns:eu-west-1:999999999999:x","Message":"{}","Timestamp":"T","SignatureVersion":"1","Signature":"AA==","SigningCertURL":"https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-x.pem"}"#;
        let why = t.authenticate(other).await.unwrap_err();
        assert!(
            why.to_string().contains("not one of reconcile.sns_topic_arns"),
            "{why}"
        );
        let why = trust(false, SignatureCheck::Unchecked)
            .authenticate(other)
            .await
            .unwrap_err();
        assert!(
            why.to_string().contains("not one of"),
            "unchecked signatures still check the topic: {why}"
        );
        let unsigned = other
            .replace("999999999999:x", "123456789012:herald-ses-events")
            .replace(r#""SignatureVersion":"1","#, "");
        let why = t.authenticate(&unsigned).await.unwrap_err();
        assert!(why.to_string().contains("without SignatureVersion"), "{why}");
        assert!(trust(false, SignatureCheck::Unchecked)
            .authenticate(&unsigned)
            .await
            .is_ok());
        // Not JSON, or JSON of another shape: decoding says why next.
        assert!(t.authenticate("not json").await.is_ok());
        assert!(t.authenticate("[1]").await.is_ok());
    }
}
