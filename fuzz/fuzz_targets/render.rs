//! Rendering the sample templates with arbitrary event data and seller profiles (the input
//! is `event NUL profile`): never panics, subjects never carry CR/LF, markup from data
//! never reaches the HTML part raw, and template syntax in data is never evaluated (the
//! corpus holds `{{ "fuzz-evaluated-" ~ 7*7 }}` in data: evaluated, it would print 49).
#![no_main]

use std::sync::OnceLock;

use herald_core::render::{RenderOptions, Renderer, TemplateRevision};
use herald_core::{Channel, OrderEvent, SellerRecord};
use libfuzzer_sys::fuzz_target;

fn renderer() -> &'static Renderer {
    static RENDERER: OnceLock<Renderer> = OnceLock::new();
    RENDERER.get_or_init(|| {
        let t = |channel, subject: Option<&str>, text: &str, html: Option<&str>| TemplateRevision {
            template: "order_created".into(),
            channel,
            locale: "en".into(),
            revision: "1".into(),
            subject: subject.map(str::to_owned),
            body_text: text.to_owned(),
            body_html: html.map(str::to_owned),
        };
        Renderer::new(
            vec![
                t(
                    Channel::Email,
                    Some("New order {{ order_id }} on {{ marketplace_id }}"),
                    include_str!("../../config/templates/order_created/email.en.txt"),
                    Some(include_str!("../../config/templates/order_created/email.en.html")),
                ),
                t(
                    Channel::Sms,
                    None,
                    include_str!("../../config/templates/order_created/sms.en.txt"),
                    None,
                ),
            ],
            RenderOptions {
                default_locale: "en".into(),
                sms_max_segments: 10,
            },
        )
    })
}

const EVALUATED: &str = "fuzz-evaluated-49";

fuzz_target!(|data: &[u8]| {
    let (event, profile) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    let Ok(event) = OrderEvent::decode(event, 64 * 1024) else {
        return;
    };
    let written = String::from_utf8_lossy(data).contains(EVALUATED);
    let seller = match SellerRecord::decode(Some(b"acme:s1"), Some(profile), 64 * 1024) {
        Ok(SellerRecord::Upsert(p)) => Some(p),
        _ => None,
    };
    for channel in Channel::ALL {
        let Ok(payload) = renderer().render("order_created", channel, &event, seller.as_ref()) else {
            continue;
        };
        if let Some(subject) = &payload.subject {
            assert!(!subject.contains(['\r', '\n']), "subject {subject:?}");
        }
        if let Some(html) = &payload.body_html {
            assert!(!html.contains("<script"), "raw markup from data in the HTML part");
        }
        let text = format!("{:?}{}", payload.subject, payload.body_text);
        assert!(
            written || !text.contains(EVALUATED),
            "template syntax in data was evaluated"
        );
    }
});
