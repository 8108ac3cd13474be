//! The SQS queue SES events arrive on (configuration set -> SNS topic -> SQS): long-polled
//! batch receives, and deletes once the caller has committed what the messages said.
//!
//! Unlike the senders, this client keeps the SDK's standard retries: receiving and
//! deleting are safe to repeat (a lost receive only hides its messages until their
//! visibility timeout ends; deleting twice is harmless).

use std::collections::HashMap;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName};
use aws_sdk_sqs::Client;
use aws_smithy_types::error::display::DisplayErrorContext;

use crate::settings::{sdk_config, AwsSettings};

/// SQS returns at most ten messages per receive and deletes at most ten per batch.
pub const MAX_BATCH: usize = 10;

/// How a [`QueueReader`] polls.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    pub queue_url: String,
    /// Long-poll wait of one receive (SQS allows 0-20 s).
    pub wait: Duration,
    /// How long received messages stay hidden from other readers: longer than it takes to
    /// commit a batch, or a second reader gets them too (harmless, only wasted work).
    pub visibility_timeout: Duration,
    /// Messages per receive, 1-10.
    pub max_messages: usize,
}

/// One received message.
#[derive(Debug, Clone)]
pub struct QueueMessage {
    pub message_id: String,
    pub receipt_handle: String,
    pub body: String,
    /// How many times SQS has handed this message out (1 on the first receive).
    pub receive_count: u32,
}

/// A call to SQS failed (after the SDK's own retries).
#[derive(Debug, thiserror::Error)]
#[error("SQS {operation} on {queue_url} failed: {detail}")]
pub struct QueueError {
    pub operation: &'static str,
    pub queue_url: String,
    pub detail: String,
}

/// Reads one SQS queue. Cheap to share.
#[derive(Debug, Clone)]
pub struct QueueReader {
    client: Client,
    settings: QueueSettings,
}

impl QueueReader {
    pub async fn new(aws: &AwsSettings, settings: QueueSettings) -> Self {
        let base = sdk_config(aws).await;
        // A long poll holds the request open for `wait`: the attempt timeout must outlast it.
        let config = aws_sdk_sqs::config::Builder::from(&base)
            .retry_config(RetryConfig::standard().with_max_attempts(3))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(aws.connect_timeout)
                    .operation_attempt_timeout(settings.wait + aws.attempt_timeout)
                    .build(),
            )
            .build();
        Self {
            client: Client::from_conf(config),
            settings,
        }
    }

    pub fn queue_url(&self) -> &str {
        &self.settings.queue_url
    }

    fn error(&self, operation: &'static str, detail: String) -> QueueError {
        QueueError {
            operation,
            queue_url: self.settings.queue_url.clone(),
            detail,
        }
    }

    /// The queue's approximate number of visible messages; also the start-up check that the
    /// queue exists and may be read.
    pub async fn depth(&self) -> Result<u64, QueueError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.settings.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(|e| self.error("GetQueueAttributes", DisplayErrorContext(&e).to_string()))?;
        Ok(out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// One long-polled receive: up to `max_messages`, or none after `wait`.
    pub async fn receive(&self) -> Result<Vec<QueueMessage>, QueueError> {
        let s = &self.settings;
        let out = self
            .client
            .receive_message()
            .queue_url(&s.queue_url)
            .max_number_of_messages(s.max_messages.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(s.wait.as_secs().min(20) as i32)
            .visibility_timeout(s.visibility_timeout.as_secs().min(43_200) as i32)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| self.error("ReceiveMessage", DisplayErrorContext(&e).to_string()))?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                let count = m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                Some(QueueMessage {
                    message_id: m.message_id?,
                    receipt_handle: m.receipt_handle?,
                    body: m.body.unwrap_or_default(),
                    receive_count: count,
                })
            })
            .collect())
    }

    /// Deletes messages whose effect is committed. Returns the ids SQS did not delete, with
    /// its reason (they come back after their visibility timeout and are found to be done).
    pub async fn delete(&self, messages: &[&QueueMessage]) -> Result<HashMap<String, String>, QueueError> {
        let mut failed = HashMap::new();
        for chunk in messages.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(&m.receipt_handle)
                        .build()
                        .map_err(|e| self.error("DeleteMessageBatch", e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out = self
                .client
                .delete_message_batch()
                .queue_url(&self.settings.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| self.error("DeleteMessageBatch", DisplayErrorContext(&e).to_string()))?;
            for f in out.failed {
                let index: usize = f.id.parse().unwrap_or(usize::MAX);
                if let Some(m) = chunk.get(index) {
                    failed.insert(
                        m.message_id.clone(),
                        format!("{}: {}", f.code, f.message.unwrap_or_default()),
                    );
                }
            }
        }
        Ok(failed)
    }
}
