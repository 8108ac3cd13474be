//! Configuration: the embedded defaults ([`DEFAULTS`], `config/herald.example.toml`, where
//! every key is documented), then the TOML file, then `HERALD_*` environment variables
//! (`HERALD_DATABASE__URL` sets `database.url`, for every table of [`Config::sections`]).
//! The sections' structs have no defaults of their own and refuse unknown keys. Validated
//! at start-up; every error names the key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use figment::providers::{Env, Format, Toml};
use figment::Figment;
use herald_core::consent::is_plausible_email;
use herald_core::lease::LeaseBudget;
use herald_core::retry::{RetryPolicy, UnknownPolicy};
use herald_core::Channel;
use herald_kafka::admin::TopicSpec;
use herald_kafka::KafkaSettings;
use herald_store::StoreConfig;
use herald_telemetry::{LogSettings, OtelSettings};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub log: LogSettings,
    pub telemetry: OtelSettings,
    pub admin: AdminConfig,
    pub http_ingest: HttpIngestConfig,
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
    /// None by default: an event kind without a route is skipped and counted.
    #[serde(default)]
    pub routes: Vec<Route>,
}

/// The admin HTTP endpoint: health, readiness, metrics and the inspection API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// `host:port`; loopback by default. Empty: no admin endpoint.
    pub listen: String,
    /// `host:port` of a second listener serving only `/healthz`, `/readyz` and `/metrics`:
    /// what a pod exposes to its kubelet and Prometheus while `listen` (the ledger, the
    /// mutations) stays on loopback. Empty (the default): none.
    pub probe_listen: String,
    /// Bearer token the mutating endpoints (resolve, dead-letter replay) require. Prefer
    /// `token_file` or `HERALD_ADMIN__TOKEN`; without a token those endpoints answer 401.
    pub token: Option<String>,
    /// A file holding the token (trailing whitespace ignored).
    pub token_file: Option<String>,
}

impl AdminConfig {
    /// The configured token, from `token` or `token_file`; `None` when neither is set.
    pub fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        bearer_token("admin", self.token.as_deref(), self.token_file.as_deref())
    }
}

/// A bearer token given inline or in a file (trailing whitespace ignored); `section` names
/// the keys in errors.
fn bearer_token(section: &str, token: Option<&str>, file: Option<&str>) -> anyhow::Result<Option<String>> {
    if let Some(t) = token.filter(|t| !t.is_empty()) {
        return Ok(Some(t.to_owned()));
    }
    match file.filter(|f| !f.is_empty()) {
        Some(f) => {
            let t = std::fs::read_to_string(f).with_context(|| format!("{section}.token_file {f}"))?;
            let t = t.trim_end().to_owned();
            if t.is_empty() {
                bail!("{section}.token_file {f} is empty");
            }
            Ok(Some(t))
        }
        None => Ok(None),
    }
}

/// HTTP ingest: `POST /v1/order-events` with an `Idempotency-Key`, for producers that
/// cannot write to Kafka. Served by processes running the ingest role.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpIngestConfig {
    /// `host:port`; empty (the default): no HTTP ingest.
    pub listen: String,
    /// Bearer token every request needs (not the admin token). Prefer `token_file` or
    /// `HERALD_HTTP_INGEST__TOKEN`; the listener refuses to start without one.
    pub token: Option<String>,
    pub token_file: Option<String>,
    /// How long an Idempotency-Key is answered with its first response: at least 24.
    pub key_retention_hours: u32,
    /// How long a request waits for another request with the same key before answering
    /// 409 (still in progress).
    pub in_progress_wait_ms: u64,
    /// Most requests converging at once (each holds a database connection of the pool the
    /// role's Kafka batches use); more answer 503 with Retry-After. Below database.pool_size.
    pub max_in_flight: usize,
}

impl HttpIngestConfig {
    pub fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        bearer_token("http_ingest", self.token.as_deref(), self.token_file.as_deref())
    }

    pub fn key_retention(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.key_retention_hours) * 3600)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// What `herald run` connects as: in production a runtime role that reads and writes
    /// rows and cannot change the schema (see `runtime_role`).
    pub url: String,
    /// The role that owns the schema, for migrations (`herald migrate`, and
    /// `migrate_on_start`). Unset: `url`, one role for everything (development).
    pub owner_url: Option<String>,
    /// After migrating, the owner grants this role what `herald run` needs (SELECT,
    /// INSERT, UPDATE, DELETE on Herald's tables, its sequences) and nothing more.
    pub runtime_role: Option<String>,
    /// PEM bundle of the CAs that signed the server's certificate, for URLs with
    /// `sslmode=require`. Unset: the system's trusted roots. The certificate and its name
    /// are always verified.
    pub tls_ca_file: Option<String>,
    /// A file holding `url`'s password (a mounted secret), instead of the URL.
    pub password_file: Option<String>,
    /// A file holding `owner_url`'s password (or `url`'s, when owner_url is unset).
    pub owner_password_file: Option<String>,
    pub pool_size: usize,
    pub connect_timeout_ms: u64,
    /// Apply pending migrations when `herald run` starts.
    pub migrate_on_start: bool,
    /// Months of `notification_attempts` partitions created ahead of time.
    pub attempt_partitions_ahead: u32,
}

/// A configured path, unless unset or empty (an empty environment override unsets it).
fn non_empty_path(p: &Option<String>) -> Option<std::path::PathBuf> {
    p.as_deref().filter(|f| !f.is_empty()).map(Into::into)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    pub brokers: String,
    pub client_id: String,
    /// Prepended to every topic name and consumer group id (one namespace per
    /// environment or test).
    pub topic_prefix: String,
    pub replication_factor: i32,
    /// `min.insync.replicas` of the topics Herald creates: with `acks=all`, how many
    /// replicas must hold a write before the broker acknowledges it. 0 (the default): 2
    /// when the replication factor is 3 or more, else 1.
    pub min_insync_replicas: i32,
    pub topics: TopicNames,
    pub partitions: TopicPartitions,
    /// Passed through verbatim to librdkafka (SASL, TLS, tuning).
    pub properties: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicNames {
    pub order_events: String,
    pub seller_profiles: String,
    pub deliveries: String,
    pub dead_letter: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicPartitions {
    pub order_events: i32,
    pub seller_profiles: i32,
    pub deliveries: i32,
    pub dead_letter: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    pub group_id: String,
    /// Most messages per poll batch (one PostgreSQL transaction).
    pub batch_max_messages: usize,
    /// How long a batch waits for more messages after its first.
    pub batch_linger_ms: u64,
    /// Most bytes (keys, values and headers) per poll batch; a larger message comes alone.
    pub batch_max_bytes: usize,
    /// librdkafka's queue of fetched messages not yet in a batch, in KiB
    /// (`queued.max.messages.kbytes` of the ingest consumer; it may overshoot by one fetch).
    pub prefetch_max_kbytes: u32,
    /// Larger messages are dead-lettered as `too_large`.
    pub max_message_bytes: usize,
    /// Longest wait between retries of a batch whose database work failed.
    pub retry_backoff_max_ms: u64,
    /// How long an order whose seller has no profile yet is held (`awaiting_profile`)
    /// before its intents are `suppressed` / `no_seller_profile`. 0: suppressed at once.
    pub profile_wait_secs: u64,
}

impl IngestConfig {
    /// The hold of an order whose seller has no profile, if orders are held.
    pub fn profile_wait(&self) -> Option<std::time::Duration> {
        (self.profile_wait_secs > 0).then(|| std::time::Duration::from_secs(self.profile_wait_secs))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Most outbox rows claimed and published per round.
    pub batch_size: i64,
    /// Fallback poll when no LISTEN notification arrives (also picks up rows that become
    /// due later, such as scheduled retries).
    pub poll_interval_ms: u64,
    /// Longest wait between failed rounds.
    pub retry_backoff_max_ms: u64,
    /// How often intents that are due but have no outbox row (a lost delivery message, a
    /// database clock step) are looked for and re-queued.
    pub stranded_check_secs: u64,
    /// How long past due an intent without an outbox row may be before it counts as
    /// stranded. Keep it above the deliveries topic's usual lag: an intent whose message
    /// is only waiting would be queued twice (harmless, but counted).
    pub stranded_grace_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Consumer group on herald.deliveries.
    pub group_id: String,
    /// Provider requests in flight at once in this process. Around them, up to as many
    /// again attempts are being claimed or recorded, so that database round trips overlap
    /// the sends instead of holding a slot.
    pub max_in_flight: usize,
    /// Messages received and not yet completed per partition before it is paused alone,
    /// so that one slow partition cannot hold the whole window. 0 (the default): no limit
    /// of its own, only the process's window (8 x max_in_flight, at least 1,024). Pausing
    /// makes librdkafka drop and re-fetch what it prefetched: keep it above the window's
    /// share of a partition, or it becomes routine and starves the workers.
    pub max_outstanding_per_partition: usize,
    /// Most claims (or records) grouped into one transaction.
    pub db_batch_max: usize,
    /// How long a claim or record batch waits for company. 0 (the default) waits not at
    /// all: under load, batches form from what queued during the transactions in progress.
    pub db_batch_linger_ms: u64,
    /// A claimed intent's lease. A claimed attempt may wait for its channel's rate, then
    /// for a send slot (at most one attempt timeout), then send (one attempt timeout),
    /// with `lease_margin_ms` to spare; each channel claims no more than its rate sends in
    /// what is left (`herald_core::lease`). An attempt whose turn comes too late is
    /// recorded `not_sent`, never sent on an expiring lease.
    pub lease_secs: u64,
    /// Kept free at the end of every lease: the claim's round trip, scheduling, the record.
    pub lease_margin_ms: u64,
    /// How often expired leases (dead workers) are looked for.
    pub sweep_interval_ms: u64,
    /// On revoke and on SIGTERM: the longest wait for in-flight attempts to be recorded.
    pub drain_timeout_ms: u64,
}

/// The AWS clients. Unset values come from the standard chain (AWS_REGION,
/// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, profiles, instance roles).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsConfig {
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    pub connect_timeout_ms: u64,
    /// One attempt = one request: the SDK's retries are off; past this the outcome is
    /// `unknown` (the request may have been received).
    pub attempt_timeout_ms: u64,
    /// Static credentials, for the local stack only; production uses the standard chain.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelsConfig {
    pub email: EmailChannelConfig,
    pub sms: SmsChannelConfig,
}

/// Retry behaviour shared by both channels.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in all, the first included; then a retryable failure is `failed`.
    pub max_attempts: u32,
    pub base_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// "hold" (state unknown until `herald intent resolve`) or "retry".
    pub on_unknown: UnknownPolicy,
    /// Sends per second through this channel (SES MaxSendRate, SNS SMS TPS).
    pub rate_per_second: u32,
}

/// serde documents `deny_unknown_fields` beside `flatten` as unsupported, yet it is what
/// refuses an unknown key here (without it one is silently ignored, even though the
/// flattened [`RetryConfig`] denies unknown fields): `make test` tries one in every table.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailChannelConfig {
    /// Default From address (a verified SES identity).
    pub sender: String,
    /// marketplace_id -> From address.
    pub sender_overrides: BTreeMap<String, String>,
    pub configuration_set: Option<String>,
    #[serde(flatten)]
    pub retry: RetryConfig,
}

/// serde documents `deny_unknown_fields` beside `flatten` as unsupported, yet it is what
/// refuses an unknown key here (without it one is silently ignored, even though the
/// flattened [`RetryConfig`] denies unknown fields): `make test` tries one in every table.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsChannelConfig {
    pub sender_id: Option<String>,
    #[serde(flatten)]
    pub retry: RetryConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenderingConfig {
    pub default_locale: String,
    pub sms_max_segments: u32,
}

/// Retention's three clocks (DESIGN.md, "Retention"). Defaults and their reasons are in
/// `config/herald.example.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Whole monthly partitions of `notification_attempts` whose upper bound is older than
    /// this many months are dropped (older rows of the default partition deleted).
    pub attempt_months: u32,
    /// Rendered subject, bodies and destination of payloads created longer ago are purged
    /// (never while a non-terminal intent references the payload). 0: as soon as every
    /// intent referencing the payload is terminal.
    pub payload_body_days: u32,
    /// Terminal intents created and last updated longer ago are deleted with their rows.
    /// Unset: kept forever.
    pub intent_days: Option<u32>,
    /// The pass inside `herald run` (partition upkeep and the clocks); 0: none (run
    /// `herald retention run` from a scheduler instead).
    pub interval_secs: u64,
    /// Rows per statement (and transaction) of the clocks.
    pub batch_size: i64,
}

/// The `reconcile` role: SES event records (configuration set -> SNS topic -> SQS queue)
/// settle `unknown` e-mail attempts and feed the suppression list (README, "Provider
/// evidence").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileConfig {
    /// The SQS queue subscribed to the configuration set's event topic. Unset: no evidence
    /// is read, and an `unknown` e-mail attempt follows `on_unknown` at once.
    pub queue_url: Option<String>,
    /// How long an `unknown` e-mail attempt waits for an event before the channel's
    /// `on_unknown` policy decides (and records that no evidence came). SES publishes
    /// `Send` within seconds; a `Delivery` may take minutes.
    pub silence_secs: u64,
    /// SQS long polling: how long one receive waits for messages (at most 20).
    pub wait_secs: u64,
    /// Messages per receive (at most 10).
    pub batch: u64,
    /// How long a received message stays invisible to other readers; it must cover one
    /// batch's commit. A crash before the delete: the message comes back after it.
    pub visibility_timeout_secs: u64,
    /// CloudWatch Logs groups of SNS's SMS delivery status (`sns/<region>/<account>/
    /// DirectPublishToPhoneNumber` and its `/Failure`). Empty: SMS status is not read.
    pub sms_status_log_groups: Vec<String>,
    /// Seconds between reads of those groups.
    pub sms_status_poll_secs: u64,
    /// Each read starts this long before the newest record stored (records reach
    /// CloudWatch Logs late; those read twice converge).
    pub sms_status_overlap_secs: u64,
    /// The first read of a group starts this long ago.
    pub sms_status_lookback_secs: u64,
}

/// Maps an event kind to a template and the channels it notifies on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub event_kind: String,
    pub template: String,
    pub channels: Vec<Channel>,
    /// `deliver` (the default) or `observe`: see [`RouteMode`].
    #[serde(default)]
    pub mode: RouteMode,
    /// With `mode = "deliver"`: events that occurred before this instant (their
    /// `occurred_at`) are still frozen `observed`. The switch from an older notifier is then
    /// a property of the event, not of when or by which instance it was processed: a backlog,
    /// a dead-letter replay, a re-emission or an instance not yet restarted decide the same.
    #[serde(default)]
    pub deliver_from: Option<DateTime<Utc>>,
}

impl Route {
    /// Whether an intent of an event that occurred at `occurred_at` is frozen `observed`.
    pub fn observes(&self, occurred_at: DateTime<Utc>) -> bool {
        match self.mode {
            RouteMode::Observe => true,
            RouteMode::Deliver => self.deliver_from.is_some_and(|from| occurred_at < from),
        }
    }
}

/// What a route's intents become once frozen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// Queued for delivery (state `pending`, or `suppressed` without consent).
    #[default]
    Deliver,
    /// The adoption path's first step, while another notifier still sends: converged,
    /// rendered, consent decided and frozen, counted and traced, then `observed` and never
    /// sent. The mode is decided when the intent is created (a held one remembers it):
    /// switching the route to `deliver` affects only intents created afterwards.
    Observe,
}

/// Every default, and the documentation of every key: the example configuration is the
/// first layer of every load, so that a default is written once, where it is explained.
/// Every key of a section is in it (a section's struct has no defaults of its own: a key
/// missing here fails every load, and `make test`); only optional keys and the routes are
/// left out (unset, and none).
pub const DEFAULTS: &str = include_str!("../../../config/herald.example.toml");

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

    /// Checks what serde cannot; each message names its key.
    pub fn validate(&self) -> anyhow::Result<()> {
        let range = |key: &str, v: u64, lo: u64, hi: u64| -> anyhow::Result<()> {
            if v < lo || v > hi {
                bail!("{key} = {v} is out of range: expected {lo}..={hi}");
            }
            Ok(())
        };
        if self.database.url.trim().is_empty() {
            bail!("database.url is empty");
        }
        self.database
            .url
            .parse::<tokio_postgres_config::Config>()
            .map_err(|e| anyhow::anyhow!("database.url is not a valid PostgreSQL URL: {e}"))?;
        range("database.pool_size", self.database.pool_size as u64, 1, 1000)?;
        range(
            "database.connect_timeout_ms",
            self.database.connect_timeout_ms,
            100,
            600_000,
        )?;
        range(
            "database.attempt_partitions_ahead",
            self.database.attempt_partitions_ahead.into(),
            0,
            36,
        )?;
        for (key, listen) in [
            ("admin.listen", &self.admin.listen),
            ("admin.probe_listen", &self.admin.probe_listen),
        ] {
            if !listen.is_empty() {
                listen
                    .parse::<std::net::SocketAddr>()
                    .map_err(|e| anyhow::anyhow!("{key} {listen:?}: {e}"))?;
            }
        }
        if !self.admin.probe_listen.is_empty()
            && self.admin.probe_listen == self.admin.listen
            && !self.admin.listen.ends_with(":0")
        {
            bail!(
                "admin.probe_listen and admin.listen are both {:?}: give each its own",
                self.admin.listen
            );
        }
        let h = &self.http_ingest;
        range(
            "http_ingest.key_retention_hours",
            h.key_retention_hours.into(),
            24,
            24 * 365,
        )?;
        range(
            "http_ingest.in_progress_wait_ms",
            h.in_progress_wait_ms,
            1,
            10_000,
        )?;
        if !h.listen.is_empty() {
            h.listen
                .parse::<std::net::SocketAddr>()
                .map_err(|e| anyhow::anyhow!("http_ingest.listen {:?}: {e}", h.listen))?;
            if h.token.as_deref().is_none_or(str::is_empty)
                && h.token_file.as_deref().is_none_or(str::is_empty)
            {
                bail!(
                    "http_ingest.listen is set but neither http_ingest.token nor http_ingest.token_file is"
                );
            }
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
        if self.kafka.brokers.trim().is_empty() {
            bail!("kafka.brokers is empty");
        }
        for key in self.kafka.properties.keys() {
            if let Some(why) = herald_kafka::client::refused_property(key) {
                bail!("kafka.properties.\"{key}\" cannot be set: {why}");
            }
        }
        range(
            "kafka.replication_factor",
            self.kafka.replication_factor as u64,
            1,
            16,
        )?;
        if self.kafka.min_insync_replicas != 0 {
            range(
                "kafka.min_insync_replicas",
                self.kafka.min_insync_replicas as u64,
                1,
                self.kafka.replication_factor as u64,
            )?;
        }
        for (key, name) in [
            ("kafka.topics.order_events", &self.kafka.topics.order_events),
            ("kafka.topics.seller_profiles", &self.kafka.topics.seller_profiles),
            ("kafka.topics.deliveries", &self.kafka.topics.deliveries),
            ("kafka.topics.dead_letter", &self.kafka.topics.dead_letter),
        ] {
            let full = format!("{}{name}", self.kafka.topic_prefix);
            if full.is_empty()
                || full.len() > 249
                || !full
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            {
                bail!("{key} = {full:?} (with kafka.topic_prefix) is not a valid Kafka topic name");
            }
        }
        for (key, n) in [
            (
                "kafka.partitions.order_events",
                self.kafka.partitions.order_events,
            ),
            (
                "kafka.partitions.seller_profiles",
                self.kafka.partitions.seller_profiles,
            ),
            ("kafka.partitions.deliveries", self.kafka.partitions.deliveries),
            ("kafka.partitions.dead_letter", self.kafka.partitions.dead_letter),
        ] {
            range(key, n as u64, 1, 10_000)?;
        }
        if self.ingest.group_id.trim().is_empty() {
            bail!("ingest.group_id is empty");
        }
        range(
            "ingest.batch_max_messages",
            self.ingest.batch_max_messages as u64,
            1,
            100_000,
        )?;
        range("ingest.batch_linger_ms", self.ingest.batch_linger_ms, 0, 60_000)?;
        range(
            "ingest.batch_max_bytes",
            self.ingest.batch_max_bytes as u64,
            1,
            1 << 30,
        )?;
        // librdkafka's own range for `queued.max.messages.kbytes` is 1..=2097151.
        range(
            "ingest.prefetch_max_kbytes",
            self.ingest.prefetch_max_kbytes.into(),
            64,
            2_097_151,
        )?;
        range(
            "ingest.max_message_bytes",
            self.ingest.max_message_bytes as u64,
            256,
            64 << 20,
        )?;
        range(
            "ingest.retry_backoff_max_ms",
            self.ingest.retry_backoff_max_ms,
            10,
            600_000,
        )?;
        range(
            "ingest.profile_wait_secs",
            self.ingest.profile_wait_secs,
            0,
            7 * 86_400,
        )?;
        range("relay.batch_size", self.relay.batch_size as u64, 1, 10_000)?;
        range("relay.poll_interval_ms", self.relay.poll_interval_ms, 10, 600_000)?;
        range(
            "relay.retry_backoff_max_ms",
            self.relay.retry_backoff_max_ms,
            10,
            600_000,
        )?;
        range(
            "relay.stranded_check_secs",
            self.relay.stranded_check_secs,
            1,
            86_400,
        )?;
        range(
            "relay.stranded_grace_secs",
            self.relay.stranded_grace_secs,
            1,
            7 * 86_400,
        )?;
        let r = &self.retention;
        range("retention.attempt_months", r.attempt_months.into(), 1, 1200)?;
        range(
            "retention.payload_body_days",
            r.payload_body_days.into(),
            0,
            365_000,
        )?;
        if let Some(days) = r.intent_days {
            range("retention.intent_days", days.into(), 1, 365_000)?;
        }
        if r.interval_secs != 0 {
            range("retention.interval_secs", r.interval_secs, 60, 7 * 86_400)?;
        }
        range("retention.batch_size", r.batch_size as u64, 1, 10_000)?;
        let rc = &self.reconcile;
        if rc.queue_url.as_deref().is_some_and(|u| u.trim().is_empty()) {
            bail!("reconcile.queue_url is empty: remove it, or name the SQS queue");
        }
        range("reconcile.silence_secs", rc.silence_secs, 1, 7 * 86_400)?;
        if rc.sms_status_log_groups.iter().any(|g| g.trim().is_empty()) {
            bail!("reconcile.sms_status_log_groups has an empty name");
        }
        range(
            "reconcile.sms_status_poll_secs",
            rc.sms_status_poll_secs,
            1,
            86_400,
        )?;
        range(
            "reconcile.sms_status_overlap_secs",
            rc.sms_status_overlap_secs,
            0,
            7 * 86_400,
        )?;
        range(
            "reconcile.sms_status_lookback_secs",
            rc.sms_status_lookback_secs,
            0,
            30 * 86_400,
        )?;
        range("reconcile.wait_secs", rc.wait_secs, 0, 20)?;
        range("reconcile.batch", rc.batch, 1, 10)?;
        range(
            "reconcile.visibility_timeout_secs",
            rc.visibility_timeout_secs,
            5,
            43_200,
        )?;
        if let Some(role) = &self.database.runtime_role {
            let mut chars = role.chars();
            let valid = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && role.len() <= 63;
            if !valid {
                bail!("database.runtime_role = {role:?} is not a plain role name ([a-z_][a-z0-9_]*, at most 63)");
            }
        }
        let d = &self.delivery;
        if d.group_id.trim().is_empty() {
            bail!("delivery.group_id is empty");
        }
        range("delivery.max_in_flight", d.max_in_flight as u64, 1, 100_000)?;
        range(
            "delivery.max_outstanding_per_partition",
            d.max_outstanding_per_partition as u64,
            0,
            1_000_000,
        )?;
        range("delivery.db_batch_max", d.db_batch_max as u64, 1, 10_000)?;
        range("delivery.db_batch_linger_ms", d.db_batch_linger_ms, 0, 10_000)?;
        range("delivery.sweep_interval_ms", d.sweep_interval_ms, 100, 3_600_000)?;
        range("delivery.drain_timeout_ms", d.drain_timeout_ms, 0, 600_000)?;
        range("aws.connect_timeout_ms", self.aws.connect_timeout_ms, 10, 600_000)?;
        range("aws.attempt_timeout_ms", self.aws.attempt_timeout_ms, 10, 600_000)?;
        range("delivery.lease_secs", d.lease_secs, 1, 86_400)?;
        range("delivery.lease_margin_ms", d.lease_margin_ms, 100, 600_000)?;
        if !is_plausible_email(&self.channels.email.sender) {
            bail!(
                "channels.email.sender = {:?} is not an e-mail address",
                self.channels.email.sender
            );
        }
        for (m, a) in &self.channels.email.sender_overrides {
            if !is_plausible_email(a) {
                bail!("channels.email.sender_overrides.{m} = {a:?} is not an e-mail address");
            }
        }
        for (name, r) in [
            ("channels.email", &self.channels.email.retry),
            ("channels.sms", &self.channels.sms.retry),
        ] {
            range(&format!("{name}.max_attempts"), r.max_attempts.into(), 1, 100)?;
            range(
                &format!("{name}.base_backoff_ms"),
                r.base_backoff_ms,
                1,
                86_400_000,
            )?;
            range(
                &format!("{name}.max_backoff_ms"),
                r.max_backoff_ms,
                r.base_backoff_ms,
                86_400_000,
            )?;
            range(
                &format!("{name}.rate_per_second"),
                r.rate_per_second.into(),
                1,
                100_000,
            )?;
            // Not even one attempt of this channel could wait for its rate, a send slot
            // and its send inside the lease: every attempt would end `not_sent`.
            let budget = self.lease_budget();
            if budget.claim_window(r.rate_per_second) == 0 {
                bail!(
                    "delivery.lease_secs = {} cannot cover a send of {name} at rate_per_second = {}: a lease \
                     must hold one rate interval ({:.0} ms) + 2 x aws.attempt_timeout_ms ({} ms: one waiting \
                     for a send slot, one sending) + delivery.lease_margin_ms ({} ms); raise lease_secs or \
                     lower the timeouts",
                    d.lease_secs,
                    r.rate_per_second,
                    1000.0 / f64::from(r.rate_per_second),
                    self.aws.attempt_timeout_ms,
                    d.lease_margin_ms
                );
            }
        }
        if self.rendering.default_locale.trim().is_empty() {
            bail!("rendering.default_locale is empty");
        }
        range(
            "rendering.sms_max_segments",
            self.rendering.sms_max_segments.into(),
            1,
            10,
        )?;
        let mut kinds = BTreeSet::new();
        for (n, r) in self.routes.iter().enumerate() {
            if r.event_kind.trim().is_empty() {
                bail!("routes[{n}].event_kind is empty");
            }
            if !kinds.insert(r.event_kind.as_str()) {
                bail!("routes[{n}].event_kind = {:?} is routed twice", r.event_kind);
            }
            if r.template.trim().is_empty() {
                bail!("routes[{n}].template is empty");
            }
            if r.channels.is_empty() {
                bail!("routes[{n}].channels is empty");
            }
            if r.channels.iter().collect::<BTreeSet<_>>().len() != r.channels.len() {
                bail!("routes[{n}].channels lists a channel twice");
            }
            if r.mode == RouteMode::Observe && r.deliver_from.is_some() {
                bail!("routes[{n}].deliver_from applies to mode = \"deliver\" only (an observed route sends nothing)");
            }
        }
        Ok(())
    }

    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.kafka.topic_prefix)
    }

    /// The topics Herald's ingest consumes, with the prefix: the only ones a dead-letter
    /// replay writes to.
    pub fn ingest_topics(&self) -> Vec<String> {
        vec![
            self.topic(&self.kafka.topics.order_events),
            self.topic(&self.kafka.topics.seller_profiles),
        ]
    }

    pub fn group(&self, group: &str) -> String {
        format!("{}{group}", self.kafka.topic_prefix)
    }

    /// Each consuming role's group and topics, with the prefix, as JSON (`herald check-config
    /// --consumers`): what the chart's lag-based autoscaling must name.
    pub fn consumers(&self) -> serde_json::Value {
        let t = &self.kafka.topics;
        serde_json::json!({
            "ingest": {
                "group": self.group(&self.ingest.group_id),
                "topics": [self.topic(&t.order_events), self.topic(&t.seller_profiles)],
            },
            "deliver": {
                "group": self.group(&self.delivery.group_id),
                "topics": [self.topic(&t.deliveries)],
            },
        })
    }

    pub fn store(&self) -> StoreConfig {
        StoreConfig {
            url: self.database.url.clone(),
            pool_size: self.database.pool_size,
            connect_timeout: Duration::from_millis(self.database.connect_timeout_ms),
            tls_ca_file: self.tls_ca_file(),
            password_file: non_empty_path(&self.database.password_file),
        }
    }

    /// The schema owner's connection, for migrations: `database.owner_url`, else `url`.
    pub fn owner_store(&self) -> StoreConfig {
        StoreConfig {
            url: self
                .database
                .owner_url
                .clone()
                .unwrap_or_else(|| self.database.url.clone()),
            pool_size: 1,
            connect_timeout: Duration::from_millis(self.database.connect_timeout_ms),
            tls_ca_file: self.tls_ca_file(),
            password_file: match self.database.owner_url {
                Some(_) => non_empty_path(&self.database.owner_password_file),
                None => non_empty_path(&self.database.owner_password_file)
                    .or_else(|| non_empty_path(&self.database.password_file)),
            },
        }
    }

    fn tls_ca_file(&self) -> Option<std::path::PathBuf> {
        non_empty_path(&self.database.tls_ca_file)
    }

    pub fn kafka_settings(&self) -> KafkaSettings {
        KafkaSettings {
            brokers: self.kafka.brokers.clone(),
            client_id: self.kafka.client_id.clone(),
            properties: self.kafka.properties.clone(),
        }
    }

    pub fn topic_specs(&self) -> Vec<TopicSpec> {
        let t = &self.kafka.topics;
        let p = &self.kafka.partitions;
        let rf = self.kafka.replication_factor;
        let min_insync = match self.kafka.min_insync_replicas {
            0 if rf >= 3 => 2,
            0 => 1,
            n => n,
        };
        let spec = |name: &str, partitions: i32, mut config: Vec<(String, String)>| {
            config.push(("min.insync.replicas".into(), min_insync.to_string()));
            TopicSpec {
                name: self.topic(name),
                partitions,
                replication: rf,
                config,
            }
        };
        vec![
            spec(&t.order_events, p.order_events, vec![]),
            spec(
                &t.seller_profiles,
                p.seller_profiles,
                vec![("cleanup.policy".into(), "compact".into())],
            ),
            spec(&t.deliveries, p.deliveries, vec![]),
            spec(&t.dead_letter, p.dead_letter, vec![]),
        ]
    }

    /// What a delivery lease covers (`herald_core::lease`).
    pub fn lease_budget(&self) -> LeaseBudget {
        LeaseBudget {
            lease: Duration::from_secs(self.delivery.lease_secs),
            attempt_timeout: Duration::from_millis(self.aws.attempt_timeout_ms),
            margin: Duration::from_millis(self.delivery.lease_margin_ms),
        }
    }

    /// A channel's retry and rate settings.
    fn channel_retry(&self, channel: Channel) -> &RetryConfig {
        match channel {
            Channel::Email => &self.channels.email.retry,
            Channel::Sms => &self.channels.sms.retry,
        }
    }

    /// The send-rate limit of a channel, per second.
    pub fn rate_per_second(&self, channel: Channel) -> u32 {
        self.channel_retry(channel).rate_per_second
    }

    /// The AWS clients' settings (SES, SNS, SQS).
    pub fn aws_settings(&self) -> herald_channels::AwsSettings {
        let a = &self.aws;
        herald_channels::AwsSettings {
            region: a.region.clone(),
            endpoint_url: a.endpoint_url.clone(),
            connect_timeout: Duration::from_millis(a.connect_timeout_ms),
            attempt_timeout: Duration::from_millis(a.attempt_timeout_ms),
            static_credentials: match (&a.access_key_id, &a.secret_access_key) {
                (Some(id), Some(secret)) => Some(herald_channels::StaticCredentials {
                    access_key_id: id.clone(),
                    secret_access_key: secret.clone(),
                }),
                _ => None,
            },
        }
    }

    pub fn retry_policy(&self, channel: Channel) -> RetryPolicy {
        let r = self.channel_retry(channel);
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

/// tokio-postgres' URL parser, re-exported under a name that says why it is here.
mod tokio_postgres_config {
    pub use herald_store::PgConfig as Config;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(toml: &str) -> anyhow::Result<Config> {
        let c: Config = Figment::from(Toml::string(DEFAULTS))
            .merge(Toml::string(toml))
            .extract()?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn shipped_configs_are_valid() {
        for f in ["herald.example.toml", "local.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config").join(f);
            let text = std::fs::read_to_string(&path).unwrap();
            load_str(&text).unwrap_or_else(|e| panic!("{f}: {e:#}"));
        }
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let e = load_str("[ingest]\nbatch_max_messages = 0").unwrap_err();
        assert!(format!("{e:#}").contains("ingest.batch_max_messages"), "{e:#}");
        let e = load_str("[ingest]\nbatch_max_messages = \"many\"").unwrap_err();
        assert!(format!("{e:#}").contains("batch_max_messages"), "{e:#}");
        let e = load_str("[kafka]\nbrokerz = \"x\"").unwrap_err();
        assert!(format!("{e:#}").contains("brokerz"), "{e:#}");
        let e =
            load_str("[[routes]]\nevent_kind = \"a\"\ntemplate = \"t\"\nchannels = [\"fax\"]").unwrap_err();
        assert!(format!("{e:#}").contains("fax"), "{e:#}");
        let e = load_str("[database]\nurl = \"postgres://h:notaport/db\"").unwrap_err();
        assert!(format!("{e:#}").contains("database.url"), "{e:#}");
    }

    #[test]
    fn a_route_delivers_unless_it_says_observe() {
        let route = |extra: &str| {
            load_str(&format!(
                "[[routes]]\nevent_kind = \"order.created\"\ntemplate = \"t\"\nchannels = [\"email\"]\n{extra}"
            ))
        };
        let c = route("").unwrap();
        assert_eq!(c.route("order.created").unwrap().mode, RouteMode::Deliver);
        let c = route("mode = \"observe\"").unwrap();
        assert_eq!(c.route("order.created").unwrap().mode, RouteMode::Observe);
        let e = route("mode = \"shadow\"").unwrap_err();
        assert!(format!("{e:#}").contains("shadow"), "{e:#}");
        let e = route("mode = \"observe\"\ndeliver_from = \"2026-12-05T10:00:00Z\"").unwrap_err();
        assert!(format!("{e:#}").contains("deliver_from"), "{e:#}");

        // The switch is a property of the event: before deliver_from, observed.
        let c = route("deliver_from = \"2026-12-05T10:00:00Z\"").unwrap();
        let r = c.route("order.created").unwrap();
        let at = |t: &str| t.parse::<DateTime<Utc>>().unwrap();
        assert!(r.observes(at("2026-12-05T09:59:59.999Z")));
        assert!(!r.observes(at("2026-12-05T10:00:00Z")));
        let c = route("mode = \"observe\"").unwrap();
        assert!(c
            .route("order.created")
            .unwrap()
            .observes(at("2030-01-01T00:00:00Z")));
        assert!(!route("")
            .unwrap()
            .route("order.created")
            .unwrap()
            .observes(at("2000-01-01T00:00:00Z")));
    }

    #[test]
    fn properties_that_would_break_the_offset_discipline_are_refused_naming_the_key() {
        for (key, why) in [
            ("auto.offset.reset", "skip"),
            ("enable.auto.offset.store", "durable"),
            ("enable.auto.commit", "durable"),
            ("auto.commit.enable", "durable"),
            ("group.id", "ingest.group_id"),
            ("isolation.level", "aborted"),
            ("enable.idempotence", "duplicate"),
            ("acks", "acks=all"),
            ("request.required.acks", "acks=all"),
        ] {
            let e = load_str(&format!("[kafka.properties]\n\"{key}\" = \"x\"")).unwrap_err();
            let e = format!("{e:#}");
            assert!(e.contains(&format!("kafka.properties.\"{key}\"")), "{key}: {e}");
            assert!(e.contains(why), "{key}: {e}");
        }
        // Case, spaces and librdkafka's `topic.` prefix do not get around it.
        assert!(load_str("[kafka.properties]\n\" Auto.Offset.Reset \" = \"latest\"").is_err());
        assert!(load_str("[kafka.properties]\n\"topic.auto.offset.reset\" = \"latest\"").is_err());
        assert!(load_str("[kafka.properties]\n\"topic.acks\" = \"1\"").is_err());
        // Tuning and security stay settable.
        let c = load_str(
            "[kafka.properties]\n\"security.protocol\" = \"SASL_SSL\"\n\"session.timeout.ms\" = \"6000\"",
        )
        .unwrap();
        assert_eq!(c.kafka.properties.len(), 2);
    }

    #[test]
    fn ingest_memory_bounds_are_validated_naming_the_key() {
        let c = load_str("[ingest]\nbatch_max_bytes = 1048576\nprefetch_max_kbytes = 4096").unwrap();
        assert_eq!(c.ingest.batch_max_bytes, 1 << 20);
        assert_eq!(c.ingest.prefetch_max_kbytes, 4096);
        let defaults = load_str("").unwrap();
        assert_eq!(defaults.ingest.batch_max_bytes, 8 << 20);
        assert_eq!(defaults.ingest.prefetch_max_kbytes, 16 * 1024);
        let e = load_str("[ingest]\nbatch_max_bytes = 0").unwrap_err();
        assert!(format!("{e:#}").contains("ingest.batch_max_bytes"), "{e:#}");
        let e = load_str("[ingest]\nprefetch_max_kbytes = 3000000").unwrap_err();
        assert!(format!("{e:#}").contains("ingest.prefetch_max_kbytes"), "{e:#}");
    }

    #[test]
    fn a_lease_that_cannot_cover_one_send_at_the_rate_is_refused_naming_the_keys() {
        // 15 s lease, 5 s attempts, 3 s margin: 2 s of rate wait. 1/s fits two; fine.
        let ok = "[delivery]\nlease_secs = 15\n[aws]\nattempt_timeout_ms = 5000\n[channels.email]\nrate_per_second = 1";
        assert_eq!(load_str(ok).unwrap().lease_budget().claim_window(1), 2);
        // 13 s: nothing is left for the rate.
        let e = load_str(&ok.replace("lease_secs = 15", "lease_secs = 13")).unwrap_err();
        let e = format!("{e:#}");
        for key in [
            "delivery.lease_secs",
            "channels.email",
            "rate_per_second",
            "aws.attempt_timeout_ms",
            "delivery.lease_margin_ms",
        ] {
            assert!(e.contains(key), "{key} not named in: {e}");
        }
    }

    #[test]
    fn topics_ask_for_two_in_sync_replicas_where_there_are_three() {
        let min_insync = |toml: &str| -> Vec<String> {
            load_str(toml)
                .unwrap()
                .topic_specs()
                .iter()
                .map(|t| {
                    t.config
                        .iter()
                        .find(|(k, _)| k == "min.insync.replicas")
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                })
                .collect()
        };
        assert_eq!(min_insync(""), vec!["2"; 4], "replication factor 3 by default");
        assert_eq!(min_insync("[kafka]\nreplication_factor = 1"), vec!["1"; 4]);
        assert_eq!(
            min_insync("[kafka]\nreplication_factor = 5\nmin_insync_replicas = 3"),
            vec!["3"; 4]
        );
        let e = load_str("[kafka]\nreplication_factor = 1\nmin_insync_replicas = 2").unwrap_err();
        assert!(format!("{e:#}").contains("kafka.min_insync_replicas"), "{e:#}");
    }

    #[test]
    fn http_ingest_is_off_by_default_and_needs_a_token_and_a_day_of_keys() {
        let c = load_str("").unwrap();
        assert!(c.http_ingest.listen.is_empty());
        assert_eq!(c.http_ingest.key_retention(), Duration::from_secs(168 * 3600));
        let on = "[http_ingest]\nlisten = \"127.0.0.1:9465\"\ntoken = \"t\"\n";
        assert_eq!(
            load_str(on)
                .unwrap()
                .http_ingest
                .bearer_token()
                .unwrap()
                .as_deref(),
            Some("t")
        );
        for (toml, key) in [
            ("[http_ingest]\nlisten = \"127.0.0.1:9465\"", "http_ingest.token"),
            ("[http_ingest]\nkey_retention_hours = 23", "http_ingest.key_retention_hours"),
            (
                "[database]\npool_size = 4\n[http_ingest]\nlisten = \"127.0.0.1:9465\"\ntoken = \"t\"\nmax_in_flight = 4",
                "http_ingest.max_in_flight",
            ),
            ("[http_ingest]\nlisten = \"nowhere\"\ntoken = \"t\"", "http_ingest.listen"),
            (
                "[admin]\nlisten = \"127.0.0.1:9465\"\n[http_ingest]\nlisten = \"127.0.0.1:9465\"\ntoken = \"t\"",
                "admin.listen",
            ),
        ] {
            let e = load_str(toml).unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
    }

    #[test]
    fn retention_defaults_keep_intents_and_bad_values_name_their_key() {
        let c = load_str("").unwrap();
        assert_eq!(
            (
                c.retention.attempt_months,
                c.retention.payload_body_days,
                c.retention.intent_days
            ),
            (6, 90, None)
        );
        assert_eq!((c.retention.interval_secs, c.retention.batch_size), (3600, 1000));
        assert_eq!(
            load_str("[retention]\nintent_days = 400")
                .unwrap()
                .retention
                .intent_days,
            Some(400)
        );
        assert_eq!(
            load_str("[retention]\ninterval_secs = 0")
                .unwrap()
                .retention
                .interval_secs,
            0
        );
        for (toml, key) in [
            ("attempt_months = 0", "retention.attempt_months"),
            ("payload_body_days = 365001", "retention.payload_body_days"),
            ("intent_days = 0", "retention.intent_days"),
            ("interval_secs = 5", "retention.interval_secs"),
            ("batch_size = 0", "retention.batch_size"),
            ("batch_size = 1000000", "retention.batch_size"),
        ] {
            let e = load_str(&format!("[retention]\n{toml}")).unwrap_err();
            assert!(format!("{e:#}").contains(key), "{toml}: {e:#}");
        }
    }

    /// Every table of the configuration that has keys of its own (a struct, not a free
    /// map such as `kafka.properties`), as a dotted path.
    fn tables() -> Vec<String> {
        fn walk(prefix: &str, dict: &figment::value::Dict, out: &mut Vec<String>) {
            for (k, v) in dict {
                if let figment::value::Value::Dict(_, d) = v {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    if !d.is_empty() {
                        out.push(path.clone());
                    }
                    walk(&path, d, out);
                }
            }
        }
        let Ok(figment::value::Value::Dict(_, top)) = figment::value::Value::serialize(Config::defaults())
        else {
            unreachable!()
        };
        let mut out = Vec::new();
        walk("", &top, &mut out);
        out
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API returns its own large error
    fn every_table_refuses_unknown_keys_from_the_file_and_the_environment() {
        let tables = tables();
        for t in [
            "log",
            "kafka",
            "kafka.topics",
            "channels.email",
            "channels.sms",
            "reconcile",
        ] {
            assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
        }
        for table in &tables {
            let e = load_str(&format!(
                "[{table}]
zz_unknown_key = 1"
            ))
            .err()
            .unwrap_or_else(|| panic!("[{table}] took an unknown key"));
            assert!(format!("{e:#}").contains("zz_unknown_key"), "[{table}]: {e:#}");
        }
        for table in &tables {
            let var = format!(
                "HERALD_{}__ZZ_UNKNOWN_KEY",
                table.replace('.', "__").to_uppercase()
            );
            figment::Jail::expect_with(|jail| {
                jail.set_env(&var, "1");
                let e = Config::load(Path::new("absent.toml"), false)
                    .err()
                    .unwrap_or_else(|| panic!("{var} was ignored or taken"));
                assert!(format!("{e:#}").contains("zz_unknown_key"), "{var}: {e:#}");
                Ok(())
            });
        }
    }

    #[test]
    fn the_example_is_the_defaults_and_every_table_takes_overrides() {
        let c = Config::defaults();
        assert!(c.routes.is_empty(), "no route by default");
        assert_eq!(c.database.pool_size, 16);
        assert_eq!(c.channels.sms.retry.rate_per_second, 20);
        // The telemetry crate's own defaults (for its callers outside the configuration)
        // are the same values.
        fn json<T: Serialize>(v: &T) -> serde_json::Value {
            serde_json::to_value(v).unwrap()
        }
        assert_eq!(json(&c.log), json(&LogSettings::default()));
        assert_eq!(json(&c.telemetry), json(&OtelSettings::default()));
        let sections = Config::sections();
        let Ok(serde_json::Value::Object(top)) = serde_json::to_value(&c) else {
            unreachable!()
        };
        let mut tables: Vec<&String> = top.keys().filter(|k| *k != "routes").collect();
        tables.sort();
        let mut sections: Vec<&String> = sections.iter().collect();
        sections.sort();
        assert_eq!(sections, tables);
        assert_eq!(sections.len(), 14, "{sections:?}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API returns its own large error
    fn environment_overrides_the_file() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("h.toml", "[ingest]\nbatch_max_messages = 100")?;
            jail.set_env("HERALD_INGEST__BATCH_MAX_MESSAGES", "250");
            jail.set_env("HERALD_RETENTION__INTENT_DAYS", "730");
            jail.set_env("HERALD_BIN", "/not/configuration");
            let c = Config::load(Path::new("h.toml"), true).map_err(|e| e.to_string())?;
            assert_eq!(c.ingest.batch_max_messages, 250);
            assert_eq!(c.retention.intent_days, Some(730));
            Ok(())
        });
    }
}
