//! SMS through SNS: one `Publish` call to a phone number per attempt, as a transactional
//! message, its result classified by `classify`. This module builds requests; it does not
//! decide about retries.

use aws_sdk_sns::error::BuildError;
use aws_sdk_sns::types::MessageAttributeValue;
use aws_sdk_sns::Client;

use crate::deliver::classify;
use crate::deliver::message::SmsMessage;
use crate::deliver::outcome::Outcome;
use crate::settings::{sdk_config, AwsSettings};

const SMS_TYPE: &str = "AWS.SNS.SMS.SMSType";
const SENDER_ID: &str = "AWS.SNS.SMS.SenderID";

/// Sends SMS through SNS. Cheap to share: hold one per process.
#[derive(Debug, Clone)]
pub struct SnsSender {
    client: Client,
}

impl SnsSender {
    /// A sender with SDK retries off and the timeouts of `settings`; see [`crate::SesSender::new`].
    pub async fn new(settings: &AwsSettings) -> Self {
        Self {
            client: Client::new(&sdk_config(settings).await),
        }
    }

    /// The region the client will call, if one was configured or found in the environment.
    pub fn region(&self) -> Option<&str> {
        self.client.config().region().map(|r| r.as_ref())
    }

    /// One `Publish` call.
    pub async fn send(&self, m: &SmsMessage<'_>) -> Outcome {
        let sms_type = match string_attribute("Transactional") {
            Ok(value) => value,
            Err(err) => return classify::unbuildable(&err),
        };
        let mut request = self
            .client
            .publish()
            .phone_number(m.phone)
            .message(m.text)
            .message_attributes(SMS_TYPE, sms_type);
        if let Some(sender_id) = m.sender_id {
            match string_attribute(sender_id) {
                Ok(value) => request = request.message_attributes(SENDER_ID, value),
                Err(err) => return classify::unbuildable(&err),
            }
        }
        match request.send().await {
            Ok(output) => classify::accepted(output.message_id),
            Err(err) => classify::sdk_error(&err),
        }
    }
}

fn string_attribute(value: &str) -> Result<MessageAttributeValue, BuildError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
}
