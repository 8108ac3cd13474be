//! The daemon's roles, one folder each, in the order a notification meets them:
//!
//! | role | what it does | its adapters |
//! |---|---|---|
//! | [`ingest`] | order events and seller profiles from Kafka to frozen intents and outbox rows, poison to the dead-letter topic | `herald_kafka::ingest`, `herald_kafka::dead_letter`, `herald_store::ingest` |
//! | [`http_ingest`] | the same convergence for `POST /v1/order-events`, answered once per idempotency key | `herald_store::http_ingest`, `herald_store::ingest` |
//! | [`relay`] | outbox rows to `herald.deliveries` | `herald_store::relay`, `herald_kafka::relay`, `herald_kafka::deliveries` |
//! | [`deliver`] | claim, send through SES or SNS, record every attempt, then the offset | `herald_kafka::deliver`, `herald_store::delivery`, `herald_store::reconcile` (the silence sweep), `herald_channels` |
//! | [`reconcile`] | the providers' evidence settles `unknown` attempts and fills the suppression list | `herald_channels::reconcile`, `herald_store::reconcile` |
//!
//! `herald run --roles ...` starts them (`commands/run.rs`); any set may share a process.

pub mod deliver;
pub mod http_ingest;
pub mod ingest;
pub mod reconcile;
pub mod relay;
