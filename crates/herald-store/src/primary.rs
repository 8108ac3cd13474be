//! Keeping the pool on the primary. A failover or a switchover leaves connections on a node
//! that no longer takes writes: the old primary, stopped (its connections close, and the
//! pool drops closed ones), or fenced read-only while clients stay connected, or reached
//! again through a stale DNS name. New connections find the primary through the URL
//! (`host=a,b` with `target_session_attrs=read-write`: tokio-postgres asks each host in
//! turn and skips one whose sessions are read-only). Existing ones are dropped here:
//!
//! - an answer that says "this node takes no writes" (SQLSTATE 25006,
//!   `read_only_sql_transaction`) on a connection made after the last such answer marks
//!   every connection made before it as stale: they were made when that node looked like
//!   the primary, and each is dropped when next taken from the pool, not used again;
//! - a connection last taken more than `idle_check_after` ago (2 s in Herald) is asked,
//!   when taken, whether its session is read-only (one round trip, bounded by the connect
//!   timeout; a connection in steady use is not asked, its next write answers instead);
//! - every connection is dropped past `database.max_connection_age`, so that none outlives
//!   an endpoint change by more than that.
//!
//! What the failing statement's caller sees is a transient error (`not_primary`): its batch
//! is retried, on a connection made after the mark, to the new primary.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_postgres::ClientWrapper;

/// A connection last taken longer ago than this is asked whether it is still on a writable
/// node before it is used again. Below it, connections are in steady use and their next
/// write tells.
pub const IDLE_CHECK_AFTER: Duration = Duration::from_secs(2);

/// The SQLSTATE of a write refused because the session is read-only: a standby, or a
/// primary fenced with `default_transaction_read_only`.
pub const READ_ONLY_SQLSTATE: &str = "25006";

/// What the pool knows about where the primary is. One per [`crate::Store`].
#[derive(Debug)]
pub struct PrimaryWatch {
    max_age: Duration,
    idle_check_after: Duration,
    /// How long the idle check may wait for its answer: a node gone without a reset (a
    /// lost host, a partition) would otherwise hold `Store::conn` for the kernel's TCP
    /// retransmission time.
    check_timeout: Duration,
    /// When a connection last answered that its node takes no writes.
    lost_at: Mutex<Option<Instant>>,
}

impl PrimaryWatch {
    pub fn new(max_age: Duration, idle_check_after: Duration, check_timeout: Duration) -> Self {
        Self {
            max_age,
            idle_check_after,
            check_timeout,
            lost_at: Mutex::new(None),
        }
    }

    /// Notes an error from a connection made at `created`: if it says the node is no longer
    /// the primary, every connection made up to now is stale. A connection already stale
    /// (in use when the mark was set) moves nothing: the connections made since are to the
    /// node that is primary now.
    pub fn saw(&self, e: &tokio_postgres::Error, created: Instant) {
        if e.code().map(|c| c.code()) == Some(READ_ONLY_SQLSTATE) && !self.is_stale(created) {
            self.lost(e);
        }
    }

    fn lost(&self, why: &dyn std::fmt::Display) {
        let mut lost_at = self.lost_at.lock().expect("primary watch lock");
        let first = lost_at.is_none_or(|at| at.elapsed() > Duration::from_secs(1));
        *lost_at = Some(Instant::now());
        if first {
            tracing::warn!(
                error = %why,
                "the database answered that it takes no writes: dropping the pool's connections to it; \
                 new ones go to the host that is primary now"
            );
        }
    }

    /// Whether a connection made at `created` was made before the last sign that the
    /// primary moved.
    pub fn is_stale(&self, created: Instant) -> bool {
        self.lost_at
            .lock()
            .expect("primary watch lock")
            .is_some_and(|at| created <= at)
    }

    /// Whether the pool may hand out this connection again (deadpool's `pre_recycle`).
    async fn keeps(
        &self,
        client: &ClientWrapper,
        metrics: &deadpool_postgres::Metrics,
    ) -> Result<(), String> {
        if self.is_stale(metrics.created) {
            return Err("made before its node stopped taking writes".into());
        }
        if metrics.age() > self.max_age {
            return Err(format!(
                "older than database.max_connection_age ({:?})",
                self.max_age
            ));
        }
        if metrics.last_used() < self.idle_check_after {
            return Ok(());
        }
        // One round trip, on a connection that sat idle: a fenced primary's reload or a
        // promotion elsewhere shows here before a write fails on it. Through a pooler it
        // asks the server the pooler uses now, which is the one the next statement meets.
        let asked = tokio::time::timeout(
            self.check_timeout,
            client.simple_query("SHOW transaction_read_only"),
        );
        match asked
            .await
            .map_err(|_| format!("the idle check had no answer within {:?}", self.check_timeout))?
        {
            Ok(messages) => {
                let read_only = messages.iter().any(
                    |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("on")),
                );
                if read_only {
                    self.lost(&"an idle connection's session is read-only");
                    return Err("its session is read-only".into());
                }
                Ok(())
            }
            Err(e) => Err(format!("the idle check failed: {e}")),
        }
    }
}

/// The pool's `pre_recycle` hook: drops a connection [`PrimaryWatch::keeps`] refuses.
pub fn hook(watch: std::sync::Arc<PrimaryWatch>) -> deadpool_postgres::Hook {
    deadpool_postgres::Hook::async_fn(move |client, metrics| {
        let watch = watch.clone();
        Box::pin(async move {
            watch
                .keeps(client, metrics)
                .await
                .map_err(|why| deadpool_postgres::HookError::Message(why.into()))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_makes_every_earlier_connection_stale_and_no_later_one() {
        let watch = PrimaryWatch::new(Duration::from_secs(60), IDLE_CHECK_AFTER, Duration::from_secs(5));
        let before = Instant::now();
        assert!(!watch.is_stale(before), "no mark yet");
        watch.lost(&"test");
        let after = Instant::now();
        assert!(watch.is_stale(before));
        assert!(!watch.is_stale(after + Duration::from_millis(1)));
    }
}
