//! `[[routes]]`: which event kinds notify, with which template, on which channels, and
//! whether their intents are delivered or only observed.

use std::collections::BTreeSet;

use anyhow::bail;
use chrono::{DateTime, Utc};
use herald_core::Channel;
use serde::{Deserialize, Serialize};

/// Maps an event kind to a template and the channels it notifies on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub event_kind: String,
    pub template: String,
    pub channels: Vec<Channel>,
    /// `deliver` (the default) or `observe`: see [`RouteMode`].
    #[serde(default)]
    pub mode: RouteMode,
    /// With `mode = "deliver"`: events that occurred before this instant (their
    /// `occurred_at`) are still frozen `observed`. The switch from an older notifier is then
    /// a property of the event, not of when or by which instance it was processed: a backlog,
    /// a dead-letter replay, a re-emission or an instance not yet restarted decide the same.
    #[serde(default)]
    pub deliver_from: Option<DateTime<Utc>>,
}

impl Route {
    /// Whether an intent of an event that occurred at `occurred_at` is frozen `observed`.
    pub fn observes(&self, occurred_at: DateTime<Utc>) -> bool {
        match self.mode {
            RouteMode::Observe => true,
            RouteMode::Deliver => self.deliver_from.is_some_and(|from| occurred_at < from),
        }
    }
}

/// What a route's intents become once frozen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// Queued for delivery (state `pending`, or `suppressed` without consent).
    #[default]
    Deliver,
    /// The adoption path's first step, while another notifier still sends: converged,
    /// rendered, consent decided and frozen, counted and traced, then `observed` and never
    /// sent. The mode is decided when the intent is created (a held one remembers it):
    /// switching the route to `deliver` affects only intents created afterwards.
    Observe,
}

/// Each route's keys, and no event kind routed twice.
pub(super) fn validate(routes: &[Route]) -> anyhow::Result<()> {
    let mut kinds = BTreeSet::new();
    for (n, r) in routes.iter().enumerate() {
        if r.event_kind.trim().is_empty() {
            bail!("routes[{n}].event_kind is empty");
        }
        if !kinds.insert(r.event_kind.as_str()) {
            bail!("routes[{n}].event_kind = {:?} is routed twice", r.event_kind);
        }
        if r.template.trim().is_empty() {
            bail!("routes[{n}].template is empty");
        }
        if r.channels.is_empty() {
            bail!("routes[{n}].channels is empty");
        }
        if r.channels.iter().collect::<BTreeSet<_>>().len() != r.channels.len() {
            bail!("routes[{n}].channels lists a channel twice");
        }
        if r.mode == RouteMode::Observe && r.deliver_from.is_some() {
            bail!("routes[{n}].deliver_from applies to mode = \"deliver\" only (an observed route sends nothing)");
        }
    }
    Ok(())
}
