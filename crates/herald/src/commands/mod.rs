//! One module per subcommand; each takes the validated configuration.

pub mod dead_letter;
pub mod intent;
pub mod lag;
pub mod migrate;
pub mod retention;
pub mod run;
pub mod suppression;
pub mod template;
pub mod topics;

use std::time::Duration;

use herald_kafka::connect::Reachability;
use herald_kafka::KafkaError;

use crate::config::Config;

/// How long a command waits for the cluster's first answer before it goes on anyway (the
/// roles then wait for it) or, for one-shot commands, fails with the client's error.
const KAFKA_CHECK: Duration = Duration::from_secs(10);

/// Whether the cluster answers as configured. A refused password, an untrusted or misnamed
/// certificate, or no OAUTHBEARER token is an error at once, naming the broker and the
/// cause; a cluster that does not answer within [`KAFKA_CHECK`] is logged, and the command
/// goes on (a broker restarting is waited for).
pub async fn check_kafka(config: &Config) -> anyhow::Result<()> {
    let settings = config.kafka_settings();
    let topic = config.topic(&config.kafka.topics.deliveries);
    let checked =
        tokio::task::spawn_blocking(move || herald_kafka::connect::check(&settings, &topic, KAFKA_CHECK))
            .await?;
    match checked {
        Ok(Reachability::Answered) => {
            tracing::info!(brokers = %config.kafka.brokers, protocol = %config.kafka.security_protocol,
                "Kafka answered");
            Ok(())
        }
        Ok(Reachability::NotYet(last)) => {
            let reason = last.map_or_else(|| "no broker answered".to_owned(), |f| f.reason);
            tracing::warn!(brokers = %config.kafka.brokers, reason = %reason, waited_s = KAFKA_CHECK.as_secs(),
                "Kafka does not answer yet; going on, the clients keep trying");
            Ok(())
        }
        Err(e @ KafkaError::Connection(_)) => Err(anyhow::Error::new(e)),
        Err(e) => Err(anyhow::Error::new(e).context("creating the Kafka client of the start-up check")),
    }
}
