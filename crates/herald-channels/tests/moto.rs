//! The senders against the local moto server on 127.0.0.1:14566 (`deploy/local/moto.sh
//! start`; `make test` starts it). These tests fail, not skip, when moto does not answer.
//! Each run uses its own domain and message texts, so runs do not see each other's data.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_channels::{
    AwsSettings, EmailMessage, ErrorCategory, Outcome, SesSender, SmsMessage, SnsSender, StaticCredentials,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MOTO: &str = "127.0.0.1:14566";

fn settings(endpoint_url: &str) -> AwsSettings {
    AwsSettings {
        region: Some("us-east-1".into()),
        endpoint_url: Some(endpoint_url.into()),
        connect_timeout: Duration::from_secs(2),
        attempt_timeout: Duration::from_secs(10),
        static_credentials: Some(StaticCredentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        }),
    }
}

/// Fails the test with instructions when moto is not listening.
async fn moto_settings() -> AwsSettings {
    let reachable = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(MOTO)).await;
    if !matches!(reachable, Ok(Ok(_))) {
        panic!(
            "moto is not reachable on {MOTO}: start it with `deploy/local/moto.sh start` \
             (or `deploy/local/stack.sh up`); these tests need it and do not skip"
        );
    }
    settings(&format!("http://{MOTO}"))
}

/// A name no other run used: the process id and the clock.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// `GET /moto-api/data.json`: everything moto received, per service.
async fn moto_data() -> Value {
    let mut stream = TcpStream::connect(MOTO).await.expect("connect to moto");
    let request = format!("GET /moto-api/data.json HTTP/1.0\r\nHost: {MOTO}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send GET");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read response");
    let response = String::from_utf8(response).expect("utf-8 response");
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "data.json: {head}"
    );
    serde_json::from_str(body).expect("data.json is JSON")
}

/// The record in `data[service][kind]` whose `key` field equals `value`.
fn record<'a>(data: &'a Value, service: &str, kind: &str, key: &str, value: &str) -> &'a Value {
    data[service][kind]
        .as_array()
        .and_then(|records| records.iter().find(|r| r[key].as_str() == Some(value)))
        .unwrap_or_else(|| panic!("no {service}.{kind} with {key} = {value:?} in moto's data"))
}

fn message_id(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Accepted { provider_message_id } => provider_message_id,
        other => panic!("expected Accepted, got {other:?}"),
    }
}

#[tokio::test]
async fn email_from_a_verified_domain_is_accepted_and_reaches_the_provider() {
    let ses = SesSender::new(&moto_settings().await).await;
    let domain = format!("{}.herald-test.example", unique("verified"));
    ses.verify_identity(&domain).await.expect("create identity");
    ses.verify_identity(&domain)
        .await
        .expect("creating it again is fine");
    let from = format!("notifications@{domain}");
    let subject = unique("Order shipped");

    let outcome = ses
        .send(&EmailMessage {
            from: &from,
            to: "seller@example.com",
            subject: &subject,
            text: "Your order has shipped.",
            html: Some("<p>Your order has shipped.</p>"),
            configuration_set: None,
            tags: &[("intent_id", "9f86d081884c7d65"), ("attempt", "1")],
        })
        .await;
    let id = message_id(&outcome).to_owned();

    let data = moto_data().await;
    let sent = record(&data, "ses", "Message", "id", &id);
    assert_eq!(sent["source"], from.as_str());
    assert_eq!(
        sent["destinations"]["ToAddresses"],
        serde_json::json!(["seller@example.com"])
    );
    assert_eq!(sent["subject"], subject.as_str());
}

#[tokio::test]
async fn email_from_an_unverified_domain_is_rejected() {
    let ses = SesSender::new(&moto_settings().await).await;
    let from = format!("notifications@{}.herald-test.example", unique("unverified"));
    let outcome = ses
        .send(&EmailMessage {
            from: &from,
            to: "seller@example.com",
            subject: "Order shipped",
            text: "Your order has shipped.",
            html: None,
            configuration_set: None,
            tags: &[],
        })
        .await;
    // moto answers MessageRejected "Email address not verified ...", as SES does.
    assert!(
        matches!(
            outcome,
            Outcome::Rejected {
                category: ErrorCategory::UnverifiedSender,
                ..
            }
        ),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn sms_is_accepted_and_reaches_the_provider() {
    let sns = SnsSender::new(&moto_settings().await).await;
    let text = unique("Order 1042 shipped");
    let outcome = sns
        .send(&SmsMessage {
            phone: "+15555550100",
            text: &text,
            sender_id: Some("Herald"),
        })
        .await;
    let id = message_id(&outcome).to_owned();

    let data = moto_data().await;
    let sent = record(&data, "sns", "SMS", "message_id", &id);
    assert_eq!(sent["message"], text.as_str());
    assert_eq!(sent["phone_number"], "+15555550100");
}

#[tokio::test]
async fn connection_refused_is_retryable_connect_failed() {
    // Nothing listens on port 1: the request never leaves, so a retry cannot duplicate.
    let settings = settings("http://127.0.0.1:1");
    let email = SesSender::new(&settings)
        .await
        .send(&EmailMessage {
            from: "notifications@herald.example",
            to: "seller@example.com",
            subject: "s",
            text: "t",
            html: None,
            configuration_set: None,
            tags: &[],
        })
        .await;
    assert!(
        matches!(
            email,
            Outcome::Retryable {
                category: ErrorCategory::ConnectFailed,
                ..
            }
        ),
        "{email:?}"
    );
    let sms = SnsSender::new(&settings)
        .await
        .send(&SmsMessage {
            phone: "+15555550100",
            text: "t",
            sender_id: None,
        })
        .await;
    assert!(
        matches!(
            sms,
            Outcome::Retryable {
                category: ErrorCategory::ConnectFailed,
                ..
            }
        ),
        "{sms:?}"
    );
}
