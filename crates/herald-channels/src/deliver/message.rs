//! What a sender is asked to deliver: borrowed views of a frozen payload. Building these
//! from a payload row is the delivery worker's job; this module owns only their shape.

/// One e-mail, sent through SES v2 `SendEmail` with Simple content.
#[derive(Debug, Clone, Copy)]
pub struct EmailMessage<'a> {
    /// Sender address; its address or domain must be a verified SES identity.
    pub from: &'a str,
    pub to: &'a str,
    pub subject: &'a str,
    pub text: &'a str,
    pub html: Option<&'a str>,
    /// SES configuration set (event publishing: delivery, bounce, complaint).
    pub configuration_set: Option<&'a str>,
    /// SES message tags (name, value), e.g. the intent id and the attempt number, carried on
    /// every SES event so an attempt can be reconciled later. Characters outside
    /// `[A-Za-z0-9_-]` are replaced by `_` and each part is cut to 256 characters.
    pub tags: &'a [(&'a str, &'a str)],
}

/// One SMS, sent through SNS `Publish` to a phone number as a transactional message.
#[derive(Debug, Clone, Copy)]
pub struct SmsMessage<'a> {
    /// E.164 phone number, e.g. `+15555550100`.
    pub phone: &'a str,
    pub text: &'a str,
    /// Alphanumeric sender id, where the destination country supports one.
    pub sender_id: Option<&'a str>,
}
