//! A production-like mix of order events for the telemetry tests and the volume
//! measurement: mostly routine orders (e-mail sent; SMS sent or suppressed by consent), a
//! share produced twice (a retrying producer), a share reused with another total
//! (conflicts), and a marketplace whose sender is not verified (its e-mail is rejected).
//! Every event carries a `traceparent` of its own, as an instrumented producer's would: one
//! trace per event. (An event without one is traced under its poll batch's `receive` span,
//! so its trace holds the whole batch.)

use anyhow::Result;
use serde_json::json;

use crate::kafka::{produce, producer};
use crate::samples::order_event;
use crate::TestEnv;

/// The marketplace whose e-mail is rejected, with the sender override that does it (set it
/// in Herald's environment).
pub const REJECTED_MARKETPLACE: &str = "rejectco";
pub const UNVERIFIED_SENDER: (&str, &str) = (
    "HERALD_CHANNELS__EMAIL__SENDER_OVERRIDES__REJECTCO",
    "orders@not-verified.example",
);

#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Orders of the marketplace whose e-mail is sent (one seller each).
    pub orders: usize,
    /// Orders of REJECTED_MARKETPLACE.
    pub rejected: usize,
    /// Every n-th order is produced twice (0: none).
    pub duplicate_every: usize,
    /// Every n-th order is produced again with another total (0: none).
    pub conflict_every: usize,
}

impl Mix {
    /// Intents the mix creates: two per order (e-mail and SMS).
    pub fn intents(&self) -> usize {
        2 * (self.orders + self.rejected)
    }

    pub fn conflicts(&self) -> usize {
        2 * every(self.orders, self.conflict_every)
    }
}

/// A `traceparent` starting a new sampled trace.
fn new_traceparent() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("00-{id}-{}-01", &id[..16])
}

fn every(n: usize, k: usize) -> usize {
    if k == 0 {
        0
    } else {
        n.div_ceil(k)
    }
}

/// Order `i`'s id in `marketplace`.
pub fn order_id(marketplace: &str, i: usize) -> String {
    format!("{marketplace}-{i}")
}

/// Produces the mix's seller profiles and, once ingest has stored them all (an order for a
/// seller not yet known is held, which is not routine), its order events. Sellers opt in to
/// e-mail; every other one to SMS. Needs an ingest role running.
pub async fn produce_mix(env: &TestEnv, mix: Mix) -> Result<()> {
    let p = producer()?;
    let markets = [("acme", mix.orders), (REJECTED_MARKETPLACE, mix.rejected)];
    for (marketplace, count) in markets {
        for i in 0..count {
            let seller = format!("seller-{i}");
            let profile = json!({"seller_id": seller, "marketplace_id": marketplace,
                "email": format!("{seller}@{marketplace}.example"), "phone": "+15555550123", "locale": "en",
                "email_opt_in": true, "sms_opt_in": i % 2 == 0, "version": 1});
            produce(
                &p,
                &env.topic("seller-profiles"),
                Some(format!("{marketplace}:{seller}").as_bytes()),
                Some(profile.to_string().as_bytes()),
                &[],
            )
            .await?;
        }
    }
    env.wait_count(
        "sellers stored",
        "SELECT count(*) FROM sellers",
        (mix.orders + mix.rejected) as i64,
        std::time::Duration::from_secs(300),
    )
    .await?;
    let orders = env.topic("order-events");
    for (marketplace, count) in markets {
        let routine = marketplace != REJECTED_MARKETPLACE;
        for i in 0..count {
            let seller = format!("seller-{i}");
            let order = order_id(marketplace, i);
            let copies = if routine && mix.duplicate_every > 0 && i % mix.duplicate_every == 0 {
                2
            } else {
                1
            };
            for copy in 0..copies {
                let event = order_event(
                    &format!("evt-{order}-{copy}"),
                    "order.created",
                    marketplace,
                    &order,
                    &seller,
                    "12.00",
                );
                let tp = new_traceparent();
                produce(
                    &p,
                    &orders,
                    Some(order.as_bytes()),
                    Some(&event),
                    &[("traceparent", &tp)],
                )
                .await?;
            }
            if routine && mix.conflict_every > 0 && i % mix.conflict_every == 0 {
                let changed = order_event(
                    &format!("evt-{order}-changed"),
                    "order.created",
                    marketplace,
                    &order,
                    &seller,
                    "99.00",
                );
                let tp = new_traceparent();
                produce(
                    &p,
                    &orders,
                    Some(order.as_bytes()),
                    Some(&changed),
                    &[("traceparent", &tp)],
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// Waits until every intent of the mix is final (accepted, suppressed or rejected), every
/// conflict is on record, and both consumer groups have caught up.
pub async fn wait_settled(env: &TestEnv, mix: Mix, timeout: std::time::Duration) -> Result<()> {
    env.wait_count(
        "every intent final",
        "SELECT count(*) FROM notification_intents WHERE state IN ('accepted', 'suppressed', 'rejected')",
        mix.intents() as i64,
        timeout,
    )
    .await?;
    env.wait_count(
        "every conflict on record",
        "SELECT count(*) FROM intent_conflicts",
        mix.conflicts() as i64,
        timeout,
    )
    .await?;
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"]).await
}
