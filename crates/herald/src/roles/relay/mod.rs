//! The relay role: publishes due outbox rows to `herald.deliveries` and deletes them once
//! the broker acknowledged. Woken by `LISTEN herald_outbox`, with a poll interval as the
//! fallback (and for rows that become due later, such as scheduled retries). Several relays
//! may run at once: `FOR UPDATE SKIP LOCKED` gives each its own rows. A round waits for its
//! acknowledgements for `relay.ack_wait_ms` at most; the late ones are awaited beside the
//! next rounds (`on_their_way`), their rows made due again only once the producer's own
//! timeout has passed, so a partition whose leader does not answer holds only its own
//! rows.

mod on_their_way;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use herald_kafka::{DeliveryMessage, DeliveryPublisher};
use herald_store::relay::{OutboxListener, RelayTx};
use herald_store::Store;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::obs::{self, Obs};
use crate::retrying::{always, class_of, run_with_retries, Schedule, Stage};
use crate::shutdown::Shutdown;
use on_their_way::{Answered, OnTheirWay, Sent};

pub async fn run(config: Arc<Config>, store: Store, mut shutdown: Shutdown, obs: Obs) -> anyhow::Result<()> {
    let publisher = DeliveryPublisher::new(
        &config.kafka_settings(),
        &config.topic(&config.kafka.topics.deliveries),
    )?;
    let batch = config.relay.batch_size;
    let poll = Duration::from_millis(config.relay.poll_interval_ms);
    let schedule = Schedule::new(
        Duration::from_millis(100),
        Duration::from_millis(config.relay.retry_backoff_max_ms),
    );
    let mut listener: Option<OutboxListener> = None;
    // False behind a transaction pooler without a session URL: the relay polls only.
    let mut may_listen = true;
    let mut published_total = 0u64;
    // Locked by the round that uses it (one at a time): a `FnMut` retry cannot lend it.
    let on_their_way = tokio::sync::Mutex::new(OnTheirWay::default());
    let limits = Limits {
        batch,
        ack_wait: Duration::from_millis(config.relay.ack_wait_ms),
        max_unacknowledged: config.relay.max_unacknowledged,
    };
    info!(topic = publisher.topic(), batch, "relay publishing");
    let stranded = tokio::spawn(requeue_stranded(config.clone(), store.clone(), obs.clone()));
    loop {
        if shutdown.is_requested() {
            break;
        }
        // A listener on a node that stopped being the primary hears nothing more.
        if listener
            .as_ref()
            .is_some_and(|l| store.primary_moved_since(l.created))
        {
            info!("the database's primary moved: listening for outbox inserts again");
            listener = None;
        }
        if listener.is_none() && may_listen {
            match store.listen_outbox().await {
                Ok(l) => listener = Some(l),
                Err(e @ herald_store::StoreError::NoSession(_)) => {
                    info!(reason = %e, poll_ms = poll.as_millis() as u64, "polling the outbox, not listening");
                    may_listen = false;
                }
                Err(e) => warn!(error = %e, "cannot LISTEN for outbox inserts; polling"),
            }
        }
        // Outbox rows are Herald's own: nothing in them to isolate, so every failure is
        // retried (a permanent one is logged as an error by `always`).
        let round_done = run_with_retries(
            Stage {
                name: "relay",
                metrics: &obs.metrics,
            },
            || round(&store, &publisher, &limits, &on_their_way, &obs),
            always(class_of),
            schedule,
            Some(&mut shutdown),
        )
        .await;
        match round_done {
            Ok(Round { claimed, published }) => {
                published_total += published as u64;
                if claimed as i64 == batch {
                    continue; // more may be due right now
                }
                let mut waiting = on_their_way.lock().await;
                if waiting.len() >= limits.max_unacknowledged {
                    // Full: wait for an answer (then a round deletes or republishes).
                    waiting
                        .wait_for_one(tokio::time::Instant::now() + limits.ack_wait)
                        .await;
                    continue;
                }
            }
            Err(_) => break, // shutdown requested while waiting to retry
        }
        let woken = async {
            match listener.as_mut() {
                Some(l) => l.rx.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.requested() => break,
            alive = woken => if !alive { listener = None },
            _ = tokio::time::sleep(poll) => {}
        }
    }
    stranded.abort();
    // Messages still on their way: their answers, for up to ack_wait, are recorded; the
    // rest stay deferred and are published again once their deferral runs out.
    let mut waiting = on_their_way.lock().await;
    waiting
        .wait_for_all(tokio::time::Instant::now() + limits.ack_wait)
        .await;
    let last = waiting.answered();
    let recorded = async {
        store.outbox_published(&last.acknowledged).await?;
        store.outbox_due_now(&last.refused).await
    };
    if let Err(e) = recorded.await {
        warn!(error = %e, "answers that came in at shutdown not recorded; their rows are published again later");
    }
    if waiting.len() > 0 {
        info!(
            on_their_way = waiting.len(),
            "relay stopping with messages not acknowledged yet: their rows are published again once due"
        );
    }
    info!(published_total, "relay stopped");
    Ok(())
}

/// Every `relay.stranded_check_secs`: intents due for longer than
/// `relay.stranded_grace_secs` with no outbox row get one. Nothing else would ever bring
/// them to a worker: the delivery message that should have was lost (acknowledged by a
/// broker that then lost it), or a database clock step made a retry due with no row left.
async fn requeue_stranded(config: Arc<Config>, store: Store, obs: Obs) {
    let every = Duration::from_secs(config.relay.stranded_check_secs);
    let grace = Duration::from_secs(config.relay.stranded_grace_secs);
    // At start (a restart after an incident finds them at once), then every `every`.
    loop {
        match store.requeue_stranded(grace, 1000).await {
            Ok(ids) => {
                obs.metrics.intents_requeued(ids.len());
                if !ids.is_empty() {
                    let shown: Vec<String> = ids.iter().take(10).map(ToString::to_string).collect();
                    warn!(intents = ids.len(), first = %shown.join(","), grace_secs = grace.as_secs(),
                          "intents due without an outbox row (a lost delivery message or a clock step): queued again");
                }
            }
            Err(e) => warn!(error = %e, "stranded-intent check failed"),
        }
        tokio::time::sleep(every).await;
    }
}

/// What one round did: rows claimed, and rows deleted (its own acknowledged, and those of
/// earlier rounds acknowledged since).
struct Round {
    claimed: usize,
    published: usize,
}

/// The relay's bounds, from `[relay]`.
struct Limits {
    batch: i64,
    ack_wait: Duration,
    max_unacknowledged: usize,
}

/// Publishes up to `batch` due rows (fewer while messages are on their way past earlier
/// rounds), waits up to `ack_wait` for their acknowledgements, deletes the acknowledged
/// rows (this round's and earlier ones'), defers the late ones, and makes the earlier
/// refused ones due again. On an error, the earlier answers are kept for the next round.
async fn round(
    store: &Store,
    publisher: &DeliveryPublisher,
    limits: &Limits,
    on_their_way: &tokio::sync::Mutex<OnTheirWay>,
    obs: &Obs,
) -> anyhow::Result<Round> {
    let mut on_their_way = on_their_way.lock().await;
    let earlier = on_their_way.answered();
    let done = publish_round(store, publisher, limits, &mut on_their_way, &earlier, obs).await;
    if done.is_err() {
        // Nothing of them was committed: their rows are still deferred, and they are
        // recorded by the next round. Failure policy: a crash before it leaves them due
        // once their deferral runs out.
        on_their_way.keep(earlier);
    }
    done
}

async fn publish_round(
    store: &Store,
    publisher: &DeliveryPublisher,
    limits: &Limits,
    on_their_way: &mut OnTheirWay,
    earlier: &Answered,
    obs: &Obs,
) -> anyhow::Result<Round> {
    let room = limits.max_unacknowledged.saturating_sub(on_their_way.len()) as i64;
    let mut conn = store.conn().await?;
    let tx = RelayTx::begin(&mut conn).await?;
    // The earlier refused first: due again at once, they may be claimed right below.
    tx.due_now(&earlier.refused).await?;
    let rows = if room > 0 {
        tx.claim_due(limits.batch.min(room)).await?
    } else {
        Vec::new()
    };
    if rows.is_empty() {
        tx.finish(&earlier.acknowledged).await?;
        obs.metrics.relay_published(earlier.acknowledged.len() as u64);
        return Ok(Round {
            claimed: 0,
            published: earlier.acknowledged.len(),
        });
    }
    let ids: Vec<String> = rows.iter().map(|r| r.intent_id.to_string()).collect();
    // `send herald.deliveries` per row, child of the context stored with the row; the
    // message carries the send span's context on to delivery.
    let spans: Vec<Option<tracing::Span>> = rows
        .iter()
        .zip(&ids)
        .map(|(r, id)| {
            obs.tracing
                .then(|| obs::send_span(publisher.topic(), id, r.trace_context.as_deref()))
        })
        .collect();
    let contexts: Vec<Option<String>> = rows
        .iter()
        .zip(&spans)
        .map(|(r, span)| match span {
            Some(s) => obs::traceparent_or(s, r.trace_context.as_deref()),
            None => r.trace_context.clone(),
        })
        .collect();
    let messages: Vec<DeliveryMessage> = rows
        .iter()
        .zip(contexts)
        .map(|(r, traceparent)| DeliveryMessage {
            intent_id: r.intent_id,
            channel: Some(r.channel),
            traceparent,
        })
        .collect();
    // The failpoint puts the producer in librdkafka's fatal state (as a broker restart can)
    // just before this round publishes: the round's first send is refused and replaces the
    // client, the later ones go through the new client, and a later round publishes the
    // refused row.
    #[cfg(feature = "failpoints")]
    if fail::eval("relay-producer-fatal", |_| ()).is_some()
        && publisher.raise_fatal_error("failpoint relay-producer-fatal")
    {
        warn!("failpoint relay-producer-fatal: producer put in librdkafka's fatal state");
    }
    // The round's sends are awaited together until `ack_wait`; those still unanswered then
    // become tasks of their own (`on_their_way`), which outlive the round.
    let mut sends: FuturesUnordered<_> = rows
        .iter()
        .zip(&messages)
        .map(|(r, m)| {
            let (row, intent_id, send) = (r.id, r.intent_id, publisher.publish(m));
            // Pinned, so that the late ones can be moved out to their own tasks.
            Box::pin(async move {
                Sent {
                    row,
                    intent_id,
                    answer: send.await,
                }
            })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + limits.ack_wait;
    let mut published = Vec::with_capacity(rows.len());
    let mut answered = HashSet::with_capacity(rows.len());
    let mut refused = None;
    while let Ok(Some(sent)) = tokio::time::timeout_at(deadline, sends.next()).await {
        answered.insert(sent.row);
        match sent.answer {
            Ok(()) => published.push(sent.row),
            Err(e) => {
                debug!(intent_id = %sent.intent_id, error = %e, "delivery message not acknowledged; it stays in the outbox");
                refused.get_or_insert(anyhow::Error::new(e));
            }
        }
    }
    drop(spans);
    let late_rows: Vec<i64> = rows
        .iter()
        .map(|r| r.id)
        .filter(|row| !answered.contains(row))
        .collect();
    let deleted: Vec<i64> = published.iter().chain(&earlier.acknowledged).copied().collect();
    // Failure policy: a crash here, after the broker acknowledged and before the delete
    // commits, leaves the rows to be published again: a duplicate message, never a loss.
    fail::fail_point!("relay-after-publish");
    // Late rows: due again once the producer would have given up on them (and a margin),
    // so that no relay publishes them again while their answer may still come. Should the
    // commit fail, their rows stay due and a later round publishes them again (a
    // duplicate when the late answer was an acknowledgement).
    tx.finish_deferring(&deleted, &late_rows, publisher.message_timeout() + LATE_MARGIN)
        .await?;
    for send in sends {
        on_their_way.add(send);
    }
    if !late_rows.is_empty() {
        warn!(late = late_rows.len(), ack_wait_ms = limits.ack_wait.as_millis() as u64, on_their_way = on_their_way.len(),
              "delivery messages not acknowledged in time (a partition leader slow, frozen or being elected): the relay goes on; their rows wait for the answer");
    }
    obs.metrics.relay_published(deleted.len() as u64);
    debug!(claimed = rows.len(), published = published.len(), "relay round");
    // A round with every record refused fails, so the caller backs off before the rows are
    // claimed again: a client that refuses at once (one in librdkafka's fatal state, say)
    // would otherwise be asked again and again without a pause. A round that published
    // some is a success with a warning: the refused rows go in a later round, and one row
    // refused every time cannot slow the others down to the backoff's pace.
    if let Some(e) = refused {
        let not_acked = rows.len() - published.len() - late_rows.len();
        let e = e.context(format!(
            "{not_acked} of {} delivery messages not acknowledged; they stay in the outbox",
            rows.len()
        ));
        if published.is_empty() {
            return Err(e);
        }
        warn!(error = %format!("{e:#}"), "relay round partly refused");
    }
    Ok(Round {
        claimed: rows.len(),
        published: deleted.len(),
    })
}

/// Beyond the producer's own timeout, before a late row is due again.
const LATE_MARGIN: Duration = Duration::from_secs(5);
