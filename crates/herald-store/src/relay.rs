//! The outbox side of the relay: claim due rows with `FOR UPDATE SKIP LOCKED` so several
//! relays share the work, delete them once the broker acknowledged, and LISTEN for inserts.

use futures::StreamExt;
use herald_core::Channel;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use uuid::Uuid;

use crate::{Connection, Hot, Result, Sql, Store, Transaction};

/// Due outbox rows, oldest first, skipping rows another relay holds
/// (outbox_available_at_idx), with their intent's channel. The row carries it (V14); a row
/// queued before V14 or by an older Herald has none, and only for such a row the intent's
/// is looked up (notification_intents_pkey, the contents' primary key: one probe; the
/// outbox's foreign key keeps the intent there). No join: whatever the statistics, the
/// plan reads the due rows and nothing else.
pub(crate) const CLAIM_DUE: &str = "SELECT o.id, o.intent_id, o.trace_context,
            coalesce(o.channel, (SELECT i.channel FROM intent_contents i WHERE i.id = o.intent_id))
     FROM outbox o
     WHERE o.available_at <= now()
     ORDER BY o.available_at, o.id
     LIMIT $1
     FOR UPDATE SKIP LOCKED";
/// Published rows (outbox_pkey).
pub(crate) const DELETE_PUBLISHED: &str = "DELETE FROM outbox WHERE id = ANY($1::int8[])";

/// The channel the `outbox_notify_after_insert` trigger notifies (migrations/V1).
pub const OUTBOX_CHANNEL: &str = "herald_outbox";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: i64,
    pub intent_id: Uuid,
    pub trace_context: Option<String>,
    /// The intent's channel: published with the message, so that a delivery worker knows
    /// which channel's claim window the intent takes before it claims.
    pub channel: Channel,
}

/// One relay round: the claimed rows stay locked (invisible to other relays) until
/// [`RelayTx::finish`] deletes them and commits, or the transaction is dropped.
pub struct RelayTx<'a> {
    tx: Transaction<'a>,
}

impl<'a> RelayTx<'a> {
    pub async fn begin(conn: &'a mut Connection) -> Result<Self> {
        Ok(Self {
            tx: conn.transaction().await?,
        })
    }

    /// Up to `limit` due rows, oldest first, skipping rows another relay holds.
    pub async fn claim_due(&self, limit: i64) -> Result<Vec<OutboxRow>> {
        // outbox_available_at_idx (available_at, id). Prepared once per connection: a
        // relay round is a few rows, and planning it again cost as much as running it.
        let rows = self.tx.query(Hot(CLAIM_DUE), &[&limit]).await?;
        rows.into_iter()
            .map(|r| {
                Ok(OutboxRow {
                    id: r.get(0),
                    intent_id: r.get(1),
                    trace_context: r.get(2),
                    channel: crate::stored_channel("outbox.channel", r.get(3))?,
                })
            })
            .collect()
    }

    /// Makes `rows` (whose messages were refused after their round) due at once.
    pub async fn due_now(&self, rows: &[i64]) -> Result<()> {
        if !rows.is_empty() {
            self.tx.execute(DUE_NOW, &[&rows]).await?;
        }
        Ok(())
    }

    /// Deletes the published rows and commits.
    ///
    /// Failure policy: call only after the broker acknowledged every row. A crash before
    /// the commit leaves the rows in place (the locks die with the session) and another
    /// round publishes them again: a duplicate on the topic, which delivery absorbs through
    /// the intent's state and lease. Nothing is ever deleted unpublished.
    pub async fn finish(self, published: &[i64]) -> Result<()> {
        self.finish_deferring(published, &[], std::time::Duration::ZERO)
            .await
    }

    /// [`RelayTx::finish`], and the rows in `late` (published, their answer not in yet)
    /// made due again only `after` from now: meanwhile no relay claims them, this one
    /// deletes each once its message is acknowledged, and a refused one is made due at
    /// once ([`Store::outbox_due_now`]).
    ///
    /// Failure policy: a crash with such rows deferred leaves them in the outbox, due again
    /// after `after`: published again, a duplicate for an acknowledged one, never a loss.
    pub async fn finish_deferring(
        self,
        published: &[i64],
        late: &[i64],
        after: std::time::Duration,
    ) -> Result<()> {
        if !published.is_empty() {
            // outbox_pkey
            self.tx.execute(Hot(DELETE_PUBLISHED), &[&published]).await?;
        }
        if !late.is_empty() {
            let ms = after.as_millis() as i64;
            // outbox_pkey
            self.tx.execute(DEFER, &[&late, &ms]).await?;
        }
        self.tx.commit().await?;
        Ok(())
    }
}

/// Late rows made due again later (outbox_pkey).
const DEFER: &str =
    "UPDATE outbox SET available_at = now() + $2::int8 * interval '1 millisecond' WHERE id = ANY($1::int8[])";
/// Rows whose messages were refused made due at once (outbox_pkey).
const DUE_NOW: &str = "UPDATE outbox SET available_at = now() WHERE id = ANY($1::int8[])";

impl Store {
    /// Deletes rows whose messages the broker acknowledged after their round (outbox_pkey).
    /// A row another relay claimed meanwhile (its deferral ran out) waits for that relay's
    /// round; one already deleted is no longer there.
    pub async fn outbox_published(&self, published: &[i64]) -> Result<()> {
        if published.is_empty() {
            return Ok(());
        }
        let conn = self.conn().await?;
        conn.execute(Hot(DELETE_PUBLISHED), &[&published]).await?;
        Ok(())
    }

    /// Makes rows whose messages were refused after their round due at once.
    pub async fn outbox_due_now(&self, refused: &[i64]) -> Result<()> {
        if refused.is_empty() {
            return Ok(());
        }
        let conn = self.conn().await?;
        conn.execute(DUE_NOW, &[&refused]).await?;
        Ok(())
    }

    /// LISTENs on the outbox channel over a session of its own (see [`Store::session`]).
    /// The listener's receiver yields one unit per notification and closes when the
    /// connection is lost: the relay then falls back to its poll interval and listens
    /// again. [`StoreError::NoSession`](crate::StoreError::NoSession): behind a transaction
    /// pooler without `database.session_url`, where the relay only polls.
    pub async fn listen_outbox(&self) -> Result<OutboxListener> {
        let config = self
            .session_config
            .as_ref()
            .ok_or(crate::StoreError::NoSession("the relay's LISTEN"))?;
        let created = std::time::Instant::now();
        let (client, mut connection) = config.connect(self.tls.clone()).await?;
        let (tx, rx) = mpsc::channel(1);
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        tokio::spawn(async move {
            while let Some(msg) = messages.next().await {
                match msg {
                    Ok(AsyncMessage::Notification(_)) => {
                        // A full channel already holds a wake-up: dropping this one is fine.
                        let _ = tx.try_send(());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "outbox LISTEN connection lost; polling until it is back");
                        break;
                    }
                }
            }
        });
        client.batch_execute(&format!("LISTEN {OUTBOX_CHANNEL}")).await?;
        Ok(OutboxListener {
            _client: client,
            rx,
            created,
        })
    }
}

/// Wake-ups from `LISTEN herald_outbox`. Dropping it closes the connection.
pub struct OutboxListener {
    _client: tokio_postgres::Client,
    pub rx: mpsc::Receiver<()>,
    /// When its connection was made: a listener on a node that stopped being the primary
    /// hears nothing more, and is replaced once the pool saw the primary move
    /// ([`Store::primary_moved_since`]).
    pub created: std::time::Instant,
}
