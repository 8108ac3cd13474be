//! Grouping the database work of many attempts: the claims of the attempts about to start
//! go in one statement, the records of the attempts just finished in another, each
//! gathered for at most `delivery.db_batch_linger_ms` or `delivery.db_batch_max` attempts,
//! several statements of each kind in flight at once. So PostgreSQL sees a few hundred
//! transactions a second, not two per send. Knows nothing of claims or records.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use herald_store::StoreError;
use tokio::sync::{mpsc, Semaphore};

use crate::retrying::{always, run_with_retries, Schedule, Stage};

/// Receives one item, then whatever else arrives within the linger time, up to `max`.
async fn gather<T>(rx: &mut mpsc::Receiver<T>, max: usize, linger: Duration) -> Option<Vec<T>> {
    let first = rx.recv().await?;
    let mut batch = vec![first];
    let deadline = tokio::time::Instant::now() + linger;
    while batch.len() < max {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(item)) => batch.push(item),
            Ok(None) | Err(_) => break,
        }
    }
    Some(batch)
}

/// Statements of one kind (claims, or records) running at once: batches are pipelined, so
/// one commit in progress does not hold up the attempts gathering behind it.
const CONCURRENT_BATCHES: usize = 4;

/// Gathers batches from `rx` and runs `work` on each, up to [`CONCURRENT_BATCHES`] at once.
/// Returns once `rx` is closed and every batch has finished.
pub async fn pipelined<T, F, Fut>(mut rx: mpsc::Receiver<T>, max: usize, linger: Duration, work: F)
where
    T: Send + 'static,
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(CONCURRENT_BATCHES));
    while let Some(batch) = gather(&mut rx, max, linger).await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let job = work(batch);
        tokio::spawn(async move {
            job.await;
            drop(slot);
        });
    }
    let _ = slots.acquire_many(CONCURRENT_BATCHES as u32).await;
}

/// Runs `op` until it succeeds, backing off up to 5 s. Used where giving up would lose
/// the truth: a claim already holds permits, a record describes a send that happened. So
/// even an error classed permanent is retried (and logged as an error).
pub async fn until_ok<T, F, Fut>(stage: Stage<'_>, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let schedule = Schedule::new(Duration::from_millis(50), Duration::from_secs(5));
    loop {
        // `always` classes nothing permanent and no shutdown is passed: only `Ok` returns.
        if let Ok(v) = run_with_retries(stage, &mut op, always(StoreError::class), schedule, None).await {
            return v;
        }
    }
}
