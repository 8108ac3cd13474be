//! Topic administration: `herald topics ensure` creates Herald's topics through the Kafka
//! admin API and reports the ones that already exist with another partition count.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::RDKafkaErrorCode;

use crate::connect::{metadata_client, Plain};
use crate::{KafkaError, KafkaSettings, Result};

#[derive(Debug, Clone)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    pub replication: i32,
    /// Topic configs such as `cleanup.policy=compact`.
    pub config: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicStatus {
    Created,
    /// The topic existed; `partitions` is its actual count.
    Exists {
        partitions: i32,
    },
}

/// Creates each topic that does not exist. Existing topics are left unchanged.
pub async fn ensure_topics(
    settings: &KafkaSettings,
    specs: &[TopicSpec],
) -> Result<Vec<(String, TopicStatus)>> {
    let admin = ServedAdmin::create(settings)?;
    let admin = &admin.client;
    let new: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|s| {
            s.config.iter().fold(
                NewTopic::new(&s.name, s.partitions, TopicReplication::Fixed(s.replication)),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics(new.iter(), &opts).await?;
    let mut out = Vec::new();
    for r in results {
        match r {
            Ok(name) => out.push((name, TopicStatus::Created)),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                let md = admin
                    .inner()
                    .fetch_metadata(Some(&name), Duration::from_secs(10))?;
                let partitions = md
                    .topics()
                    .iter()
                    .find(|t| t.name() == name)
                    .map(|t| t.partitions().len() as i32)
                    .unwrap_or(0);
                out.push((name, TopicStatus::Exists { partitions }));
            }
            Err((name, code)) => {
                return Err(KafkaError::Topic {
                    topic: name,
                    detail: format!("could not be created: {code}"),
                })
            }
        }
    }
    Ok(out)
}

/// An admin client whose main queue a thread of its own serves while it lives: its
/// OAUTHBEARER token requests, log lines and errors (rust-rdkafka's `AdminClient` polls only
/// its results; `herald-kafka-ffi`).
struct ServedAdmin {
    client: Arc<AdminClient<Plain>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServedAdmin {
    fn create(settings: &KafkaSettings) -> Result<Self> {
        let client: Arc<AdminClient<Plain>> =
            Arc::new(settings.admin().create_with_context(settings.hooks().wrap(()))?);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (client, stop) = (Arc::clone(&client), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("herald-admin-queue".to_owned())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        herald_kafka_ffi::serve_main_queue(&client, Duration::from_millis(100));
                    }
                })?
        };
        Ok(Self {
            client,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ServedAdmin {
    /// Stops serving within one wait (100 ms) and waits for it: the client is destroyed
    /// only after no thread polls its queue any more.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A long-lived client for readiness checks: can the cluster's metadata be fetched?
pub struct Probe {
    client: BaseProducer<Plain>,
    brokers: String,
}

impl Probe {
    pub fn new(settings: &KafkaSettings) -> Result<Self> {
        Ok(Self {
            client: metadata_client(settings)?,
            brokers: settings.brokers.clone(),
        })
    }

    /// Blocking: fetches the metadata of `topic` within `timeout`; names the broker
    /// error otherwise, with the client's last refused credentials or certificate.
    pub fn check(&self, topic: &str, timeout: Duration) -> Result<()> {
        // Serves its events first: a token due for refresh, errors to record.
        self.client.poll(crate::connect::EVENTS);
        let md = match self.client.client().fetch_metadata(Some(topic), timeout) {
            Ok(md) => {
                self.client.context().hooks.report().answered();
                md
            }
            Err(e) => {
                self.client.poll(crate::connect::EVENTS);
                // Without rustls's second opinion (`Misconfigured::new`): a readiness
                // probe does not open a TLS connection of its own at every check.
                return Err(
                    match self.client.context().hooks.report().last_misconfiguration() {
                        Some(failure) => KafkaError::Connection(crate::connect::Misconfigured {
                            brokers: self.brokers.clone(),
                            failure,
                            diagnosis: None,
                        }),
                        None => e.into(),
                    },
                );
            }
        };
        match md.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() => Ok(()),
            _ => Err(KafkaError::Topic {
                topic: topic.to_owned(),
                detail: "not available in the cluster metadata".into(),
            }),
        }
    }
}
