//! The one place that decides whether a failed operation runs again, used by the ingest,
//! relay and delivery loops (in the manner of Svix's `run_with_retries(fun, should_retry,
//! schedule)`).
//!
//! Each library says what its errors are ([`StoreError::class`], [`KafkaError::class`]);
//! [`class_of`] finds the typed error under an `anyhow` chain and asks it. A transient
//! error is retried with capped, jittered, doubling backoff; a permanent one is handed
//! back to the caller, who isolates the input at fault (ingest) or, where giving up would
//! lose the truth (a record of a send that happened), says so in its predicate and keeps
//! trying.

use std::future::Future;
use std::time::Duration;

use herald_core::ErrorClass;
use herald_kafka::KafkaError;
use herald_store::StoreError;
use herald_telemetry::Metrics;
use tracing::{error, warn};

use crate::shutdown::Shutdown;

/// When to try again: `first`, doubling up to `max`, each delay drawn from its upper half
/// (so that workers retrying the same outage spread out).
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub first: Duration,
    pub max: Duration,
}

impl Schedule {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max: max.max(first),
        }
    }

    /// The delay after the `retry`-th consecutive failure (0-based), before jitter.
    fn ceiling(&self, retry: u32) -> Duration {
        self.first.saturating_mul(1u32 << retry.min(20)).min(self.max)
    }

    pub fn delay(&self, retry: u32, jitter: f64) -> Duration {
        self.ceiling(retry).mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }
}

/// Why [`run_with_retries`] returned without a result.
#[derive(Debug)]
pub enum GaveUp<E> {
    /// The predicate classed the error permanent: the same input fails the same way.
    Permanent(E, ErrorClass),
    /// Shutdown was requested while waiting to retry.
    Shutdown,
}

/// What a loop is retrying, for the log and the `stage` label of
/// `herald_batches_retried_total`.
#[derive(Clone, Copy)]
pub struct Stage<'a> {
    pub name: &'static str,
    pub metrics: &'a Metrics,
}

/// Runs `op` until it succeeds, its error is classed permanent by `should_retry`, or
/// `shutdown` (when given) is requested during a wait. Every retry is logged and counted by
/// stage and class.
pub async fn run_with_retries<T, E, Op, Fut>(
    stage: Stage<'_>,
    mut op: Op,
    should_retry: impl Fn(&E) -> ErrorClass,
    schedule: Schedule,
    mut shutdown: Option<&mut Shutdown>,
) -> Result<T, GaveUp<E>>
where
    E: std::fmt::Debug + std::fmt::Display,
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut retry = 0u32;
    loop {
        let e = match op().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let class = should_retry(&e);
        let ErrorClass::Transient(label) = class else {
            return Err(GaveUp::Permanent(e, class));
        };
        let wait = schedule.delay(retry, herald_core::retry::jitter());
        stage.metrics.batch_retried(stage.name, label);
        warn!(stage = stage.name, class = label, retry = retry + 1, retry_in_ms = wait.as_millis() as u64,
              error = %format!("{e:#}"), "transient failure; retrying");
        retry = retry.saturating_add(1);
        match shutdown.as_deref_mut() {
            Some(s) => tokio::select! {
                _ = s.requested() => return Err(GaveUp::Shutdown),
                _ = tokio::time::sleep(wait) => {}
            },
            None => tokio::time::sleep(wait).await,
        }
    }
}

/// The class of an error from the store or the Kafka side, wherever it sits in an `anyhow`
/// chain of context. An error of any other kind (none is expected) is transient: retrying
/// it cannot lose input, classing it permanent could.
pub fn class_of(e: &anyhow::Error) -> ErrorClass {
    e.chain()
        .find_map(|cause| {
            if let Some(s) = cause.downcast_ref::<StoreError>() {
                Some(s.class())
            } else {
                cause.downcast_ref::<KafkaError>().map(KafkaError::class)
            }
        })
        .unwrap_or(ErrorClass::Transient("other"))
}

/// For loops whose work must be stored whatever it takes (a claim holding permits, a record
/// of a send that happened): every error is retried, and one classed permanent is logged
/// as an error, since only an operator can end it.
pub fn always<E: std::fmt::Display>(class: impl Fn(&E) -> ErrorClass) -> impl Fn(&E) -> ErrorClass {
    move |e| match class(e) {
        ErrorClass::Permanent(label) => {
            error!(class = label, error = %e, "error classed permanent where giving up would lose the truth; retrying");
            ErrorClass::Transient(label)
        }
        transient => transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

    fn metrics() -> Metrics {
        Metrics::unexported()
    }

    #[derive(Debug)]
    struct Fails(ErrorClass);
    impl std::fmt::Display for Fails {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{:?}", self.0)
        }
    }

    fn quick() -> Schedule {
        Schedule::new(Duration::from_millis(1), Duration::from_millis(4))
    }

    /// Runs `run_with_retries` on an operation that fails `failures` times with `class`,
    /// then succeeds; returns its result and how many calls were made.
    async fn flaky(
        failures: u32,
        class: ErrorClass,
        should_retry: impl Fn(&Fails) -> ErrorClass,
    ) -> (Result<u32, GaveUp<Fails>>, u32) {
        let m = metrics();
        let calls = AtomicU32::new(0);
        let stage = Stage {
            name: "test",
            metrics: &m,
        };
        let op = || async {
            match calls.fetch_add(1, Relaxed) {
                n if n < failures => Err(Fails(class)),
                n => Ok(n),
            }
        };
        let r = run_with_retries(stage, op, should_retry, quick(), None).await;
        (r, calls.load(Relaxed))
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_success() {
        let (r, calls) = flaky(3, ErrorClass::Transient("connection"), |e| e.0).await;
        assert_eq!(r.unwrap(), 3);
        assert_eq!(calls, 4);
    }

    #[tokio::test]
    async fn a_permanent_error_is_handed_back_at_once() {
        let (r, calls) = flaky(u32::MAX, ErrorClass::Permanent("data_exception"), |e| e.0).await;
        assert!(matches!(
            r,
            Err(GaveUp::Permanent(_, ErrorClass::Permanent("data_exception")))
        ));
        assert_eq!(calls, 1, "never retried");
    }

    #[tokio::test]
    async fn always_retries_even_a_permanent_error() {
        let (r, calls) = flaky(
            1,
            ErrorClass::Permanent("data_exception"),
            always(|e: &Fails| e.0),
        )
        .await;
        assert_eq!(r.unwrap(), 1);
        assert_eq!(calls, 2);
    }

    #[test]
    fn the_schedule_doubles_up_to_its_cap_with_jitter_in_the_upper_half() {
        let s = Schedule::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(s.delay(0, 1.0), Duration::from_millis(100));
        assert_eq!(s.delay(0, 0.0), Duration::from_millis(50));
        assert_eq!(s.delay(3, 1.0), Duration::from_millis(800));
        assert_eq!(s.delay(9, 1.0), Duration::from_secs(1));
        assert_eq!(s.delay(u32::MAX, 1.0), Duration::from_secs(1));
    }

    #[test]
    fn typed_errors_are_found_under_context() {
        let db = anyhow::Error::new(StoreError::IntentNotFound("x".into())).context("converging intents");
        assert_eq!(class_of(&db), ErrorClass::Permanent("request_refused"));
        let other = anyhow::anyhow!("something else").context("outer");
        assert_eq!(class_of(&other), ErrorClass::Transient("other"));
    }
}
