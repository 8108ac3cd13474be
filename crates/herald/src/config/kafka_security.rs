//! `kafka.security_protocol`, `[kafka.tls]` and `[kafka.sasl]`: how Herald reaches the
//! brokers (herald_kafka::security). Validated with the rest at load; the secrets (from files
//! or `HERALD_KAFKA__SASL__PASSWORD` / `HERALD_KAFKA__TLS__KEY_PASSWORD`) are read, and an
//! MSK IAM token source started, only by the commands that make Kafka clients (`run`,
//! `topics`, `dead-letter`, `lag`: [`KafkaConfig::security`]); `migrate`, `retention`, the
//! ledger's commands and `check-config` read no Kafka secret and need none mounted.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use herald_kafka::security::{Protocol, Sasl, Scram, Secret, Security, Tls};
use herald_kafka::token::UnsecuredJwt;
use serde::{Deserialize, Serialize};

use super::aws::AwsConfig;
use super::kafka::KafkaConfig;

/// TLS files for `ssl` and `sasl_ssl` (PEM).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTlsConfig {
    /// The CAs that signed the brokers' certificates. Unset: the system's trusted roots.
    pub ca_file: Option<String>,
    /// A client certificate and its key, for brokers that require mTLS.
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    /// The key's passphrase (better: `key_password_file`, or the environment).
    pub key_password: Option<String>,
    pub key_password_file: Option<String>,
}

/// SASL for `sasl_plaintext` and `sasl_ssl`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSaslConfig {
    /// "" (none), "plain", "scram-sha-256", "scram-sha-512", "aws_msk_iam", or
    /// "oauthbearer_unsecured_jwt" (a development broker with Kafka's unsecured validator).
    pub mechanism: String,
    pub username: Option<String>,
    /// The password (better: `password_file`, a mounted secret, or the environment).
    pub password: Option<String>,
    pub password_file: Option<String>,
    /// aws_msk_iam: the cluster's region. Unset: `aws.region`, then `AWS_REGION`.
    pub aws_region: Option<String>,
}

impl fmt::Debug for KafkaTlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaTlsConfig")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("key_password_file", &self.key_password_file)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for KafkaSaslConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSaslConfig")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password_file", &self.password_file)
            .field("aws_region", &self.aws_region)
            .finish_non_exhaustive()
    }
}

/// A mechanism as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    Plain,
    Scram(Scram),
    AwsMskIam,
    UnsecuredJwt,
}

const MECHANISMS: &str = "plain, scram-sha-256, scram-sha-512, aws_msk_iam, oauthbearer_unsecured_jwt";

/// How long an unsecured development token is valid (librdkafka asks again at 80%).
const UNSECURED_LIFETIME: Duration = Duration::from_secs(3600);

impl KafkaSaslConfig {
    fn mechanism(&self) -> anyhow::Result<Option<Mechanism>> {
        Ok(Some(match self.mechanism.trim().to_ascii_lowercase().as_str() {
            "" => return Ok(None),
            "plain" => Mechanism::Plain,
            "scram-sha-256" => Mechanism::Scram(Scram::Sha256),
            "scram-sha-512" => Mechanism::Scram(Scram::Sha512),
            "aws_msk_iam" => Mechanism::AwsMskIam,
            "oauthbearer_unsecured_jwt" => Mechanism::UnsecuredJwt,
            other => bail!("kafka.sasl.mechanism = {other:?} is not one of {MECHANISMS}"),
        }))
    }

    fn has_password(&self) -> bool {
        non_empty(&self.password).is_some() || non_empty(&self.password_file).is_some()
    }
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// A secret given inline (or by the environment) or in a file; a file's trailing line break
/// is not part of it.
fn secret(key: &str, inline: &Option<String>, file: &Option<String>) -> anyhow::Result<Option<Secret>> {
    if let Some(v) = non_empty(inline) {
        return Ok(Some(Secret::new(v)));
    }
    let Some(path) = non_empty(file) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("{key}_file {path}"))?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        bail!("{key}_file {path} is empty");
    }
    Ok(Some(Secret::new(value)))
}

impl KafkaConfig {
    fn protocol(&self) -> anyhow::Result<Protocol> {
        Protocol::parse(&self.security_protocol).with_context(|| {
            format!(
                "kafka.security_protocol = {:?} is not one of plaintext, ssl, sasl_plaintext, sasl_ssl",
                self.security_protocol
            )
        })
    }

    /// The security settings' shape, secrets left out (placeholders): what validation checks.
    fn shape(&self) -> anyhow::Result<(Security, Option<Mechanism>)> {
        let protocol = self.protocol()?;
        let mechanism = self.sasl.mechanism()?;
        let placeholder = || Secret::new("-");
        let username = || non_empty(&self.sasl.username).unwrap_or_default().to_owned();
        let sasl = mechanism.map(|m| match m {
            Mechanism::Plain => Sasl::Plain {
                username: username(),
                password: placeholder(),
            },
            Mechanism::Scram(hash) => Sasl::Scram {
                hash,
                username: username(),
                password: placeholder(),
            },
            Mechanism::AwsMskIam | Mechanism::UnsecuredJwt => Sasl::OAuthBearer(Arc::new(UnsecuredJwt {
                principal: String::new(),
                lifetime: UNSECURED_LIFETIME,
            })),
        });
        let t = &self.tls;
        let tls = Tls {
            ca_file: non_empty(&t.ca_file).map(Into::into),
            cert_file: non_empty(&t.cert_file).map(Into::into),
            key_file: non_empty(&t.key_file).map(Into::into),
            key_password: (non_empty(&t.key_password).is_some() || non_empty(&t.key_password_file).is_some())
                .then(placeholder),
        };
        Ok((Security { protocol, tls, sasl }, mechanism))
    }

    pub(super) fn validate_security(&self) -> anyhow::Result<()> {
        let (shape, mechanism) = self.shape()?;
        shape.check().map_err(anyhow::Error::msg)?;
        match mechanism {
            Some(Mechanism::Plain | Mechanism::Scram(_)) => {
                if non_empty(&self.sasl.username).is_none() {
                    bail!(
                        "kafka.sasl.mechanism = {:?} needs kafka.sasl.username",
                        self.sasl.mechanism
                    );
                }
                if !self.sasl.has_password() {
                    bail!(
                        "kafka.sasl.mechanism = {:?} needs kafka.sasl.password_file (or HERALD_KAFKA__SASL__PASSWORD)",
                        self.sasl.mechanism
                    );
                }
            }
            Some(Mechanism::AwsMskIam) => {
                if shape.protocol != Protocol::SaslSsl {
                    bail!("kafka.sasl.mechanism = \"aws_msk_iam\" needs kafka.security_protocol = \"sasl_ssl\" (MSK's IAM listener, port 9098, is TLS)");
                }
                if self.sasl.has_password() {
                    bail!("kafka.sasl.mechanism = \"aws_msk_iam\" takes no password: it signs with the AWS credentials of [aws]");
                }
            }
            Some(Mechanism::UnsecuredJwt) | None => {}
        }
        Ok(())
    }

    /// The security settings with their secrets, for clients about to be made. Reads the
    /// secret files; for `aws_msk_iam`, fetches AWS credentials (an error when the chain
    /// has none) and keeps them fresh on the current runtime.
    pub async fn security(&self, aws: &AwsConfig) -> anyhow::Result<Security> {
        let (mut security, mechanism) = self.shape()?;
        let t = &self.tls;
        security.tls.key_password = secret("kafka.tls.key_password", &t.key_password, &t.key_password_file)?;
        for (key, file) in [
            ("kafka.tls.ca_file", &security.tls.ca_file),
            ("kafka.tls.cert_file", &security.tls.cert_file),
            ("kafka.tls.key_file", &security.tls.key_file),
        ] {
            if let Some(path) = file {
                std::fs::metadata(path).with_context(|| format!("{key} {}", path.display()))?;
            }
        }
        let password = || -> anyhow::Result<Secret> {
            secret(
                "kafka.sasl.password",
                &self.sasl.password,
                &self.sasl.password_file,
            )?
            .context("kafka.sasl.password_file (or HERALD_KAFKA__SASL__PASSWORD) is not set")
        };
        let username = non_empty(&self.sasl.username).unwrap_or("herald").to_owned();
        security.sasl = match mechanism {
            None => None,
            Some(Mechanism::Plain) => Some(Sasl::Plain {
                username,
                password: password()?,
            }),
            Some(Mechanism::Scram(hash)) => Some(Sasl::Scram {
                hash,
                username,
                password: password()?,
            }),
            Some(Mechanism::UnsecuredJwt) => Some(Sasl::OAuthBearer(Arc::new(UnsecuredJwt {
                principal: username,
                lifetime: UNSECURED_LIFETIME,
            }))),
            Some(Mechanism::AwsMskIam) => {
                let settings = aws.settings();
                let sdk = herald_channels::sdk_config(&settings).await;
                let region = non_empty(&self.sasl.aws_region)
                    .map(str::to_owned)
                    .or_else(|| sdk.region().map(|r| r.to_string()))
                    .context("kafka.sasl.mechanism = \"aws_msk_iam\" needs a region: kafka.sasl.aws_region, aws.region or AWS_REGION")?;
                let provider = sdk.credentials_provider().context(
                    "no AWS credentials provider for MSK IAM (the [aws] settings and the AWS chain)",
                )?;
                let source = herald_kafka::msk_iam::MskIam::start(provider, &region).await?;
                Some(Sasl::OAuthBearer(source))
            }
        };
        Ok(security)
    }
}
