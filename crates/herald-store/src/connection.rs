//! How every pooled statement reaches PostgreSQL: the one place that decides whether a
//! statement may be prepared once per connection, and that hands each error to the
//! [`PrimaryWatch`](crate::primary::PrimaryWatch).
//!
//! Two ways to run a statement, by `database.pooler`:
//!
//! - `none` (the default; a direct connection, or a pooler in session mode): the hot
//!   statements (given as [`Hot`]) are prepared once per connection
//!   and reused; the others are prepared, run and closed on each call, so that PostgreSQL
//!   plans them for their values.
//! - `transaction` (PgBouncer in transaction mode, RDS Proxy): consecutive message
//!   exchanges of one client may reach different server connections, so no named statement
//!   may outlive its exchange. Every statement is sent as the unnamed statement with its
//!   parameters' types, parsed, bound and run in one exchange (`query_typed`), and planned
//!   for its values every time. The types are PostgreSQL's own for that text: learned once
//!   per text from a statement prepared and closed inside a transaction (which a
//!   transaction pooler keeps on one server connection), and kept for the process.
//!   tokio-postgres names one statement of its own: the lookup of a type it does not know
//!   (an enum, a domain, an extension's type), cached per connection. Herald's schema uses
//!   built-in types only; a column or parameter of another type would break this mode on
//!   its first use, and must not be added without a way around that lookup.
//!
//! Every pooled statement and commit is bounded by `database.query_timeout_ms`: past it the
//! server is asked to cancel it and the connection is closed, never pooled again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::time::Instant;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{CancelToken, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::destination::DestinationKey;
use crate::primary::PrimaryWatch;
use crate::{Result, StoreError};

/// `database.pooler`: what sits between Herald and PostgreSQL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooler {
    /// Nothing, or a pooler in session mode: a connection is one server session.
    #[default]
    None,
    /// A pooler in transaction mode: a server session only for the length of a transaction.
    Transaction,
}

/// What every connection of one [`crate::Store`] shares.
pub(crate) struct Shared {
    pub(crate) pooler: Pooler,
    pub(crate) primary: Arc<PrimaryWatch>,
    /// How long a pooled statement (or a commit) may go unanswered (`database.query_timeout_ms`).
    query_timeout: Duration,
    /// For the cancel requests of statements past the query timeout.
    tls: MakeRustlsConnect,
    /// Parameter types by statement text, for `Pooler::Transaction`.
    described: Mutex<HashMap<String, Arc<[Type]>>>,
    /// The suppression list's key (`StoreConfig::destination_key`).
    destination_key: Option<DestinationKey>,
}

impl Shared {
    pub(crate) fn new(
        pooler: Pooler,
        primary: Arc<PrimaryWatch>,
        query_timeout: Duration,
        tls: MakeRustlsConnect,
        destination_key: Option<DestinationKey>,
    ) -> Self {
        Self {
            pooler,
            primary,
            query_timeout,
            tls,
            described: Mutex::new(HashMap::new()),
            destination_key,
        }
    }

    pub(crate) fn destination_key(&self) -> Result<&DestinationKey> {
        self.destination_key.as_ref().ok_or(StoreError::NoDestinationKey)
    }
}

/// A pooled connection. Only statements through [`Sql`] reach it.
pub struct Connection {
    /// `None` only while it is dropped.
    client: Option<deadpool_postgres::Object>,
    shared: Arc<Shared>,
    /// When the pool made it (for the primary watch).
    created: Instant,
    /// To ask the server to stop a statement past the query timeout.
    cancel: CancelToken,
    /// A statement went unanswered past the query timeout, or the connection may be inside
    /// a transaction nobody will end: anything sent next would queue behind the statement
    /// or run inside that transaction. Closed when dropped, never pooled again.
    broken: AtomicBool,
}

/// A transaction on a pooled connection: rolled back if dropped before [`Self::commit`].
pub(crate) struct Transaction<'a> {
    tx: deadpool_postgres::Transaction<'a>,
    lease: Lease<'a>,
}

/// What a statement on a pooled connection answers to: the store's shared state, and the
/// connection's `broken` flag.
#[derive(Clone, Copy)]
pub(crate) struct Lease<'c> {
    shared: &'c Shared,
    broken: &'c AtomicBool,
    created: Instant,
    cancel: &'c CancelToken,
}

impl Lease<'_> {
    /// The store's error for `e`, noted by the primary watch.
    fn seen(self, e: tokio_postgres::Error) -> StoreError {
        self.shared.primary.saw(&e, self.created);
        StoreError::Db(e)
    }

    /// `work`, or a timeout error once it has gone unanswered for the query timeout; the
    /// server is then asked to cancel it (a backend waiting for a synchronous standby, or
    /// for a lock, would otherwise hold its transaction's locks and a connection slot after
    /// the client left), and the connection is broken (closed when dropped). The server may
    /// have done the work (a commit whose answer never came; a cancelled wait for a standby
    /// leaves the commit done locally): every caller's retry converges either way, as after
    /// any lost answer.
    async fn bounded<T>(self, work: impl Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.shared.query_timeout, work).await {
            Ok(result) => result,
            Err(_) => {
                self.broken.store(true, Ordering::Relaxed);
                let (cancel, tls) = (self.cancel.clone(), self.shared.tls.clone());
                tokio::spawn(async move {
                    if let Err(e) = cancel.cancel_query(tls).await {
                        tracing::debug!(error = %e, "cancel request for a statement past the query timeout");
                    }
                });
                Err(StoreError::QueryTimeout(self.shared.query_timeout))
            }
        }
    }
}

impl Connection {
    pub(crate) fn new(client: deadpool_postgres::Object, shared: Arc<Shared>) -> Self {
        Self {
            created: deadpool_postgres::Object::metrics(&client).created,
            cancel: client.cancel_token(),
            client: Some(client),
            shared,
            broken: AtomicBool::new(false),
        }
    }

    fn lease(&self) -> Lease<'_> {
        Lease {
            shared: &self.shared,
            broken: &self.broken,
            created: self.created,
            cancel: &self.cancel,
        }
    }

    pub(crate) async fn transaction(&mut self) -> Result<Transaction<'_>> {
        let lease = Lease {
            shared: &self.shared,
            broken: &self.broken,
            created: self.created,
            cancel: &self.cancel,
        };
        let client = self.client.as_mut().expect("a connection is whole until dropped");
        let tx = lease
            .bounded(async { client.transaction().await.map_err(|e| lease.seen(e)) })
            .await?;
        Ok(Transaction { tx, lease })
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if self.broken.load(Ordering::Relaxed) {
            if let Some(client) = self.client.take() {
                // Out of the pool and closed: the server sees the client gone.
                drop(deadpool_postgres::Object::take(client));
            }
        }
    }
}

impl<'a> Transaction<'a> {
    /// The suppression list's key, for the digests a statement of this transaction passes.
    pub(crate) fn destination_key(&self) -> Result<&'a DestinationKey> {
        self.lease.shared.destination_key()
    }

    /// A crash before the commit's answer leaves the transaction's fate to the server: it
    /// committed or not, and the caller's retry must converge either way. The same holds
    /// when the answer does not come within the query timeout.
    pub async fn commit(self) -> Result<()> {
        let lease = self.lease;
        lease
            .bounded(async move { self.tx.commit().await.map_err(|e| lease.seen(e)) })
            .await
    }
}

/// Where a statement runs: a pooled connection outside a transaction or inside one, or a
/// session of its own ([`crate::Store::session`]) outside or inside a transaction. A
/// session is a server session by construction: its statements may be named.
pub(crate) enum On<'c> {
    Pooled(&'c deadpool_postgres::ClientWrapper, Lease<'c>),
    PooledTransaction(&'c deadpool_postgres::Transaction<'c>, Lease<'c>),
    Session(&'c tokio_postgres::Client),
    SessionTransaction(&'c tokio_postgres::Transaction<'c>),
}

/// Runs `$body` with `$c` bound to whichever client or transaction an [`On`] holds (each
/// derefs to, or is, a tokio-postgres client or transaction with the same methods).
macro_rules! on_any {
    ($on:expr, $c:ident => $body:expr) => {
        match $on {
            On::Pooled($c, _) => $body,
            On::PooledTransaction($c, _) => $body,
            On::Session($c) => $body,
            On::SessionTransaction($c) => $body,
        }
    };
}

impl On<'_> {
    /// The store's error for `e`, noted by the pool's primary watch.
    fn seen(&self, e: tokio_postgres::Error) -> StoreError {
        match self {
            On::Pooled(_, lease) | On::PooledTransaction(_, lease) => lease.seen(e),
            On::Session(_) | On::SessionTransaction(_) => StoreError::Db(e),
        }
    }

    /// `work` within the query timeout on a pooled connection; unbounded on a session
    /// (migrations, partition upkeep and retention may run long).
    async fn bounded<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        match self {
            On::Pooled(_, lease) | On::PooledTransaction(_, lease) => lease.bounded(work).await,
            On::Session(_) | On::SessionTransaction(_) => work.await,
        }
    }
}

/// A hot statement (see [`crate::plans::HotStatement::prepared`]): prepared once per
/// connection unless a transaction pooler forbids it. Any other text is planned for its
/// values on each call.
#[derive(Clone, Copy)]
pub(crate) struct Hot(pub &'static str);

/// A statement's text and how it is sent.
pub(crate) trait Text: Send + Sync {
    fn text(&self) -> &str;
    fn hot(&self) -> bool {
        false
    }
}

impl Text for &str {
    fn text(&self) -> &str {
        self
    }
}

impl Text for &String {
    fn text(&self) -> &str {
        self
    }
}

impl Text for Hot {
    fn text(&self) -> &str {
        self.0
    }
    fn hot(&self) -> bool {
        true
    }
}

/// The statements of Herald's store, on a [`Connection`] or a [`Transaction`].
pub(crate) trait Sql: Send + Sync {
    /// Where its statements run; the methods below are the ways to run one.
    fn on(&self) -> On<'_>;

    fn query(
        &self,
        sql: impl Text,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>>> + Send {
        async move { rows(self, &sql, params).await }
    }

    fn execute(
        &self,
        sql: impl Text,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64>> + Send {
        async move { count(self, &sql, params).await }
    }

    /// Exactly one row, or [`StoreError::RowCount`].
    fn query_one(
        &self,
        sql: impl Text,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row>> + Send {
        async move {
            let mut rows = rows(self, &sql, params).await?;
            match rows.len() {
                1 => Ok(rows.pop().expect("one row")),
                n => Err(StoreError::RowCount(n)),
            }
        }
    }

    /// At most one row, or [`StoreError::RowCount`].
    fn query_opt(
        &self,
        sql: impl Text,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Option<Row>>> + Send {
        async move {
            let mut rows = rows(self, &sql, params).await?;
            match rows.len() {
                0 | 1 => Ok(rows.pop()),
                n => Err(StoreError::RowCount(n)),
            }
        }
    }

    /// Statements without parameters, in the simple protocol (one exchange, nothing named).
    fn batch_execute(&self, sql: &str) -> impl Future<Output = Result<()>> + Send {
        async move {
            let on = self.on();
            on.bounded(async { on_any!(&on, c => c.batch_execute(sql).await).map_err(|e| on.seen(e)) })
                .await
        }
    }
}

impl Sql for Connection {
    fn on(&self) -> On<'_> {
        On::Pooled(
            self.client.as_ref().expect("a connection is whole until dropped"),
            self.lease(),
        )
    }
}

impl Sql for Transaction<'_> {
    fn on(&self) -> On<'_> {
        On::PooledTransaction(&self.tx, self.lease)
    }
}

impl Sql for tokio_postgres::Client {
    fn on(&self) -> On<'_> {
        On::Session(self)
    }
}

impl Sql for tokio_postgres::Transaction<'_> {
    fn on(&self) -> On<'_> {
        On::SessionTransaction(self)
    }
}

/// Runs `$sql` on `$on` the way its connection and its text call for, with `$each`
/// (`query` or `execute`) and its form with parameter types `$typed`.
macro_rules! run {
    ($on:expr, $sql:expr, $params:expr, $each:ident, $typed:ident) => {{
        let on = $on;
        let text = $sql.text();
        let prepared_once = |lease: &Lease| $sql.hot() && lease.shared.pooler == Pooler::None;
        let result = match on {
            On::Pooled(c, lease) if prepared_once(lease) => match c.prepare_cached(text).await {
                Ok(statement) => c.$each(&statement, $params).await,
                Err(e) => Err(e),
            },
            On::PooledTransaction(c, lease) if prepared_once(lease) => match c.prepare_cached(text).await {
                Ok(statement) => c.$each(&statement, $params).await,
                Err(e) => Err(e),
            },
            On::Pooled(_, lease) | On::PooledTransaction(_, lease) if lease.shared.pooler == Pooler::Transaction => {
                let types = described(on, lease.shared, text).await?;
                let typed: Vec<_> = $params.iter().copied().zip(types.iter().cloned()).collect();
                on_any!(on, c => c.$typed(text, &typed).await)
            }
            _ => on_any!(on, c => c.$each(text, $params).await),
        };
        result.map_err(|e| on.seen(e))
    }};
}

async fn rows(
    sql_on: &(impl Sql + ?Sized),
    sql: &impl Text,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>> {
    let on = sql_on.on();
    on.bounded(async { run!(&on, sql, params, query, query_typed) })
        .await
}

async fn count(sql_on: &(impl Sql + ?Sized), sql: &impl Text, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
    let on = sql_on.on();
    on.bounded(async { run!(&on, sql, params, execute, execute_typed) })
        .await
}

/// The parameter types PostgreSQL infers for `sql`, asked once per text. The statement is
/// prepared and closed inside a transaction, so that behind a transaction pooler its Parse
/// and its Close reach the same server connection, and no named statement is left behind
/// on a server connection other clients share.
async fn described(on: &On<'_>, shared: &Shared, sql: &str) -> Result<Arc<[Type]>> {
    if let Some(types) = shared.described.lock().expect("described lock").get(sql) {
        return Ok(types.clone());
    }
    let types: Arc<[Type]> = match on {
        On::Pooled(c, lease) => {
            // Broken until the ROLLBACK is answered: if this future is dropped (a task
            // aborted) in between, the connection is closed instead of going back to the
            // pool inside the transaction, where the next borrower's writes would be lost.
            lease.broken.store(true, Ordering::Relaxed);
            c.batch_execute("BEGIN").await.map_err(|e| on.seen(e))?;
            let prepared = c.prepare(sql).await.map(|s| -> Arc<[Type]> { s.params().into() });
            // The statement is closed (dropped above) before the ROLLBACK is sent. If the
            // process dies before the ROLLBACK, the server ends the transaction with the
            // connection; a pooler does the same for its server connection's client.
            c.batch_execute("ROLLBACK").await.map_err(|e| on.seen(e))?;
            lease.broken.store(false, Ordering::Relaxed);
            prepared.map_err(|e| on.seen(e))?
        }
        // Inside a transaction already (or a session): the statement's Close is sent when it
        // is dropped here, before anything else the transaction sends.
        _ => on_any!(on, c => c.prepare(sql).await)
            .map_err(|e| on.seen(e))?
            .params()
            .into(),
    };
    shared
        .described
        .lock()
        .expect("described lock")
        .insert(sql.to_owned(), types.clone());
    Ok(types)
}
