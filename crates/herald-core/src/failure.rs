//! Whether an error is worth retrying. Each library crate says what its own errors are
//! (the store from the SQLSTATE, the Kafka side from librdkafka's code); the daemon's one
//! retry helper (`herald::retrying`) acts on the answer. Nothing here matches on text.

/// What a failed operation tells its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Trying the same thing again later may work: the connection was lost, a timeout, a
    /// serialization failure or deadlock, the broker unavailable. The label is bounded (a
    /// metric label and a log field).
    Transient(&'static str),
    /// Trying the same input again will fail the same way: PostgreSQL or the broker refused
    /// the data itself (a data exception, a constraint, a message too large). Retrying it
    /// stalls everything queued behind it; the input must be isolated instead.
    Permanent(&'static str),
}

impl ErrorClass {
    pub fn is_transient(self) -> bool {
        matches!(self, ErrorClass::Transient(_))
    }

    /// The bounded label: `connection`, `timeout`, `serialization`, `data_exception`, ...
    pub fn label(self) -> &'static str {
        match self {
            ErrorClass::Transient(l) | ErrorClass::Permanent(l) => l,
        }
    }
}
