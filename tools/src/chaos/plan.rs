//! What a scenario produces: orders with a run-unique tag in their ids, each published one
//! or more times (exact re-emissions, some from a second producer), and for a share of
//! them a re-emission with changed content. One seller in eight is late: its profile is
//! produced halfway through the orders, so its earlier orders are held (`awaiting_profile`)
//! and must be released and sent once, under the scenario's faults. The plan is also the
//! expectation the invariants are checked against.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::future::try_join_all;
use rdkafka::producer::FutureProducer;

use super::rng::Rng;
use integration_tests::kafka::{produce, producer};
use integration_tests::samples::{order_event, UniqueSeller};
use integration_tests::{publish_sellers, TestEnv};

/// The channels an `order.created` event is routed to in the test configuration.
pub const CHANNELS: [&str; 2] = ["email", "sms"];

pub struct PlanSpec {
    pub orders: usize,
    /// Each order event is produced 1..=max_copies times, identical bytes.
    pub max_copies: u64,
    /// Share of the copies produced by a second, independent producer.
    pub second_producer_share: f64,
    /// Share of the orders re-sent later with changed content (a different total).
    pub conflict_share: f64,
}

pub struct Message {
    pub order: usize,
    pub second_producer: bool,
    pub value: Vec<u8>,
}

pub struct Plan {
    /// In every order id of the run, unique to the run: what the provider received is
    /// attributed by it.
    pub tag: String,
    pub sellers: Vec<UniqueSeller>,
    pub orders: Vec<String>,
    /// The order events and their exact re-emissions, shuffled.
    pub messages: Vec<Message>,
    /// Re-emissions with changed content, produced after every message above was
    /// acknowledged, so each lands behind its original in the order's partition.
    pub conflicts: Vec<Message>,
}

const SELLERS: usize = 8;

impl Plan {
    pub fn new(spec: &PlanSpec, rng: &mut Rng) -> Self {
        // Not from the seed: a repeated seed must not count an earlier run's sends.
        let tag = format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let orders: Vec<String> = (0..spec.orders).map(|n| format!("{tag}-{n}")).collect();
        let mut messages = Vec::new();
        let mut conflicts = Vec::new();
        for (i, order) in orders.iter().enumerate() {
            let seller = Self::seller_id(Self::seller_of(i));
            let value = order_event(
                &format!("evt-{order}"),
                "order.created",
                "acme",
                order,
                &seller,
                "12.00",
            );
            for _ in 0..rng.range(1, spec.max_copies) {
                messages.push(Message {
                    order: i,
                    second_producer: rng.chance(spec.second_producer_share),
                    value: value.clone(),
                });
            }
            if rng.chance(spec.conflict_share) {
                conflicts.push(Message {
                    order: i,
                    second_producer: rng.chance(spec.second_producer_share),
                    value: order_event(
                        &format!("evt-{order}-changed"),
                        "order.created",
                        "acme",
                        order,
                        &seller,
                        "99.99",
                    ),
                });
            }
        }
        rng.shuffle(&mut messages);
        Self {
            tag,
            sellers: (0..SELLERS).map(|_| UniqueSeller::new()).collect(),
            orders,
            messages,
            conflicts,
        }
    }

    /// Index in `sellers` of the seller of the `n`-th order.
    pub fn seller_of(n: usize) -> usize {
        n % SELLERS
    }

    /// The seller id of `sellers[i]` in profiles and order events.
    pub fn seller_id(i: usize) -> String {
        format!("seller-{i}")
    }

    pub fn events(&self) -> usize {
        self.messages.len() + self.conflicts.len()
    }

    /// Exact re-emissions: events beyond the first of each order.
    pub fn duplicates(&self) -> usize {
        self.messages.len() - self.orders.len()
    }

    /// Business keys (order, channel) that must each end as one intent.
    pub fn expected_intents(&self) -> usize {
        self.orders.len() * CHANNELS.len()
    }

    /// Publishes the profiles (opted in, destinations of their own) of every seller but
    /// the late one and waits until they are stored, so that every order is routed with
    /// consent granted (the late seller's once its profile came).
    pub async fn seed_sellers(&self, env: &TestEnv) -> Result<()> {
        let ids: Vec<String> = (0..LATE_SELLER).map(Self::seller_id).collect();
        let profiles: Vec<_> = self
            .sellers
            .iter()
            .zip(&ids)
            .map(|(s, id)| s.profile(id))
            .collect();
        publish_sellers(env, &profiles).await
    }

    /// Produces the late seller's profile (acknowledged by the broker).
    async fn publish_late_seller(&self, p: &FutureProducer, topic: &str) -> Result<()> {
        let id = Self::seller_id(LATE_SELLER);
        let profile = self.sellers[LATE_SELLER].profile(&id);
        produce(p, topic, Some(&profile.key()), Some(&profile.value()), &[]).await?;
        Ok(())
    }
}

/// The seller whose profile comes halfway through the orders.
pub const LATE_SELLER: usize = SELLERS - 1;

/// What was produced, once every message was acknowledged by the broker.
pub struct Production {
    pub messages: usize,
    pub conflicts: usize,
}

/// How a production waits for the broker's acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Each slice waits for its acknowledgements: a broker outage stretches the
    /// production instead of losing it.
    SliceBySlice,
    /// Slices go out on time whatever the acknowledgements of the earlier ones, all awaited
    /// before the conflicting re-emissions: a producer as an application runs one, which
    /// goes on producing to the healthy partitions while one partition's leader is away.
    Pipelined,
}

/// Produces the plan's messages evenly over `over` (ten slices a second) from two
/// producers, the late seller's profile to `seller_topic` halfway, then, once every one
/// was acknowledged, the conflicting re-emissions.
pub async fn produce_plan(
    plan: Arc<Plan>,
    topic: String,
    seller_topic: String,
    over: Duration,
    pacing: Pacing,
) -> Result<Production> {
    let producers = Arc::new([producer()?, producer()?]);
    let slices = (over.as_millis() / 100).max(1) as usize;
    let per_slice = plan.messages.len().div_ceil(slices).max(1);
    let chunks = plan.messages.len().div_ceil(per_slice).max(1);
    let start = Instant::now();
    let mut in_flight = tokio::task::JoinSet::new();
    for (n, range) in (0..plan.messages.len()).step_by(per_slice).enumerate() {
        let chunk = range..(range + per_slice).min(plan.messages.len());
        if n == chunks / 2 {
            plan.publish_late_seller(&producers[0], &seller_topic).await?;
        }
        match pacing {
            Pacing::SliceBySlice => send_all(&producers, &plan, &topic, &plan.messages[chunk]).await?,
            Pacing::Pipelined => {
                let (producers, plan, topic) = (producers.clone(), plan.clone(), topic.clone());
                in_flight
                    .spawn(async move { send_all(&producers, &plan, &topic, &plan.messages[chunk]).await });
            }
        }
        // Evenly over the whole of `over`, however few the messages.
        let due = start + over.mul_f64((n + 1) as f64 / chunks as f64);
        tokio::time::sleep_until(due.into()).await;
    }
    while let Some(sent) = in_flight.join_next().await {
        sent??;
    }
    send_all(&producers, &plan, &topic, &plan.conflicts).await?;
    Ok(Production {
        messages: plan.messages.len(),
        conflicts: plan.conflicts.len(),
    })
}

async fn send_all(producers: &[FutureProducer; 2], plan: &Plan, topic: &str, msgs: &[Message]) -> Result<()> {
    try_join_all(msgs.iter().map(|m| {
        let key = plan.orders[m.order].as_bytes();
        produce(
            &producers[usize::from(m.second_producer)],
            topic,
            Some(key),
            Some(&m.value),
            &[],
        )
    }))
    .await?;
    Ok(())
}
