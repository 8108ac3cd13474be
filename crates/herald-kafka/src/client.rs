//! librdkafka configuration shared by every client Herald creates. Extra properties from
//! the `[kafka.properties]` table (tuning) are passed through verbatim; security (TLS, SASL)
//! comes from [`Security`] and is set after them.

use std::collections::BTreeMap;

use rdkafka::ClientConfig;

use crate::context::Hooks;
use crate::security::Security;

/// Why a `[kafka.properties]` key is refused, if it is: the settings that make Herald's
/// at-least-once promise and its offset discipline (configuration refuses them at load,
/// naming the key; the clients below set them after the pass-through as well). librdkafka
/// takes a topic property under a `topic.` prefix too, so the prefix is looked through.
pub fn refused_property(key: &str) -> Option<&'static str> {
    let key = key.trim().to_ascii_lowercase();
    let key = key.strip_prefix("topic.").unwrap_or(&key);
    let why = match key {
        "auto.offset.reset" => {
            "a group without a committed offset starts from the earliest message; \
             `latest` would skip everything produced before its first commit"
        }
        "enable.auto.commit" | "auto.commit.enable" | "enable.auto.offset.store" | "offset.store.method" => {
            "Herald stores an offset only once the message's work is durable and lets \
             librdkafka commit the stored offsets; committing what was merely handed out would \
             lose messages in a crash"
        }
        "group.id" => {
            "consumer groups are ingest.group_id and delivery.group_id (with kafka.topic_prefix); \
             one id for every client would merge them"
        }
        "isolation.level" => {
            "consumers read committed messages only; read_uncommitted would process aborted \
             transactions' messages"
        }
        "enable.idempotence" | "acks" | "request.required.acks" => {
            "the producers are idempotent with acks=all: anything less can lose or duplicate a \
             published delivery or dead letter"
        }
        _ => return crate::security::owned_property(key),
    };
    Some(why)
}

#[derive(Debug, Clone)]
pub struct KafkaSettings {
    pub brokers: String,
    pub client_id: String,
    /// Passed through to every client, after Herald's own settings (so they can override
    /// tuning, never the offset discipline: see [`KafkaSettings::consumer`]).
    pub properties: BTreeMap<String, String>,
    /// TLS and SASL, set on every client after the pass-through.
    pub security: Security,
    /// The consumers' group session timeout (`session.timeout.ms`).
    pub session_timeout_ms: u32,
}

/// Kafka's own default group session timeout since 3.0 (KIP-735), and Herald's: a broker
/// that fails or restarts (a rolling upgrade) must not make every consumer whose group
/// coordinator it was leave its group. Measured on the three-node cluster (herald-chaos
/// `controller`): with 10 s, the active controller's SIGKILL made the consumers' sessions
/// time out against a coordinator waiting for the dead broker to be fenced, every partition
/// was revoked and notifications accepted fell from 16/s to 0.1/s for the 19 s of the
/// fault; with 45 s, 16.1/s to 14.8/s. The cost: a consumer that dies without leaving
/// (SIGKILL, a lost node) holds its partitions for this long.
pub const DEFAULT_SESSION_TIMEOUT_MS: u32 = 45_000;

impl KafkaSettings {
    /// Plain TCP to `brokers`, no properties: the local stack's and the tests' clients.
    pub fn plaintext(brokers: &str, client_id: &str) -> Self {
        Self {
            brokers: brokers.to_owned(),
            client_id: client_id.to_owned(),
            properties: BTreeMap::new(),
            security: Security::default(),
            session_timeout_ms: DEFAULT_SESSION_TIMEOUT_MS,
        }
    }

    /// The context parts of a new client: its token source (OAUTHBEARER) and a connection
    /// report of its own. Every client Herald makes is created with them
    /// ([`crate::context::Hooked`]).
    pub fn hooks(&self) -> Hooks {
        Hooks::new(self.security.token_source())
    }

    fn base(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", &self.client_id)
            .set("socket.keepalive.enable", "true");
        c
    }

    /// The `[kafka.properties]` pass-through, applied after a client's tuning so that an
    /// operator can change it (a shorter session timeout for faster failover, say), then
    /// security, which no property changes.
    fn pass_through(&self, c: &mut ClientConfig) {
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        self.security.apply(c);
    }

    /// At-least-once consumer: offsets are stored explicitly after the work is durable and
    /// committed by librdkafka's auto-commit; cooperative-sticky assignment. `tuning`
    /// (property and value) is the consumer's own on top of the shared tuning; both go in
    /// before the `[kafka.properties]` pass-through, so an operator's property always wins.
    pub fn consumer(&self, group_id: &str, tuning: &[(&str, &str)]) -> ClientConfig {
        let mut c = self.base();
        c.set("partition.assignment.strategy", "cooperative-sticky")
            .set("enable.partition.eof", "false")
            .set("session.timeout.ms", self.session_timeout_ms.to_string())
            .set("heartbeat.interval.ms", "1000")
            .set("max.poll.interval.ms", "300000")
            .set("auto.commit.interval.ms", "1000")
            .set("statistics.interval.ms", crate::stats::STATISTICS_INTERVAL_MS);
        for (k, v) in tuning {
            c.set(*k, *v);
        }
        self.pass_through(&mut c);
        // These make the group and the at-least-once promise; they are set last so that no
        // pass-through property can change them.
        c.set("group.id", group_id)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed");
        c
    }

    /// Idempotent producer, acknowledged by all in-sync replicas.
    pub fn producer(&self) -> ClientConfig {
        let mut c = self.base();
        c.set("linger.ms", "5").set("message.timeout.ms", "30000");
        self.pass_through(&mut c);
        // No pass-through property can weaken what the outbox relies on.
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("request.required.acks", "all");
        without_statistics(&mut c);
        c
    }

    /// A consumer that only reads (assigned partitions, never subscribed) and never
    /// commits: operator inspection (`herald lag`, `herald dead-letter list`). With the
    /// group id of a Herald group it can read that group's committed offsets without
    /// joining it.
    pub fn reader(&self, group_id: &str) -> ClientConfig {
        let mut c = self.base();
        c.set("group.id", group_id)
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest");
        self.pass_through(&mut c);
        c.set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed");
        without_statistics(&mut c);
        c
    }

    pub fn admin(&self) -> ClientConfig {
        let mut c = self.base();
        self.pass_through(&mut c);
        without_statistics(&mut c);
        c
    }
}

/// Statistics only for the consumers, whose contexts read them (lag): a client without a
/// reader would log each report whole at INFO (rdkafka's default), every interval, if an
/// operator's `statistics.interval.ms` reached it through the pass-through.
fn without_statistics(c: &mut ClientConfig) {
    c.set("statistics.interval.ms", "0");
}

#[cfg(test)]
mod tests {
    use super::KafkaSettings;

    #[test]
    fn properties_override_tuning_but_never_the_delivery_guarantees() {
        let s = KafkaSettings {
            brokers: "127.0.0.1:19092".into(),
            client_id: "herald-test".into(),
            properties: [
                ("session.timeout.ms", "6000"),
                ("message.timeout.ms", "90000"),
                ("statistics.interval.ms", "1000"),
                // Refused at load (security owns it); were it to get through, security's
                // own setting wins.
                ("security.protocol", "SASL_SSL"),
                ("enable.auto.offset.store", "true"),
                ("isolation.level", "read_uncommitted"),
                ("acks", "1"),
                ("enable.idempotence", "false"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            security: crate::security::Security::default(),
            session_timeout_ms: super::DEFAULT_SESSION_TIMEOUT_MS,
        };
        let consumer = s.consumer("g", &[]);
        assert_eq!(consumer.get("session.timeout.ms"), Some("6000"));
        assert_eq!(consumer.get("security.protocol"), Some("plaintext"));
        assert_eq!(consumer.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(consumer.get("isolation.level"), Some("read_committed"));
        let producer = s.producer();
        assert_eq!(producer.get("message.timeout.ms"), Some("90000"));
        assert_eq!(producer.get("acks"), Some("all"));
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
        assert_eq!(
            (
                consumer.get("statistics.interval.ms"),
                producer.get("statistics.interval.ms"),
                s.admin().get("statistics.interval.ms"),
                s.reader("g").get("statistics.interval.ms"),
            ),
            (Some("1000"), Some("0"), Some("0"), Some("0")),
            "statistics for the consumers only, whose contexts read them"
        );
        assert_eq!(s.admin().get("security.protocol"), Some("plaintext"));
        assert_eq!(s.reader("g").get("isolation.level"), Some("read_committed"));
        let tuned = s.consumer(
            "g",
            &[("session.timeout.ms", "45000"), ("fetch.wait.max.ms", "20")],
        );
        assert_eq!(
            tuned.get("session.timeout.ms"),
            Some("6000"),
            "the operator's property wins"
        );
        assert_eq!(tuned.get("fetch.wait.max.ms"), Some("20"));
        assert_eq!(tuned.get("enable.auto.offset.store"), Some("false"));
    }

    /// Each consumer's own tuning is a default the operator can change; its own setting
    /// without a property is what it documents.
    #[test]
    fn properties_override_each_consumers_tuning() {
        let with = |props: &[(&str, &str)]| KafkaSettings {
            brokers: "127.0.0.1:19092".into(),
            client_id: "herald-test".into(),
            properties: props
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            security: crate::security::Security::default(),
            session_timeout_ms: super::DEFAULT_SESSION_TIMEOUT_MS,
        };
        let operator = with(&[
            ("queued.max.messages.kbytes", "512"),
            ("fetch.queue.backoff.ms", "5"),
        ]);
        let delivery = crate::deliver::client_config(&operator, "g");
        assert_eq!(delivery.get("queued.max.messages.kbytes"), Some("512"));
        let ingest = crate::ingest::client_config(&operator, "g", 4096);
        assert_eq!(ingest.get("fetch.queue.backoff.ms"), Some("5"));
        assert_eq!(
            ingest.get("queued.max.messages.kbytes"),
            Some("4096"),
            "ingest.prefetch_max_kbytes wins"
        );
        let plain = with(&[]);
        let delivery = crate::deliver::client_config(&plain, "g");
        assert_eq!(delivery.get("queued.max.messages.kbytes"), Some("2048"));
        let ingest = crate::ingest::client_config(&plain, "g", 4096);
        assert_eq!(ingest.get("fetch.queue.backoff.ms"), Some("50"));
    }
}
