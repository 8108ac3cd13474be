//! `[kafka]`: brokers, Herald's four topics (names, partitions, how they are created) and the
//! `[kafka.properties]` pass-through. How the brokers are reached (TLS, SASL) is in
//! `kafka_security`.

use std::collections::BTreeMap;

use anyhow::bail;
use herald_kafka::admin::TopicSpec;
use herald_kafka::security::Security;
use herald_kafka::KafkaSettings;
use serde::{Deserialize, Serialize};

use super::kafka_security::{KafkaSaslConfig, KafkaTlsConfig};
use super::range;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    pub brokers: String,
    pub client_id: String,
    /// plaintext, ssl, sasl_plaintext or sasl_ssl.
    pub security_protocol: String,
    /// The consumer groups' session timeout (`session.timeout.ms`).
    pub consumer_session_timeout_ms: u32,
    pub tls: KafkaTlsConfig,
    pub sasl: KafkaSaslConfig,
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

/// One of Herald's topics, as configured.
pub struct Topic<'a> {
    /// Its key under `kafka.topics` and `kafka.partitions`.
    pub key: &'static str,
    /// Its name, without the prefix.
    pub name: &'a str,
    pub partitions: i32,
    /// Topic configuration it is created with, beside `min.insync.replicas`.
    pub config: &'static [(&'static str, &'static str)],
}

impl KafkaConfig {
    /// Herald's topics: the one list that validation and topic creation read.
    pub fn topics(&self) -> [Topic<'_>; 4] {
        let (t, p) = (&self.topics, &self.partitions);
        [
            Topic {
                key: "order_events",
                name: &t.order_events,
                partitions: p.order_events,
                config: &[],
            },
            Topic {
                key: "seller_profiles",
                name: &t.seller_profiles,
                partitions: p.seller_profiles,
                config: &[("cleanup.policy", "compact")],
            },
            Topic {
                key: "deliveries",
                name: &t.deliveries,
                partitions: p.deliveries,
                config: &[],
            },
            Topic {
                key: "dead_letter",
                name: &t.dead_letter,
                partitions: p.dead_letter,
                config: &[],
            },
        ]
    }

    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if self.brokers.trim().is_empty() {
            bail!("kafka.brokers is empty");
        }
        for key in self.properties.keys() {
            if let Some(why) = herald_kafka::client::refused_property(key) {
                bail!("kafka.properties.\"{key}\" cannot be set: {why}");
            }
        }
        self.validate_security()?;
        // The broker's group.min/max.session.timeout.ms defaults: 6 s to 30 min.
        range(
            "kafka.consumer_session_timeout_ms",
            self.consumer_session_timeout_ms.into(),
            6_000,
            1_800_000,
        )?;
        range("kafka.replication_factor", self.replication_factor as u64, 1, 16)?;
        if self.min_insync_replicas != 0 {
            range(
                "kafka.min_insync_replicas",
                self.min_insync_replicas as u64,
                1,
                self.replication_factor as u64,
            )?;
        }
        for topic in self.topics() {
            let full = self.topic(topic.name);
            if full.is_empty()
                || full.len() > 249
                || !full
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            {
                bail!(
                    "kafka.topics.{} = {full:?} (with kafka.topic_prefix) is not a valid Kafka topic name",
                    topic.key
                );
            }
        }
        for topic in self.topics() {
            range(
                &format!("kafka.partitions.{}", topic.key),
                topic.partitions as u64,
                1,
                10_000,
            )?;
        }
        Ok(())
    }

    /// A topic's name with the prefix.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.topic_prefix)
    }

    /// A consumer group's id with the prefix.
    pub fn group(&self, group: &str) -> String {
        format!("{}{group}", self.topic_prefix)
    }

    /// The clients' settings, with `security` (from [`KafkaConfig::security`]).
    pub fn settings(&self, security: Security) -> KafkaSettings {
        KafkaSettings {
            brokers: self.brokers.clone(),
            client_id: self.client_id.clone(),
            properties: self.properties.clone(),
            security,
            session_timeout_ms: self.consumer_session_timeout_ms,
        }
    }

    /// What `herald topics ensure` creates. `min.insync.replicas`: as configured, else 2
    /// where there are 3 replicas or more, else 1.
    pub fn topic_specs(&self) -> Vec<TopicSpec> {
        let rf = self.replication_factor;
        let min_insync = match self.min_insync_replicas {
            0 if rf >= 3 => 2,
            0 => 1,
            n => n,
        };
        self.topics()
            .into_iter()
            .map(|t| {
                let mut config: Vec<(String, String)> = t
                    .config
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect();
                config.push(("min.insync.replicas".into(), min_insync.to_string()));
                TopicSpec {
                    name: self.topic(t.name),
                    partitions: t.partitions,
                    replication: rf,
                    config,
                }
            })
            .collect()
    }
}
