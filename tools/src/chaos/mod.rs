//! `make chaos`: scenarios over the real local stack and several real `herald` processes.
//! Each injects one class of fault while orders flow, lets the run settle, then checks the
//! invariants of [`invariants`] by reading PostgreSQL, what the provider fake received and
//! the committed offsets, and prints one line of figures. Every scenario is bounded in
//! events and time and stops by itself; a violated invariant names the intents involved.
//!
//! The scenarios stop and start the stack's broker and database: run them alone, not next
//! to other tests.

pub mod cluster;
pub mod faults;
pub mod fleet;
pub mod hostile;
pub mod invariants;
pub mod plan;
pub mod postgres;
pub mod rng;
pub mod scenarios;
pub mod watch;

/// The short version runs in `make test`; the long one in `make chaos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Short,
    Long,
}

impl Scale {
    pub fn pick<T>(self, short: T, long: T) -> T {
        match self {
            Scale::Short => short,
            Scale::Long => long,
        }
    }
}
