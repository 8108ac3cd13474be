//! The context of every librdkafka client Herald makes ([`Hooked`]): its OAUTHBEARER
//! tokens, its statistics (the consumers' lag), and what it learns about its connections.
//!
//! - **Tokens.** librdkafka asks for a token on the client's main queue, before the first
//!   connection and before each expiry; rust-rdkafka answers it (calling
//!   `generate_oauth_token` here) only while that client is polled. The consumers and
//!   producers are polled all the time; the metadata-only clients (readiness, `herald lag`,
//!   the start-up check) poll before they ask ([`crate::connect`], [`crate::admin`]), and
//!   the admin client, which rust-rdkafka never polls, is served by `herald-kafka-ffi`.
//! - **Connection failures.** librdkafka reports a refused password, an untrusted or
//!   misnamed certificate and a broker it cannot reach as client errors; they are logged at
//!   ERROR (as rust-rdkafka's default does) and kept in the client's [`ConnectionReport`],
//!   which the start-up check and readiness read to say why a cluster does not answer.

use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, UNIX_EPOCH};

use rdkafka::client::OAuthToken;
use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Statistics};

use crate::stats::LagStats;
use crate::token::TokenSource;

/// What a client shares with its context; cheap to clone.
#[derive(Clone)]
pub struct Hooks {
    token: Option<Arc<dyn TokenSource>>,
    lag: Option<LagStats>,
    report: Arc<ConnectionReport>,
}

impl Hooks {
    pub(crate) fn new(token: Option<Arc<dyn TokenSource>>) -> Self {
        Self {
            token,
            lag: None,
            report: Arc::default(),
        }
    }

    /// The same, with statistics recorded into `lag` (the consumers').
    pub(crate) fn with_lag(mut self, lag: LagStats) -> Self {
        self.lag = Some(lag);
        self
    }

    pub fn report(&self) -> &Arc<ConnectionReport> {
        &self.report
    }

    /// Whether the client authenticates with OAUTHBEARER tokens (and so must be polled
    /// before it can connect).
    pub fn needs_token(&self) -> bool {
        self.token.is_some()
    }

    /// Wraps a client's own callbacks.
    pub fn wrap<T>(self, inner: T) -> Hooked<T> {
        Hooked { hooks: self, inner }
    }
}

/// What went wrong with a connection, by what an operator must fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The broker refused the credentials (a wrong password, an unknown user, a mechanism
    /// it does not enable).
    Authentication,
    /// TLS refused a certificate: an untrusted one, one for another name, a client
    /// certificate the broker requires and was not given.
    Tls,
    /// The broker closed the connection as a listener of another protocol would (a
    /// plaintext client at a TLS port, TLS at a plaintext one, SASL where there is none).
    /// A broker that is starting or stopping closes fresh connections the same way once,
    /// so this stops start-up only when it keeps happening ([`ConnectionReport`]).
    Protocol,
    /// The token source had no token to give.
    Token,
    /// The cluster's ACLs deny Herald's principal its topics.
    Authorization,
    /// The broker could not be reached (refused, reset, unresolvable).
    Transport,
}

/// librdkafka's and OpenSSL's words for a certificate refused by either side: no broker
/// restart says them.
const CERTIFICATE_REFUSED: [&str; 6] = [
    "certificate verify failed",
    "alert bad certificate",
    "alert unknown ca",
    "alert certificate unknown",
    "alert certificate required",
    "alert certificate expired",
];

/// librdkafka's hints that the listener speaks another protocol (a connection closed in
/// the TLS handshake alternates with the hinted one when TLS meets a plaintext listener).
const OTHER_PROTOCOL: [&str; 5] = [
    "incorrect security.protocol",
    "connecting to a PLAINTEXT broker listener",
    "SSL handshake failed",
    "in state SSL_HANDSHAKE",
    "wrong version number",
];

/// librdkafka's words for a connection the broker accepted and never completed within
/// `socket.connection.setup.timeout.ms` ("... in state SSL_HANDSHAKE").
const SETUP_TIMED_OUT: &str = "Connection setup timed out";

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Authentication => "authentication",
            FailureKind::Tls => "tls",
            FailureKind::Protocol => "protocol",
            FailureKind::Token => "token",
            FailureKind::Authorization => "authorization",
            FailureKind::Transport => "transport",
        }
    }

    /// The class of a client error by its code and librdkafka's words; `None` for errors
    /// that say nothing about the connection.
    pub fn of(code: RDKafkaErrorCode, reason: &str) -> Option<Self> {
        use RDKafkaErrorCode as C;
        if matches!(code, C::SSL | C::BrokerTransportFailure)
            && CERTIFICATE_REFUSED.iter().any(|w| reason.contains(w))
        {
            return Some(FailureKind::Tls);
        }
        // A broker that accepted the connection and then said nothing (paused, overloaded,
        // a black-holed network) times out in whatever state it was in: never a protocol.
        // (librdkafka 2.12 logs this one at warning level, below what reaches the error
        // callback; kept for a version that reports it.)
        if code == C::BrokerTransportFailure && reason.contains(SETUP_TIMED_OUT) {
            return Some(FailureKind::Transport);
        }
        Some(match code {
            C::Authentication
            | C::SaslAuthenticationFailed
            | C::UnsupportedSASLMechanism
            | C::IllegalSASLState
            | C::ClusterAuthorizationFailed => FailureKind::Authentication,
            C::SSL | C::BrokerTransportFailure if OTHER_PROTOCOL.iter().any(|w| reason.contains(w)) => {
                FailureKind::Protocol
            }
            C::SSL => FailureKind::Protocol,
            C::BrokerTransportFailure | C::Resolve | C::BrokerNotAvailable => FailureKind::Transport,
            // "1/1 brokers are down" follows each broker's own failure (already recorded)
            // and names no cause: it must neither replace that failure nor end a series of
            // protocol failures.
            C::AllBrokersDown => return None,
            _ => return None,
        })
    }

    /// Whether retrying cannot help until an operator changes something: start-up stops
    /// at once on these (and on [`FailureKind::Protocol`] when it persists).
    pub fn is_misconfiguration(self) -> bool {
        matches!(
            self,
            FailureKind::Authentication | FailureKind::Tls | FailureKind::Token | FailureKind::Authorization
        )
    }
}

/// How long protocol failures must go on, with no other failure and no answer in between,
/// before they count as a misconfiguration: a broker that restarts closes a fresh
/// connection once, then refuses connections (transport) until it is back. Time, not a
/// count: librdkafka reports an error identical to the broker's last one at most once every
/// 30 s (`rd_kafka_broker_set_error`), so a listener of another protocol that closes every
/// connection the same way is reported once, and one alternating between two of its words
/// a few times. Any other failure is never identical to the last one, so it always
/// reaches the report and ends the series ("all brokers are down", a summary with no
/// cause, is not recorded). What this can misjudge: a broker that closes one connection as
/// it goes down, while the client's reconnect backoff (grown past 2 s by earlier failures)
/// keeps it from trying again: start-up then stops naming the protocol, and the supervisor
/// starts Herald again.
const PROTOCOL_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// One connection failure: its kind and librdkafka's words (which name the broker).
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: FailureKind,
    pub reason: String,
    pub at: Instant,
}

/// How many of librdkafka's reasons for undecodable batches a client keeps.
const DECODE_FAILURES_KEPT: usize = 16;

/// What one client learned about its connections, and librdkafka's words for the batches it
/// could not decode.
#[derive(Debug, Default)]
pub struct ConnectionReport {
    last: Mutex<Option<Failure>>,
    last_misconfiguration: Mutex<Option<Failure>>,
    /// Protocol failures in a row (any other failure, or an answer, ends the series): when
    /// the first came, and the latest.
    protocol_series: Mutex<Option<(Instant, Failure)>>,
    tokens: AtomicU64,
    /// librdkafka's reasons for the last undecodable batches ("Decompression (codec 0x4) of
    /// message at 1234 of 567 bytes failed: ..."), newest last: the consumer error a
    /// consumer is handed carries only the code.
    decode_failures: Mutex<std::collections::VecDeque<String>>,
}

impl ConnectionReport {
    fn record(&self, kind: FailureKind, reason: &str) {
        let failure = Failure {
            kind,
            reason: reason.to_owned(),
            at: Instant::now(),
        };
        {
            let mut series = self.protocol_series.lock().unwrap_or_else(|e| e.into_inner());
            *series = match (kind, series.take()) {
                (FailureKind::Protocol, Some((since, _))) => Some((since, failure.clone())),
                (FailureKind::Protocol, None) => Some((failure.at, failure.clone())),
                _ => None,
            };
        }
        if kind.is_misconfiguration() {
            *self
                .last_misconfiguration
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(failure.clone());
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(failure);
    }

    /// A broker answered: protocol failures before it were a broker restarting.
    pub fn answered(&self) {
        *self.protocol_series.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The last failure of any kind.
    pub fn last(&self) -> Option<Failure> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last failure an operator must fix (credentials, certificates, tokens), or the
    /// latest of protocol failures that have gone on for [`PROTOCOL_FOR`] with nothing else
    /// in between. Judged when asked, not when librdkafka reports: it reports a repeated
    /// failure only once in 30 s.
    pub fn last_misconfiguration(&self) -> Option<Failure> {
        let latched = self
            .last_misconfiguration
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        latched.or_else(|| {
            let series = self.protocol_series.lock().unwrap_or_else(|e| e.into_inner());
            series
                .as_ref()
                .filter(|(since, _)| since.elapsed() >= PROTOCOL_FOR)
                .map(|(_, latest)| latest.clone())
        })
    }

    /// How many OAUTHBEARER tokens this client handed to librdkafka.
    pub fn tokens_given(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    fn record_decode_failure(&self, reason: &str) {
        let mut kept = self.decode_failures.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == DECODE_FAILURES_KEPT {
            kept.pop_front();
        }
        kept.push_back(reason.to_owned());
    }

    /// librdkafka's last reason for an undecodable batch.
    pub fn last_decode_failure(&self) -> Option<String> {
        self.decode_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .back()
            .cloned()
    }

    /// librdkafka's last reason for an undecodable batch that starts at `offset` (its
    /// reasons name the batch's first offset, not its partition).
    pub fn decode_failure_at(&self, offset: i64) -> Option<String> {
        let kept = self.decode_failures.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter()
            .rev()
            .find(|r| crate::undecodable::batch_start(r) == Some(offset))
            .cloned()
    }
}

/// A client's own callbacks (`inner`: rebalances, delivery reports, or `()`), with the
/// hooks every client has. The one `ClientContext` of Herald's clients.
pub struct Hooked<T> {
    pub hooks: Hooks,
    pub inner: T,
}

impl<T> AsRef<Hooks> for Hooked<T> {
    fn as_ref(&self) -> &Hooks {
        &self.hooks
    }
}

impl<T: Send + Sync + 'static> ClientContext for Hooked<T> {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn stats(&self, statistics: Statistics) {
        if let Some(lag) = &self.hooks.lag {
            lag.record(&statistics);
        }
    }

    fn error(&self, error: RdKafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        if let Some(kind) = code.and_then(|c| FailureKind::of(c, reason)) {
            self.hooks.report.record(kind, reason);
        }
        if code.is_some_and(crate::undecodable::is_undecodable) {
            self.hooks.report.record_decode_failure(reason);
        }
        // As rust-rdkafka's default context logs them (same target and text), so that a
        // broker that refuses the password is an ERROR line naming it, at every attempt.
        tracing::error!(target: "rdkafka::client", "librdkafka: {error}: {reason}");
    }

    fn generate_oauth_token(&self, _oauthbearer_config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        let Some(source) = &self.hooks.token else {
            // librdkafka asks only when sasl.mechanism is OAUTHBEARER, which Security sets
            // only with a source: unreachable unless a property got around it.
            let reason =
                "sasl.mechanism is OAUTHBEARER but Herald has no token source (kafka.sasl.mechanism)";
            self.hooks.report.record(FailureKind::Token, reason);
            return Err(reason.into());
        };
        match source.token() {
            Ok(token) => {
                self.hooks.report.tokens.fetch_add(1, Ordering::Relaxed);
                let lifetime_ms = token
                    .expires_at
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                tracing::debug!(source = source.describe(), principal = %token.principal, lifetime_ms,
                    "OAUTHBEARER token handed to librdkafka");
                Ok(OAuthToken {
                    token: token.value,
                    principal_name: token.principal,
                    lifetime_ms,
                })
            }
            Err(e) => {
                let reason = e.to_string();
                self.hooks.report.record(FailureKind::Token, &reason);
                tracing::error!(target: "rdkafka::client", source = source.describe(), error = %reason,
                    "no OAUTHBEARER token for librdkafka; it asks again shortly, and the client stays unconnected meanwhile");
                Err(reason.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::{Token, TokenError};
    use std::time::Duration;

    struct Fixed(Option<&'static str>);

    impl TokenSource for Fixed {
        fn token(&self) -> Result<Token, TokenError> {
            match self.0 {
                Some(v) => Ok(Token {
                    value: v.into(),
                    principal: "p".into(),
                    expires_at: UNIX_EPOCH + Duration::from_secs(2_000_000_000),
                }),
                None => Err(TokenError {
                    source_name: "fixed",
                    detail: "no credentials".into(),
                }),
            }
        }
        fn describe(&self) -> &'static str {
            "fixed"
        }
    }

    #[test]
    fn a_token_is_handed_over_with_its_expiry_in_ms_and_a_failure_is_kept() {
        let ok = Hooks::new(Some(Arc::new(Fixed(Some("tok"))))).wrap(());
        let t = ok.generate_oauth_token(None).unwrap();
        assert_eq!((t.token.as_str(), t.lifetime_ms), ("tok", 2_000_000_000_000));
        assert_eq!(ok.hooks.report().tokens_given(), 1);

        let failing = Hooks::new(Some(Arc::new(Fixed(None)))).wrap(());
        let Err(e) = failing.generate_oauth_token(None) else {
            panic!("a token from a source that has none")
        };
        assert!(e.to_string().contains("no credentials"), "{e}");
        let f = failing.hooks.report().last_misconfiguration().unwrap();
        assert_eq!(f.kind, FailureKind::Token);
        assert_eq!(failing.hooks.report().tokens_given(), 0);
    }

    #[test]
    fn client_errors_are_kept_by_what_an_operator_must_fix() {
        let c = Hooks::new(None).wrap(());
        c.error(
            RdKafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "127.0.0.1:1/bootstrap: Connect failed: Connection refused",
        );
        assert_eq!(c.hooks.report().last().unwrap().kind, FailureKind::Transport);
        assert!(c.hooks.report().last_misconfiguration().is_none());
        c.error(
            RdKafkaError::Global(RDKafkaErrorCode::Authentication),
            "sasl_ssl://127.0.0.1:19094/bootstrap: SASL authentication error: invalid credentials",
        );
        let f = c.hooks.report().last_misconfiguration().unwrap();
        assert_eq!(f.kind, FailureKind::Authentication);
        assert!(f.reason.contains("19094"));
        c.error(
            RdKafkaError::Global(RDKafkaErrorCode::SSL),
            "ssl://b:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
        );
        assert_eq!(
            c.hooks.report().last_misconfiguration().unwrap().kind,
            FailureKind::Tls
        );
        // An error that says nothing about the connection changes nothing.
        c.error(RdKafkaError::Global(RDKafkaErrorCode::QueueFull), "queue full");
        assert_eq!(c.hooks.report().last().unwrap().kind, FailureKind::Tls);
        // A batch that cannot be decoded is kept by the offset it names.
        c.error(
            RdKafkaError::Global(RDKafkaErrorCode::NotImplemented),
            "Decompression (codec 0x4) of message at 1234 of 567 bytes failed: Local: Not implemented",
        );
        assert!(c
            .hooks
            .report()
            .decode_failure_at(1234)
            .unwrap()
            .contains("codec 0x4"));
        assert_eq!(c.hooks.report().decode_failure_at(123), None);
    }

    #[test]
    fn a_refused_certificate_is_tls_and_a_closed_connection_only_suspect() {
        let of = |code, reason| FailureKind::of(code, reason);
        use RDKafkaErrorCode::{BrokerTransportFailure as T, SSL};
        assert_eq!(
            of(T, "ssl://127.0.0.1:19096/bootstrap: Receive failed: ...: SSL routines::sslv3 alert bad certificate: SSL alert number 42"),
            Some(FailureKind::Tls)
        );
        for closed in [
            "sasl_ssl://127.0.0.1:19092/bootstrap: SSL handshake failed: Disconnected: SSL connection closed by peer: connecting to a PLAINTEXT broker listener? (after 2ms in state SSL_HANDSHAKE)",
            "sasl_ssl://127.0.0.1:19092/bootstrap: Disconnected: SSL connection closed by peer (after 0ms in state SSL_HANDSHAKE)",
            "127.0.0.1:19094/bootstrap: Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol configuration (connecting to a SSL listener?)",
        ] {
            assert_eq!(of(T, closed), Some(FailureKind::Protocol), "{closed}");
        }
        assert_eq!(
            of(
                T,
                "b:9092/1: Connect to ipv4#127.0.0.1:19192 failed: Connection refused"
            ),
            Some(FailureKind::Transport)
        );
        assert_eq!(
            of(
                SSL,
                "ssl://b:9093/1: SSL handshake failed: unexpected eof while reading"
            ),
            Some(FailureKind::Protocol)
        );
    }

    #[test]
    fn a_protocol_failure_counts_only_when_it_keeps_happening() {
        let report = ConnectionReport::default();
        let closed = "b:9094/bootstrap: Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol configuration";
        let age = |r: &ConnectionReport, by: Duration| {
            if let Some((since, _)) = r.protocol_series.lock().unwrap().as_mut() {
                *since -= by;
            }
        };
        // A broker restarting: closed once, then refused, then closed once more.
        report.record(FailureKind::Protocol, closed);
        age(&report, PROTOCOL_FOR);
        report.record(FailureKind::Transport, "Connection refused");
        report.record(FailureKind::Protocol, closed);
        report.record(FailureKind::Transport, "Connection refused");
        assert!(report.last_misconfiguration().is_none());
        // Closed once, then the broker answered: a restart, however long ago.
        report.record(FailureKind::Protocol, closed);
        report.answered();
        age(&report, PROTOCOL_FOR);
        assert!(report.last_misconfiguration().is_none());
        // Another protocol's listener: closed at every try, and librdkafka reports the
        // repeats of an identical error once in 30 s, so one report may be all there is.
        report.record(FailureKind::Protocol, closed);
        assert!(
            report.last_misconfiguration().is_none(),
            "not yet for long enough"
        );
        age(&report, PROTOCOL_FOR);
        let f = report
            .last_misconfiguration()
            .expect("2 s of nothing but closed connections");
        assert_eq!((f.kind, f.reason.as_str()), (FailureKind::Protocol, closed));
        // A later report of the same series keeps its start.
        report.record(FailureKind::Protocol, "b:9094/bootstrap: SSL handshake failed");
        assert_eq!(
            report.last_misconfiguration().unwrap().reason,
            "b:9094/bootstrap: SSL handshake failed"
        );
    }

    #[test]
    fn all_brokers_down_ends_no_protocol_series() {
        assert_eq!(
            FailureKind::of(RDKafkaErrorCode::AllBrokersDown, "1/1 brokers are down"),
            None
        );
        let c = Hooks::new(None).wrap(());
        let closed = "sasl_ssl://127.0.0.1:19092/bootstrap: SSL handshake failed: Disconnected: SSL connection closed by peer: connecting to a PLAINTEXT broker listener?";
        c.error(
            RdKafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            closed,
        );
        c.error(
            RdKafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        if let Some((since, _)) = c.hooks.report().protocol_series.lock().unwrap().as_mut() {
            *since -= PROTOCOL_FOR;
        }
        let f = c
            .hooks
            .report()
            .last_misconfiguration()
            .expect("the listener of another protocol, named");
        assert_eq!(f.reason, closed);
        assert_eq!(c.hooks.report().last().unwrap().reason, closed);
    }

    #[test]
    fn a_handshake_that_times_out_is_transport() {
        assert_eq!(
            FailureKind::of(
                RDKafkaErrorCode::BrokerTransportFailure,
                "sasl_ssl://127.0.0.1:19092/bootstrap: Connection setup timed out in state SSL_HANDSHAKE (after 30029ms in state SSL_HANDSHAKE)"
            ),
            Some(FailureKind::Transport)
        );
    }
}
