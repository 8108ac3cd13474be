//! Herald's domain, without I/O: what an order event and a seller profile are, how a
//! business key and a request fingerprint are computed, the intent states and attempt
//! outcomes, consent, and how a template becomes a frozen payload.
//!
//! Everything here is deterministic and synchronous so that the store, the Kafka side and
//! the tests can agree on one definition of each decision. This crate must not talk to
//! PostgreSQL, Kafka or a provider.

pub mod channel;
pub mod consent;
pub mod destination;
pub mod digest;
pub mod event;
pub mod failure;
pub mod keys;
pub mod lease;
pub mod payload;
pub mod render;
pub mod resolution;
pub mod retry;
pub mod seller;
pub mod state;

pub use channel::Channel;
pub use consent::ConsentDecision;
pub use event::{DecodeError, OrderEvent};
pub use failure::ErrorClass;
pub use keys::{BusinessKey, Fingerprint, IdempotencyKey};
pub use payload::Payload;
pub use resolution::Resolution;
pub use seller::{SellerProfile, SellerRecord};
pub use state::{AttemptOutcome, IntentState, NotSentReason};
