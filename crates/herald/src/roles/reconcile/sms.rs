//! SNS's SMS delivery status, read from CloudWatch Logs (`reconcile.sms_status_log_groups`)
//! every `sms_status_poll_secs` and stored as provider events against the accepted SMS
//! attempts they name (by the message id `Publish` returned).
//!
//! ```text
//! cursor (provider_log_cursors) - overlap ─FilterLogEvents─> records ─decode─> events | rejects
//!   events ──store──> cursor moves to the newest record stored
//! ```
//!
//! An `unknown` SMS attempt is never settled here: its `Publish` answer never came back, so
//! Herald has no message id to look for, and the records carry nothing else of Herald's.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_channels::reconcile::sms_status::{decode_sms_status, LogRecord, SmsStatusReader};
use herald_core::state::Verdict;
use herald_core::Channel;
use herald_store::reconcile::{Applied, ProviderEvent};
use herald_store::Store;
use tracing::{info, warn};

use super::{keep, store_isolating, Input, Stopped};
use crate::config::Config;
use crate::obs::Obs;
use crate::shutdown::Shutdown;

/// The event types an SMS delivery status is stored as.
pub const EVENT_TYPES: [&str; 2] = ["delivered", "failed"];

/// Events per transaction.
const STORE_CHUNK: usize = 100;

pub async fn run(config: Arc<Config>, store: Store, mut shutdown: Shutdown, obs: Obs) {
    let rc = &config.reconcile;
    let reader = SmsStatusReader::new(&config.aws_settings()).await;
    let every = Duration::from_secs(rc.sms_status_poll_secs);
    info!(groups = ?rc.sms_status_log_groups, poll_secs = rc.sms_status_poll_secs,
          "reconcile reading SMS delivery status");
    loop {
        for group in &rc.sms_status_log_groups {
            match poll(&config, &reader, &store, &obs, group, &mut shutdown).await {
                Ok(0) => {}
                Ok(n) => info!(group = %group, records = n, "SMS delivery status read"),
                Err(Stopped) => return,
            }
        }
        tokio::select! {
            _ = shutdown.requested() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Reads one group from its cursor, stores what it finds, moves the cursor. Returns the
/// records read. A failed read is logged and tried again next poll.
async fn poll(
    config: &Config,
    reader: &SmsStatusReader,
    store: &Store,
    obs: &Obs,
    group: &str,
    shutdown: &mut Shutdown,
) -> Result<usize, Stopped> {
    let rc = &config.reconcile;
    let source = format!("cloudwatch_logs:{group}");
    let cursor = match store.log_cursor(&source).await {
        Ok(c) => c,
        Err(e) => {
            warn!(group, error = %e, "SMS status cursor not read; trying again next poll");
            return Ok(0);
        }
    };
    let since = match cursor {
        Some(at) => at - chrono::Duration::seconds(rc.sms_status_overlap_secs as i64),
        None => Utc::now() - chrono::Duration::seconds(rc.sms_status_lookback_secs as i64),
    };
    // Every page to the end: each is stored and moves the cursor before the next is read,
    // so a poll cut short (shutdown, a failed read) resumes from what it stored, and the
    // overlap read again never holds the cursor back however many records it has.
    let mut read = 0;
    let mut token = None;
    loop {
        let (records, next) = match reader.page(group, since.timestamp_millis(), token).await {
            Ok(page) => page,
            Err(e) => {
                warn!(error = %e, "SMS delivery status not read; trying again next poll");
                return Ok(read);
            }
        };
        read += records.len();
        for chunk in records.chunks(STORE_CHUNK) {
            store_chunk(store, obs, group, &source, chunk, shutdown).await?;
        }
        match next {
            Some(t) if !shutdown.is_requested() => token = Some(t),
            _ => return Ok(read),
        }
    }
}

async fn store_chunk(
    store: &Store,
    obs: &Obs,
    group: &str,
    source: &str,
    chunk: &[LogRecord],
    shutdown: &mut Shutdown,
) -> Result<(), Stopped> {
    // Each decoded record with its event: a record PostgreSQL refuses is kept as itself.
    let mut decoded: Vec<(&LogRecord, ProviderEvent)> = Vec::with_capacity(chunk.len());
    for r in chunk {
        match decode_sms_status(group, &r.event_id, &r.message) {
            Ok(s) => decoded.push((
                r,
                ProviderEvent {
                    key: s.key.clone(),
                    channel: Channel::Sms,
                    event_type: s.event_type().to_owned(),
                    provider_message_id: s.message_id.clone(),
                    occurred_at: s.occurred_at,
                    intent_tag: None,
                    attempt_tag: None,
                    // Delivered or not, SNS had the message.
                    verdict: Some(Verdict::Accepted),
                    bounce_type: None,
                    bounce_subtype: None,
                    complaint_type: None,
                    detail: s.provider_response.clone(),
                    price_usd: s.price_usd,
                    suppress: None,
                },
            )),
            Err(why) => {
                keep(store, obs, record_input(source, r), &why.0, "rejected", shutdown).await?;
            }
        }
    }
    if !decoded.is_empty() {
        let inputs: Vec<Input<'_>> = decoded.iter().map(|(r, _)| record_input(source, r)).collect();
        let events: Vec<ProviderEvent> = decoded.into_iter().map(|(_, e)| e).collect();
        let applied = store_isolating(store, obs, &inputs, &events, shutdown).await?;
        for (e, a) in events.iter().zip(applied) {
            let t = if e.event_type == "delivered" {
                "delivered"
            } else {
                "failed"
            };
            let outcome = match a {
                None => continue,
                Some(Applied::Duplicate) => "duplicate",
                Some(Applied::Stored { matched: Some(_), .. }) => "matched",
                Some(Applied::Stored { matched: None, .. }) => "unmatched",
            };
            super::stats::of(obs).event(t, outcome);
        }
    }
    // Committed: the cursor may move past them. A crash before this reads them again.
    if let Some(newest) = chunk.iter().map(|r| r.timestamp_ms).max() {
        let at = DateTime::<Utc>::from_timestamp_millis(newest).unwrap_or_else(Utc::now);
        if let Err(e) = store.advance_log_cursor(source, at).await {
            warn!(group, error = %e, "SMS status cursor not moved: the records are read again and converge");
        }
    }
    Ok(())
}

fn record_input<'a>(source: &'a str, r: &'a LogRecord) -> Input<'a> {
    Input {
        source,
        id: &r.event_id,
        body: &r.message,
    }
}
