//! Herald's Kafka side, by stage:
//!
//! | stage | modules |
//! |---|---|
//! | every client | `client` (librdkafka settings, `[kafka.properties]`), `security` (TLS and SASL), `context` (the one client context: tokens, statistics, connection failures), `token` (OAUTHBEARER sources; AWS MSK IAM in `msk_iam`), `connect` (the start-up check, metadata-only clients), `producer` (each send awaited until acknowledged), `headers`, `stats` (lag from librdkafka's statistics) |
//! | ingest | `ingest` (poll batches, offsets stored once the batch is durable), `undecodable` (a record batch librdkafka cannot decode: found, for the caller to dead-letter and skip), `dead_letter` (poison to `herald.dead-letter`) |
//! | relay | `relay` (the publisher of `herald.deliveries`), `deliveries` (its wire form) |
//! | deliver | `deliver` (many attempts in flight, an outstanding window, revocations that wait; `deliver::tracker`, the contiguous completed prefix per partition), `deliveries` (decoding) |
//! | operators | `admin` (`herald topics ensure`), `inspect` (`herald lag`, `herald dead-letter list\|replay`) |
//!
//! Offsets are stored here and only here: a caller hands back the positions whose work is
//! durable, and this crate stores them (`enable.auto.offset.store=false`) for librdkafka's
//! auto-commit to pick up. Nothing in this crate knows about PostgreSQL.

pub mod admin;
pub mod client;
pub mod connect;
pub mod context;
pub mod dead_letter;
pub mod deliver;
pub mod deliveries;
pub mod headers;
pub mod ingest;
pub mod inspect;
pub mod msk_iam;
pub mod producer;
pub mod relay;
pub mod security;
pub mod stats;
pub mod tls_diagnosis;
pub mod token;
pub mod undecodable;

pub use client::KafkaSettings;
pub use dead_letter::{DeadLetter, DeadLetterProducer};
pub use deliveries::DeliveryMessage;
pub use ingest::{BatchConsumer, Position};
pub use relay::DeliveryPublisher;
pub use stats::LagStats;

use herald_core::ErrorClass;
use rdkafka::types::RDKafkaErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("kafka: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("topic {topic:?}: {detail}")]
    Topic { topic: String, detail: String },
    #[error("cannot start a client thread (the delivery consumer's poll thread, a producer's delivery thread): {0}")]
    PollThread(#[from] std::io::Error),
    /// The cluster refused the credentials or the certificate, or no token came.
    #[error(transparent)]
    Connection(#[from] connect::Misconfigured),
}

pub type Result<T, E = KafkaError> = std::result::Result<T, E>;

impl KafkaError {
    /// Whether the same input would be refused again ([`ErrorClass::Permanent`]: isolate
    /// it) or the environment failed ([`ErrorClass::Transient`]: try again later, with
    /// backoff). Decided from librdkafka's typed code, never from the message text.
    ///
    /// Only what the broker or the client refuses *about the record itself* is permanent:
    /// its size, its framing, its content. Authorization, authentication and configuration
    /// errors are transient here: an operator fixes them, and the same input then goes
    /// through; dead-lettering every message meanwhile would be the wrong cure.
    pub fn class(&self) -> ErrorClass {
        match self {
            KafkaError::Client(e) => match e.rdkafka_error_code() {
                Some(code) => class_of_code(code),
                None => class_of_codeless(e),
            },
            // Missing or broken topic metadata: the deployment, not the input.
            KafkaError::Topic { .. } => ErrorClass::Transient("topic_metadata"),
            KafkaError::PollThread(_) => ErrorClass::Transient("poll_thread"),
            // An operator fixes it; the same input then goes through.
            KafkaError::Connection(_) => ErrorClass::Transient("authentication"),
        }
    }
}

/// The class of one of librdkafka's codes (local ones are negative, broker ones positive).
fn class_of_code(code: RDKafkaErrorCode) -> ErrorClass {
    use ErrorClass::{Permanent, Transient};
    use RDKafkaErrorCode as C;
    match code {
        // The record is over the client's `message.max.bytes` or the topic's
        // `max.message.bytes` (the client and the broker both answer code 10), or its
        // batch is over the broker's limit (18): the same record is refused again.
        C::MessageSizeTooLarge | C::MessageBatchTooLarge => Permanent("message_too_large"),
        // Corrupt or malformed: CRC mismatch, a negative size, bad framing or compression.
        C::InvalidMessage | C::InvalidMessageSize | C::BadMessage | C::BadCompression => {
            Permanent("invalid_message")
        }
        // The broker's record validation (a keyless record on a compacted topic, ...).
        C::InvalidRecord | C::InvalidTimestamp | C::UnsupportedForMessageFormat => {
            Permanent("invalid_record")
        }
        C::KeySerialization | C::ValueSerialization | C::KeyDeserialization | C::ValueDeserialization => {
            Permanent("serialization")
        }

        C::AllBrokersDown
        | C::BrokerTransportFailure
        | C::BrokerNotAvailable
        | C::NetworkException
        | C::Resolve
        | C::DestroyBroker
        | C::BrokerDestroy => Transient("broker_unavailable"),
        C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::ReplicaNotAvailable
        | C::PreferredLeaderNotAvailable
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::KafkaStorageError => Transient("not_leader"),
        C::NotEnoughReplicas | C::NotEnoughReplicasAfterAppend | C::ISRInsufficient => {
            Transient("not_enough_replicas")
        }
        C::MessageTimedOut | C::RequestTimedOut | C::OperationTimedOut | C::TimedOutQueue => {
            Transient("timeout")
        }
        C::QueueFull => Transient("queue_full"),
        C::ThrottlingQuotaExceeded => Transient("throttled"),
        C::CoordinatorLoadInProgress
        | C::CoordinatorNotAvailable
        | C::NotCoordinator
        | C::WaitingForCoordinator => Transient("coordinator_unavailable"),
        C::RebalanceInProgress
        | C::IllegalGeneration
        | C::UnknownMemberId
        | C::AssignmentLost
        | C::FencedMemberEpoch
        | C::StaleMemberEpoch
        | C::State => Transient("rebalance"),
        C::UnknownTopic | C::UnknownTopicOrPartition | C::UnknownPartition | C::UnknownTopicId => {
            Transient("unknown_topic")
        }
        C::TopicAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::DelegationTokenAuthorizationFailed => Transient("authorization"),
        C::Authentication
        | C::SaslAuthenticationFailed
        | C::UnsupportedSASLMechanism
        | C::IllegalSASLState
        | C::SSL => Transient("authentication"),
        C::InvalidArgument
        | C::InvalidConfig
        | C::InvalidRequiredAcks
        | C::InvalidTopic
        | C::PolicyViolation
        | C::UnsupportedFeature
        | C::UnsupportedVersion
        | C::UnsupportedCompressionType
        | C::NotConfigured
        | C::NotImplemented => Transient("config"),
        // The idempotent producer's fatal state: the input is not at fault, and the send
        // that met it replaced the client (`producer`), so a retry goes through a new one.
        C::Fatal | C::Fenced | C::ProducerFenced | C::OutOfOrderSequenceNumber => Transient("producer_fatal"),
        // Records a client threw away unsent: what a client in the fatal state does with
        // its queue (and a client being destroyed with its own).
        C::PurgeQueue | C::PurgeInflight => Transient("purged"),
        _ => Transient("other"),
    }
}

/// The class of a client error that carries no librdkafka code.
fn class_of_codeless(e: &rdkafka::error::KafkaError) -> ErrorClass {
    use rdkafka::error::KafkaError as E;
    match e {
        E::Canceled => ErrorClass::Transient("client_closed"),
        E::ClientConfig(..) | E::ClientCreation(_) | E::Nul(_) | E::AdminOpCreation(_) => {
            ErrorClass::Transient("config")
        }
        _ => ErrorClass::Transient("other"),
    }
}

/// The message type batches are made of, and the trait to read it.
pub use rdkafka::message::{OwnedMessage, Timestamp};
pub use rdkafka::Message;

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::KafkaError as Rd;
    use RDKafkaErrorCode as C;

    fn produce(code: C) -> KafkaError {
        KafkaError::Client(Rd::MessageProduction(code))
    }

    #[test]
    fn a_refused_record_is_permanent_and_the_environment_is_transient() {
        for (code, label) in [
            (C::MessageSizeTooLarge, "message_too_large"),
            (C::MessageBatchTooLarge, "message_too_large"),
            (C::InvalidMessageSize, "invalid_message"),
            (C::InvalidMessage, "invalid_message"),
            (C::InvalidRecord, "invalid_record"),
        ] {
            assert_eq!(produce(code).class(), ErrorClass::Permanent(label), "{code:?}");
        }
        for (code, label) in [
            (C::AllBrokersDown, "broker_unavailable"),
            (C::BrokerTransportFailure, "broker_unavailable"),
            (C::MessageTimedOut, "timeout"),
            (C::RequestTimedOut, "timeout"),
            (C::NotLeaderForPartition, "not_leader"),
            (C::QueueFull, "queue_full"),
            (C::NotEnoughReplicas, "not_enough_replicas"),
            (C::CoordinatorNotAvailable, "coordinator_unavailable"),
            (C::TopicAuthorizationFailed, "authorization"),
            (C::SaslAuthenticationFailed, "authentication"),
            (C::InvalidConfig, "config"),
            (C::UnknownTopicOrPartition, "unknown_topic"),
            (C::Fatal, "producer_fatal"),
            (C::PurgeQueue, "purged"),
            (C::OffsetOutOfRange, "other"),
        ] {
            assert_eq!(produce(code).class(), ErrorClass::Transient(label), "{code:?}");
        }
        // The code decides, whatever operation reported it.
        assert_eq!(
            KafkaError::Client(Rd::MessageConsumption(C::MessageSizeTooLarge)).class(),
            ErrorClass::Permanent("message_too_large")
        );
        assert_eq!(
            KafkaError::Client(Rd::ConsumerCommit(C::CoordinatorLoadInProgress)).class(),
            ErrorClass::Transient("coordinator_unavailable")
        );
        assert_eq!(
            KafkaError::Client(Rd::Canceled).class(),
            ErrorClass::Transient("client_closed")
        );
        assert_eq!(
            KafkaError::Topic {
                topic: "t".into(),
                detail: "not in the cluster metadata".into()
            }
            .class(),
            ErrorClass::Transient("topic_metadata")
        );
    }

    #[test]
    fn labels_are_bounded_snake_case() {
        // Every code librdkafka 2.12 defines, through every label this mapping can give.
        for raw in -200..=130 {
            let Ok(resp) = rdkafka::types::RDKafkaRespErr::try_from(raw) else {
                continue;
            };
            let code = C::from(resp);
            let label = produce(code).class().label();
            assert!(
                !label.is_empty()
                    && label.len() <= 32
                    && label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{code:?}: {label:?}"
            );
        }
    }
}
