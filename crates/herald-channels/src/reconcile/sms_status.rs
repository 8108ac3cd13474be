//! SNS's SMS delivery status: with `DeliveryStatusIAMRole` set on the account, SNS writes
//! one JSON record per SMS to CloudWatch Logs, in `sns/<region>/<account>/DirectPublishToPhoneNumber`
//! (delivered) and `.../DirectPublishToPhoneNumber/Failure` (not delivered):
//!
//! ```json
//! {"notification": {"messageId": "34d9b400-...", "timestamp": "2016-06-28 00:40:34.558"},
//!  "delivery": {"destination": "+1XXX5550100", "priceInUSD": 0.00645, "smsType": "Transactional",
//!               "providerResponse": "Message has been accepted by phone carrier", ...},
//!  "status": "SUCCESS"}
//! ```
//!
//! A record names its message by the id `Publish` returned: it can only be matched to an
//! attempt that got that id (an accepted one). The destination is never kept.

use std::time::Duration;

use aws_sdk_cloudwatchlogs::config::retry::RetryConfig;
use aws_sdk_cloudwatchlogs::config::timeout::TimeoutConfig;
use aws_sdk_cloudwatchlogs::error::DisplayErrorContext;
use aws_sdk_cloudwatchlogs::Client;
use chrono::{DateTime, NaiveDateTime, Utc};
use herald_core::digest::fields_hex;
use serde_json::Value;

use crate::reconcile::ses_events::Malformed;
use crate::settings::{sdk_config, AwsSettings};

const DETAIL_MAX: usize = 300;

/// One SMS delivery status, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct SmsStatus {
    /// Converges a record read twice: the log group and CloudWatch's event id.
    pub key: String,
    /// The id `Publish` returned.
    pub message_id: String,
    pub occurred_at: DateTime<Utc>,
    /// `SUCCESS`: the carrier took it. Otherwise it was not delivered.
    pub delivered: bool,
    pub price_usd: Option<f64>,
    /// The carrier's answer as SNS reports it, cut short; no destination.
    pub provider_response: Option<String>,
}

impl SmsStatus {
    /// The name stored and used as a metric label.
    pub fn event_type(&self) -> &'static str {
        if self.delivered {
            "delivered"
        } else {
            "failed"
        }
    }
}

/// Decodes one log record of `log_group` (CloudWatch's `eventId`, the record's message).
pub fn decode_sms_status(log_group: &str, event_id: &str, message: &str) -> Result<SmsStatus, Malformed> {
    let v: Value = serde_json::from_str(message).map_err(|e| Malformed(format!("not JSON: {e}")))?;
    let notification = v
        .get("notification")
        .ok_or_else(|| Malformed("no notification object".into()))?;
    let message_id = notification
        .get("messageId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Malformed("no notification.messageId".into()))?;
    let stamp = notification
        .get("timestamp")
        .and_then(Value::as_str)
        .ok_or_else(|| Malformed("no notification.timestamp".into()))?;
    let occurred_at = NaiveDateTime::parse_from_str(stamp, "%Y-%m-%d %H:%M:%S%.f")
        .map(|t| t.and_utc())
        .or_else(|_| DateTime::parse_from_rfc3339(stamp).map(|t| t.with_timezone(&Utc)))
        .map_err(|e| Malformed(format!("notification.timestamp {stamp:?}: {e}")))?;
    let status = v
        .get("status")
        .and_then(Value::as_str)
        .ok_or_else(|| Malformed("no status".into()))?;
    let delivery = v.get("delivery");
    let price_usd = delivery.and_then(|d| d.get("priceInUSD")).and_then(Value::as_f64);
    let provider_response = delivery
        .and_then(|d| d.get("providerResponse"))
        .and_then(Value::as_str)
        .map(|r| {
            let mut end = r.len().min(DETAIL_MAX);
            while !r.is_char_boundary(end) {
                end -= 1;
            }
            r[..end].to_owned()
        });
    Ok(SmsStatus {
        key: fields_hex(&[b"sns-sms-status-v1", log_group.as_bytes(), event_id.as_bytes()]),
        message_id: message_id.to_owned(),
        occurred_at,
        delivered: status == "SUCCESS",
        price_usd,
        provider_response,
    })
}

/// One log record as CloudWatch Logs returns it.
#[derive(Debug, Clone)]
pub struct LogRecord {
    pub event_id: String,
    /// Milliseconds since the epoch (the record's own time).
    pub timestamp_ms: i64,
    pub message: String,
}

/// A call to CloudWatch Logs failed (after the SDK's own retries).
#[derive(Debug, thiserror::Error)]
#[error("CloudWatch Logs {operation} on {log_group} failed: {detail}")]
pub struct LogsError {
    pub operation: &'static str,
    pub log_group: String,
    pub detail: String,
}

/// Reads SMS delivery-status log groups. Cheap to share.
#[derive(Debug, Clone)]
pub struct SmsStatusReader {
    client: Client,
}

impl SmsStatusReader {
    pub async fn new(aws: &AwsSettings) -> Self {
        let base = sdk_config(aws).await;
        // Reads are idempotent: the SDK's standard retries are fine here.
        let config = aws_sdk_cloudwatchlogs::config::Builder::from(&base)
            .retry_config(RetryConfig::standard().with_max_attempts(3))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(aws.connect_timeout)
                    .operation_attempt_timeout(aws.attempt_timeout.max(Duration::from_secs(10)))
                    .build(),
            )
            .build();
        Self {
            client: Client::from_conf(config),
        }
    }

    /// One page of records of `log_group` from `since_ms` on (CloudWatch Logs pages by up
    /// to 1 MB or 10,000 records), and the token of the next page, if any. A group that
    /// does not exist yet (no SMS since logging was turned on) has no records.
    pub async fn page(
        &self,
        log_group: &str,
        since_ms: i64,
        token: Option<String>,
    ) -> Result<(Vec<LogRecord>, Option<String>), LogsError> {
        let out = self
            .client
            .filter_log_events()
            .log_group_name(log_group)
            .start_time(since_ms)
            .set_next_token(token)
            .send()
            .await;
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception())
                {
                    return Ok((Vec::new(), None));
                }
                return Err(LogsError {
                    operation: "FilterLogEvents",
                    log_group: log_group.to_owned(),
                    detail: DisplayErrorContext(&e).to_string(),
                });
            }
        };
        let records = out
            .events
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| {
                Some(LogRecord {
                    event_id: e.event_id?,
                    timestamp_ms: e.timestamp?,
                    message: e.message?,
                })
            })
            .collect();
        Ok((records, out.next_token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUCCESS: &str = r#"{"notification":{"messageId":"34d9b400-c6dd-5444-820d-fbeb0f1f54cf","timestamp":"2016-06-28 00:40:34.558"},"delivery":{"phoneCarrier":"My Phone Carrier","mnc":270,"destination":"+1XXX5550100","priceInUSD":0.00645,"smsType":"Transactional","mcc":310,"providerResponse":"Message has been accepted by phone carrier","dwellTimeMs":599,"dwellTimeMsUntilDeviceAck":1344},"status":"SUCCESS"}"#;
    const FAILURE: &str = r#"{"notification":{"messageId":"1077257a-92f3-5ca3-bc97-6a915b310625","timestamp":"2016-06-28 00:40:34.559"},"delivery":{"mnc":0,"destination":"+1XXX5550100","priceInUSD":0.00645,"smsType":"Transactional","mcc":0,"providerResponse":"Unknown error attempting to reach phone","dwellTimeMs":1420,"dwellTimeMsUntilDeviceAck":1692},"status":"FAILURE"}"#;

    #[test]
    fn the_documented_records_decode_without_the_destination() {
        let ok = decode_sms_status("g", "e1", SUCCESS).unwrap();
        assert_eq!(ok.message_id, "34d9b400-c6dd-5444-820d-fbeb0f1f54cf");
        assert!(ok.delivered);
        assert_eq!(ok.event_type(), "delivered");
        assert_eq!(ok.price_usd, Some(0.00645));
        assert_eq!(ok.occurred_at.to_rfc3339(), "2016-06-28T00:40:34.558+00:00");
        let failed = decode_sms_status("g/Failure", "e2", FAILURE).unwrap();
        assert!(!failed.delivered);
        assert_eq!(
            failed.provider_response.as_deref(),
            Some("Unknown error attempting to reach phone")
        );
        assert!(!format!("{ok:?}{failed:?}").contains("5550100"));
    }

    #[test]
    fn a_record_read_twice_has_one_key() {
        let a = decode_sms_status("g", "e1", SUCCESS).unwrap();
        assert_eq!(a.key, decode_sms_status("g", "e1", SUCCESS).unwrap().key);
        assert_ne!(a.key, decode_sms_status("g", "e2", SUCCESS).unwrap().key);
        assert_ne!(a.key, decode_sms_status("h", "e1", SUCCESS).unwrap().key);
    }

    #[test]
    fn malformed_records_say_why() {
        for (body, why) in [
            ("nope", "not JSON"),
            ("{}", "no notification"),
            (
                r#"{"notification":{"timestamp":"2016-06-28 00:40:34.558"},"status":"SUCCESS"}"#,
                "messageId",
            ),
            (
                r#"{"notification":{"messageId":"m","timestamp":"yesterday"},"status":"SUCCESS"}"#,
                "timestamp",
            ),
            (
                r#"{"notification":{"messageId":"m","timestamp":"2016-06-28 00:40:34.558"}}"#,
                "no status",
            ),
        ] {
            let e = decode_sms_status("g", "e", body).unwrap_err();
            assert!(e.0.contains(why), "{body}: {e}");
        }
    }
}
