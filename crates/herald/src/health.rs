//! Liveness and readiness. Alive = the process answers. Ready = PostgreSQL answers, the
//! Kafka cluster's metadata can be fetched, and every role started in this process is still
//! running. The checks run in the background every few seconds ([`Health::refresh_loop`]);
//! a probe is answered from their last result ([`Health::readiness`]), so probes cost
//! neither a database connection nor a Kafka round trip, however often they come.
//! `herald_ready` exports the last result.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_kafka::admin::Probe;
use herald_store::Store;
use herald_telemetry::Metrics;
use serde::Serialize;

const CHECK_TIMEOUT: Duration = Duration::from_secs(3);
const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// A result older than this (the refresh loop is stuck) is not ready.
const STALE_AFTER: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RoleStatus {
    Running,
    Stopped,
    Failed(String),
}

pub struct Health {
    store: Store,
    probe: Arc<Probe>,
    /// Any of Herald's topics: its metadata proves the cluster answers for it.
    topic: String,
    metrics: Arc<Metrics>,
    roles: Mutex<BTreeMap<&'static str, RoleStatus>>,
    last: Mutex<Option<(std::time::Instant, Readiness)>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub postgres: String,
    pub kafka: String,
    pub roles: BTreeMap<&'static str, RoleStatus>,
    /// When PostgreSQL and Kafka were checked.
    pub checked_at: chrono::DateTime<chrono::Utc>,
}

impl Health {
    pub fn new(store: Store, probe: Probe, topic: String, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            store,
            probe: Arc::new(probe),
            topic,
            metrics,
            roles: Mutex::new(BTreeMap::new()),
            last: Mutex::new(None),
        })
    }

    pub fn set_role(&self, role: &'static str, status: RoleStatus) {
        self.roles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(role, status);
    }

    /// Checks everything now (bounded by a few seconds) and updates `herald_ready`.
    pub async fn check(&self) -> Readiness {
        let postgres = match tokio::time::timeout(CHECK_TIMEOUT, self.store.ping()).await {
            Ok(Ok(())) => "ok".to_owned(),
            Ok(Err(e)) => format!("error: {e}"),
            Err(_) => format!("error: no answer within {CHECK_TIMEOUT:?}"),
        };
        let (probe, topic) = (self.probe.clone(), self.topic.clone());
        let kafka = match tokio::task::spawn_blocking(move || probe.check(&topic, CHECK_TIMEOUT)).await {
            Ok(Ok(())) => "ok".to_owned(),
            Ok(Err(e)) => format!("error: {e}"),
            Err(e) => format!("error: {e}"),
        };
        let roles = self.roles.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let checked_at = chrono::Utc::now();
        let ready = postgres == "ok"
            && kafka == "ok"
            && !roles.is_empty()
            && roles.values().all(|s| *s == RoleStatus::Running);
        self.metrics.gauges().set_ready(ready);
        let r = Readiness {
            ready,
            postgres,
            kafka,
            roles,
            checked_at,
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((std::time::Instant::now(), r.clone()));
        r
    }

    /// The last background check, with the roles as they are now: not ready before the
    /// first check, or when the last one is older than [`STALE_AFTER`].
    pub fn readiness(&self) -> Readiness {
        let roles = self.roles.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let running = !roles.is_empty() && roles.values().all(|s| *s == RoleStatus::Running);
        match last {
            Some((at, r)) if at.elapsed() <= STALE_AFTER => Readiness {
                ready: r.postgres == "ok" && r.kafka == "ok" && running,
                roles,
                ..r
            },
            Some((_, r)) => Readiness {
                ready: false,
                postgres: format!("stale: not checked for over {STALE_AFTER:?} ({})", r.postgres),
                kafka: format!("stale: not checked for over {STALE_AFTER:?} ({})", r.kafka),
                roles,
                checked_at: r.checked_at,
            },
            None => Readiness {
                ready: false,
                postgres: "not checked yet".into(),
                kafka: "not checked yet".into(),
                roles,
                checked_at: chrono::Utc::now(),
            },
        }
    }

    /// Keeps `herald_ready` current between probes; logs transitions.
    pub async fn refresh_loop(self: Arc<Self>) {
        let mut was: Option<bool> = None;
        loop {
            let r = self.check().await;
            if was != Some(r.ready) {
                if r.ready {
                    tracing::info!("ready");
                } else {
                    tracing::warn!(postgres = %r.postgres, kafka = %r.kafka, roles = ?r.roles, "not ready");
                }
                was = Some(r.ready);
            }
            tokio::time::sleep(REFRESH_EVERY).await;
        }
    }
}
