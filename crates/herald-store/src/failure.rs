//! Which database errors are worth retrying: decided from the SQLSTATE PostgreSQL sent, or,
//! when it sent none, from whether the connection closed. Never from message text.
//!
//! Permanent means "this data will be refused again": only the classes that describe the
//! data itself (21 cardinality violation, 22 data exception, 23 integrity constraint, 54
//! program limit such as an index row too large). Everything else is the environment (a lost connection, a timeout,
//! a serialization failure, a deadlock, a missing privilege or table, a full disk) and is
//! transient: classing it permanent would dead-letter healthy input during an outage.

use herald_core::ErrorClass;
use tokio_postgres::error::SqlState;

use crate::StoreError;

impl StoreError {
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::Pool(deadpool_postgres::PoolError::Backend(e)) | StoreError::Db(e) => db_class(e),
            StoreError::Pool(_) => ErrorClass::Transient("connection"),
            StoreError::Config(_) | StoreError::Migration(_) => ErrorClass::Transient("database"),
            // The caller's own request, refused for what it asked: the same request is
            // refused again.
            StoreError::RevisionContentMismatch { .. }
            | StoreError::RevisionNotFound { .. }
            | StoreError::IntentNotFound(_)
            | StoreError::NotUnknown { .. }
            | StoreError::ReasonRequired(_) => ErrorClass::Permanent("request_refused"),
            // A stored row this binary cannot read (a template of a channel only a newer
            // version knows, during a rolling upgrade) or a row gone within a transaction:
            // no input of the batch is at fault, so nothing may be dead-lettered for it.
            StoreError::Corrupt(_) => ErrorClass::Transient("unreadable_row"),
            // A statement's own shape, not its input's: a bug to see in the logs.
            StoreError::RowCount(_) => ErrorClass::Transient("client"),
            StoreError::QueryTimeout(_) => ErrorClass::Transient("timeout"),
            // Configuration: retried, and logged, until an operator gives a session URL.
            StoreError::NoSession(_)
            | StoreError::NoDestinationKey
            | StoreError::DestinationKeyChanged { .. } => ErrorClass::Transient("database"),
        }
    }

    /// The SQLSTATE PostgreSQL answered with, if it answered.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            StoreError::Pool(deadpool_postgres::PoolError::Backend(e)) | StoreError::Db(e) => {
                e.code().map(SqlState::code)
            }
            _ => None,
        }
    }
}

fn db_class(e: &tokio_postgres::Error) -> ErrorClass {
    match e.code() {
        Some(code) => sqlstate_class(code.code()),
        // No answer from the server: the connection closed or failed under the request.
        None if e.is_closed() || io_source(e) => ErrorClass::Transient("connection"),
        // Client side, before or after the server: a parameter that would not encode or a
        // column that would not decode; nothing Herald sends is of a kind that cannot
        // encode, so this is a bug to see in the logs, never a reason to drop input.
        None => ErrorClass::Transient("client"),
    }
}

fn io_source(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

/// The class of a SQLSTATE (five characters; the first two name its class).
pub fn sqlstate_class(code: &str) -> ErrorClass {
    match code {
        "40001" => ErrorClass::Transient("serialization"),
        "40P01" => ErrorClass::Transient("deadlock"),
        "55P03" => ErrorClass::Transient("lock_not_available"),
        "57014" => ErrorClass::Transient("timeout"),
        // A write on a standby or a primary fenced read-only: a failover is under way, the
        // pool drops its connections to that node (see `primary`) and the retry meets the
        // new primary.
        crate::primary::READ_ONLY_SQLSTATE => ErrorClass::Transient("not_primary"),
        _ => match code.get(..2) {
            Some("22") => ErrorClass::Permanent("data_exception"),
            Some("23") => ErrorClass::Permanent("constraint_violation"),
            // One statement asked to change a row twice: two inputs of one batch collide.
            Some("21") => ErrorClass::Permanent("cardinality_violation"),
            Some("54") => ErrorClass::Permanent("program_limit"),
            Some("08") => ErrorClass::Transient("connection"),
            Some("53") => ErrorClass::Transient("insufficient_resources"),
            Some("57") => ErrorClass::Transient("server_shutdown"),
            _ => ErrorClass::Transient("database"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_the_server_refuses_is_permanent() {
        // NUL in text (22021) and in jsonb (22P05): the inputs that stalled ingest.
        for code in ["22021", "22P05", "22001", "23505", "23514", "54000"] {
            assert!(!sqlstate_class(code).is_transient(), "{code}");
        }
        assert_eq!(sqlstate_class("22P05").label(), "data_exception");
    }

    #[test]
    fn the_environment_is_transient() {
        for code in [
            "40001", "40P01", "55P03", "57014", "57P01", "08006", "53300", "53100", "42501", "42P01", "XX000",
        ] {
            assert!(sqlstate_class(code).is_transient(), "{code}");
        }
        assert_eq!(sqlstate_class("57014").label(), "timeout");
        assert_eq!(sqlstate_class("25006").label(), "not_primary");
    }

    #[test]
    fn pool_timeouts_are_transient() {
        let e = StoreError::Pool(deadpool_postgres::PoolError::Timeout(
            deadpool_postgres::TimeoutType::Wait,
        ));
        assert_eq!(e.class(), ErrorClass::Transient("connection"));
        assert_eq!(e.sqlstate(), None);
    }
}
