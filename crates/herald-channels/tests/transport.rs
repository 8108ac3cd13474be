//! The classification against the errors the real SDK and HTTP client produce, not hand-built
//! ones: a fake HTTP server on 127.0.0.1 that misbehaves in one way per test. This is what
//! catches a dependency update that changes the error types `classify.rs` looks for.

use std::time::Duration;

use herald_channels::{AwsSettings, EmailMessage, ErrorCategory, Outcome, SesSender, StaticCredentials};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

fn settings(endpoint_url: Option<String>, attempt_timeout: Duration) -> AwsSettings {
    AwsSettings {
        region: Some("us-east-1".into()),
        endpoint_url,
        connect_timeout: Duration::from_secs(2),
        attempt_timeout,
        static_credentials: Some(StaticCredentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        }),
    }
}

fn email() -> EmailMessage<'static> {
    EmailMessage {
        from: "notifications@herald.example",
        to: "seller@example.com",
        subject: "Order shipped",
        text: "Your order has shipped.",
        html: None,
        configuration_set: None,
        tags: &[("intent_id", "0123abcd"), ("attempt", "1")],
    }
}

/// Reads one HTTP request (headers and a `Content-Length` body) so that the client has
/// certainly written it before the server misbehaves.
async fn read_request(stream: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.expect("read request");
        assert!(n > 0, "client closed before sending a whole request");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse::<usize>().expect("content-length"));
        if buf.len() >= end + 4 + length {
            return;
        }
    }
}

/// A server that reads one request and then does `respond` with the connection.
async fn fake_server<F, Fut>(respond: F) -> String
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        read_request(&mut stream).await;
        respond(stream).await;
    });
    url
}

async fn send_to(url: String, attempt_timeout: Duration) -> Outcome {
    SesSender::new(&settings(Some(url), attempt_timeout))
        .await
        .send(&email())
        .await
}

async fn answer(mut stream: TcpStream, response: &'static str) {
    stream
        .write_all(response.as_bytes())
        .await
        .expect("write response");
    stream.shutdown().await.ok();
}

#[track_caller]
fn assert_outcome(outcome: &Outcome, class: &str, category: ErrorCategory) {
    let got = match outcome {
        Outcome::Accepted { .. } => ("accepted", None),
        Outcome::Rejected { category, .. } => ("rejected", Some(*category)),
        Outcome::Retryable { category, .. } => ("retryable", Some(*category)),
        Outcome::Unknown { category, .. } => ("unknown", Some(*category)),
    };
    assert_eq!(got, (class, Some(category)), "{outcome:?}");
}

#[tokio::test]
async fn dns_failure_is_retryable_connect_failed() {
    let outcome = send_to("http://herald-test.invalid".into(), Duration::from_secs(5)).await;
    assert_outcome(&outcome, "retryable", ErrorCategory::ConnectFailed);
}

/// A listener whose accept queue is full: the kernel drops further SYNs, so a client's
/// connect hangs until its connect timeout.
async fn full_listener() -> (TcpListener, Vec<TcpStream>) {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let listener = socket.listen(0).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut queued = Vec::new();
    // Fill the queue; stop at the first connect that no longer completes.
    while let Ok(Ok(stream)) =
        tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
    {
        queued.push(stream);
        assert!(queued.len() < 64, "the accept queue never filled up");
    }
    (listener, queued)
}

#[tokio::test]
async fn connect_timeout_is_retryable_connect_failed() {
    let (listener, _queued) = full_listener().await;
    let mut settings = settings(
        Some(format!("http://{}", listener.local_addr().expect("addr"))),
        Duration::from_secs(5),
    );
    settings.connect_timeout = Duration::from_millis(300);
    let outcome = SesSender::new(&settings).await.send(&email()).await;
    assert_outcome(&outcome, "retryable", ErrorCategory::ConnectFailed);
    assert!(
        outcome.detail().is_some_and(|d| d.contains("timeout")),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn connection_closed_after_the_request_was_written_is_unknown() {
    let url = fake_server(|stream| async move { drop(stream) }).await;
    let outcome = send_to(url, Duration::from_secs(5)).await;
    assert_outcome(&outcome, "unknown", ErrorCategory::ConnectionBroken);
}

#[tokio::test]
async fn no_answer_within_the_attempt_timeout_is_unknown_timeout() {
    let url = fake_server(|stream| async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(stream);
    })
    .await;
    let outcome = send_to(url, Duration::from_millis(300)).await;
    assert_outcome(&outcome, "unknown", ErrorCategory::Timeout);
}

#[tokio::test]
async fn garbled_2xx_body_is_unknown_unreadable_response() {
    let url = fake_server(|stream| {
        answer(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\nnot json!",
        )
    })
    .await;
    let outcome = send_to(url, Duration::from_secs(5)).await;
    assert_outcome(&outcome, "unknown", ErrorCategory::UnreadableResponse);
}

#[tokio::test]
async fn a_2xx_without_message_id_is_unknown_unreadable_response() {
    let url = fake_server(|stream| {
        answer(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        )
    })
    .await;
    let outcome = send_to(url, Duration::from_secs(5)).await;
    assert_outcome(&outcome, "unknown", ErrorCategory::UnreadableResponse);
}

#[tokio::test]
async fn a_bare_503_is_retryable_provider_error() {
    let url = fake_server(|stream| {
        answer(
            stream,
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
        )
    })
    .await;
    let outcome = send_to(url, Duration::from_secs(5)).await;
    assert_outcome(&outcome, "retryable", ErrorCategory::ProviderError);
}

#[tokio::test]
async fn a_bare_502_or_504_is_unknown_the_request_may_have_been_processed() {
    for response in [
        "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 0\r\n\r\n",
    ] {
        let url = fake_server(move |stream| answer(stream, response)).await;
        let outcome = send_to(url, Duration::from_secs(5)).await;
        assert_outcome(&outcome, "unknown", ErrorCategory::ProviderError);
    }
}

#[tokio::test]
async fn a_2xx_with_message_id_is_accepted() {
    let url = fake_server(|stream| {
        answer(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 22\r\n\r\n{\"MessageId\":\"m-0001\"}",
        )
    })
    .await;
    let outcome = send_to(url, Duration::from_secs(5)).await;
    assert_eq!(
        outcome,
        Outcome::Accepted {
            provider_message_id: "m-0001".into()
        }
    );
}

#[tokio::test]
async fn an_invalid_region_is_retryable_endpoint_unresolved_without_a_request() {
    let mut settings = settings(None, Duration::from_secs(5));
    settings.region = Some("not a region!".into());
    let outcome = SesSender::new(&settings).await.send(&email()).await;
    assert_outcome(&outcome, "retryable", ErrorCategory::EndpointUnresolved);
}
