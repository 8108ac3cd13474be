//! Whether the cluster can be reached as configured, and why not: the start-up check of
//! `herald run` and the clients that only ask for metadata (readiness, `herald lag`, the
//! dead-letter reader), each with its token served before it asks.
//!
//! A refused password, an untrusted or misnamed certificate and a token source without a
//! token are an operator's to fix: start-up stops on the first one, within a second or two
//! of the client's first connection, naming the broker and librdkafka's reason. A cluster
//! that merely does not answer yet is waited for by the roles, as before.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};

use crate::context::{Failure, FailureKind, Hooked, Hooks};
use crate::{KafkaSettings, Result};

/// The context of a client with no callbacks of its own.
pub type Plain = Hooked<()>;

impl ConsumerContext for Plain {}

impl ProducerContext for Plain {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// How long a metadata-only client waits for its first token before it asks anyway.
const TOKEN_WAIT: Duration = Duration::from_secs(5);
/// How long a poll serves queued events (one with no wait at all: rust-rdkafka's producer
/// poll serves events until its deadline, and a zero deadline passes after the first).
pub(crate) const EVENTS: Duration = Duration::from_millis(5);

/// Polls `poll` until the client has handed librdkafka a token, the token source failed,
/// or `limit` passed; at once when the client needs none. librdkafka asks for the first
/// token as the client is created, and connects only once it has one.
fn serve_first_token(hooks: &Hooks, limit: Duration, poll: impl Fn(Duration)) {
    if !hooks.needs_token() {
        return;
    }
    let deadline = Instant::now() + limit;
    while hooks.report().tokens_given() == 0
        && hooks.report().last_misconfiguration().is_none()
        && Instant::now() < deadline
    {
        poll(Duration::from_millis(20));
    }
}

/// A client for metadata requests (a producer that never produces; it does not create
/// the topics it asks about), its first token served.
pub fn metadata_client(settings: &KafkaSettings) -> Result<BaseProducer<Plain>> {
    let mut config = settings.admin();
    // A metadata request for a topic that does not exist must not create it with the
    // broker's defaults (where auto-creation is on).
    config.set("allow.auto.create.topics", "false");
    let client: BaseProducer<Plain> = config.create_with_context(settings.hooks().wrap(()))?;
    serve_first_token(&client.context().hooks, TOKEN_WAIT, |d| {
        client.poll(d);
    });
    Ok(client)
}

/// A consumer that only reads (assigned, never subscribed, never committing) for
/// `group`, with `tuning` on top of the reader's settings, its first token served.
pub fn reader(settings: &KafkaSettings, group: &str, tuning: &[(&str, &str)]) -> Result<BaseConsumer<Plain>> {
    let mut config = settings.reader(group);
    for (k, v) in tuning {
        config.set(*k, *v);
    }
    let consumer: BaseConsumer<Plain> = config.create_with_context(settings.hooks().wrap(()))?;
    serve_first_token(&consumer.context().hooks, TOKEN_WAIT, |d| {
        // Nothing is assigned yet: the poll serves events and returns no message.
        let _ = consumer.poll(d);
    });
    Ok(consumer)
}

/// Why the cluster cannot be used as configured.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", describe(brokers, failure, diagnosis.as_deref()))]
pub struct Misconfigured {
    pub brokers: String,
    pub failure: Failure,
    /// For a TLS failure: rustls's verdict on the same certificate (`tls_diagnosis`),
    /// which says what librdkafka's "certificate verify failed" does not.
    pub diagnosis: Option<String>,
}

impl Misconfigured {
    /// `failure` at `settings`' brokers; for a TLS failure, with rustls's second opinion.
    pub fn new(settings: &KafkaSettings, failure: Failure) -> Self {
        let diagnosis = match failure.kind {
            FailureKind::Tls if settings.security.protocol.tls() => {
                let broker = crate::tls_diagnosis::broker_of(&failure.reason)
                    .map(str::to_owned)
                    .or_else(|| settings.brokers.split(',').next().map(|b| b.trim().to_owned()));
                broker.and_then(|b| {
                    crate::tls_diagnosis::diagnose(
                        &b,
                        settings.security.tls.ca_file.as_deref(),
                        Duration::from_secs(5),
                    )
                })
            }
            _ => None,
        };
        Self {
            brokers: settings.brokers.clone(),
            failure,
            diagnosis,
        }
    }
}

fn describe(brokers: &str, f: &Failure, diagnosis: Option<&str>) -> String {
    let (what, keys) = match f.kind {
        FailureKind::Authentication => (
            "refused Herald's credentials",
            "kafka.sasl.mechanism, kafka.sasl.username and the password",
        ),
        FailureKind::Tls => (
            "could not be reached over TLS",
            "kafka.security_protocol, kafka.tls.ca_file (the broker's certificate must be signed by a trusted CA and name the host in kafka.brokers) and, where the broker requires a client certificate, kafka.tls.cert_file and key_file (signed by a CA it trusts)",
        ),
        FailureKind::Protocol => (
            "closes every connection as a listener of another protocol would",
            "kafka.security_protocol against the listener's (plaintext, ssl, sasl_plaintext, sasl_ssl) and its port in kafka.brokers",
        ),
        FailureKind::Token => ("got no OAUTHBEARER token", "kafka.sasl.mechanism and its credentials"),
        FailureKind::Authorization => (
            "does not let Herald's principal describe its topics",
            "the cluster's ACLs (Herald's principal needs Describe, Read and Write on its topics and Read on its groups)",
        ),
        FailureKind::Transport => ("could not be reached", "kafka.brokers"),
    };
    match diagnosis {
        Some(d) => format!(
            "Kafka at {brokers} {what}: {d} (librdkafka: {}); check {keys}",
            f.reason
        ),
        None => format!("Kafka at {brokers} {what}: {}; check {keys}", f.reason),
    }
}

/// What the start-up check found.
#[derive(Debug)]
pub enum Reachability {
    /// A broker answered a metadata request.
    Answered,
    /// None answered within the limit, for a reason that may pass (a broker restarting,
    /// a network partition): the roles wait for it.
    NotYet(Option<Failure>),
}

/// Asks the cluster for `topic`'s metadata until a broker answers, a misconfiguration is
/// reported (returned at once, as an error), or `limit` passes.
pub fn check(settings: &KafkaSettings, topic: &str, limit: Duration) -> crate::Result<Reachability> {
    let client = metadata_client(settings)?;
    let report = client.context().hooks.report().clone();
    let deadline = Instant::now() + limit;
    loop {
        // Serves the client's events: its errors (recorded in the report) and tokens. A
        // poll with no wait serves one event; this serves all that are queued.
        client.poll(EVENTS);
        if let Some(failure) = report.last_misconfiguration() {
            return Err(Misconfigured::new(settings, failure).into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Reachability::NotYet(report.last()));
        }
        let ask = left.min(Duration::from_millis(500));
        if let Ok(md) = client.client().fetch_metadata(Some(topic), ask) {
            if !md.brokers().is_empty() {
                report.answered();
                // Answered; but an ACL that hides the topic from Herald's principal makes
                // every role fail later: named now.
                let denied = md
                    .topics()
                    .iter()
                    .find(|t| t.name() == topic)
                    .and_then(|t| t.error())
                    .map(rdkafka::types::RDKafkaErrorCode::from);
                if denied == Some(rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed) {
                    return Err(Misconfigured::new(
                        settings,
                        Failure {
                            kind: FailureKind::Authorization,
                            reason: format!("topic {topic}: Broker: Topic authorization failed"),
                            at: Instant::now(),
                        },
                    )
                    .into());
                }
                return Ok(Reachability::Answered);
            }
        }
    }
}
