//! The reconcile role: reads the provider's events (SES event publishing: configuration
//! set -> SNS topic -> SQS queue) and stores them as evidence against the attempts they
//! concern; an event settles an `unknown` attempt's intent, a permanent bounce or a
//! complaint puts the destination on the suppression list.
//!
//! ```text
//! receive (long poll, batch) ─authenticate─> unauthenticated ──kept with the reason──> delete
//!   ─decode─> events | ignored | malformed
//!   events ──store (one transaction)──> delete
//!   malformed ──kept with the reason──> delete
//! ```
//!
//! Authentication ([`herald_channels::reconcile::sns`]) comes first: a message whose topic
//! or signature is not SNS's for a configured topic is never read as evidence, whatever it
//! says.
//!
//! The same at-least-once discipline as the Kafka side: a message is deleted only once its
//! effect is committed in PostgreSQL. A crash in between brings it back after its
//! visibility timeout; a stored event converges on its key, a kept reject on its message
//! id. Several reconcilers may read one queue: SQS hands each message to one at a time.

use std::sync::Arc;
use std::time::Duration;

use herald_channels::reconcile::queue::{QueueMessage, QueueReader, QueueSettings};
use herald_channels::reconcile::ses_events::{decode_queue_body, QueueBody, SesEvent, SesEventType};
use herald_channels::reconcile::sns::{EvidenceTrust, Refusal, SignatureCheck};
use herald_core::Channel;
use herald_store::reconcile::{Applied, ProviderEvent};
use herald_store::Store;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::obs::Obs;
use crate::retrying::{class_of, run_with_retries, GaveUp, Schedule, Stage};
use crate::shutdown::Shutdown;

mod sms;
mod stats;

/// The `source` of rejects kept from the SES event queue.
const SOURCE: &str = "ses_events";

pub async fn run(config: Arc<Config>, store: Store, mut shutdown: Shutdown, obs: Obs) -> anyhow::Result<()> {
    let rc = &config.reconcile;
    let mut event_types: Vec<&'static str> = SesEventType::ALL.iter().map(|t| t.as_str()).collect();
    event_types.extend(sms::EVENT_TYPES);
    stats::of(&obs).init(&event_types);
    let sms = (!rc.sms_status_log_groups.is_empty()).then(|| {
        tokio::spawn(sms::run(
            config.clone(),
            store.clone(),
            shutdown.clone(),
            obs.clone(),
        ))
    });
    match rc.queue_url.clone() {
        Some(queue_url) => read_queue(&config, queue_url, &store, &mut shutdown, &obs).await,
        None => shutdown.requested().await,
    }
    if let Some(sms) = sms {
        // It stops at the same shutdown; its reads are idempotent, so no need to wait long.
        let _ = tokio::time::timeout(Duration::from_secs(5), sms).await;
    }
    stats::of(&obs).log_totals();
    Ok(())
}

/// Reads the SES event queue until shutdown.
async fn read_queue(config: &Config, queue_url: String, store: &Store, shutdown: &mut Shutdown, obs: &Obs) {
    let rc = &config.reconcile;
    let reader = QueueReader::new(
        &config.aws_settings(),
        QueueSettings {
            queue_url,
            wait: Duration::from_secs(rc.wait_secs),
            visibility_timeout: Duration::from_secs(rc.visibility_timeout_secs),
            max_messages: rc.batch as usize,
        },
    )
    .await;
    let trust = match EvidenceTrust::new(rc.trust_settings()) {
        Ok(t) => t,
        Err(e) => {
            // check-config reads the CA file too; it may have gone since.
            warn!(error = %e, "reconcile cannot authenticate provider evidence: the queue is not read");
            return;
        }
    };
    if rc.sns_signatures == SignatureCheck::Unchecked {
        warn!(
            "reconcile.sns_signatures = \"unchecked\": SNS envelopes are believed without their signature \
               (a local stand-in only; whoever can write to the queue can forge evidence)"
        );
    }
    let schedule = Schedule::new(Duration::from_millis(200), Duration::from_secs(30));
    let stage = stage(obs);
    // Also the start-up check that the queue exists and may be read; retried like any
    // receive (the queue may be created after Herald starts).
    match run_with_retries(
        stage,
        || reader.depth(),
        |_| herald_core::ErrorClass::Transient("sqs"),
        schedule,
        Some(&mut *shutdown),
    )
    .await
    {
        Ok(depth) => info!(
            queue = reader.queue_url(),
            depth, "reconcile reading provider events"
        ),
        Err(_) => return,
    }
    loop {
        if shutdown.is_requested() {
            break;
        }
        // A long poll; shutdown does not wait for it (nothing received is lost: a message
        // not deleted comes back after its visibility timeout).
        let received = tokio::select! {
            _ = shutdown.requested() => break,
            r = run_with_retries(stage, || reader.receive(), |_| herald_core::ErrorClass::Transient("sqs"),
                                 schedule, None) => r,
        };
        let messages = match received {
            Ok(m) => m,
            Err(_) => continue,
        };
        if messages.is_empty() {
            continue;
        }
        if handle(&reader, &trust, store, obs, &messages, shutdown)
            .await
            .is_err()
        {
            break;
        }
    }
}

/// The retry stage of every store and SQS call of the role.
fn stage(obs: &Obs) -> Stage<'_> {
    Stage {
        name: "reconcile",
        metrics: &obs.metrics,
    }
}

/// Shutdown was requested while a store was being retried: nothing was deleted.
pub(super) struct Stopped;

/// Decodes, stores and deletes one received batch.
async fn handle(
    reader: &QueueReader,
    trust: &EvidenceTrust,
    store: &Store,
    obs: &Obs,
    messages: &[QueueMessage],
    shutdown: &mut Shutdown,
) -> Result<(), Stopped> {
    let stats = stats::of(obs);
    let mut events: Vec<(&QueueMessage, SesEvent)> = Vec::new();
    let mut done: Vec<&QueueMessage> = Vec::new();
    for m in messages {
        match trust.authenticate(&m.body).await {
            Ok(()) => {}
            Err(Refusal::Untrusted(why)) => {
                // Kept as the record of the attempt (who wrote it is for the queue's CloudTrail).
                keep(
                    store,
                    obs,
                    queue_input(m),
                    &why.to_string(),
                    "unauthenticated",
                    shutdown,
                )
                .await?;
                done.push(m);
                continue;
            }
            Err(Refusal::Unavailable(why)) => {
                // Neither believed nor refused: not deleted, it comes back after the queue's
                // visibility timeout and is judged then.
                warn!(message_id = %m.message_id, reason = %why, "provider message left on the queue");
                stats.message("deferred");
                continue;
            }
        }
        match decode_queue_body(&m.body) {
            Ok(QueueBody::Event(e)) => events.push((m, *e)),
            Ok(QueueBody::Ignored(what)) => {
                // Kept too: an SNS subscription confirmation carries the SubscribeURL that
                // a cross-account subscription needs an operator to visit.
                let why = format!("not an event, ignored: {what}");
                keep(store, obs, queue_input(m), &why, "ignored", shutdown).await?;
                done.push(m);
            }
            Err(why) => {
                keep_reject(store, obs, m, &why.0, shutdown).await?;
                done.push(m);
            }
        }
    }
    if !events.is_empty() {
        let rows: Vec<ProviderEvent> = events.iter().map(|(_, e)| provider_event(e)).collect();
        let inputs: Vec<Input<'_>> = events.iter().map(|(m, _)| queue_input(m)).collect();
        let applied = store_isolating(store, obs, &inputs, &rows, shutdown).await?;
        for (((m, e), row), applied) in events.iter().zip(&rows).zip(applied) {
            done.push(m);
            let Some(applied) = applied else { continue };
            stats.message("event");
            let t = e.event_type.as_str();
            match applied {
                Applied::Duplicate => {
                    stats.event(t, "duplicate");
                    debug!(event = t, message_id = %e.message_id, "duplicate provider event: no effect");
                }
                Applied::Stored {
                    id,
                    matched,
                    settled,
                    suppressed,
                    refused,
                } => {
                    stats.event(t, if matched.is_some() { "matched" } else { "unmatched" });
                    if let Some((intent_id, verdict)) = settled {
                        stats.settled_by_evidence(row.channel.as_str(), verdict.as_str());
                        info!(%intent_id, event = t, provider_event_id = id, state = verdict.as_str(),
                              "unknown settled by the provider's event");
                    }
                    if let (Some((reason, _)), true) = (&row.suppress, suppressed > 0) {
                        stats.suppressions_added(*reason, suppressed);
                        info!(
                            event = t,
                            provider_event_id = id,
                            destinations = suppressed,
                            reason = reason.as_str(),
                            "destination added to the suppression list"
                        );
                    }
                    if let (Some((reason, _)), true) = (&row.suppress, refused > 0) {
                        stats.suppressions_refused(*reason, refused);
                        warn!(
                            event = t,
                            provider_event_id = id,
                            message_id = %e.message_id,
                            addresses = refused,
                            matched = matched.is_some(),
                            "a bounce or complaint named addresses that are not the destination of an attempt it \
                             matched: none suppressed"
                        );
                    }
                    if matched.is_none() {
                        debug!(event = t, message_id = %e.message_id, provider_event_id = id,
                               "provider event for no attempt of this ledger: stored");
                    }
                }
            }
        }
    }
    // Committed: now the messages may go. A crash here brings them back; they converge.
    match reader.delete(&done).await {
        Ok(failed) => {
            for (id, why) in failed {
                warn!(message_id = %id, reason = %why, "queue message not deleted: it comes back and converges");
            }
        }
        Err(e) => warn!(error = %e, "queue delete failed: the messages come back and converge"),
    }
    Ok(())
}

/// Stores events in one transaction, retrying transient failures. `None`: PostgreSQL
/// refused them (a permanent class).
async fn store_events(
    store: &Store,
    obs: &Obs,
    rows: &[ProviderEvent],
    shutdown: &mut Shutdown,
) -> Result<Option<Vec<Applied>>, Stopped> {
    let stage = stage(obs);
    let schedule = Schedule::new(Duration::from_millis(100), Duration::from_secs(30));
    match run_with_retries(
        stage,
        || async {
            store
                .apply_provider_events(rows)
                .await
                .map_err(anyhow::Error::new)
        },
        class_of,
        schedule,
        Some(shutdown),
    )
    .await
    {
        Ok(applied) => Ok(Some(applied)),
        Err(GaveUp::Permanent(e, _)) => {
            warn!(events = rows.len(), error = %format!("{e:#}"), "provider events refused by PostgreSQL");
            Ok(None)
        }
        Err(GaveUp::Shutdown) => Err(Stopped),
    }
}

/// Stores `events` (read from `inputs`, in the same order) in one transaction. A batch
/// PostgreSQL refuses (a permanent class) is narrowed down to the event, which is kept as
/// a reject with its input and answers `None`: one bad input never blocks the rest, and a
/// healthy one is never dropped with it.
pub(super) async fn store_isolating(
    store: &Store,
    obs: &Obs,
    inputs: &[Input<'_>],
    events: &[ProviderEvent],
    shutdown: &mut Shutdown,
) -> Result<Vec<Option<Applied>>, Stopped> {
    if let Some(applied) = store_events(store, obs, events, shutdown).await? {
        return Ok(applied.into_iter().map(Some).collect());
    }
    let mut one_by_one = Vec::with_capacity(events.len());
    for (input, event) in inputs.iter().zip(events) {
        match store_events(store, obs, std::slice::from_ref(event), shutdown).await? {
            Some(mut a) => one_by_one.push(a.pop()),
            None => {
                let why = "PostgreSQL refused the event's data (see the log)";
                keep(store, obs, *input, why, "rejected", shutdown).await?;
                one_by_one.push(None);
            }
        }
    }
    Ok(one_by_one)
}

/// Keeps a message that is not a provider event, with its reason, so that it can be
/// deleted.
async fn keep_reject(
    store: &Store,
    obs: &Obs,
    m: &QueueMessage,
    why: &str,
    shutdown: &mut Shutdown,
) -> Result<(), Stopped> {
    debug!(message_id = %m.message_id, receive_count = m.receive_count, "queue message kept as a reject, then deleted");
    keep(store, obs, queue_input(m), why, "rejected", shutdown).await
}

fn queue_input(m: &QueueMessage) -> Input<'_> {
    Input {
        source: SOURCE,
        id: &m.message_id,
        body: &m.body,
    }
}

/// Input that is not a provider event: where it came from, its id there, its body.
#[derive(Clone, Copy)]
pub(super) struct Input<'a> {
    pub source: &'a str,
    pub id: &'a str,
    pub body: &'a str,
}

/// Keeps input that is not a provider event with its reason (counted as `result`:
/// `rejected`, `unauthenticated` (not the provider's word), or `ignored` for what is no
/// error; a redelivery is counted again, as a read).
pub(super) async fn keep(
    store: &Store,
    obs: &Obs,
    input: Input<'_>,
    why: &str,
    result: &'static str,
    shutdown: &mut Shutdown,
) -> Result<(), Stopped> {
    let Input { source, id, body } = input;
    warn!(
        source,
        id,
        reason = why,
        "input that is not a provider event: kept with its reason, not read again"
    );
    let stage = stage(obs);
    let schedule = Schedule::new(Duration::from_millis(100), Duration::from_secs(30));
    // Herald's own row, cleaned of what PostgreSQL refuses: every failure is retried.
    let kept = run_with_retries(
        stage,
        || async {
            store
                .reject_provider_message(source, id, why, body)
                .await
                .map_err(anyhow::Error::new)
        },
        crate::retrying::always(class_of),
        schedule,
        Some(shutdown),
    )
    .await
    .map_err(|_| Stopped)?;
    if !kept {
        debug!(source, id, "kept before (a redelivery): the first row stays");
    }
    stats::of(obs).message(result);
    Ok(())
}

/// The row to store for an SES event. The addresses of a permanent bounce or a complaint
/// go to PostgreSQL only to be digested for the suppression list.
fn provider_event(e: &SesEvent) -> ProviderEvent {
    let channel = Channel::Email;
    ProviderEvent {
        key: e.key.clone(),
        channel,
        event_type: e.event_type.as_str().to_owned(),
        provider_message_id: e.message_id.clone(),
        occurred_at: e.occurred_at,
        intent_tag: e.intent_tag.clone(),
        attempt_tag: e.attempt_tag.clone(),
        verdict: e.event_type.verdict(),
        bounce_type: e.bounce_type.clone(),
        bounce_subtype: e.bounce_subtype.clone(),
        complaint_type: e.complaint_type.clone(),
        detail: e.detail.clone(),
        price_usd: None,
        suppress: e.suppress.map(|reason| (reason, e.recipients.clone())),
    }
}
