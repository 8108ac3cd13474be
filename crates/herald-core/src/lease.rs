//! What a delivery lease can cover: the last moment a claimed attempt may still start its
//! provider request, and how many attempts of one channel may be claimed and waiting at
//! once, so that every send that starts also ends inside the lease PostgreSQL granted.
//!
//! A claimed attempt waits, in this order, for its channel's rate (a FIFO schedule), for
//! a send slot (FIFO; at most as many attempts wait for one as there are slots, so the
//! wait is at most one attempt timeout), then sends (at most one attempt timeout). The
//! margin covers the claim's round trip, scheduling and the record. So the rate wait may
//! use the lease less two attempt timeouts and the margin, and a channel may have as many
//! attempts claimed and waiting as its rate lets through in that time.
//!
//! Times are measured on the worker's monotonic clock from the moment the claim request
//! left: PostgreSQL started the lease no earlier than that, so the worker's deadline is
//! never later than the lease's end, whatever either clock says.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseBudget {
    /// The lease PostgreSQL grants at each claim (`delivery.lease_secs`).
    pub lease: Duration,
    /// The longest one provider request may take (`aws.attempt_timeout_ms`).
    pub attempt_timeout: Duration,
    /// Kept free at the end of the lease (`delivery.lease_margin_ms`).
    pub margin: Duration,
}

impl LeaseBudget {
    /// The last moment a send may start for a claim whose request left at `claim_sent`:
    /// the request must be over (one attempt timeout) with the margin to spare.
    pub fn send_deadline(&self, claim_sent: Instant) -> Instant {
        claim_sent + self.lease.saturating_sub(self.attempt_timeout + self.margin)
    }

    /// How long a claimed attempt may wait for its channel's rate.
    pub fn rate_wait(&self) -> Duration {
        self.lease.saturating_sub(self.attempt_timeout * 2 + self.margin)
    }

    /// How many attempts of a channel limited to `rate_per_second` may be claimed and not
    /// yet sent at once: what the rate lets through in [`LeaseBudget::rate_wait`]. 0 means
    /// not even one: the configuration cannot work (validation refuses it).
    pub fn claim_window(&self, rate_per_second: u32) -> usize {
        (f64::from(rate_per_second) * self.rate_wait().as_secs_f64()).floor() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(lease: u64, attempt_timeout: u64, margin: u64) -> LeaseBudget {
        LeaseBudget {
            lease: Duration::from_secs(lease),
            attempt_timeout: Duration::from_secs(attempt_timeout),
            margin: Duration::from_secs(margin),
        }
    }

    #[test]
    fn a_send_must_end_inside_the_lease_with_the_margin_to_spare() {
        let b = budget(15, 4, 3);
        let t = Instant::now();
        assert_eq!(b.send_deadline(t), t + Duration::from_secs(8));
        // A lease shorter than one attempt: no send may start at all.
        assert_eq!(budget(5, 4, 3).send_deadline(t), t);
    }

    #[test]
    fn the_claim_window_is_what_the_rate_sends_within_the_lease() {
        // The case: 1/s with a 60 s lease cannot claim 512.
        assert_eq!(budget(60, 10, 3).claim_window(1), 37);
        // An SES sandbox account at 2/s, 15 s lease, 4 s attempts: 15 - 8 - 3 = 4 s.
        assert_eq!(budget(15, 4, 3).claim_window(2), 8);
        assert_eq!(budget(60, 10, 3).claim_window(14), 518);
        // Nothing fits: validation must refuse this.
        assert_eq!(budget(12, 5, 3).claim_window(100), 0);
        assert_eq!(budget(14, 5, 3).claim_window(0), 0);
    }
}
