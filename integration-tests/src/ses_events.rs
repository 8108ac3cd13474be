//! The provider-evidence path of the real setup, on moto: an SQS queue subscribed to two
//! SNS topics (one with raw message delivery, one without), standing in for the topic an
//! SES configuration set's event destination publishes to. moto's SES does not publish
//! events, so the tests publish SES event records themselves, built from the fixtures
//! written after AWS's documented examples (`crates/herald-channels/tests/fixtures/ses`).

use std::time::Duration;

use anyhow::{Context, Result};
use aws_sdk_sqs::types::QueueAttributeName;
use herald_channels::{sdk_config, AwsSettings, StaticCredentials};
use serde_json::{json, Value};

use crate::moto::MOTO;
use crate::workspace_root;

/// One test's event path: its own queue and topics.
pub struct EventQueue {
    pub queue_url: String,
    pub queue_arn: String,
    /// SNS delivers the SES record inside its JSON envelope.
    pub envelope_topic: String,
    /// SNS delivers the SES record as the message body (raw message delivery).
    pub raw_topic: String,
    sqs: aws_sdk_sqs::Client,
    sns: aws_sdk_sns::Client,
}

/// SQS, SNS and CloudWatch Logs clients of moto.
async fn clients() -> (
    aws_sdk_sqs::Client,
    aws_sdk_sns::Client,
    aws_sdk_cloudwatchlogs::Client,
) {
    let config = sdk_config(&AwsSettings {
        region: Some("us-east-1".into()),
        endpoint_url: Some(format!("http://{MOTO}")),
        connect_timeout: Duration::from_secs(2),
        attempt_timeout: Duration::from_secs(30),
        static_credentials: Some(StaticCredentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        }),
    })
    .await;
    (
        aws_sdk_sqs::Client::new(&config),
        aws_sdk_sns::Client::new(&config),
        aws_sdk_cloudwatchlogs::Client::new(&config),
    )
}

impl EventQueue {
    /// A queue and topics of their own for one test.
    pub async fn create(name: &str) -> Result<Self> {
        let unique = format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        Self::named(&format!("herald-ses-events-{unique}")).await
    }

    /// The queue `name` and its topics, created if missing (SQS and SNS create calls are
    /// idempotent for the same name and attributes).
    pub async fn named(name: &str) -> Result<Self> {
        let (sqs, sns, _) = clients().await;
        let unique = name;
        let queue_url = sqs
            .create_queue()
            .queue_name(name)
            .send()
            .await
            .context("creating the SQS queue")?
            .queue_url
            .context("no queue url")?;
        let queue_arn = sqs
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await?
            .attributes
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .context("no queue arn")?;
        let mut topics = Vec::new();
        for raw in [false, true] {
            let arn = sns
                .create_topic()
                .name(format!("{unique}-{}", if raw { "raw" } else { "env" }))
                .send()
                .await
                .context("creating the SNS topic")?
                .topic_arn
                .context("no topic arn")?;
            let mut subscribe = sns
                .subscribe()
                .topic_arn(&arn)
                .protocol("sqs")
                .endpoint(&queue_arn);
            if raw {
                subscribe = subscribe.attributes("RawMessageDelivery", "true");
            }
            subscribe.send().await.context("subscribing the queue")?;
            topics.push(arn);
        }
        Ok(Self {
            queue_url,
            queue_arn,
            raw_topic: topics.pop().unwrap_or_default(),
            envelope_topic: topics.pop().unwrap_or_default(),
            sqs,
            sns,
        })
    }

    /// Publishes an SES event record through SNS: in its envelope, or raw.
    pub async fn publish(&self, record: &Value, raw: bool) -> Result<()> {
        let topic = if raw {
            &self.raw_topic
        } else {
            &self.envelope_topic
        };
        self.sns
            .publish()
            .topic_arn(topic)
            .message(record.to_string())
            .send()
            .await
            .context("publishing an SES event")?;
        Ok(())
    }

    /// Puts a body on the queue directly (what no SNS topic would deliver: malformed input).
    pub async fn send_raw_body(&self, body: &str) -> Result<()> {
        self.sqs
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .send()
            .await
            .context("sending to the queue")?;
        Ok(())
    }

    /// Messages on the queue: visible, and received but not deleted yet.
    pub async fn depth(&self) -> Result<(i64, i64)> {
        let attributes = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await?
            .attributes
            .unwrap_or_default();
        let get = |n: QueueAttributeName| attributes.get(&n).and_then(|v| v.parse().ok()).unwrap_or(-1);
        Ok((
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        ))
    }

    pub async fn delete(self) {
        let _ = self.sqs.delete_queue().queue_url(&self.queue_url).send().await;
        for topic in [&self.envelope_topic, &self.raw_topic] {
            let _ = self.sns.delete_topic().topic_arn(topic).send().await;
        }
    }

    /// The `[reconcile]` section of a test's configuration for this queue, fed by moto's
    /// SNS: its envelopes from the envelope topic (moto signs nothing verifiable, so their
    /// signatures go unchecked; tests/evidence_trust.rs checks real ones) and bare records
    /// from the raw topic.
    pub fn config(&self, silence_secs: u64) -> String {
        format!(
            "[reconcile]\nqueue_url = \"{}\"\nsilence_secs = {silence_secs}\nwait_secs = 1\nvisibility_timeout_secs = 10\n\
             sns_topic_arns = [\"{}\"]\nsns_signatures = \"unchecked\"\nraw_delivery = true\n",
            self.queue_url, self.envelope_topic
        )
    }

    /// The topic whose envelopes reach the queue (not raw).
    pub fn envelope_topic(&self) -> &str {
        &self.envelope_topic
    }
}

/// What one event is about.
pub struct About<'a> {
    /// `mail.messageId`: the id SendEmail returned (moto's, for an attempt it received).
    pub message_id: &'a str,
    /// Herald's tags: the intent id (simple form) and the attempt number. None: the
    /// record carries no Herald tags (matched by message id only).
    pub tags: Option<(&'a str, i32)>,
    /// Put in the record's destination and recipient fields.
    pub recipient: &'a str,
}

/// An SES event record from the fixture `name` (`delivery`, `bounce`, ...), about `about`.
pub fn ses_event(name: &str, about: &About<'_>) -> Result<Value> {
    let path = workspace_root().join(format!("crates/herald-channels/tests/fixtures/ses/{name}.json"));
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut record: Value = serde_json::from_str(&text)?;
    let mail = record
        .get_mut("mail")
        .and_then(Value::as_object_mut)
        .context("fixture without mail")?;
    mail.insert("messageId".into(), json!(about.message_id));
    mail.insert("destination".into(), json!([about.recipient]));
    let tags = mail
        .entry("tags")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .context("mail.tags is not an object")?;
    tags.remove("herald_intent");
    tags.remove("herald_attempt");
    if let Some((intent, attempt)) = about.tags {
        tags.insert("herald_intent".into(), json!([intent]));
        tags.insert("herald_attempt".into(), json!([attempt.to_string()]));
    }
    for (object, list, field) in [
        ("bounce", "bouncedRecipients", Some("emailAddress")),
        ("complaint", "complainedRecipients", Some("emailAddress")),
        ("delivery", "recipients", None),
        ("deliveryDelay", "delayedRecipients", Some("emailAddress")),
    ] {
        if let Some(entries) = record
            .get_mut(object)
            .and_then(|o| o.get_mut(list))
            .and_then(Value::as_array_mut)
        {
            for e in entries.iter_mut() {
                match field {
                    Some(f) => {
                        if let Some(o) = e.as_object_mut() {
                            o.insert(f.into(), json!(about.recipient));
                        }
                    }
                    None => *e = json!(about.recipient),
                }
            }
        }
    }
    Ok(record)
}

/// SNS's SMS delivery-status log groups of one test, on moto's CloudWatch Logs: moto's SNS
/// does not write them, so the tests put the records SNS would.
pub struct SmsStatusLogs {
    pub delivered_group: String,
    pub failure_group: String,
    client: aws_sdk_cloudwatchlogs::Client,
}

impl SmsStatusLogs {
    pub async fn create(name: &str) -> Result<Self> {
        let (_, _, client) = clients().await;
        let unique = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let delivered_group =
            format!("sns/us-east-1/123456789012/DirectPublishToPhoneNumber-{name}-{unique}");
        let failure_group = format!("{delivered_group}/Failure");
        for group in [&delivered_group, &failure_group] {
            client
                .create_log_group()
                .log_group_name(group)
                .send()
                .await
                .context("creating a log group")?;
            client
                .create_log_stream()
                .log_group_name(group)
                .log_stream_name("stream")
                .send()
                .await
                .context("creating a log stream")?;
        }
        Ok(Self {
            delivered_group,
            failure_group,
            client,
        })
    }

    /// The `[reconcile]` keys that read these groups, polled every second.
    pub fn config(&self) -> String {
        format!(
            "sms_status_log_groups = [\"{}\", \"{}\"]\nsms_status_poll_secs = 1\n",
            self.delivered_group, self.failure_group
        )
    }

    /// Writes one record, as SNS does, to the group of its status.
    pub async fn put(&self, message_id: &str, phone: &str, delivered: bool) -> Result<()> {
        self.put_raw(
            delivered,
            &json!({
                "notification": {
                    "messageId": message_id,
                    "timestamp": chrono::Utc::now().format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                },
                "delivery": {
                    "phoneCarrier": "My Phone Carrier",
                    "mnc": 270,
                    "destination": phone,
                    "priceInUSD": 0.00645,
                    "smsType": "Transactional",
                    "mcc": 310,
                    "providerResponse": if delivered { "Message has been accepted by phone carrier" }
                                        else { "Unknown error attempting to reach phone" },
                    "dwellTimeMs": 599,
                },
                "status": if delivered { "SUCCESS" } else { "FAILURE" },
            })
            .to_string(),
        )
        .await
    }

    /// Writes `message` as a record of the delivered (or failure) group.
    pub async fn put_raw(&self, delivered: bool, message: &str) -> Result<()> {
        let group = if delivered {
            &self.delivered_group
        } else {
            &self.failure_group
        };
        let event = aws_sdk_cloudwatchlogs::types::InputLogEvent::builder()
            .timestamp(chrono::Utc::now().timestamp_millis())
            .message(message)
            .build()
            .context("a log event")?;
        self.client
            .put_log_events()
            .log_group_name(group)
            .log_stream_name("stream")
            .log_events(event)
            .send()
            .await
            .context("putting a log event")?;
        Ok(())
    }

    pub async fn delete(self) {
        for group in [&self.delivered_group, &self.failure_group] {
            let _ = self.client.delete_log_group().log_group_name(group).send().await;
        }
    }
}
