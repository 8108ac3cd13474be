//! Held intents (`awaiting_profile`) rendered with their seller's profile and frozen, in the
//! transaction that stores the profile (or in the hold sweeper's). An intent that does not
//! render with the profile stays held, its hold noting why; the wait still runs.

use std::collections::{BTreeSet, HashMap};

use anyhow::Context;
use herald_core::render::Renderer;
use herald_core::OrderEvent;
use herald_store::ingest::holds::{Decided, HeldIntent, Release};
use herald_store::IngestTx;
use tracing::{info, warn};
use uuid::Uuid;

use super::IngestStats;

/// What one release did, to report once its transaction committed.
#[derive(Default)]
pub struct Released {
    pub decided: Vec<Decided>,
    pub failed: Vec<(Uuid, String)>,
}

impl Released {
    /// Logs and counts what was decided. Call after the commit only.
    pub fn report(&self, stats: &IngestStats, how: &'static str) {
        for d in &self.decided {
            info!(intent_id = %d.intent_id, state = %d.state, held_secs = d.held_for.as_secs_f64(), how,
                  "held intent released: rendered and frozen with the seller's profile");
            count_observed(stats, d);
        }
        for (id, error) in &self.failed {
            warn!(intent_id = %id, error = %error, how,
                  "held intent did not render with the seller's profile: still held until its wait runs out");
        }
        stats.holds("released", self.decided.len());
        stats.holds("release_failed", self.failed.len());
    }
}

/// Counts a held intent decided `observed` (its route was in `observe` mode when it was
/// created).
pub fn count_observed(stats: &IngestStats, d: &Decided) {
    if d.state == herald_core::IntentState::Observed.as_str() {
        stats.held_intent_observed(&d.channel, &d.consent);
    }
}

/// Renders `held` with their sellers' stored profiles and freezes them in `tx`. Intents
/// whose seller has no profile (deleted meanwhile) are left held.
pub async fn release(
    tx: &IngestTx<'_>,
    renderer: &Renderer,
    held: Vec<HeldIntent>,
) -> anyhow::Result<Released> {
    if held.is_empty() {
        return Ok(Released::default());
    }
    let keys: Vec<(String, String)> = held
        .iter()
        .map(|h| (h.marketplace_id.clone(), h.seller_id.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let profiles = tx
        .sellers(&keys)
        .await
        .context("reading the profiles of held intents")?;
    let (releases, failed) = render(renderer, &profiles, held);
    let decided = tx.release(&releases).await.context("releasing held intents")?;
    tx.record_release_failures(&failed)
        .await
        .context("recording held intents that did not render")?;
    Ok(Released { decided, failed })
}

/// The pure part: each held intent with a profile, rendered (or why it did not render).
fn render(
    renderer: &Renderer,
    profiles: &HashMap<(String, String), herald_core::SellerProfile>,
    held: Vec<HeldIntent>,
) -> (Vec<Release>, Vec<(Uuid, String)>) {
    let mut releases = Vec::new();
    let mut failed = Vec::new();
    for h in held {
        let Some(profile) = profiles.get(&(h.marketplace_id.clone(), h.seller_id.clone())) else {
            continue;
        };
        // The event was decoded and validated when it was held; decoding it again gives
        // the same rendering context.
        let event = serde_json::to_vec(&h.event)
            .map_err(|e| e.to_string())
            .and_then(|bytes| OrderEvent::decode(&bytes, usize::MAX).map_err(|e| e.detail));
        let rendered = event.and_then(|event| {
            renderer
                .render(&h.template, h.channel, &event, Some(profile))
                .map_err(|e| e.to_string())
        });
        match rendered {
            Ok(payload) => releases.push(Release {
                intent_id: h.intent_id,
                digest: payload.digest(),
                payload,
                profile_version: profile.version,
            }),
            Err(e) => failed.push((h.intent_id, e)),
        }
    }
    (releases, failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::render::{RenderOptions, TemplateRevision};
    use herald_core::{Channel, ConsentDecision, SellerProfile};

    fn renderer() -> Renderer {
        let rev = |locale: &str, subject: &str| TemplateRevision {
            template: "order-created".into(),
            channel: Channel::Email,
            locale: locale.into(),
            revision: format!("{locale}-1"),
            subject: Some(subject.into()),
            body_text: "Total {{ order.total }}".into(),
            body_html: None,
        };
        Renderer::new(
            vec![
                rev("en", "Order {{ order_id }}"),
                rev("de", "Bestellung {{ order_id }}"),
            ],
            RenderOptions {
                default_locale: "en".into(),
                sms_max_segments: 3,
            },
        )
    }

    fn held(seller: &str, channel: Channel, event: serde_json::Value) -> HeldIntent {
        HeldIntent {
            intent_id: Uuid::now_v7(),
            marketplace_id: "acme".into(),
            seller_id: seller.into(),
            channel,
            template: "order-created".into(),
            event,
        }
    }

    #[test]
    fn held_intents_render_with_the_profile_or_say_why_not() {
        let order = serde_json::json!({"event_id":"e","event_kind":"order.created","marketplace_id":"acme",
            "order_id":"8042","seller_id":"s1","occurred_at":"2026-09-21T10:00:00Z","order":{"total":"9.90"}});
        let profile = SellerProfile {
            marketplace_id: "acme".into(),
            seller_id: "s1".into(),
            email: Some("s1@example.com".into()),
            phone: None,
            locale: Some("de".into()),
            email_opt_in: true,
            sms_opt_in: false,
            version: 7,
            suppressed: Default::default(),
        };
        let profiles = HashMap::from([(("acme".to_owned(), "s1".to_owned()), profile)]);
        let (releases, failed) = render(
            &renderer(),
            &profiles,
            vec![
                held("s1", Channel::Email, order.clone()),
                // No SMS template: stays held, with the reason.
                held("s1", Channel::Sms, order.clone()),
                // No profile for this seller: left alone.
                held("s2", Channel::Email, order),
            ],
        );
        assert_eq!(releases.len(), 1);
        let p = &releases[0].payload;
        assert_eq!(
            (p.locale.as_str(), p.subject.as_deref(), p.destination.as_deref()),
            ("de", Some("Bestellung 8042"), Some("s1@example.com"))
        );
        assert_eq!(p.consent, ConsentDecision::Granted);
        assert_eq!(releases[0].profile_version, 7);
        assert_eq!(releases[0].digest, p.digest());
        assert_eq!(failed.len(), 1);
        assert!(failed[0].1.contains("sms"), "{}", failed[0].1);
    }
}
