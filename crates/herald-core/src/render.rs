//! Template revisions and rendering: turns an order event, the seller's profile and the
//! active template revision into a frozen [`Payload`].
//!
//! minijinja runs with strict undefined behaviour (a missing variable is an error, not an
//! empty string); HTML bodies are auto-escaped; subjects lose CR/LF so no header can be
//! injected; SMS text must fit the configured number of segments. Data is never evaluated
//! as a template, so `{{ 7*7 }}` inside an order field renders literally.

use std::collections::HashMap;

use minijinja::{Environment, UndefinedBehavior};
use serde_json::{json, Map, Value};

use crate::channel::Channel;
use crate::consent::decide;
use crate::event::OrderEvent;
use crate::payload::Payload;
use crate::seller::SellerProfile;

/// Largest rendered body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// One immutable template revision as stored in `templates`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRevision {
    pub template: String,
    pub channel: Channel,
    pub locale: String,
    pub revision: String,
    pub subject: Option<String>,
    pub body_text: String,
    pub body_html: Option<String>,
}

impl TemplateRevision {
    /// The content digest that makes re-publishing a revision with other content detectable.
    pub fn content_digest(&self) -> String {
        let opt = |o: &Option<String>| {
            o.as_deref()
                .map(|s| format!("1{s}"))
                .unwrap_or_else(|| "0".into())
        };
        crate::digest::fields_hex(&[
            b"template-v1",
            opt(&self.subject).as_bytes(),
            self.body_text.as_bytes(),
            opt(&self.body_html).as_bytes(),
        ])
    }

    /// Checks a revision before it is published: the parts its channel needs, and that
    /// every part compiles.
    pub fn validate(&self) -> Result<(), String> {
        match self.channel {
            Channel::Email if self.subject.as_deref().is_none_or(|s| s.trim().is_empty()) => {
                return Err("an e-mail template needs a subject".into())
            }
            Channel::Sms if self.subject.is_some() || self.body_html.is_some() => {
                return Err("an SMS template has a body only (no subject, no HTML)".into())
            }
            _ => {}
        }
        if self.body_text.trim().is_empty() {
            return Err("the text body is empty".into());
        }
        let mut env = Environment::new();
        for (part, name, source) in self.parts() {
            env.add_template_owned(name, source.to_owned())
                .map_err(|e| format!("{part} does not compile: {e:#}"))?;
        }
        Ok(())
    }

    fn name(&self, part: &str) -> String {
        format!(
            "{}/{}/{}/{}/{part}",
            self.template, self.channel, self.locale, self.revision
        )
    }

    fn parts(&self) -> Vec<(&'static str, String, &str)> {
        let mut parts = vec![("body", self.name("body.txt"), self.body_text.as_str())];
        if let Some(s) = &self.subject {
            parts.push(("subject", self.name("subject.txt"), s));
        }
        if let Some(h) = &self.body_html {
            parts.push(("html body", self.name("body.html"), h));
        }
        parts
    }
}

#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// Last step of the locale fallback (`fr-CA` -> `fr` -> this).
    pub default_locale: String,
    /// Most SMS segments a rendered text may need.
    pub sms_max_segments: u32,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum RenderError {
    #[error(
        "no active revision of template {template:?} for {channel} in locale {locale:?} or its fallbacks"
    )]
    Missing {
        template: String,
        channel: Channel,
        locale: String,
    },
    #[error("template {template:?} revision {revision:?} ({channel}, {locale}) failed: {detail}")]
    Failed {
        template: String,
        channel: Channel,
        locale: String,
        revision: String,
        detail: String,
    },
}

/// The active revisions, compiled once for a batch of events.
pub struct Renderer {
    env: Environment<'static>,
    active: HashMap<(String, Channel, String), TemplateRevision>,
    compile_errors: HashMap<String, String>,
    options: RenderOptions,
}

impl Renderer {
    pub fn new(active: Vec<TemplateRevision>, options: RenderOptions) -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        let mut compile_errors = HashMap::new();
        for rev in &active {
            for (_, name, source) in rev.parts() {
                if let Err(e) = env.add_template_owned(name.clone(), source.to_owned()) {
                    compile_errors.insert(name, format!("{e:#}"));
                }
            }
        }
        let active = active
            .into_iter()
            .map(|r| ((r.template.clone(), r.channel, r.locale.clone()), r))
            .collect();
        Self {
            env,
            active,
            compile_errors,
            options,
        }
    }

    /// Locale fallback: exact, then the language alone, then the default locale.
    pub fn resolve(&self, template: &str, channel: Channel, locale: &str) -> Option<&TemplateRevision> {
        let language = locale.split(['-', '_']).next().unwrap_or(locale);
        [locale, language, self.options.default_locale.as_str()]
            .into_iter()
            .find_map(|l| self.active.get(&(template.to_owned(), channel, l.to_owned())))
    }

    /// Renders the payload of one (event, channel). The consent decision is taken here so
    /// that it is frozen with the content.
    pub fn render(
        &self,
        template: &str,
        channel: Channel,
        event: &OrderEvent,
        seller: Option<&SellerProfile>,
    ) -> Result<Payload, RenderError> {
        let wanted_locale = seller
            .and_then(|s| s.locale.clone())
            .unwrap_or_else(|| self.options.default_locale.clone());
        let rev = self
            .resolve(template, channel, &wanted_locale)
            .ok_or_else(|| RenderError::Missing {
                template: template.to_owned(),
                channel,
                locale: wanted_locale.clone(),
            })?;
        let fail = |detail: String| RenderError::Failed {
            template: rev.template.clone(),
            channel,
            locale: rev.locale.clone(),
            revision: rev.revision.clone(),
            detail,
        };
        let ctx = context(event, seller);
        let run = |part: &str| -> Result<String, RenderError> {
            let name = rev.name(part);
            if let Some(e) = self.compile_errors.get(&name) {
                return Err(fail(format!("{part} does not compile: {e}")));
            }
            let tmpl = self
                .env
                .get_template(&name)
                .map_err(|e| fail(format!("{part}: {e:#}")))?;
            let out = tmpl.render(&ctx).map_err(|e| fail(format!("{part}: {e:#}")))?;
            if out.len() > MAX_BODY_BYTES {
                return Err(fail(format!(
                    "{part} renders to {} bytes, limit is {MAX_BODY_BYTES}",
                    out.len()
                )));
            }
            Ok(out)
        };
        let subject = match rev.subject {
            Some(_) => Some(clean_subject(&run("subject.txt")?)),
            None => None,
        };
        let body_text = run("body.txt")?;
        let body_html = match rev.body_html {
            Some(_) => Some(run("body.html")?),
            None => None,
        };
        if channel == Channel::Sms {
            let segments = sms_segments(&body_text);
            if segments > self.options.sms_max_segments {
                return Err(fail(format!(
                    "SMS text needs {segments} segments, limit is {}",
                    self.options.sms_max_segments
                )));
            }
        }
        if subject.as_deref() == Some("") {
            return Err(fail("subject renders empty".into()));
        }
        let (consent, destination) = decide(seller, channel);
        Ok(Payload {
            channel,
            destination,
            locale: rev.locale.clone(),
            consent,
            template: rev.template.clone(),
            template_revision: rev.revision.clone(),
            subject,
            body_text,
            body_html,
        })
    }
}

/// What a template may use: the event as received, its order, and the seller's id and
/// locale. Destinations are deliberately absent.
fn context(event: &OrderEvent, seller: Option<&SellerProfile>) -> Value {
    let mut ctx = Map::new();
    for key in [
        "event_kind",
        "marketplace_id",
        "order_id",
        "seller_id",
        "occurred_at",
    ] {
        if let Some(v) = event.document.get(key) {
            ctx.insert(key.to_owned(), v.clone());
        }
    }
    ctx.insert(
        "order".into(),
        event.document.get("order").cloned().unwrap_or(Value::Null),
    );
    ctx.insert("event".into(), Value::Object(event.document.clone()));
    ctx.insert(
        "seller".into(),
        json!({
            "seller_id": event.seller_id,
            "locale": seller.and_then(|s| s.locale.clone()),
        }),
    );
    Value::Object(ctx)
}

/// Subjects lose CR and LF (header injection) and surrounding white space.
pub fn clean_subject(s: &str) -> String {
    s.split(['\r', '\n'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

const GSM7_BASIC: &str = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà";
const GSM7_EXTENDED: &str = "^{}\\[~]|€\u{c}";

/// Number of SMS segments a text needs: GSM-7 (160 septets, 153 per part when split) when
/// every character is in the GSM alphabet, UCS-2 (70 units, 67 per part) otherwise.
pub fn sms_segments(text: &str) -> u32 {
    let septets: Option<usize> = text.chars().try_fold(0usize, |n, c| {
        if GSM7_BASIC.contains(c) {
            Some(n + 1)
        } else if GSM7_EXTENDED.contains(c) {
            Some(n + 2)
        } else {
            None
        }
    });
    let (units, single, part) = match septets {
        Some(n) => (n, 160, 153),
        None => (text.encode_utf16().count(), 70, 67),
    };
    if units <= single {
        1
    } else {
        units.div_ceil(part) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consent::ConsentDecision;
    use crate::event::OrderEvent;

    const EVENT: &str = r#"{"event_id":"evt-1","event_kind":"order.created","marketplace_id":"acme","order_id":"8042","seller_id":"seller-19","occurred_at":"2026-09-21T10:00:00Z","order":{"total":"129.90","currency":"EUR","item_count":3,"note":"<b>{{ 7*7 }}</b>"}}"#;

    fn event() -> OrderEvent {
        OrderEvent::decode(EVENT.as_bytes(), 65536).unwrap()
    }

    fn seller(locale: &str) -> SellerProfile {
        SellerProfile {
            marketplace_id: "acme".into(),
            seller_id: "seller-19".into(),
            email: Some("s19@example.com".into()),
            phone: Some("+15555550100".into()),
            locale: Some(locale.into()),
            email_opt_in: true,
            sms_opt_in: true,
            version: 1,
            suppressed: Default::default(),
        }
    }

    fn email(locale: &str, revision: &str, subject: &str) -> TemplateRevision {
        TemplateRevision {
            template: "order_created".into(),
            channel: Channel::Email,
            locale: locale.into(),
            revision: revision.into(),
            subject: Some(subject.into()),
            body_text: "Order {{ order_id }}: {{ order.total }} {{ order.currency }} {{ order.note }}".into(),
            body_html: Some("<p>{{ order.note }}</p>".into()),
        }
    }

    fn options() -> RenderOptions {
        RenderOptions {
            default_locale: "en".into(),
            sms_max_segments: 2,
        }
    }

    #[test]
    fn renders_with_locale_fallback_and_escaping() {
        let r = Renderer::new(
            vec![
                email("en", "1", "New order {{ order_id }}"),
                email("fr", "2", "Nouvelle commande\r\n{{ order_id }}"),
            ],
            options(),
        );
        let p = r
            .render("order_created", Channel::Email, &event(), Some(&seller("fr-CA")))
            .unwrap();
        assert_eq!(p.locale, "fr");
        assert_eq!(p.template_revision, "2");
        assert_eq!(p.subject.as_deref(), Some("Nouvelle commande 8042"));
        assert_eq!(p.body_text, "Order 8042: 129.90 EUR <b>{{ 7*7 }}</b>");
        assert_eq!(
            p.body_html.as_deref(),
            Some("<p>&lt;b&gt;{{ 7*7 }}&lt;&#x2f;b&gt;</p>")
        );
        assert_eq!(p.consent, ConsentDecision::Granted);
        assert_eq!(p.destination.as_deref(), Some("s19@example.com"));
        let p = r
            .render("order_created", Channel::Email, &event(), Some(&seller("de-DE")))
            .unwrap();
        assert_eq!(p.locale, "en");
    }

    #[test]
    fn undefined_variable_is_an_error() {
        let mut t = email("en", "1", "x");
        t.body_text = "{{ order.missing_field }}".into();
        let r = Renderer::new(vec![t], options());
        let e = r
            .render("order_created", Channel::Email, &event(), None)
            .unwrap_err();
        assert!(matches!(e, RenderError::Failed { .. }), "{e}");
    }

    #[test]
    fn missing_template_is_named() {
        let r = Renderer::new(vec![], options());
        let e = r
            .render("order_created", Channel::Sms, &event(), None)
            .unwrap_err();
        assert!(matches!(e, RenderError::Missing { .. }));
    }

    #[test]
    fn sms_over_the_segment_limit_fails() {
        let t = TemplateRevision {
            template: "order_created".into(),
            channel: Channel::Sms,
            locale: "en".into(),
            revision: "1".into(),
            subject: None,
            body_text: "{% for i in range(400) %}x{% endfor %}".into(),
            body_html: None,
        };
        let r = Renderer::new(vec![t], options());
        assert!(r.render("order_created", Channel::Sms, &event(), None).is_err());
    }

    #[test]
    fn segment_counts() {
        assert_eq!(sms_segments(&"a".repeat(160)), 1);
        assert_eq!(sms_segments(&"a".repeat(161)), 2);
        assert_eq!(sms_segments(&"é".repeat(160)), 1);
        assert_eq!(sms_segments(&"ł".repeat(70)), 1);
        assert_eq!(sms_segments(&"ł".repeat(71)), 2);
        assert_eq!(sms_segments(&"[".repeat(80)), 1);
        assert_eq!(sms_segments(&"[".repeat(81)), 2);
    }

    #[test]
    fn validation_refuses_broken_revisions() {
        let mut t = email("en", "1", "ok");
        assert!(t.validate().is_ok());
        t.body_text = "{% if %}".into();
        assert!(t.validate().is_err());
        let mut t = email("en", "1", " ");
        assert!(t.validate().is_err());
        t.subject = Some("x".into());
        assert_ne!(t.content_digest(), email("en", "1", "y").content_digest());
    }
}
