//! Liveness and readiness. Alive = the process answers. Ready = PostgreSQL answers, the
//! Kafka cluster's metadata can be fetched, and every role started in this process is still
//! running. `herald_ready` exports the last readiness result.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_kafka::admin::Probe;
use herald_store::Store;
use herald_telemetry::Metrics;
use serde::Serialize;

const CHECK_TIMEOUT: Duration = Duration::from_secs(3);
const REFRESH_EVERY: Duration = Duration::from_secs(5);

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
}

#[derive(Debug, Clone, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub postgres: String,
    pub kafka: String,
    pub roles: BTreeMap<&'static str, RoleStatus>,
}

impl Health {
    pub fn new(store: Store, probe: Probe, topic: String, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            store,
            probe: Arc::new(probe),
            topic,
            metrics,
            roles: Mutex::new(BTreeMap::new()),
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
        let ready = postgres == "ok"
            && kafka == "ok"
            && !roles.is_empty()
            && roles.values().all(|s| *s == RoleStatus::Running);
        self.metrics.gauges().set_ready(ready);
        Readiness {
            ready,
            postgres,
            kafka,
            roles,
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
