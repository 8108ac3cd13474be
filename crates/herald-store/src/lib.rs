//! Herald's PostgreSQL store: the connection pool, the migrations runner, and every SQL
//! statement Herald runs. No other crate writes SQL.
//!
//! | stage | modules |
//! |---|---|
//! | ingest | `ingest` (the batch transaction; `ingest::holds`, orders held for a seller profile; `ingest::sellers`) |
//! | HTTP ingest | `http_ingest` (the idempotency key's claim and answer), then `ingest` |
//! | relay | `relay` (the outbox) |
//! | deliver | `delivery` (claim, record, the lease sweep, operators' resolutions) |
//! | reconcile | `reconcile` (provider evidence, the suppression list), `destination` (the list's keyed digests) |
//! | operators and upkeep | `inspect` (the ledger's views), `templates`, `retention`, `partitions`, `migrate` |
//! | every statement | `connection` (how a statement is sent: prepared once per connection, or unnamed behind a transaction pooler), `primary` (connections dropped once their node stops taking writes), `plans` (the hot statements whose plans `integration-tests/tests/plans.rs` checks), `failure` (error classes), `tls` |
//!
//! Each statement names the index it relies on in a comment next to it. Constraint names
//! are mapped to domain errors here (a unique violation on a business key is an outcome,
//! not a failure).

/// SQL: the intent `$alias` is in one of `$states`, for statements that reach intents by
/// another index (the primary key, the payload digest). Written as a CASE so that the
/// planner cannot use the partial index of live intents (notification_intents_state_idx)
/// instead. Its statistics, taken when nearly every intent is terminal, count almost no
/// live ones; with a backlog they have not seen (after an outage) the planner scanned every
/// live intent through that index: to find a claim batch's few (a claim of 24 took 33.6 ms
/// with 100,000 pending intents, 1.7 ms by id), or once per payload in retention's purge.
/// `tests/plans.rs` checks those plans under such statistics.
macro_rules! state_is_one_of {
    ($alias:literal, $($state:literal),+) => {
        concat!("CASE ", $alias, ".state", $(" WHEN '", $state, "' THEN true",)+ " ELSE false END")
    };
}

pub mod connection;
pub mod delivery;
pub mod destination;
pub mod failure;
pub mod http_ingest;
pub mod ingest;
pub mod inspect;
pub mod migrate;
pub mod partitions;
pub mod plans;
pub mod primary;
pub mod reconcile;
pub mod relay;
pub mod retention;
pub mod templates;
pub mod tls;

use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use connection::{Connection, Pooler};
pub(crate) use connection::{Hot, Sql, Transaction};
pub use ingest::{Convergence, IngestTx, NewIntent};
pub use inspect::{IntentFilter, IntentRef};
use primary::PrimaryWatch;
pub use templates::PublishOutcome;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid database url: {0}")]
    Config(String),
    #[error("could not get a database connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("database error: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] refinery::Error),
    #[error(
        "revision {revision:?} of template {template:?} ({channel}, {locale}) is already published \
         with other content; template revisions are immutable, publish a new revision instead"
    )]
    RevisionContentMismatch {
        template: String,
        channel: String,
        locale: String,
        revision: String,
    },
    #[error("template {template:?} ({channel}, {locale}) has no revision {revision:?}")]
    RevisionNotFound {
        template: String,
        channel: String,
        locale: String,
        revision: String,
    },
    /// No intent has this id or business key (its text).
    #[error("no intent for {0}")]
    IntentNotFound(String),
    /// Only an `unknown` intent is resolved by an operator.
    #[error("intent {id} ({named}) is {state}, not unknown: only unknown intents are resolved")]
    NotUnknown {
        id: uuid::Uuid,
        named: String,
        state: String,
    },
    /// An operator's decision is stored with why it was made.
    #[error("{0} is recorded with a reason")]
    ReasonRequired(&'static str),
    /// A stored row this binary cannot read; the text says which and why (for the log,
    /// no caller reads it).
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
    /// A pooled statement or commit unanswered for this long: its connection is closed.
    #[error(
        "the database did not answer within {0:?} (database.query_timeout_ms); the connection is closed"
    )]
    QueryTimeout(Duration),
    /// A statement expected to answer one row (at most one) answered this many.
    #[error("the statement answered {0} rows where one was expected")]
    RowCount(usize),
    /// Work that holds a server session (LISTEN, session advisory locks) and has none: a
    /// transaction pooler is configured without `database.session_url`.
    #[error("{0} needs a database session, and database.pooler = \"transaction\" gives none: set database.session_url to a connection that bypasses the pooler")]
    NoSession(&'static str),
    /// A statement that reads or writes the suppression list, on a store built without its
    /// key.
    #[error("the suppression list's digests need suppression.key, and this store has none")]
    NoDestinationKey,
    /// The configured key is not the one the list was keyed with (`suppression_key`).
    #[error(
        "suppression.key (key id {configured}) is not the key the suppression list is keyed with (key id \
         {recorded}): its entries would match no address, and the destinations they stand for would be sent \
         to again. Configure the key the list was made with"
    )]
    DestinationKeyChanged { configured: String, recorded: String },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Pool settings from the `[database]` section of the configuration.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub url: String,
    pub pool_size: usize,
    pub connect_timeout: Duration,
    /// PEM bundle of the CAs trusted for the server's certificate when the URL says
    /// `sslmode=require`; `None`: the system's roots (see [`tls`]).
    pub tls_ca_file: Option<PathBuf>,
    /// A file holding the password (a mounted secret), used instead of one in the URL.
    pub password_file: Option<PathBuf>,
    /// What sits between Herald and PostgreSQL (see [`connection`]).
    pub pooler: Pooler,
    /// A connection that is a server session of its own (not through a transaction
    /// pooler), for LISTEN and session advisory locks; `None`: `url`'s, unless `pooler`
    /// is `Transaction`, where there is none.
    pub session_url: Option<String>,
    /// Pooled connections older than this are closed, not reused (see [`primary`]).
    pub max_connection_age: Duration,
    /// How long a pooled statement or commit may go unanswered before its connection is
    /// closed and the caller gets a transient error (see [`connection`]).
    pub query_timeout: Duration,
    /// A pooled connection last taken longer ago than this is asked whether its node
    /// still takes writes before it is used (see [`primary`]); Herald uses
    /// [`primary::IDLE_CHECK_AFTER`].
    pub idle_check_after: Duration,
    /// The key of the suppression list's digests (`suppression.key`, see [`destination`]);
    /// `None` only where nothing reads or writes the list (statements that need it fail
    /// with [`StoreError::NoDestinationKey`]).
    pub destination_key: Option<destination::DestinationKey>,
}

/// An intent's stored channel (`notification_intents.channel`, CHECKed in the schema).
pub(crate) fn intent_channel(text: &str) -> Result<herald_core::Channel> {
    stored_channel("notification_intents.channel", text)
}

/// A channel read from `column` (every channel column is CHECKed in the schema).
pub(crate) fn stored_channel(column: &str, text: &str) -> Result<herald_core::Channel> {
    text.parse()
        .map_err(|e| StoreError::Corrupt(format!("{column}: {e}")))
}

/// An intent's stored state (`notification_intents.state`, CHECKed in the schema).
pub(crate) fn intent_state(text: &str) -> Result<herald_core::IntentState> {
    text.parse()
        .map_err(|e| StoreError::Corrupt(format!("notification_intents.state: {e}")))
}

/// A handle on the database: cheap to clone, shared by every task of a role.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    pg_config: tokio_postgres::Config,
    /// Where [`Store::session`] connects; `None`: nowhere (a transaction pooler alone).
    session_config: Option<tokio_postgres::Config>,
    tls: MakeRustlsConnect,
    shared: Arc<connection::Shared>,
}

impl Store {
    /// Builds the pool. No connection is made until the first use.
    pub fn new(config: &StoreConfig) -> Result<Self> {
        let pooled = pg_config(&config.url, config)?;
        let session_config = match (&config.session_url, config.pooler) {
            (Some(url), _) => Some(pg_config(url, config)?),
            (None, Pooler::None) => Some(pooled.clone()),
            (None, Pooler::Transaction) => None,
        };
        let tls = tls::connector(config.tls_ca_file.as_deref())?;
        let primary = Arc::new(PrimaryWatch::new(
            config.max_connection_age,
            config.idle_check_after,
            config.connect_timeout,
        ));
        let manager = Manager::from_config(
            pooled.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .wait_timeout(Some(config.connect_timeout))
            .create_timeout(Some(config.connect_timeout))
            .pre_recycle(primary::hook(primary.clone()))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(e.to_string()))?;
        Ok(Self {
            pool,
            pg_config: pooled,
            session_config,
            shared: Arc::new(connection::Shared::new(
                config.pooler,
                primary,
                config.query_timeout,
                tls.clone(),
                config.destination_key.clone(),
            )),
            tls,
        })
    }

    /// The suppression list's key ([`StoreConfig::destination_key`]).
    pub fn destination_key(&self) -> Result<&destination::DestinationKey> {
        self.shared.destination_key()
    }

    pub fn pg_config(&self) -> &tokio_postgres::Config {
        &self.pg_config
    }

    pub async fn conn(&self) -> Result<Connection> {
        Ok(Connection::new(self.pool.get().await?, self.shared.clone()))
    }

    /// Whether a connection made at `created` may be on a node that no longer takes writes
    /// (see [`primary`]): the outbox listener reconnects then.
    pub fn primary_moved_since(&self, created: std::time::Instant) -> bool {
        self.shared.primary.is_stale(created)
    }

    /// A server session outside the pool, for LISTEN, session advisory locks and session
    /// settings (migrations, partition upkeep, retention): over `database.session_url`,
    /// else `database.url` unless that is a transaction pooler's.
    pub async fn session(&self, purpose: &'static str) -> Result<tokio_postgres::Client> {
        let config = self
            .session_config
            .as_ref()
            .ok_or(StoreError::NoSession(purpose))?;
        let (client, connection) = config.connect(self.tls.clone()).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "database session ended");
            }
        });
        Ok(client)
    }
}

/// `url` parsed, with the settings every connection of the store gets.
fn pg_config(url: &str, config: &StoreConfig) -> Result<tokio_postgres::Config> {
    let mut pg_config: tokio_postgres::Config =
        url.parse().map_err(|e| StoreError::Config(format!("{e}")))?;
    pg_config.connect_timeout(config.connect_timeout);
    // TLS only when asked for (sslmode=require), and then verified (see `tls`): the
    // default `prefer` would otherwise fail against a server that offers TLS with a
    // certificate from a CA nobody configured, where it connected before.
    if pg_config.get_ssl_mode() == tokio_postgres::config::SslMode::Prefer {
        pg_config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    }
    if let Some(path) = &config.password_file {
        // The error names the file, never its content.
        let password = std::fs::read_to_string(path)
            .map_err(|e| StoreError::Config(format!("password file {}: {e}", path.display())))?;
        let password = password.trim_end_matches(['\r', '\n']);
        if password.is_empty() {
            return Err(StoreError::Config(format!(
                "password file {} is empty",
                path.display()
            )));
        }
        pg_config.password(password);
    }
    if pg_config.get_application_name().is_none() {
        pg_config.application_name("herald");
    }
    Ok(pg_config)
}
pub use tokio_postgres::Config as PgConfig;
