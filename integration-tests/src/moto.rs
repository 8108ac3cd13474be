//! What the moto server (the SES v2 / SNS stand-in of the local stack) received, read back
//! through `GET /moto-api/data.json`: `ses.Message` entries (source, destinations, subject,
//! body, id) and `sns.SMS` entries (phone_number, message, message_id).

use anyhow::Result;
use serde_json::Value;

use crate::http::request;

pub const MOTO: &str = "127.0.0.1:14566";

async fn get(path: &str) -> Result<Value> {
    // moto serialises its live state for data.json while other requests change it, and now
    // and then answers 500 for that race (seen with tests in parallel; its log has no
    // traceback). The read changes nothing, so it is asked again, a few times.
    let mut status = 0;
    for _ in 0..5 {
        let (s, body) = request(MOTO, "GET", path, None).await?;
        if s == 200 {
            return Ok(body);
        }
        status = s;
        if s < 500 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    anyhow::bail!("moto answered {status} to GET {path}")
}

/// The SES messages whose destinations include `address`.
pub async fn emails_to(address: &str) -> Result<Vec<Value>> {
    let data = get("/moto-api/data.json").await?;
    Ok(entries(&data, "ses", "Message")
        .into_iter()
        .filter(|m| {
            m.get("destinations")
                .is_some_and(|d| d.to_string().contains(address))
        })
        .collect())
}

/// The SMS sent to `phone`.
pub async fn sms_to(phone: &str) -> Result<Vec<Value>> {
    let data = get("/moto-api/data.json").await?;
    Ok(entries(&data, "sns", "SMS")
        .into_iter()
        .filter(|m| m.get("phone_number").and_then(Value::as_str) == Some(phone))
        .collect())
}

fn entries(data: &Value, service: &str, model: &str) -> Vec<Value> {
    data.get(service)
        .and_then(|s| s.get(model))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Everything moto received: (SES messages, SMS), from one read of its state.
pub async fn received() -> Result<(Vec<Value>, Vec<Value>)> {
    let data = get("/moto-api/data.json").await?;
    Ok((entries(&data, "ses", "Message"), entries(&data, "sns", "SMS")))
}

/// Sends an e-mail through moto's SES v2 API directly, bypassing Herald: what a duplicate
/// no attempt explains looks like to the invariant checks (their canary).
pub async fn send_email_directly(to: &str, subject: &str) -> Result<()> {
    let body = serde_json::json!({
        "FromEmailAddress": "notifications@herald.example",
        "Destination": {"ToAddresses": [to]},
        "Content": {"Simple": {"Subject": {"Data": subject}, "Body": {"Text": {"Data": "canary"}}}},
    });
    let auth = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ses/aws4_request, SignedHeaders=host, Signature=0";
    let (status, text) = crate::http::request_text(
        MOTO,
        "POST",
        "/v2/email/outbound-emails",
        &[("Authorization", auth)],
        Some(&body),
    )
    .await?;
    anyhow::ensure!(status == 200, "moto answered {status} to SendEmail: {text}");
    Ok(())
}
