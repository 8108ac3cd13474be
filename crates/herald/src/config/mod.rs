//! Configuration: the embedded defaults ([`DEFAULTS`], `config/herald.example.toml`, where
//! every key is documented), then the TOML file, then `HERALD_*` environment variables
//! (`HERALD_DATABASE__URL` sets `database.url`, for every table of [`Config::sections`]).
//! Validated at start-up; every error names the key.
//!
//! One module per section, its validation beside its fields; the sections' structs have no
//! defaults of their own and refuse unknown keys. [`Config::validate`] runs each section's,
//! then what spans sections: HTTP ingest's share of the database pool and the listeners
//! that must differ here, a lease that must cover a send at each channel's rate in
//! `channels.rs` (given the lease from `[delivery]` and `[aws]`).

mod admin;
mod aws;
mod channels;
mod database;
mod delivery;
mod http_ingest;
mod ingest;
mod kafka;
mod kafka_security;
mod listeners;
mod reconcile;
mod relay;
mod rendering;
mod retention;
mod routes;
mod suppression;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use figment::providers::{Env, Format, Toml};
use figment::Figment;
use herald_core::lease::LeaseBudget;
use herald_core::retry::RetryPolicy;
use herald_core::Channel;
use herald_kafka::admin::TopicSpec;
use herald_kafka::security::{Protocol, Security};
use herald_kafka::KafkaSettings;
use herald_store::destination::DestinationKey;
use herald_store::StoreConfig;
use herald_telemetry::{LogSettings, OtelSettings};
use serde::{Deserialize, Serialize};

use admin::AdminConfig;
use aws::AwsConfig;
use channels::ChannelsConfig;
use database::DatabaseConfig;
use delivery::DeliveryConfig;
use http_ingest::HttpIngestConfig;
use ingest::IngestConfig;
use kafka::KafkaConfig;
use listeners::ListenersConfig;
use reconcile::ReconcileConfig;
use relay::RelayConfig;
use rendering::RenderingConfig;
pub use retention::RetentionConfig;
pub use routes::Route;
use suppression::SuppressionConfig;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub log: LogSettings,
    pub telemetry: OtelSettings,
    pub admin: AdminConfig,
    pub http_ingest: HttpIngestConfig,
    pub listeners: ListenersConfig,
    pub database: DatabaseConfig,
    pub kafka: KafkaConfig,
    pub ingest: IngestConfig,
    pub relay: RelayConfig,
    pub delivery: DeliveryConfig,
    pub aws: AwsConfig,
    pub channels: ChannelsConfig,
    pub rendering: RenderingConfig,
    pub retention: RetentionConfig,
    pub reconcile: ReconcileConfig,
    pub suppression: SuppressionConfig,
    /// None by default: an event kind without a route is skipped and counted.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// How Kafka is reached, secrets read and token source started
    /// ([`Config::resolve_kafka_security`]); not configuration itself.
    #[serde(skip)]
    kafka_security: Option<Security>,
    /// `suppression`'s key, read ([`Config::resolve_destination_key`]) only by the
    /// commands that read or write the suppression list.
    #[serde(skip)]
    destination_key: Option<DestinationKey>,
}

/// Every default, and the documentation of every key: the example configuration is the
/// first layer of every load, so that a default is written once, where it is explained.
/// Every key of a section is in it (no section's struct, `[log]` and `[telemetry]`'s in
/// herald-telemetry included, has serde defaults: a key missing here fails every load, and
/// `make test`); only optional keys and the routes are left out (unset, and none).
pub const DEFAULTS: &str = include_str!("../../../../config/herald.example.toml");

impl Config {
    /// The defaults alone ([`DEFAULTS`]), unvalidated.
    pub fn defaults() -> Self {
        Figment::from(Toml::string(DEFAULTS))
            .extract()
            .expect("config/herald.example.toml holds every default")
    }

    /// The sections `HERALD_<SECTION>__<KEY>` variables may set: the configuration's
    /// top-level tables, read from its structure (a section added to [`Config`] takes
    /// environment overrides with nothing else to change).
    pub fn sections() -> Vec<String> {
        match figment::value::Value::serialize(Self::defaults()) {
            Ok(figment::value::Value::Dict(_, sections)) => sections
                .into_iter()
                .filter(|(_, v)| matches!(v, figment::value::Value::Dict(..)))
                .map(|(k, _)| k)
                .collect(),
            other => unreachable!("the configuration serializes to a table: {other:?}"),
        }
    }

    /// Defaults < `path` < environment, not yet validated.
    fn figment(path: &Path) -> Figment {
        let sections = Self::sections();
        Figment::from(Toml::string(DEFAULTS))
            .merge(Toml::file(path))
            .merge(
                // Only HERALD_<SECTION>__... is configuration; other HERALD_* variables
                // (HERALD_BIN in the tests, say) belong to someone else.
                Env::prefixed("HERALD_")
                    .filter(move |k| {
                        let k = k.as_str().to_ascii_lowercase();
                        sections.iter().any(|s| k.starts_with(&format!("{s}__")))
                    })
                    .split("__"),
            )
    }

    /// Loads defaults < `path` < environment. A missing file is an error only when the
    /// path was given explicitly.
    pub fn load(path: &Path, explicit: bool) -> anyhow::Result<Self> {
        if explicit && !path.exists() {
            bail!("configuration file {} does not exist", path.display());
        }
        let config: Config = Self::figment(path).extract().with_context(|| {
            format!(
                "invalid configuration (file {}, HERALD_* environment)",
                path.display()
            )
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot, each section then what spans sections; each message
    /// names its key.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.database.validate()?;
        self.admin.validate()?;
        self.http_ingest.validate()?;
        self.listeners.validate()?;
        if self.reconcile.sns_signatures == herald_channels::reconcile::sns::SignatureCheck::Unchecked
            && self.aws.endpoint_url.is_none()
        {
            bail!(
                "reconcile.sns_signatures = \"unchecked\" is for a local stand-in SNS (aws.endpoint_url set): \
                 against AWS, whoever can write to the queue could forge evidence; use \"verify\""
            );
        }
        if self.admin.max_concurrent_requests >= self.database.pool_size as u64 {
            bail!(
                "admin.max_concurrent_requests = {} must be below database.pool_size = {}: admin requests \
                 share the pool with the roles",
                self.admin.max_concurrent_requests,
                self.database.pool_size
            );
        }
        if self.listeners.idle_timeout_secs * 1000 <= self.database.query_timeout_ms {
            bail!(
                "listeners.idle_timeout_secs = {} must be longer than database.query_timeout_ms = {}: \
                 a connection whose request waits on PostgreSQL moves no byte meanwhile",
                self.listeners.idle_timeout_secs,
                self.database.query_timeout_ms
            );
        }
        let h = &self.http_ingest;
        if !h.listen.is_empty() {
            if h.max_in_flight == 0 || h.max_in_flight >= self.database.pool_size {
                bail!(
                    "http_ingest.max_in_flight = {} is out of range: expected 1..{} (below database.pool_size, \
                     which the ingest role's Kafka batches share)",
                    h.max_in_flight,
                    self.database.pool_size
                );
            }
            if h.listen == self.admin.listen && !h.listen.ends_with(":0") {
                bail!(
                    "http_ingest.listen and admin.listen are both {:?}: give each its own",
                    h.listen
                );
            }
        }
        self.kafka.validate()?;
        self.ingest.validate()?;
        self.relay.validate()?;
        self.retention.validate()?;
        self.reconcile.validate()?;
        self.suppression.validate()?;
        self.delivery.validate()?;
        self.aws.validate()?;
        self.channels.validate(&self.lease_budget())?;
        self.rendering.validate()?;
        routes::validate(&self.routes)
    }

    /// A topic's name with `kafka.topic_prefix`.
    pub fn topic(&self, name: &str) -> String {
        self.kafka.topic(name)
    }

    /// A consumer group's id with `kafka.topic_prefix`.
    pub fn group(&self, group: &str) -> String {
        self.kafka.group(group)
    }

    /// The topics Herald's ingest consumes, with the prefix: the only ones a dead-letter
    /// replay writes to.
    pub fn ingest_topics(&self) -> Vec<String> {
        let t = &self.kafka.topics;
        vec![self.topic(&t.order_events), self.topic(&t.seller_profiles)]
    }

    /// Each consuming role's group and topics, with the prefix, as JSON (`herald check-config
    /// --consumers`): what the chart's lag-based autoscaling must name.
    pub fn consumers(&self) -> serde_json::Value {
        serde_json::json!({
            "ingest": {
                "group": self.group(&self.ingest.group_id),
                "topics": self.ingest_topics(),
            },
            "deliver": {
                "group": self.group(&self.delivery.group_id),
                "topics": [self.topic(&self.kafka.topics.deliveries)],
            },
        })
    }

    /// The roles' pool, with the suppression list's key (none unless loaded by [`Config::load`]).
    pub fn store(&self) -> StoreConfig {
        StoreConfig {
            destination_key: self.destination_key.clone(),
            ..self.database.store()
        }
    }

    /// The schema owner's, with the key too (retention keys a purged payload's destination).
    pub fn owner_store(&self) -> StoreConfig {
        StoreConfig {
            destination_key: self.destination_key.clone(),
            ..self.database.owner_store()
        }
    }

    /// Reads the suppression list's key (a file, maybe): once, before the store is made,
    /// for the commands that read or write the list (`run`, `retention`, `suppression`).
    pub fn resolve_destination_key(&mut self) -> anyhow::Result<()> {
        self.destination_key = Some(self.suppression.destination_key()?);
        Ok(())
    }

    /// Reads the Kafka secrets and, for MSK IAM, fetches AWS credentials: once, before any
    /// Kafka client is made (every command but `check-config`).
    pub async fn resolve_kafka_security(&mut self) -> anyhow::Result<()> {
        self.kafka_security = Some(self.kafka.security(&self.aws).await?);
        Ok(())
    }

    /// The Kafka clients' settings. Plain TCP when security was not resolved, which only a
    /// plaintext configuration may skip.
    pub fn kafka_settings(&self) -> KafkaSettings {
        let security = match &self.kafka_security {
            Some(s) => s.clone(),
            None => {
                assert_eq!(
                    Protocol::parse(&self.kafka.security_protocol),
                    Some(Protocol::Plaintext),
                    "Config::resolve_kafka_security must run before Kafka clients are made"
                );
                Security::default()
            }
        };
        self.kafka.settings(security)
    }

    pub fn topic_specs(&self) -> Vec<TopicSpec> {
        self.kafka.topic_specs()
    }

    pub fn aws_settings(&self) -> herald_channels::AwsSettings {
        self.aws.settings()
    }

    /// What a delivery lease covers (`herald_core::lease`).
    pub fn lease_budget(&self) -> LeaseBudget {
        LeaseBudget {
            lease: Duration::from_secs(self.delivery.lease_secs),
            attempt_timeout: Duration::from_millis(self.aws.attempt_timeout_ms),
            margin: Duration::from_millis(self.delivery.lease_margin_ms),
        }
    }

    /// The send-rate limit of a channel, per second.
    pub fn rate_per_second(&self, channel: Channel) -> u32 {
        self.channels.retry(channel).rate_per_second
    }

    pub fn retry_policy(&self, channel: Channel) -> RetryPolicy {
        let r = self.channels.retry(channel);
        RetryPolicy {
            max_attempts: r.max_attempts,
            base_backoff: Duration::from_millis(r.base_backoff_ms),
            max_backoff: Duration::from_millis(r.max_backoff_ms),
            on_unknown: r.on_unknown,
            // Only SES publishes events Herald can match to an attempt: an SMS publish
            // that timed out has no message id to find in the delivery-status logs.
            evidence_window: match channel {
                Channel::Email if self.reconcile.queue_url.is_some() => {
                    Some(Duration::from_secs(self.reconcile.silence_secs))
                }
                _ => None,
            },
        }
    }

    pub fn route(&self, event_kind: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.event_kind == event_kind)
    }
}

/// `key = v` within `lo..=hi`, or an error naming the key.
fn range(key: &str, v: u64, lo: u64, hi: u64) -> anyhow::Result<()> {
    if v < lo || v > hi {
        bail!("{key} = {v} is out of range: expected {lo}..={hi}");
    }
    Ok(())
}

/// A `host:port` to listen on, unless empty (no listener).
fn listen_address(key: &str, listen: &str) -> anyhow::Result<()> {
    if !listen.is_empty() {
        listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| anyhow::anyhow!("{key} {listen:?}: {e}"))?;
    }
    Ok(())
}

/// A bearer token given inline or in a file (trailing whitespace ignored); `section` names
/// the keys in errors.
/// A token given inline or in the file at `file` (the key `file_key`).
fn bearer_token(file_key: &str, token: Option<&str>, file: Option<&str>) -> anyhow::Result<Option<String>> {
    if let Some(t) = token.filter(|t| !t.is_empty()) {
        return Ok(Some(t.to_owned()));
    }
    match file.filter(|f| !f.is_empty()) {
        Some(f) => {
            let t = std::fs::read_to_string(f).with_context(|| format!("{file_key} {f}"))?;
            let t = t.trim_end().to_owned();
            if t.is_empty() {
                bail!("{file_key} {f} is empty");
            }
            Ok(Some(t))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests;
