//! How Herald's clients reach the brokers: the protocol (plain TCP or TLS, with or without
//! SASL), TLS as managed clusters serve it (the broker's certificate and name always
//! verified, a CA file, a client certificate for mTLS), and SASL's mechanisms (PLAIN,
//! SCRAM-SHA-256/512, OAUTHBEARER with a token source: AWS MSK IAM, or an unsecured JWT
//! for a development broker).
//!
//! This module owns the librdkafka properties of security and nothing else: every client
//! gets them from [`Security::apply`], after the `[kafka.properties]` pass-through, so no
//! pass-through property can weaken them ([`crate::client::refused_property`] refuses the
//! keys at load). Secrets are [`Secret`]s: their `Debug` shows no value, and rust-rdkafka's
//! `ClientConfig` leaves `sasl.password` and `ssl.key.password` out of its own `Debug`.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rdkafka::ClientConfig;

use crate::token::TokenSource;

/// librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl Protocol {
    /// Every protocol, for parsing and for error messages.
    pub const ALL: [Protocol; 4] = [
        Protocol::Plaintext,
        Protocol::Ssl,
        Protocol::SaslPlaintext,
        Protocol::SaslSsl,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Plaintext => "plaintext",
            Protocol::Ssl => "ssl",
            Protocol::SaslPlaintext => "sasl_plaintext",
            Protocol::SaslSsl => "sasl_ssl",
        }
    }

    /// Case-insensitive, as librdkafka takes it (`SASL_SSL` and `sasl_ssl`).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
    }

    pub fn tls(self) -> bool {
        matches!(self, Protocol::Ssl | Protocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(self, Protocol::SaslPlaintext | Protocol::SaslSsl)
    }
}

/// A password or key passphrase: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("** redacted **")
    }
}

/// TLS files (PEM). The broker's certificate chain and its name (or IP address) are always
/// verified; without `ca_file`, against the system's trusted roots (what MSK, Confluent
/// Cloud and Aiven's public certificates need).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// The CAs that signed the brokers' certificates (a private CA: Strimzi, self-managed).
    pub ca_file: Option<PathBuf>,
    /// A client certificate (mTLS), with its key.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The key's passphrase, when it is encrypted.
    pub key_password: Option<Secret>,
}

/// A SCRAM hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scram {
    Sha256,
    Sha512,
}

/// How Herald authenticates over SASL.
#[derive(Clone)]
pub enum Sasl {
    Plain {
        username: String,
        password: Secret,
    },
    Scram {
        hash: Scram,
        username: String,
        password: Secret,
    },
    /// OAUTHBEARER, with tokens from `source` (asked on the poll thread of each client,
    /// before its first connection and again before each token expires).
    OAuthBearer(Arc<dyn TokenSource>),
}

impl Sasl {
    /// librdkafka's `sasl.mechanism`.
    pub fn mechanism(&self) -> &'static str {
        match self {
            Sasl::Plain { .. } => "PLAIN",
            Sasl::Scram {
                hash: Scram::Sha256, ..
            } => "SCRAM-SHA-256",
            Sasl::Scram {
                hash: Scram::Sha512, ..
            } => "SCRAM-SHA-512",
            Sasl::OAuthBearer(_) => "OAUTHBEARER",
        }
    }
}

impl fmt::Debug for Sasl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sasl::Plain { username, .. } | Sasl::Scram { username, .. } => f
                .debug_struct(self.mechanism())
                .field("username", username)
                .finish_non_exhaustive(),
            Sasl::OAuthBearer(source) => f.debug_tuple("OAUTHBEARER").field(&source.describe()).finish(),
        }
    }
}

/// Everything about how a client connects, beside the brokers' addresses.
#[derive(Debug, Clone, Default)]
pub struct Security {
    pub protocol: Protocol,
    pub tls: Tls,
    pub sasl: Option<Sasl>,
}

impl Security {
    /// Whether the parts agree (a SASL protocol has a mechanism and the others none; TLS
    /// files only with TLS; a client key with its certificate). The message names what to
    /// change, in the configuration's words (`kafka.…`).
    pub fn check(&self) -> Result<(), String> {
        let p = self.protocol;
        match (&self.sasl, p.sasl()) {
            (None, true) => {
                return Err(format!(
                    "kafka.security_protocol = \"{}\" needs kafka.sasl.mechanism",
                    p.as_str()
                ))
            }
            (Some(s), false) => {
                return Err(format!(
                    "kafka.sasl.mechanism {} needs kafka.security_protocol = \"sasl_ssl\" (or \"sasl_plaintext\"), not \"{}\"",
                    s.mechanism(),
                    p.as_str()
                ))
            }
            _ => {}
        }
        // A PLAIN password crosses the network as it is: only inside TLS.
        if matches!(self.sasl, Some(Sasl::Plain { .. })) && !p.tls() {
            return Err(
                "kafka.sasl.mechanism = \"plain\" sends the password in clear: use kafka.security_protocol = \"sasl_ssl\""
                    .into(),
            );
        }
        let t = &self.tls;
        if !p.tls() && (t.ca_file.is_some() || t.cert_file.is_some() || t.key_file.is_some()) {
            return Err(format!(
                "kafka.tls files are set but kafka.security_protocol = \"{}\" does not use TLS (\"ssl\" or \"sasl_ssl\")",
                p.as_str()
            ));
        }
        if t.cert_file.is_some() != t.key_file.is_some() {
            return Err(
                "kafka.tls.cert_file and kafka.tls.key_file go together (a client certificate and its key)"
                    .into(),
            );
        }
        if t.key_password.is_some() && t.key_file.is_none() {
            return Err("kafka.tls.key_password is set without kafka.tls.key_file".into());
        }
        Ok(())
    }

    /// Sets the security properties on a client's configuration; called last, so that they
    /// win over anything set before.
    pub fn apply(&self, c: &mut ClientConfig) {
        c.set("security.protocol", self.protocol.as_str());
        if self.protocol.tls() {
            // librdkafka's defaults since 2.0, written out: a broker whose certificate is
            // not signed by a trusted CA, or not for the name Herald dialled, is refused.
            c.set("enable.ssl.certificate.verification", "true")
                .set("ssl.endpoint.identification.algorithm", "https");
            let t = &self.tls;
            if let Some(ca) = &t.ca_file {
                c.set("ssl.ca.location", ca.to_string_lossy());
            }
            if let (Some(cert), Some(key)) = (&t.cert_file, &t.key_file) {
                c.set("ssl.certificate.location", cert.to_string_lossy())
                    .set("ssl.key.location", key.to_string_lossy());
            }
            if let Some(p) = &t.key_password {
                c.set("ssl.key.password", p.expose());
            }
        }
        if let Some(sasl) = &self.sasl {
            c.set("sasl.mechanism", sasl.mechanism());
            match sasl {
                Sasl::Plain { username, password }
                | Sasl::Scram {
                    username, password, ..
                } => {
                    c.set("sasl.username", username)
                        .set("sasl.password", password.expose());
                }
                // The token comes from the client's context (`context::Hooked`), asked
                // when librdkafka wants one.
                Sasl::OAuthBearer(_) => {}
            }
        }
    }

    /// The token source, where the mechanism is OAUTHBEARER.
    pub fn token_source(&self) -> Option<Arc<dyn TokenSource>> {
        match &self.sasl {
            Some(Sasl::OAuthBearer(s)) => Some(s.clone()),
            _ => None,
        }
    }
}

/// The `[kafka.properties]` keys that security owns: set through `kafka.security_protocol`,
/// `kafka.tls.*` and `kafka.sasl.*`, where they are checked together and secrets come from
/// files or the environment. Those that would turn verification off are refused outright.
pub(crate) fn owned_property(key: &str) -> Option<&'static str> {
    let why = match key {
        "security.protocol" => "set kafka.security_protocol",
        "sasl.mechanism" | "sasl.mechanisms" => "set kafka.sasl.mechanism",
        "sasl.username" => "set kafka.sasl.username",
        "sasl.password" => {
            "set kafka.sasl.password_file (a mounted secret) or HERALD_KAFKA__SASL__PASSWORD, never a property"
        }
        "ssl.certificate.location" => "set kafka.tls.cert_file",
        "ssl.key.location" => "set kafka.tls.key_file",
        "ssl.key.password" => {
            "set kafka.tls.key_password_file or HERALD_KAFKA__TLS__KEY_PASSWORD, never a property"
        }
        "ssl.endpoint.identification.algorithm" | "enable.ssl.certificate.verification" => {
            "Herald always verifies the broker's certificate and name; give kafka.tls.ca_file for a private CA"
        }
        "ssl.ca.pem" | "ssl.certificate.pem" | "ssl.key.pem" => {
            "give PEM as files: kafka.tls.ca_file, cert_file and key_file (a key inline in the configuration would be a secret outside the secret files)"
        }
        "ssl.keystore.location" | "ssl.keystore.password" | "ssl_key" | "ssl_certificate" | "ssl_ca" => {
            "give the client certificate and key as PEM files: kafka.tls.cert_file and key_file (with key_password_file)"
        }
        "ssl.ca.certificate.stores" | "ssl.ca.location" => "set kafka.tls.ca_file",
        "ssl.engine.location" | "ssl.providers" => "Herald uses OpenSSL's default provider",
        key if key.starts_with("sasl.oauthbearer.") || key == "enable.sasl.oauthbearer.unsecure.jwt" => {
            "OAUTHBEARER tokens come from kafka.sasl.mechanism (\"aws_msk_iam\")"
        }
        key if key.starts_with("sasl.kerberos.") => "GSSAPI (Kerberos) is not built into Herald's librdkafka",
        _ => return None,
    };
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sasl_ssl() -> Security {
        Security {
            protocol: Protocol::SaslSsl,
            tls: Tls {
                ca_file: Some("/etc/kafka/ca.crt".into()),
                ..Tls::default()
            },
            sasl: Some(Sasl::Scram {
                hash: Scram::Sha512,
                username: "herald".into(),
                password: Secret::new("s3cret-value"),
            }),
        }
    }

    #[test]
    fn tls_verifies_the_broker_and_sasl_sets_the_mechanism() {
        let mut c = ClientConfig::new();
        sasl_ssl().apply(&mut c);
        assert_eq!(c.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(c.get("ssl.endpoint.identification.algorithm"), Some("https"));
        assert_eq!(c.get("enable.ssl.certificate.verification"), Some("true"));
        assert_eq!(c.get("ssl.ca.location"), Some("/etc/kafka/ca.crt"));
        assert_eq!(c.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(c.get("sasl.username"), Some("herald"));
        assert_eq!(c.get("sasl.password"), Some("s3cret-value"));
        assert_eq!(c.get("ssl.certificate.location"), None);
        let mut plain = ClientConfig::new();
        Security::default().apply(&mut plain);
        assert_eq!(plain.get("security.protocol"), Some("plaintext"));
        assert_eq!(plain.get("sasl.mechanism"), None);
        assert_eq!(plain.get("ssl.endpoint.identification.algorithm"), None);
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let mut s = sasl_ssl();
        s.tls.key_password = Some(Secret::new("key-phrase-value"));
        let mut c = ClientConfig::new();
        s.apply(&mut c);
        for shown in [format!("{s:?}"), format!("{c:?}")] {
            assert!(!shown.contains("s3cret-value"), "{shown}");
            assert!(!shown.contains("key-phrase-value"), "{shown}");
        }
        assert!(
            format!("{s:?}").contains("herald"),
            "the username is not a secret"
        );
    }

    #[test]
    fn parts_that_disagree_are_refused_naming_the_key() {
        let mut s = sasl_ssl();
        assert_eq!(s.check(), Ok(()));
        s.protocol = Protocol::Ssl;
        assert!(s.check().unwrap_err().contains("kafka.security_protocol"));
        s.sasl = None;
        assert_eq!(s.check(), Ok(()));
        s.protocol = Protocol::SaslSsl;
        assert!(s.check().unwrap_err().contains("needs kafka.sasl.mechanism"));
        s.protocol = Protocol::Plaintext;
        assert!(s.check().unwrap_err().contains("kafka.tls files"));
        let plain_in_clear = Security {
            protocol: Protocol::SaslPlaintext,
            tls: Tls::default(),
            sasl: Some(Sasl::Plain {
                username: "u".into(),
                password: Secret::new("p"),
            }),
        };
        assert!(plain_in_clear.check().unwrap_err().contains("in clear"));
        let half_mtls = Security {
            protocol: Protocol::Ssl,
            tls: Tls {
                cert_file: Some("/c.pem".into()),
                ..Tls::default()
            },
            sasl: None,
        };
        assert!(half_mtls.check().unwrap_err().contains("go together"));
    }

    #[test]
    fn protocols_parse_as_librdkafka_spells_them() {
        assert_eq!(Protocol::parse("SASL_SSL"), Some(Protocol::SaslSsl));
        assert_eq!(Protocol::parse("plaintext"), Some(Protocol::Plaintext));
        assert_eq!(Protocol::parse("tls"), None);
    }
}
