//! `[database]`: the PostgreSQL connections of `herald run` and of migrations.

use std::time::Duration;

use anyhow::bail;
use herald_store::{PgConfig, Pooler, StoreConfig};
use serde::{Deserialize, Serialize};

use super::range;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// What `herald run` connects as: in production a runtime role that reads and writes
    /// rows and cannot change the schema (see `runtime_role`).
    pub url: String,
    /// The role that owns the schema, for migrations (`herald migrate`, and
    /// `migrate_on_start`). Unset: `url`, one role for everything (development).
    pub owner_url: Option<String>,
    /// After migrating, the owner grants this role what `herald run` needs (SELECT,
    /// INSERT, UPDATE, DELETE on Herald's tables, its sequences) and nothing more.
    pub runtime_role: Option<String>,
    /// PEM bundle of the CAs that signed the server's certificate, for URLs with
    /// `sslmode=require`. Unset: the system's trusted roots. The certificate and its name
    /// are always verified.
    pub tls_ca_file: Option<String>,
    /// A file holding `url`'s password (a mounted secret), instead of the URL.
    pub password_file: Option<String>,
    /// A file holding `owner_url`'s password (or `url`'s, when owner_url is unset).
    pub owner_password_file: Option<String>,
    pub pool_size: usize,
    pub connect_timeout_ms: u64,
    /// What sits between Herald and `url`: `none`, or `transaction` (a transaction-mode
    /// pooler: no statement outlives its message exchange).
    pub pooler: Pooler,
    /// A connection that bypasses the pooler, for what holds a server session: the relay's
    /// LISTEN, and (without `owner_url`) the advisory locks of migrations, partition
    /// upkeep and retention. Unset with a transaction pooler: the relay polls.
    pub session_url: Option<String>,
    /// Pooled connections are closed past this age, so that none stays on a node an
    /// endpoint no longer names (a failover behind DNS) for longer.
    pub max_connection_age_s: u64,
    /// How long a pooled statement or commit may go unanswered: then its connection is
    /// closed (the server may be waiting on something that will not come, as a commit
    /// waits for a synchronous standby that was promoted away) and the batch retried.
    pub query_timeout_ms: u64,
    /// Apply pending migrations when `herald run` starts.
    pub migrate_on_start: bool,
    /// Months of `notification_attempts` partitions created ahead of time.
    pub attempt_partitions_ahead: u32,
}

/// A configured path, unless unset or empty (an empty environment override unsets it).
fn non_empty_path(p: &Option<String>) -> Option<std::path::PathBuf> {
    p.as_deref().filter(|f| !f.is_empty()).map(Into::into)
}

impl DatabaseConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if self.url.trim().is_empty() {
            bail!("database.url is empty");
        }
        self.url
            .parse::<PgConfig>()
            .map_err(|e| anyhow::anyhow!("database.url is not a valid PostgreSQL URL: {e}"))?;
        range("database.pool_size", self.pool_size as u64, 1, 1000)?;
        range(
            "database.connect_timeout_ms",
            self.connect_timeout_ms,
            100,
            600_000,
        )?;
        range(
            "database.max_connection_age_s",
            self.max_connection_age_s,
            10,
            86_400,
        )?;
        range(
            "database.query_timeout_ms",
            self.query_timeout_ms,
            1000,
            3_600_000,
        )?;
        if let Some(url) = &self.session_url {
            url.parse::<PgConfig>()
                .map_err(|e| anyhow::anyhow!("database.session_url is not a valid PostgreSQL URL: {e}"))?;
        }
        if self.pooler == Pooler::Transaction && self.session_url.is_none() && self.owner_url.is_none() {
            bail!(
                "database.pooler = \"transaction\" needs a connection that bypasses the pooler for the advisory \
                 locks of migrations, partition upkeep and retention: set database.session_url (or owner_url)"
            );
        }
        range(
            "database.attempt_partitions_ahead",
            self.attempt_partitions_ahead.into(),
            0,
            36,
        )?;
        if let Some(role) = &self.runtime_role {
            let mut chars = role.chars();
            let valid = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && role.len() <= 63;
            if !valid {
                bail!("database.runtime_role = {role:?} is not a plain role name ([a-z_][a-z0-9_]*, at most 63)");
            }
        }
        Ok(())
    }

    /// `herald run`'s connection.
    pub fn store(&self) -> StoreConfig {
        StoreConfig {
            url: self.url.clone(),
            pool_size: self.pool_size,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            tls_ca_file: non_empty_path(&self.tls_ca_file),
            password_file: non_empty_path(&self.password_file),
            pooler: self.pooler,
            session_url: self.session_url.clone(),
            max_connection_age: Duration::from_secs(self.max_connection_age_s),
            query_timeout: Duration::from_millis(self.query_timeout_ms),
            idle_check_after: herald_store::primary::IDLE_CHECK_AFTER,
            // [suppression]'s, set by `Config::store`.
            destination_key: None,
        }
    }

    /// The schema owner's connection, for migrations: `owner_url` (a direct connection: it
    /// runs DDL and holds advisory locks), else `url` with its pooler and session URL.
    pub fn owner_store(&self) -> StoreConfig {
        StoreConfig {
            url: self.owner_url.clone().unwrap_or_else(|| self.url.clone()),
            pool_size: 1,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            tls_ca_file: non_empty_path(&self.tls_ca_file),
            password_file: match self.owner_url {
                Some(_) => non_empty_path(&self.owner_password_file),
                None => {
                    non_empty_path(&self.owner_password_file).or_else(|| non_empty_path(&self.password_file))
                }
            },
            pooler: match self.owner_url {
                Some(_) => Pooler::None,
                None => self.pooler,
            },
            session_url: match self.owner_url {
                Some(_) => None,
                None => self.session_url.clone(),
            },
            max_connection_age: Duration::from_secs(self.max_connection_age_s),
            query_timeout: Duration::from_millis(self.query_timeout_ms),
            idle_check_after: herald_store::primary::IDLE_CHECK_AFTER,
            // [suppression]'s, set by `Config::store`.
            destination_key: None,
        }
    }
}
