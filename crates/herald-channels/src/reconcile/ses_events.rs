//! The provider's own evidence of what became of a message: Amazon SES event records, as
//! SES event publishing delivers them (configuration set -> SNS topic -> SQS queue), decoded
//! into a [`SesEvent`].
//!
//! Both SQS body forms are understood: with SNS raw message delivery on, the body is the
//! event record itself; with it off, an SNS envelope (`"Type": "Notification"`) whose
//! `Message` is the record as a string. Records without event publishing (identity
//! feedback notifications) name their type `notificationType` and carry no tags; they are
//! understood too and match by message id only.
//!
//! What a record says about the recipient stays here: a [`SesEvent`] carries the addresses
//! it concerns only so that the caller can digest them (for the suppression list), and
//! never the bounce diagnostic (which quotes addresses) or any content.

use std::fmt;

use chrono::{DateTime, Utc};
use herald_core::digest::fields_hex;
use serde::Deserialize;
use serde_json::Value;

/// The tag SES carries for Herald's intent id (its simple, 32-hex-digit form).
pub const INTENT_TAG: &str = "herald_intent";
/// The tag SES carries for the attempt number within the intent.
pub const ATTEMPT_TAG: &str = "herald_attempt";

/// Longest `detail` kept from a record (a rendering failure's message, a reject reason).
const DETAIL_MAX: usize = 300;

/// The event types SES publishes, as AWS documents them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SesEventType {
    Send,
    Delivery,
    Bounce,
    Complaint,
    Reject,
    RenderingFailure,
    DeliveryDelay,
    Open,
    Click,
    Subscription,
}

pub use herald_core::state::Verdict;

impl SesEventType {
    pub const ALL: [SesEventType; 10] = [
        SesEventType::Send,
        SesEventType::Delivery,
        SesEventType::Bounce,
        SesEventType::Complaint,
        SesEventType::Reject,
        SesEventType::RenderingFailure,
        SesEventType::DeliveryDelay,
        SesEventType::Open,
        SesEventType::Click,
        SesEventType::Subscription,
    ];

    /// The name stored and used as a metric label (snake case, bounded).
    pub fn as_str(self) -> &'static str {
        match self {
            SesEventType::Send => "send",
            SesEventType::Delivery => "delivery",
            SesEventType::Bounce => "bounce",
            SesEventType::Complaint => "complaint",
            SesEventType::Reject => "reject",
            SesEventType::RenderingFailure => "rendering_failure",
            SesEventType::DeliveryDelay => "delivery_delay",
            SesEventType::Open => "open",
            SesEventType::Click => "click",
            SesEventType::Subscription => "subscription",
        }
    }

    /// The type as SES spells it in `eventType` (or `notificationType`).
    fn from_ses(name: &str) -> Option<Self> {
        Some(match name {
            "Send" => SesEventType::Send,
            "Delivery" => SesEventType::Delivery,
            "Bounce" => SesEventType::Bounce,
            "Complaint" => SesEventType::Complaint,
            "Reject" => SesEventType::Reject,
            "Rendering Failure" => SesEventType::RenderingFailure,
            "DeliveryDelay" => SesEventType::DeliveryDelay,
            "Open" => SesEventType::Open,
            "Click" => SesEventType::Click,
            "Subscription" => SesEventType::Subscription,
            _ => return None,
        })
    }

    /// The record's object for this type (`"bounce"`, `"failure"`, ...).
    fn object(self) -> &'static str {
        match self {
            SesEventType::Send => "send",
            SesEventType::Delivery => "delivery",
            SesEventType::Bounce => "bounce",
            SesEventType::Complaint => "complaint",
            SesEventType::Reject => "reject",
            SesEventType::RenderingFailure => "failure",
            SesEventType::DeliveryDelay => "deliveryDelay",
            SesEventType::Open => "open",
            SesEventType::Click => "click",
            SesEventType::Subscription => "subscription",
        }
    }

    /// What the event proves about an attempt whose outcome was not observed. Opens,
    /// clicks and subscription changes are stored and settle nothing.
    pub fn verdict(self) -> Option<Verdict> {
        match self {
            SesEventType::Send
            | SesEventType::Delivery
            | SesEventType::Bounce
            | SesEventType::Complaint
            | SesEventType::DeliveryDelay => Some(Verdict::Accepted),
            SesEventType::Reject | SesEventType::RenderingFailure => Some(Verdict::Rejected),
            SesEventType::Open | SesEventType::Click | SesEventType::Subscription => None,
        }
    }
}

impl fmt::Display for SesEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub use herald_core::consent::SuppressionReason;

/// One SES event record, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct SesEvent {
    pub event_type: SesEventType,
    /// `mail.messageId`: the id `SendEmail` returned.
    pub message_id: String,
    /// Herald's tags, when the record carries them (event publishing only).
    pub intent_tag: Option<String>,
    pub attempt_tag: Option<String>,
    /// The provider's time for the event (the type's own `timestamp`, else the mail's).
    pub occurred_at: DateTime<Utc>,
    pub bounce_type: Option<String>,
    pub bounce_subtype: Option<String>,
    pub complaint_type: Option<String>,
    /// A short, address-free detail: SMTP status codes of a bounce or delay, a reject
    /// reason, a rendering failure's message, a delay type.
    pub detail: Option<String>,
    /// Set for a permanent bounce or a complaint: the recipients it concerns go on the
    /// suppression list.
    pub suppress: Option<SuppressionReason>,
    /// The recipients the event concerns (bounced, complained, delayed, delivered; else the
    /// mail's destinations). For digests only: never store them.
    pub recipients: Vec<String>,
    /// Converges duplicates (SNS and SQS deliver at least once): a digest of the message
    /// id, the type, the event's own timestamp and feedback id.
    pub key: String,
}

/// What one queue message holds.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueBody {
    Event(Box<SesEvent>),
    /// Not an event, and not an error: SNS subscription confirmations and SES's test
    /// notification when an event destination is created. The text says which.
    Ignored(&'static str),
}

/// A queue message that is not an SES event record: dead-lettered with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

fn malformed(why: impl Into<String>) -> Malformed {
    Malformed(why.into())
}

/// The SNS envelope (raw message delivery off).
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "Type")]
    kind: String,
    #[serde(rename = "Message")]
    message: Option<String>,
}

/// SES's first message on a new SNS event destination.
const SES_TEST_NOTIFICATION: &str = "Successfully validated SNS topic for Amazon SES event publishing.";

/// Decodes the body of one SQS message: an SNS envelope or a raw SES event record.
pub fn decode_queue_body(body: &str) -> Result<QueueBody, Malformed> {
    let value: Value = serde_json::from_str(body).map_err(|e| malformed(format!("not JSON: {e}")))?;
    if value.get("Type").is_some()
        && value.get("eventType").is_none()
        && value.get("notificationType").is_none()
    {
        let envelope: Envelope = serde_json::from_value(value)
            .map_err(|e| malformed(format!("an SNS envelope without the expected fields: {e}")))?;
        return match envelope.kind.as_str() {
            "Notification" => {
                let message = envelope
                    .message
                    .ok_or_else(|| malformed("an SNS notification without a Message"))?;
                if message.trim() == SES_TEST_NOTIFICATION {
                    return Ok(QueueBody::Ignored(
                        "SES's test notification for a new event destination",
                    ));
                }
                let inner: Value = serde_json::from_str(&message)
                    .map_err(|e| malformed(format!("the SNS notification's Message is not JSON: {e}")))?;
                decode_record(&inner).map(|e| QueueBody::Event(Box::new(e)))
            }
            "SubscriptionConfirmation" => Ok(QueueBody::Ignored(
                "an SNS subscription confirmation (confirm the queue's subscription to the topic)",
            )),
            "UnsubscribeConfirmation" => Ok(QueueBody::Ignored("an SNS unsubscribe confirmation")),
            other => Err(malformed(format!(
                "an SNS message of type {other:?}, not a Notification"
            ))),
        };
    }
    decode_record(&value).map(|e| QueueBody::Event(Box::new(e)))
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn timestamp(s: &str) -> Result<DateTime<Utc>, Malformed> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| malformed(format!("timestamp {s:?} is not ISO 8601: {e}")))
}

/// The first value of a tag (`mail.tags` maps names to arrays of strings).
fn tag(mail: &Value, name: &str) -> Option<String> {
    mail.get("tags")?
        .get(name)?
        .as_array()?
        .first()?
        .as_str()
        .map(str::to_owned)
}

/// The `emailAddress` of each entry of `list` in `object`.
fn addresses(object: &Value, list: &str) -> Vec<String> {
    object
        .get(list)
        .and_then(Value::as_array)
        .map(|entries| {
            entries
                .iter()
                .filter_map(|e| str_at(e, "emailAddress").map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The SMTP status codes of each entry of `list` in `object` (`5.1.1`), never the
/// diagnostic text, which quotes addresses.
fn statuses(object: &Value, list: &str) -> Option<String> {
    let codes: Vec<&str> = object
        .get(list)?
        .as_array()?
        .iter()
        .filter_map(|e| str_at(e, "status"))
        .collect();
    (!codes.is_empty()).then(|| codes.join(","))
}

fn short(s: &str) -> String {
    let mut end = s.len().min(DETAIL_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Decodes an SES event record (event publishing's `eventType`, or a feedback
/// notification's `notificationType`).
fn decode_record(record: &Value) -> Result<SesEvent, Malformed> {
    let type_name = str_at(record, "eventType")
        .or_else(|| str_at(record, "notificationType"))
        .ok_or_else(|| malformed("neither an SNS envelope nor an SES event record (no eventType)"))?;
    let event_type = SesEventType::from_ses(type_name)
        .ok_or_else(|| malformed(format!("unknown SES event type {type_name:?}")))?;
    let mail = record
        .get("mail")
        .filter(|m| m.is_object())
        .ok_or_else(|| malformed("an SES event record without a mail object"))?;
    let message_id = str_at(mail, "messageId")
        .filter(|id| !id.is_empty())
        .ok_or_else(|| malformed("an SES event record without mail.messageId"))?
        .to_owned();
    let mail_time = str_at(mail, "timestamp")
        .ok_or_else(|| malformed("an SES event record without mail.timestamp"))
        .and_then(timestamp)?;
    let empty = Value::Null;
    let object = record.get(event_type.object()).unwrap_or(&empty);
    let own_time = str_at(object, "timestamp");
    let occurred_at = match own_time {
        Some(t) => timestamp(t)?,
        None => mail_time,
    };
    let feedback_id = str_at(object, "feedbackId").unwrap_or_default();
    let mut event = SesEvent {
        event_type,
        key: fields_hex(&[
            b"ses",
            message_id.as_bytes(),
            event_type.as_str().as_bytes(),
            own_time.unwrap_or_default().as_bytes(),
            feedback_id.as_bytes(),
        ]),
        message_id,
        intent_tag: tag(mail, INTENT_TAG),
        attempt_tag: tag(mail, ATTEMPT_TAG),
        occurred_at,
        bounce_type: None,
        bounce_subtype: None,
        complaint_type: None,
        detail: None,
        suppress: None,
        recipients: Vec::new(),
    };
    match event_type {
        SesEventType::Bounce => {
            let kind = str_at(object, "bounceType")
                .ok_or_else(|| malformed("a Bounce record without bounce.bounceType"))?;
            if kind == "Permanent" {
                event.suppress = Some(SuppressionReason::Bounced);
            }
            event.bounce_type = Some(short(kind));
            event.bounce_subtype = str_at(object, "bounceSubType").map(short);
            event.recipients = addresses(object, "bouncedRecipients");
            event.detail = statuses(object, "bouncedRecipients");
        }
        SesEventType::Complaint => {
            event.suppress = Some(SuppressionReason::Complained);
            event.complaint_type = str_at(object, "complaintFeedbackType").map(short);
            event.detail = str_at(object, "complaintSubType").map(short);
            event.recipients = addresses(object, "complainedRecipients");
        }
        SesEventType::Delivery => {
            event.recipients = object
                .get("recipients")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(|a| a.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
        }
        SesEventType::DeliveryDelay => {
            event.recipients = addresses(object, "delayedRecipients");
            event.detail = match (str_at(object, "delayType"), statuses(object, "delayedRecipients")) {
                (Some(kind), Some(codes)) => Some(short(&format!("{kind} {codes}"))),
                (kind, codes) => kind.map(short).or(codes),
            };
        }
        SesEventType::Reject => event.detail = str_at(object, "reason").map(short),
        SesEventType::RenderingFailure => event.detail = str_at(object, "errorMessage").map(short),
        SesEventType::Send | SesEventType::Open | SesEventType::Click | SesEventType::Subscription => {}
    }
    if event.recipients.is_empty() {
        event.recipients = mail
            .get("destination")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(|a| a.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
    }
    if event.suppress.is_some() && event.recipients.is_empty() {
        return Err(malformed(format!(
            "a {type_name} record that names no recipient: nothing to suppress"
        )));
    }
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixtures are written from the examples in AWS's documentation ("Examples of
    /// event data that Amazon SES publishes to Amazon SNS"); the integration tests send
    /// the same files through a real SQS queue.
    fn fixture(name: &str) -> String {
        let path = format!("{}/tests/fixtures/ses/{name}.json", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn event(name: &str) -> SesEvent {
        match decode_queue_body(&fixture(name)) {
            Ok(QueueBody::Event(e)) => *e,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn every_documented_type_decodes_with_herald_tags() {
        let cases = [
            ("send", SesEventType::Send, Some(Verdict::Accepted)),
            ("delivery", SesEventType::Delivery, Some(Verdict::Accepted)),
            ("bounce", SesEventType::Bounce, Some(Verdict::Accepted)),
            ("bounce-transient", SesEventType::Bounce, Some(Verdict::Accepted)),
            ("complaint", SesEventType::Complaint, Some(Verdict::Accepted)),
            (
                "delivery-delay",
                SesEventType::DeliveryDelay,
                Some(Verdict::Accepted),
            ),
            ("reject", SesEventType::Reject, Some(Verdict::Rejected)),
            (
                "rendering-failure",
                SesEventType::RenderingFailure,
                Some(Verdict::Rejected),
            ),
            ("open", SesEventType::Open, None),
            ("click", SesEventType::Click, None),
            ("subscription", SesEventType::Subscription, None),
        ];
        for (name, kind, verdict) in cases {
            let e = event(name);
            assert_eq!(e.event_type, kind, "{name}");
            assert_eq!(kind.verdict(), verdict, "{name}");
            assert_eq!(
                e.message_id,
                "0102018c2f3a4b5c-6d7e8f90-1a2b-4c3d-9e8f-7a6b5c4d3e2f-000000"
            );
            assert_eq!(
                e.intent_tag.as_deref(),
                Some("0b1e8f9c2d4a4e6f8a9b0c1d2e3f4a5b"),
                "{name}"
            );
            assert_eq!(e.attempt_tag.as_deref(), Some("1"), "{name}");
            assert_eq!(e.recipients, ["seller@example.com"], "{name}");
        }
    }

    #[test]
    fn bounces_and_complaints_say_what_to_suppress_and_keep_no_address() {
        let hard = event("bounce");
        assert_eq!(hard.suppress, Some(SuppressionReason::Bounced));
        assert_eq!(hard.bounce_type.as_deref(), Some("Permanent"));
        assert_eq!(hard.bounce_subtype.as_deref(), Some("General"));
        // The status code, never the diagnostic that quotes the address.
        assert_eq!(hard.detail.as_deref(), Some("5.1.1"));
        assert_eq!(hard.occurred_at.to_rfc3339(), "2026-11-30T10:16:02.669+00:00");

        let soft = event("bounce-transient");
        assert_eq!(soft.suppress, None);
        assert_eq!(soft.bounce_subtype.as_deref(), Some("MailboxFull"));

        let complaint = event("complaint");
        assert_eq!(complaint.suppress, Some(SuppressionReason::Complained));
        assert_eq!(complaint.complaint_type.as_deref(), Some("abuse"));

        for name in [
            "bounce",
            "complaint",
            "delivery-delay",
            "reject",
            "rendering-failure",
        ] {
            let e = event(name);
            assert!(
                !e.detail.as_deref().unwrap_or_default().contains('@'),
                "{name}: {:?}",
                e.detail
            );
        }
        assert_eq!(
            event("delivery-delay").detail.as_deref(),
            Some("TransientCommunicationFailure 4.4.1")
        );
        assert_eq!(event("reject").detail.as_deref(), Some("Bad content"));
    }

    #[test]
    fn the_sns_envelope_and_the_raw_record_are_the_same_event() {
        let wrapped = event("envelope-delivery");
        assert_eq!(wrapped, event("delivery"));
        // Send carries no timestamp of its own: the mail's is the event's.
        assert_eq!(
            event("send").occurred_at.to_rfc3339(),
            "2026-11-30T10:15:02.012+00:00"
        );
    }

    #[test]
    fn duplicates_share_a_key_and_different_events_do_not() {
        let keys: std::collections::HashSet<String> = [
            "send",
            "delivery",
            "bounce",
            "bounce-transient",
            "complaint",
            "delivery-delay",
            "reject",
            "rendering-failure",
            "open",
            "click",
            "subscription",
        ]
        .iter()
        .map(|n| event(n).key)
        .collect();
        assert_eq!(keys.len(), 11);
        assert_eq!(event("delivery").key, event("envelope-delivery").key);
    }

    #[test]
    fn feedback_notifications_without_event_publishing_have_no_tags() {
        let e = event("notification-bounce");
        assert_eq!(e.event_type, SesEventType::Bounce);
        assert_eq!(e.intent_tag, None);
        assert_eq!(e.attempt_tag, None);
        assert_eq!(e.key, event("bounce").key);
    }

    #[test]
    fn confirmations_and_the_test_notification_are_ignored() {
        let confirmation = r#"{"Type":"SubscriptionConfirmation","MessageId":"x","Token":"t","TopicArn":"arn","Message":"You have chosen to subscribe","SubscribeURL":"https://sns.example/confirm"}"#;
        assert!(matches!(
            decode_queue_body(confirmation),
            Ok(QueueBody::Ignored(_))
        ));
        let test =
            format!(r#"{{"Type":"Notification","MessageId":"x","Message":"{SES_TEST_NOTIFICATION}"}}"#);
        assert!(matches!(decode_queue_body(&test), Ok(QueueBody::Ignored(_))));
    }

    #[test]
    fn malformed_bodies_say_why() {
        let cases = [
            ("not json", "not JSON"),
            ("{}", "no eventType"),
            (r#"{"Type":"Notification"}"#, "without a Message"),
            (
                r#"{"Type":"Notification","Message":"{oops"}"#,
                "Message is not JSON",
            ),
            (
                r#"{"eventType":"Teleport","mail":{"messageId":"m","timestamp":"2026-01-01T00:00:00Z"}}"#,
                "unknown SES event type",
            ),
            (r#"{"eventType":"Delivery"}"#, "without a mail object"),
            (
                r#"{"eventType":"Delivery","mail":{"timestamp":"2026-01-01T00:00:00Z"}}"#,
                "without mail.messageId",
            ),
            (
                r#"{"eventType":"Delivery","mail":{"messageId":"m","timestamp":"yesterday"}}"#,
                "not ISO 8601",
            ),
            (
                r#"{"eventType":"Bounce","mail":{"messageId":"m","timestamp":"2026-01-01T00:00:00Z"},"bounce":{}}"#,
                "bounceType",
            ),
            (
                r#"{"eventType":"Complaint","mail":{"messageId":"m","timestamp":"2026-01-01T00:00:00Z"},"complaint":{}}"#,
                "names no recipient",
            ),
        ];
        for (body, why) in cases {
            let err = decode_queue_body(body).expect_err(body);
            assert!(err.0.contains(why), "{body}: {err}");
        }
    }
}
