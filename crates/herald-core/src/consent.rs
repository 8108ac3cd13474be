//! Whether a seller may be sent a notification on a channel, and where. Decided once, at
//! intent creation, and frozen with the payload: workers never re-read the profile.

use std::fmt;

use serde::Serialize;

use crate::channel::Channel;
use crate::seller::SellerProfile;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsentDecision {
    /// Opted in with a valid destination: the intent will be sent.
    Granted,
    /// The seller opted out of this channel.
    OptedOut,
    /// No address or phone number on the profile.
    NoDestination,
    /// The address or phone number on the profile is malformed.
    InvalidDestination,
    /// No profile for this seller (never received, or deleted by a tombstone).
    NoSellerProfile,
    /// The destination is on the suppression list: the provider reported a permanent
    /// bounce to it.
    Bounced,
    /// The destination is on the suppression list: its recipient complained (marked a
    /// message as spam).
    Complained,
}

impl ConsentDecision {
    pub const ALL: [ConsentDecision; 7] = [
        ConsentDecision::Granted,
        ConsentDecision::OptedOut,
        ConsentDecision::NoDestination,
        ConsentDecision::InvalidDestination,
        ConsentDecision::NoSellerProfile,
        ConsentDecision::Bounced,
        ConsentDecision::Complained,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ConsentDecision::Granted => "granted",
            ConsentDecision::OptedOut => "opted_out",
            ConsentDecision::NoDestination => "no_destination",
            ConsentDecision::InvalidDestination => "invalid_destination",
            ConsentDecision::NoSellerProfile => "no_seller_profile",
            ConsentDecision::Bounced => "bounced",
            ConsentDecision::Complained => "complained",
        }
    }

    pub fn allows_sending(self) -> bool {
        self == ConsentDecision::Granted
    }
}

impl fmt::Display for ConsentDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a destination is on the suppression list (the provider's report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SuppressionReason {
    /// A permanent bounce.
    Bounced,
    /// A complaint.
    Complained,
}

impl SuppressionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SuppressionReason::Bounced => "bounced",
            SuppressionReason::Complained => "complained",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "bounced" => Some(SuppressionReason::Bounced),
            "complained" => Some(SuppressionReason::Complained),
            _ => None,
        }
    }

    pub fn consent(self) -> ConsentDecision {
        match self {
            SuppressionReason::Bounced => ConsentDecision::Bounced,
            SuppressionReason::Complained => ConsentDecision::Complained,
        }
    }
}

/// The suppression-list entries of a seller's destinations, read with the profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Suppressed {
    pub email: Option<SuppressionReason>,
    pub sms: Option<SuppressionReason>,
}

/// The decision and, when granted, the destination to freeze into the payload.
pub fn decide(seller: Option<&SellerProfile>, channel: Channel) -> (ConsentDecision, Option<String>) {
    let Some(seller) = seller else {
        return (ConsentDecision::NoSellerProfile, None);
    };
    let (opted_in, destination, valid): (bool, Option<&String>, fn(&str) -> bool) = match channel {
        Channel::Email => (seller.email_opt_in, seller.email.as_ref(), is_plausible_email),
        Channel::Sms => (seller.sms_opt_in, seller.phone.as_ref(), is_e164),
    };
    match destination {
        _ if !opted_in => (ConsentDecision::OptedOut, None),
        None => (ConsentDecision::NoDestination, None),
        Some(d) if !valid(d) => (ConsentDecision::InvalidDestination, None),
        Some(d) => {
            let suppressed = match channel {
                Channel::Email => seller.suppressed.email,
                Channel::Sms => seller.suppressed.sms,
            };
            match suppressed {
                Some(reason) => (reason.consent(), None),
                None => (ConsentDecision::Granted, Some(d.clone())),
            }
        }
    }
}

/// A conservative address check: one `@`, a dotted domain, no white space or control
/// characters, within the SMTP length limit. The provider has the final word.
pub fn is_plausible_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    s.len() <= 254
        && !local.is_empty()
        && local.len() <= 64
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !domain.contains('@')
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | ',' | ';' | '"'))
}

/// E.164: `+`, a non-zero digit, then 6 to 14 more digits.
pub fn is_e164(s: &str) -> bool {
    let Some(digits) = s.strip_prefix('+') else {
        return false;
    };
    (7..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()) && !digits.starts_with('0')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seller(email: Option<&str>, phone: Option<&str>, email_in: bool, sms_in: bool) -> SellerProfile {
        SellerProfile {
            marketplace_id: "acme".into(),
            seller_id: "s".into(),
            email: email.map(Into::into),
            phone: phone.map(Into::into),
            locale: None,
            email_opt_in: email_in,
            sms_opt_in: sms_in,
            version: 1,
            suppressed: Suppressed::default(),
        }
    }

    #[test]
    fn a_suppressed_destination_is_not_sent_to_and_says_why() {
        let mut s = seller(Some("a@example.com"), Some("+15555550100"), true, true);
        s.suppressed.email = Some(SuppressionReason::Bounced);
        assert_eq!(decide(Some(&s), Channel::Email), (ConsentDecision::Bounced, None));
        assert_eq!(decide(Some(&s), Channel::Sms).0, ConsentDecision::Granted);
        s.suppressed.sms = Some(SuppressionReason::Complained);
        assert_eq!(
            decide(Some(&s), Channel::Sms),
            (ConsentDecision::Complained, None)
        );
        // Opting out still says opted_out: the seller's own choice is the first reason.
        s.email_opt_in = false;
        assert_eq!(decide(Some(&s), Channel::Email).0, ConsentDecision::OptedOut);
    }

    #[test]
    fn decisions_cover_each_reason_not_to_send() {
        let ok = seller(Some("a@example.com"), Some("+15555550100"), true, true);
        assert_eq!(
            decide(Some(&ok), Channel::Email),
            (ConsentDecision::Granted, Some("a@example.com".into()))
        );
        assert_eq!(decide(Some(&ok), Channel::Sms).0, ConsentDecision::Granted);
        assert_eq!(decide(None, Channel::Email).0, ConsentDecision::NoSellerProfile);
        let out = seller(Some("a@example.com"), Some("+15555550100"), false, true);
        assert_eq!(decide(Some(&out), Channel::Email).0, ConsentDecision::OptedOut);
        let none = seller(None, None, true, true);
        assert_eq!(
            decide(Some(&none), Channel::Sms).0,
            ConsentDecision::NoDestination
        );
        let bad = seller(Some("not an address"), Some("555-0100"), true, true);
        assert_eq!(
            decide(Some(&bad), Channel::Email).0,
            ConsentDecision::InvalidDestination
        );
        assert_eq!(
            decide(Some(&bad), Channel::Sms).0,
            ConsentDecision::InvalidDestination
        );
    }

    #[test]
    fn destination_checks() {
        assert!(is_plausible_email("s19@example.com"));
        assert!(!is_plausible_email("s19@example"));
        assert!(!is_plausible_email("a@b.com\r\nBcc: x@y.com"));
        assert!(!is_plausible_email("@example.com"));
        assert!(is_e164("+15555550100"));
        assert!(!is_e164("15555550100"));
        assert!(!is_e164("+0555"));
        assert!(!is_e164("+1555555010a"));
    }
}
