//! E-mail through SES v2: one `SendEmail` call per attempt, its result classified by
//! `classify`. This module builds requests; it does not decide about retries.

use aws_sdk_sesv2::error::BuildError;
use aws_sdk_sesv2::operation::create_email_identity::CreateEmailIdentityError;
use aws_sdk_sesv2::types::{Body, Content, Destination, EmailContent, Message, MessageTag};
use aws_sdk_sesv2::Client;
use aws_smithy_types::error::display::DisplayErrorContext;

use crate::deliver::classify;
use crate::deliver::message::EmailMessage;
use crate::deliver::outcome::Outcome;
use crate::deliver::tags;
use crate::settings::{sdk_config, AwsSettings};

const CHARSET: &str = "UTF-8";

/// Sends e-mail through SES v2. Cheap to share: hold one per process.
#[derive(Debug, Clone)]
pub struct SesSender {
    client: Client,
}

/// Creating an SES identity failed.
#[derive(Debug, thiserror::Error)]
#[error("creating the SES e-mail identity {identity:?} failed: {detail}")]
pub struct IdentityError {
    pub identity: String,
    pub detail: String,
}

impl SesSender {
    /// A sender with SDK retries off and the timeouts of `settings`. Resolves the region and
    /// the credentials chain lazily: a missing region shows up on the first send as
    /// `Retryable(endpoint_unresolved)`; check [`SesSender::region`] at start-up.
    pub async fn new(settings: &AwsSettings) -> Self {
        Self {
            client: Client::new(&sdk_config(settings).await),
        }
    }

    /// The region the client will call, if one was configured or found in the environment.
    pub fn region(&self) -> Option<&str> {
        self.client.config().region().map(|r| r.as_ref())
    }

    /// One `SendEmail` call.
    pub async fn send(&self, m: &EmailMessage<'_>) -> Outcome {
        let (content, tags) = match build(m) {
            Ok(parts) => parts,
            Err(err) => return classify::unbuildable(&err),
        };
        let result = self
            .client
            .send_email()
            .from_email_address(m.from)
            .destination(Destination::builder().to_addresses(m.to).build())
            .content(content)
            .set_configuration_set_name(m.configuration_set.map(str::to_owned))
            .set_email_tags((!tags.is_empty()).then_some(tags))
            .send()
            .await;
        match result {
            Ok(output) => classify::accepted(output.message_id),
            Err(err) => classify::sdk_error(&err),
        }
    }

    /// Creates an e-mail identity (a domain or an address); an existing one is fine. For the
    /// local stack and tests: moto treats a created identity as verified, whereas real SES
    /// starts verification, which needs DNS records (domain) or a clicked link (address).
    pub async fn verify_identity(&self, identity: &str) -> Result<(), IdentityError> {
        match self
            .client
            .create_email_identity()
            .email_identity(identity)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err)
                if matches!(
                    err.as_service_error(),
                    Some(CreateEmailIdentityError::AlreadyExistsException(_))
                ) =>
            {
                Ok(())
            }
            Err(err) => Err(IdentityError {
                identity: identity.to_owned(),
                detail: DisplayErrorContext(&err).to_string(),
            }),
        }
    }
}

fn build(m: &EmailMessage<'_>) -> Result<(EmailContent, Vec<MessageTag>), BuildError> {
    let text = |data: &str| Content::builder().data(data).charset(CHARSET).build();
    let body = Body::builder()
        .text(text(m.text)?)
        .set_html(m.html.map(text).transpose()?)
        .build();
    let message = Message::builder().subject(text(m.subject)?).body(body).build();
    let content = EmailContent::builder().simple(message).build();
    let tags = m
        .tags
        .iter()
        .map(|(name, value)| {
            MessageTag::builder()
                .name(tags::sanitize(name))
                .value(tags::sanitize(value))
                .build()
        })
        .collect::<Result<_, _>>()?;
    Ok((content, tags))
}
