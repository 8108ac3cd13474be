//! `[listeners]`: how each HTTP listener (HTTP ingest, admin, probes) treats connections,
//! whoever opens them (`listener.rs`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::range;
use crate::listener::Limits;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenersConfig {
    /// A request's headers must arrive within this (ms), or the connection is closed.
    pub header_read_timeout_ms: u64,
    /// A connection that moves no byte this long (s) is closed, unless Herald is working
    /// on a request whose body has all arrived.
    pub idle_timeout_secs: u64,
    /// Connections open at once on `http_ingest.listen`; one more is closed when accepted.
    pub http_ingest_max_connections: u64,
    /// The same for `admin.listen`.
    pub admin_max_connections: u64,
    /// The same for `admin.probe_listen`.
    pub probe_max_connections: u64,
}

impl ListenersConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        range(
            "listeners.header_read_timeout_ms",
            self.header_read_timeout_ms,
            100,
            300_000,
        )?;
        range("listeners.idle_timeout_secs", self.idle_timeout_secs, 1, 3_600)?;
        for (key, v) in [
            (
                "listeners.http_ingest_max_connections",
                self.http_ingest_max_connections,
            ),
            ("listeners.admin_max_connections", self.admin_max_connections),
            ("listeners.probe_max_connections", self.probe_max_connections),
        ] {
            range(key, v, 1, 100_000)?;
        }
        Ok(())
    }

    fn limits(&self, max_connections: u64) -> Limits {
        Limits {
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
        }
    }

    pub fn http_ingest(&self) -> Limits {
        self.limits(self.http_ingest_max_connections)
    }

    pub fn admin(&self) -> Limits {
        self.limits(self.admin_max_connections)
    }

    pub fn probe(&self) -> Limits {
        self.limits(self.probe_max_connections)
    }
}
