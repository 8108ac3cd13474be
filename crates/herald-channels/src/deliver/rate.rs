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
    /// is no limit.
    pub fn reserve(&self, now: Instant) -> Option<Reservation> {
        let schedule = self.schedule.as_ref()?;
        let mut s = lock(schedule);
        let before = s.tat;
        let tat = before.map_or(now, |t| t.max(now));
        let at = tat.checked_sub(s.tolerance).map_or(now, |t| t.max(now));
        let after = tat + s.interval;
        s.tat = Some(after);
        Some(Reservation { at, before, after })
    }

    /// Gives a reservation back unused. If no later one was made, the schedule is as if it
    /// never had been; otherwise it leaves a gap (the rate only gets lower).
    pub fn cancel(&self, r: Reservation) {
        if let Some(schedule) = &self.schedule {
            let mut s = lock(schedule);
            if s.tat == Some(r.after) {
                s.tat = r.before;
            }
        }
    }
}

/// A reserved send: it may go at [`Reservation::at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    at: Instant,
    before: Option<Instant>,
    after: Instant,
}

impl Reservation {
    pub fn at(&self) -> Instant {
        self.at
    }
}

fn lock(schedule: &Mutex<Schedule>) -> std::sync::MutexGuard<'_, Schedule> {
    // A panic while holding the lock leaves a plain timestamp behind; keep going.
    schedule.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(limiter: &RateLimiter, now: Instant, n: usize) -> Vec<Duration> {
        (0..n)
            .map(|_| limiter.reserve(now).expect("limited").at() - now)
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
        let a = limiter.reserve(t0).unwrap().at();
        let b = limiter.reserve(t0).unwrap().at();
        let c = limiter.reserve(t0).unwrap().at();
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
    fn the_last_reservation_given_back_is_as_if_never_made() {
        let limiter = RateLimiter::per_second(1);
        let t0 = Instant::now();
        let first = limiter.reserve(t0).unwrap();
        let second = limiter.reserve(t0).unwrap();
        let third = limiter.reserve(t0).unwrap();
        assert_eq!(third.at() - t0, Duration::from_secs(2));
        limiter.cancel(third);
        limiter.cancel(second);
        assert_eq!(
            limiter.reserve(t0).unwrap().at() - t0,
            Duration::from_secs(1),
            "both gaps closed, in reverse order"
        );
        // Not the last one: a gap stays (the rate only gets lower).
        limiter.cancel(first);
        assert_eq!(limiter.reserve(t0).unwrap().at() - t0, Duration::from_secs(2));
    }

    #[test]
    fn zero_means_unlimited() {
        assert_eq!(RateLimiter::per_second(0).reserve(Instant::now()), None);
    }
}
