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

/// Receives one item, then whatever else arrives within the linger time, up to `max`. With
/// no linger, only what is already queued: a timer, even one due now, may fire only at the
/// timer's next millisecond tick.
async fn gather<T>(rx: &mut mpsc::Receiver<T>, max: usize, linger: Duration) -> Option<Vec<T>> {
    let first = rx.recv().await?;
    let mut batch = vec![first];
    let deadline = tokio::time::Instant::now() + linger;
    while batch.len() < max {
        let next = if linger.is_zero() {
            rx.try_recv().ok()
        } else {
            tokio::time::timeout_at(deadline, rx.recv()).await.ok().flatten()
        };
        match next {
            Some(item) => batch.push(item),
            None => break,
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    // Time is paused in these tests: it moves only when every task waits on a timer, so
    // `start.elapsed()` is exactly how long `gather` waited.
    const HOUR: Duration = Duration::from_secs(3600);

    async fn queued(items: std::ops::Range<u32>) -> (mpsc::Sender<u32>, mpsc::Receiver<u32>) {
        let (tx, rx) = mpsc::channel(64);
        for i in items {
            tx.send(i).await.unwrap();
        }
        (tx, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_without_waiting_out_the_linger() {
        let (_tx, mut rx) = queued(0..5).await;
        let start = Instant::now();
        assert_eq!(gather(&mut rx, 3, HOUR).await, Some(vec![0, 1, 2]));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_channel_ends_the_wait_at_once_then_the_batches() {
        let (tx, mut rx) = queued(0..2).await;
        drop(tx);
        let start = Instant::now();
        assert_eq!(gather(&mut rx, 10, HOUR).await, Some(vec![0, 1]));
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a drain does not wait for company"
        );
        assert_eq!(gather(&mut rx, 10, HOUR).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_linger_runs_from_the_first_item_and_takes_nothing_later() {
        let ms = Duration::from_millis;
        let (tx, mut rx) = mpsc::channel(64);
        let start = Instant::now();
        let sender = tokio::spawn(async move {
            for (at, item) in [(5, 0), (6, 1), (8, 2)] {
                tokio::time::sleep_until(start + ms(at)).await;
                tx.send(item).await.unwrap();
            }
            tx
        });
        assert_eq!(gather(&mut rx, 10, ms(2)).await, Some(vec![0, 1]));
        assert_eq!(
            start.elapsed(),
            ms(7),
            "the first item at 5 ms, then 2 ms of linger"
        );
        let _tx = sender.await.unwrap();
        assert_eq!(gather(&mut rx, 10, ms(2)).await, Some(vec![2]));
    }

    #[tokio::test(start_paused = true)]
    async fn no_linger_takes_what_is_queued_and_waits_not_at_all() {
        let (_tx, mut rx) = queued(0..3).await;
        let start = Instant::now();
        assert_eq!(gather(&mut rx, 10, Duration::ZERO).await, Some(vec![0, 1, 2]));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn batches_overlap_up_to_the_limit_and_all_finish_before_it_returns() {
        let (tx, rx) = queued(0..20).await;
        drop(tx);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(Mutex::new(Vec::new()));
        pipelined(rx, 2, Duration::ZERO, |batch| {
            let (running, most, done) = (running.clone(), most.clone(), done.clone());
            async move {
                most.fetch_max(running.fetch_add(1, SeqCst) + 1, SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                running.fetch_sub(1, SeqCst);
                done.lock().unwrap().extend(batch);
            }
        })
        .await;
        assert_eq!(most.load(SeqCst), CONCURRENT_BATCHES);
        let mut done = done.lock().unwrap().clone();
        done.sort_unstable();
        assert_eq!(done, (0..20).collect::<Vec<_>>(), "every batch ran to its end");
    }
}
