//! Evidence is append-only: an attempt recorded `unknown` stays `unknown`, so the number of
//! `unknown` attempts may only grow during a run. [`UnknownWatch`] samples it every
//! quarter second while a scenario runs and keeps every fall it sees (invariant h).
//! Samples that fail (PostgreSQL is down in some scenarios) are skipped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio::task::JoinHandle;

use integration_tests::{pg_connect, wait_for};

#[derive(Default)]
struct Seen {
    samples: u64,
    last: Option<i64>,
    falls: Vec<String>,
}

pub struct UnknownWatch {
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

const EVERY: Duration = Duration::from_millis(250);

impl UnknownWatch {
    pub fn start(db_url: String) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut db = None;
                loop {
                    if db.is_none() {
                        db = pg_connect(&db_url).await.ok();
                    }
                    if let Some(client) = &db {
                        match client
                            .query_one(
                                "SELECT count(*) FROM notification_attempts WHERE outcome = 'unknown'",
                                &[],
                            )
                            .await
                        {
                            Ok(row) => seen.lock().unwrap_or_else(|e| e.into_inner()).add(row.get(0)),
                            Err(_) => db = None,
                        }
                    }
                    tokio::time::sleep(EVERY).await;
                }
            }
        });
        Self { seen, task }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until two more samples were taken (one may have started before the caller's
    /// change).
    pub async fn two_more_samples(&self) -> Result<()> {
        let from = self.lock().samples;
        wait_for(
            "two samples of the unknown attempts",
            Duration::from_secs(30),
            || async { Ok((self.lock().samples >= from + 2).then_some(())) },
        )
        .await
    }

    /// The falls seen so far, forgotten (for a canary that caused one on purpose).
    pub fn take_falls(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().falls)
    }

    /// Stops sampling; returns (samples taken, falls seen).
    pub fn stop(self) -> (u64, Vec<String>) {
        self.task.abort();
        let mut seen = self.lock();
        (seen.samples, std::mem::take(&mut seen.falls))
    }
}

impl Seen {
    fn add(&mut self, unknown: i64) {
        self.samples += 1;
        if let Some(last) = self.last.filter(|last| unknown < *last) {
            self.falls.push(format!(
                "unknown attempts fell from {last} to {unknown} at sample {}",
                self.samples
            ));
        }
        self.last = Some(unknown);
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn only_a_fall_is_a_finding() {
        let mut s = Seen::default();
        for n in [0, 0, 2, 5, 5, 9] {
            s.add(n);
        }
        assert!(s.falls.is_empty());
        s.add(8);
        assert_eq!(s.falls.len(), 1, "{:?}", s.falls);
        assert!(s.falls[0].contains("from 9 to 8"));
    }
}
