//! Per-channel send-rate limit (SES `MaxSendRate`, SNS SMS transactions per second),
//! shared by every attempt of one channel in this process. It spaces sends; it does not
//! decide anything about their outcome.
//!
//! A FIFO schedule (GCRA: a theoretical arrival time advanced by one interval per send,
//! with a burst of one second's worth): each caller reserves the moment its send may go
//! and sleeps until then. The reservation is immediate and in arrival order, so a claimed
//! attempt knows at once how long it will wait, and no waiter is overtaken by later ones;
//! that is what lets the delivery worker size its claims so that every wait fits in the
//! lease (`herald_core::lease`). A token bucket polled by many waiters (governor's
//! `until_ready`) gives neither.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct RateLimiter {
    schedule: Option<Mutex<Schedule>>,
}

#[derive(Debug)]
struct Schedule {
    interval: Duration,
    /// How far ahead of `now` the theoretical arrival time may be while a send still goes
    /// at once: the burst, less one interval.
    tolerance: Duration,
    /// The theoretical arrival time of the next send.
    tat: Option<Instant>,
}

impl RateLimiter {
    /// `rate` sends per second with a burst of `rate`; `0` means no limit.
    pub fn per_second(rate: u32) -> Self {
        let schedule = (rate > 0).then(|| {
            let interval = Duration::from_secs(1) / rate;
            Mutex::new(Schedule {
                interval,
                tolerance: interval * (rate - 1),
                tat: None,
            })
        });
        Self { schedule }
    }

    /// Reserves the next send: the moment (at or after `now`) it may go. `None` when there
    /// is no limit. A reservation that is not used leaves a gap: the rate only gets lower.
    pub fn reserve(&self, now: Instant) -> Option<Instant> {
        let schedule = self.schedule.as_ref()?;
        // A panic while holding the lock leaves a plain timestamp behind; keep going.
        let mut s = schedule.lock().unwrap_or_else(|e| e.into_inner());
        let tat = s.tat.map_or(now, |t| t.max(now));
        let at = tat.checked_sub(s.tolerance).map_or(now, |t| t.max(now));
        s.tat = Some(tat + s.interval);
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(limiter: &RateLimiter, now: Instant, n: usize) -> Vec<Duration> {
        (0..n)
            .map(|_| limiter.reserve(now).expect("limited") - now)
            .collect()
    }

    #[test]
    fn a_burst_goes_at_once_then_sends_are_spaced_by_the_rate() {
        let limiter = RateLimiter::per_second(4);
        let now = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(
            offsets(&limiter, now, 7),
            [ms(0), ms(0), ms(0), ms(0), ms(250), ms(500), ms(750)]
        );
    }

    #[test]
    fn reservations_are_first_come_first_served_and_refill_over_time() {
        let limiter = RateLimiter::per_second(2);
        let t0 = Instant::now();
        let a = limiter.reserve(t0).unwrap();
        let b = limiter.reserve(t0).unwrap();
        let c = limiter.reserve(t0).unwrap();
        assert!(a <= b && b < c, "in arrival order");
        assert_eq!(c - t0, Duration::from_millis(500));
        // Ten quiet seconds later the burst is available again, not ten seconds' worth.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(
            offsets(&limiter, later, 3),
            [Duration::ZERO, Duration::ZERO, Duration::from_millis(500)]
        );
    }

    #[test]
    fn zero_means_unlimited() {
        assert_eq!(RateLimiter::per_second(0).reserve(Instant::now()), None);
    }
}
