//! Herald's Kafka side: client configuration, the batch consumer, the dead-letter
//! producer, topic administration and header conventions.
//!
//! Offsets are stored here and only here: a caller hands back the positions whose work is
//! durable, and this crate stores them (`enable.auto.offset.store=false`) for librdkafka's
//! auto-commit to pick up. Nothing in this crate knows about PostgreSQL.

pub mod admin;
pub mod client;
pub mod consumer;
pub mod dead_letter;
pub mod deliveries;
pub mod delivery_consumer;
pub mod headers;
pub mod inspect;
pub mod stats;
pub mod tracker;

pub use client::KafkaSettings;
pub use consumer::{BatchConsumer, Position};
pub use dead_letter::{DeadLetter, DeadLetterProducer};
pub use deliveries::{DeliveryMessage, DeliveryPublisher};
pub use stats::LagStats;

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("kafka: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("topic {topic:?}: {detail}")]
    Topic { topic: String, detail: String },
    #[error("cannot start the consumer's poll thread: {0}")]
    PollThread(#[from] std::io::Error),
}

impl KafkaError {
    /// Provisional: a message too large is the input's fault; anything else the
    /// environment's.
    pub fn class(&self) -> herald_core::ErrorClass {
        use rdkafka::types::RDKafkaErrorCode as Code;
        match self {
            KafkaError::Client(e) if matches!(e.rdkafka_error_code(), Some(Code::MessageSizeTooLarge)) => {
                herald_core::ErrorClass::Permanent("message_too_large")
            }
            _ => herald_core::ErrorClass::Transient("kafka"),
        }
    }
}

pub type Result<T, E = KafkaError> = std::result::Result<T, E>;

/// The message type batches are made of, and the trait to read it.
pub use rdkafka::message::{OwnedMessage, Timestamp};
pub use rdkafka::Message;
