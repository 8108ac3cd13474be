//! Topic administration: `herald topics ensure` creates Herald's topics through the Kafka
//! admin API and reports the ones that already exist with another partition count.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

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
    let admin: AdminClient<DefaultClientContext> = settings.admin().create()?;
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

/// A long-lived client for readiness checks: can the cluster's metadata be fetched?
pub struct Probe {
    client: rdkafka::producer::BaseProducer,
}

impl Probe {
    pub fn new(settings: &KafkaSettings) -> Result<Self> {
        Ok(Self {
            client: settings.admin().create()?,
        })
    }

    /// Blocking: fetches the metadata of `topic` within `timeout`; names the broker
    /// error otherwise.
    pub fn check(&self, topic: &str, timeout: Duration) -> Result<()> {
        use rdkafka::producer::Producer;
        let md = self.client.client().fetch_metadata(Some(topic), timeout)?;
        match md.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() => Ok(()),
            _ => Err(KafkaError::Topic {
                topic: topic.to_owned(),
                detail: "not available in the cluster metadata".into(),
            }),
        }
    }
}
