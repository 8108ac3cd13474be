//! The frozen payload of an intent: rendered content, destination, locale, consent decision
//! and template revision, content-addressed by a blake3 digest. Stored once per digest.

use serde::Serialize;

use crate::channel::Channel;
use crate::consent::ConsentDecision;
use crate::digest::fields_hex;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Payload {
    pub channel: Channel,
    pub destination: Option<String>,
    pub locale: String,
    pub consent: ConsentDecision,
    pub template: String,
    pub template_revision: String,
    pub subject: Option<String>,
    pub body_text: String,
    pub body_html: Option<String>,
}

impl Payload {
    /// The content address. Every field takes part, each tagged so that an absent field and
    /// an empty one differ.
    pub fn digest(&self) -> String {
        let opt = |o: &Option<String>| -> Vec<u8> {
            match o {
                None => vec![0],
                Some(s) => {
                    let mut v = vec![1];
                    v.extend_from_slice(s.as_bytes());
                    v
                }
            }
        };
        fields_hex(&[
            b"payload-v1",
            self.channel.as_str().as_bytes(),
            &opt(&self.destination),
            self.locale.as_bytes(),
            self.consent.as_str().as_bytes(),
            self.template.as_bytes(),
            self.template_revision.as_bytes(),
            &opt(&self.subject),
            self.body_text.as_bytes(),
            &opt(&self.body_html),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload() -> Payload {
        Payload {
            channel: Channel::Email,
            destination: Some("a@example.com".into()),
            locale: "en".into(),
            consent: ConsentDecision::Granted,
            template: "order_created".into(),
            template_revision: "1".into(),
            subject: Some("New order".into()),
            body_text: "Hello".into(),
            body_html: None,
        }
    }

    #[test]
    fn digest_covers_every_field() {
        let base = payload();
        let d = base.digest();
        assert_eq!(d, payload().digest());
        let mut p = payload();
        p.template_revision = "2".into();
        assert_ne!(p.digest(), d);
        let mut p = payload();
        p.body_html = Some(String::new());
        assert_ne!(p.digest(), d);
        let mut p = payload();
        p.destination = None;
        assert_ne!(p.digest(), d);
    }
}
