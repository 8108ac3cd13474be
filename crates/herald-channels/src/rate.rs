//! Per-channel send-rate limit (SES `MaxSendRate`, SNS SMS transactions per second): a
//! token bucket from `governor`, shared by every attempt of one channel in this process.
//! It spaces sends; it does not decide anything about their outcome.

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, Quota};

/// A token bucket refilled at `rate` per second with a burst of `rate`.
#[derive(Debug)]
pub struct RateLimiter {
    bucket: Option<DefaultDirectRateLimiter>,
}

impl RateLimiter {
    /// `rate` sends per second; `0` means no limit.
    pub fn per_second(rate: u32) -> Self {
        let bucket = NonZeroU32::new(rate).map(|r| governor::RateLimiter::direct(Quota::per_second(r)));
        Self { bucket }
    }

    /// Waits until one more send fits in the rate.
    pub async fn acquire(&self) {
        if let Some(bucket) = &self.bucket {
            bucket.until_ready().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[tokio::test]
    async fn sends_beyond_the_burst_wait_for_the_rate() {
        let limiter = RateLimiter::per_second(10);
        let start = Instant::now();
        for _ in 0..10 {
            limiter.acquire().await;
        }
        assert!(
            start.elapsed() < Duration::from_millis(50),
            "the burst is immediate"
        );
        limiter.acquire().await;
        limiter.acquire().await;
        // two more tokens at 10/s: about 200 ms after the burst
        assert!(
            start.elapsed() >= Duration::from_millis(150),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn zero_means_unlimited() {
        let limiter = RateLimiter::per_second(0);
        let start = Instant::now();
        for _ in 0..10_000 {
            limiter.acquire().await;
        }
        assert!(start.elapsed() < Duration::from_millis(500));
    }
}
