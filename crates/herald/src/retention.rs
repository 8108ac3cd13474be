//! When retention runs, and what a pass is: the partition upkeep of `notification_attempts`
//! (this month and `database.attempt_partitions_ahead` more, stranded rows moved out of the
//! default partition), then the three clocks of `[retention]`, in bounded batches
//! (`herald_store::retention` holds the SQL). Used by `herald run` every
//! `retention.interval_secs` and by `herald retention run`.
//!
//! Always as the schema owner (`database.owner_url`, else `url`), on a connection or two of
//! its own. A pass that fails is logged and counted; the daemon keeps running and the next
//! pass continues where this one stopped (every batch is its own transaction).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Months, Utc};
use herald_store::partitions::{LockMode, UpkeepReport};
use herald_store::retention::{Cutoffs, IntentsRemoved, Removed, RetentionSession};
use herald_store::Store;
use herald_telemetry::Metrics;
use uuid::Uuid;

use crate::config::{Config, RetentionConfig};
use crate::shutdown::Shutdown;

/// Default-partition rows are counted up to this many: enough to alert on, cheap to read.
pub const DEFAULT_ROWS_CAP: i64 = 10_001;

/// Runs one clock's statement (`$step`, an expression removing up to `$batch` rows) until
/// a batch comes back short or the pass must stop, counting what it removed into `$total`
/// and `herald_retention_removed_total{what = $what}`. Each batch is its own transaction.
macro_rules! in_batches {
    ($cx:expr, $batch:expr, $total:expr, $what:literal, $step:expr) => {
        while ($cx.keep_going)() {
            let n = $step;
            $cx.count($what, n);
            $total += n;
            if n < $batch as u64 {
                break;
            }
        }
    };
}

/// The instants before which each clock removes, as of `now`.
pub fn cutoffs(r: &RetentionConfig, now: DateTime<Utc>) -> Cutoffs {
    let today = now.date_naive();
    Cutoffs {
        attempts: today
            .checked_sub_months(Months::new(r.attempt_months))
            .unwrap_or(today),
        payload_bodies: now - chrono::Duration::days(r.payload_body_days.into()),
        intents: r.intent_days.map(|d| now - chrono::Duration::days(d.into())),
        conflict_documents: now - chrono::Duration::days(r.conflict_document_days.into()),
        reject_bodies: now - chrono::Duration::days(r.reject_body_days.into()),
    }
}

/// What one pass did.
#[derive(Debug, Default, serde::Serialize)]
pub struct PassReport {
    /// `None`: another instance held the partition lock, or the upkeep failed.
    pub partitions_created: Option<Vec<String>>,
    /// Rows moved out of the default partition into partitions created now.
    pub rows_moved: u64,
    /// False: another instance was running a pass; the clocks did nothing here.
    pub clocks_ran: bool,
    pub removed: Removed,
    /// Suppression-list entries made before the digests were keyed, re-keyed (or lifted
    /// beside a keyed twin) from the sellers' addresses.
    pub suppressions_rekeyed: u64,
    /// Steps that failed, with their errors; the others ran.
    pub failures: Vec<(&'static str, String)>,
}

/// Where a pass runs from: the daemon only tries the partition lock (another instance's
/// upkeep is as good), a command waits for it.
pub struct PassContext<'a> {
    pub owner: &'a Store,
    pub config: &'a Config,
    pub metrics: Option<&'a Metrics>,
    pub upkeep_lock: LockMode,
    /// Checked between batches: false stops the pass (shutdown).
    pub keep_going: &'a (dyn Fn() -> bool + Sync),
}

impl PassContext<'_> {
    fn failed(&self, report: &mut PassReport, step: &'static str, e: herald_store::StoreError) {
        // The whole chain: tokio-postgres says "db error" and keeps PostgreSQL's message
        // (e.g. "must be owner of table notification_attempts") in its source.
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text = format!("{text}: {s}");
            source = s.source();
        }
        tracing::error!(step, error = %text, "retention step failed; the next pass tries again");
        if let Some(m) = self.metrics {
            m.retention_failed(step);
        }
        report.failures.push((step, text));
    }

    fn count(&self, what: &'static str, n: u64) {
        if let (Some(m), true) = (self.metrics, n > 0) {
            m.retention_removed(what, n);
        }
    }
}

/// One pass: partition upkeep, then the clocks (if this instance gets the retention lock).
#[tracing::instrument(skip_all)]
pub async fn pass(cx: &PassContext<'_>) -> PassReport {
    let mut report = PassReport::default();
    let now = Utc::now();
    let cutoffs = cutoffs(&cx.config.retention, now);
    match cx
        .owner
        .partition_upkeep(
            now.date_naive(),
            cx.config.database.attempt_partitions_ahead,
            cutoffs.attempts,
            cx.upkeep_lock,
        )
        .await
    {
        Ok(Some(UpkeepReport { created, moved })) => {
            for p in &created {
                tracing::info!(partition = %p, "attempt partition created");
            }
            report.rows_moved = moved.iter().map(|(_, n)| n).sum();
            report.partitions_created = Some(created);
        }
        Ok(None) => tracing::debug!("partition upkeep running elsewhere"),
        Err(e) => cx.failed(&mut report, "partition_upkeep", e),
    }
    let mut session = match cx.owner.retention_session().await {
        Ok(Some(s)) => s,
        Ok(None) => {
            tracing::debug!("a retention pass is running elsewhere");
            return report;
        }
        Err(e) => {
            cx.failed(&mut report, "connect", e);
            return report;
        }
    };
    report.clocks_ran = true;
    let batch = cx.config.retention.batch_size;
    if let Err(e) = attempts(cx, &mut session, &cutoffs, &mut report.removed).await {
        cx.failed(&mut report, "attempts", e);
    }
    if let Err(e) = payload_bodies(cx, &mut session, &cutoffs, batch, &mut report.removed).await {
        cx.failed(&mut report, "payload_bodies", e);
    }
    if let Some(cutoff) = cutoffs.intents {
        if let Err(e) = intents(cx, &mut session, cutoff, batch, &mut report.removed.intents).await {
            cx.failed(&mut report, "intents", e);
        }
    }
    if let Err(e) = evidence_documents(cx, &mut session, &cutoffs, batch, &mut report.removed).await {
        cx.failed(&mut report, "evidence_documents", e);
    }
    if let Err(e) = suppression_keys(cx, &mut session, batch, &mut report.suppressions_rekeyed).await {
        cx.failed(&mut report, "suppression_keys", e);
    }
    tracing::info!(
        partitions_dropped = report.removed.partitions.len(),
        default_attempts = report.removed.default_attempts,
        payload_bodies = report.removed.payload_bodies,
        provider_events = report.removed.provider_events,
        intents = report.removed.intents.intents,
        payloads = report.removed.intents.payloads,
        conflict_documents = report.removed.conflict_documents,
        reject_bodies = report.removed.reject_bodies,
        http_requests = report.removed.http_requests,
        suppressions_rekeyed = report.suppressions_rekeyed,
        failures = report.failures.len(),
        "retention pass done"
    );
    report
}

async fn attempts(
    cx: &PassContext<'_>,
    session: &mut RetentionSession,
    cutoffs: &Cutoffs,
    removed: &mut Removed,
) -> herald_store::Result<()> {
    match session.drop_attempt_partitions(cutoffs.attempts).await? {
        Some(dropped) => {
            cx.count("partitions", dropped.len() as u64);
            removed.partitions = dropped;
        }
        None => tracing::debug!("partition lock held elsewhere: no partition dropped this pass"),
    }
    let batch = cx.config.retention.batch_size;
    in_batches!(
        cx,
        batch,
        removed.default_attempts,
        "default_attempts",
        session.delete_default_attempts(cutoffs.attempts, batch).await?
    );
    in_batches!(
        cx,
        batch,
        removed.provider_events,
        "provider_events",
        session.delete_provider_events(cutoffs.attempts, batch).await?
    );
    Ok(())
}

/// HTTP ingest's expired keys (with their mismatches: nothing left to purge there), then
/// the evidence documents' clocks: each in batches until one comes back short.
async fn evidence_documents(
    cx: &PassContext<'_>,
    session: &mut RetentionSession,
    cutoffs: &Cutoffs,
    batch: i64,
    removed: &mut Removed,
) -> herald_store::Result<()> {
    in_batches!(
        cx,
        batch,
        removed.http_requests,
        "http_requests",
        session.delete_expired_http_requests(batch).await?
    );
    in_batches!(
        cx,
        batch,
        removed.conflict_documents,
        "conflict_documents",
        session
            .purge_conflict_documents(cutoffs.conflict_documents, batch)
            .await?
    );
    in_batches!(
        cx,
        batch,
        removed.reject_bodies,
        "reject_bodies",
        session.purge_reject_bodies(cutoffs.reject_bodies, batch).await?
    );
    Ok(())
}

/// The suppression list's unkeyed entries (made before V17), a batch at a time from the
/// lowest id; those no seller's profile names are passed over until the next pass.
async fn suppression_keys(
    cx: &PassContext<'_>,
    session: &mut RetentionSession,
    batch: i64,
    rekeyed: &mut u64,
) -> herald_store::Result<()> {
    let mut cursor = 0;
    while (cx.keep_going)() {
        let (changed, seen) = session.rekey_suppressions(batch, &mut cursor).await?;
        *rekeyed += changed;
        if seen < batch as usize {
            break;
        }
    }
    Ok(())
}

async fn payload_bodies(
    cx: &PassContext<'_>,
    session: &mut RetentionSession,
    cutoffs: &Cutoffs,
    batch: i64,
    removed: &mut Removed,
) -> herald_store::Result<()> {
    let mut cursor = (DateTime::<Utc>::UNIX_EPOCH, String::new());
    while (cx.keep_going)() {
        let (purged, seen) = session
            .purge_payload_bodies(cutoffs.payload_bodies, batch, &mut cursor)
            .await?;
        cx.count("payload_bodies", purged);
        removed.payload_bodies += purged;
        if seen < batch as usize {
            break;
        }
    }
    Ok(())
}

async fn intents(
    cx: &PassContext<'_>,
    session: &mut RetentionSession,
    cutoff: DateTime<Utc>,
    batch: i64,
    removed: &mut IntentsRemoved,
) -> herald_store::Result<()> {
    let mut cursor = Uuid::nil();
    while (cx.keep_going)() {
        let Some(done) = session.delete_intents(cutoff, batch, &mut cursor).await? else {
            break;
        };
        cx.count("intents", done.intents);
        cx.count("payloads", done.payloads);
        *removed += done;
    }
    Ok(())
}

/// `herald run`'s retention: a pass at start and every `retention.interval_secs` until
/// shutdown (a pass stops between batches). Never returns an error: failures are logged
/// and counted, and the next pass tries again.
pub async fn run(config: Arc<Config>, metrics: Arc<Metrics>, mut shutdown: Shutdown) {
    let every = Duration::from_secs(config.retention.interval_secs);
    if every.is_zero() {
        tracing::info!("retention.interval_secs = 0: no retention pass in this process");
        return;
    }
    metrics.init_retention();
    let owner = match Store::new(&config.owner_store()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "retention disabled: the owner's database settings are invalid");
            metrics.retention_failed("connect");
            return;
        }
    };
    loop {
        let sd = shutdown.clone();
        let keep_going = move || !sd.is_requested();
        let cx = PassContext {
            owner: &owner,
            config: &config,
            metrics: Some(&metrics),
            upkeep_lock: LockMode::Try,
            keep_going: &keep_going,
        };
        let report = pass(&cx).await;
        if report.clocks_ran && report.failures.is_empty() && !shutdown.is_requested() {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            metrics.gauges().set_retention_success(now.as_secs_f64());
        }
        tokio::select! {
            _ = shutdown.requested() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    #[test]
    fn cutoffs_count_back_from_now() {
        let now = DateTime::parse_from_rfc3339("2026-05-31T10:00:00Z")
            .unwrap()
            .to_utc();
        let c = cutoffs(&crate::config::Config::defaults().retention, now);
        // 6 calendar months back (the 31st of a 30-day month clamps to its last day).
        assert_eq!(c.attempts, NaiveDate::from_ymd_opt(2025, 11, 30).unwrap());
        assert_eq!(c.payload_bodies, now - chrono::Duration::days(90));
        assert_eq!(c.intents, None);
        let r = RetentionConfig {
            intent_days: Some(730),
            ..crate::config::Config::defaults().retention
        };
        assert_eq!(cutoffs(&r, now).intents, Some(now - chrono::Duration::days(730)));
    }
}
