//! The one place that decides what a provider call came to: accepted, rejected for good,
//! safe to retry, or unknown. Both senders hand every SDK result here; no other module
//! matches on error codes or transport errors.
//!
//! The rule that matters most: `Retryable` only when the provider cannot have taken the
//! message (it said so, or the request never reached a connected socket); whenever the
//! request may have been written, `Unknown`. A wrong `Retryable` sends a seller a duplicate
//! that no attempt row explains; a wrong `Unknown` only costs an operator a look.
//!
//! # Telling "never connected" from "broken after send"
//!
//! `SdkError::DispatchFailure` wraps a `ConnectorError` whose kind (`io`, `timeout`, `user`,
//! `other`) does not say which: aws-smithy-http-client 1.5 (`src/client.rs`, `downcast_error`
//! and `to_connector_error`) reports a refused connection and a connection reset in
//! mid-response both as `io`, and a connect timeout and a read timeout both as `timeout`.
//! `ConnectorError` has a `never_connected()` marker, but that connector never sets it and
//! it cannot be read back. What survives is the error's source chain:
//!
//! - The connector is a hyper-util legacy `Client` (`ConnectorBuilder::wrap_connector`) whose
//!   TCP/TLS connector sits inside the connect-timeout wrapper. Every failure while
//!   establishing the connection (refused, DNS, TLS handshake, and the connect timeout, whose
//!   `HttpTimeoutError` is the connector's own error) comes out of hyper-util as
//!   `hyper_util::client::legacy::Error` of kind `Connect` (`client.rs`, `connect_to`:
//!   `.map_err(|src| e!(Connect, src))`); `is_connect()` is its public test. A failure once a
//!   connection was handed a request is of kind `SendRequest` or `Canceled` with a
//!   `hyper::Error` inside (`try_send_request`), and a read timeout is an `HttpTimeoutError`
//!   around the whole call. So: `is_connect()` anywhere in the chain means the request never
//!   left; otherwise it may have.
//! - A custom DNS resolver reports `ResolveDnsError`; `io::ErrorKind::ConnectionRefused` can
//!   only come from `connect()`. Both also mean "never connected".
//! - hyper-util's `Canceled` (the request was handed back unsent) would also be safe, but its
//!   test is private; it stays `Unknown`. On a reused connection hyper-util resends such a
//!   request itself.
//! - Credential and endpoint resolution run in the orchestrator before dispatch; their
//!   failures are turned into `ConnectorError::other` (aws-smithy-runtime-api,
//!   `convert_dispatch_error`). They are recognised by `CredentialsError` /
//!   `ResolveEndpointError` in the chain. A missing region fails there; an invalid one fails
//!   earlier, as a `ConstructionFailure` around the SDK's endpoint `InvalidParams`. Both are
//!   configuration errors, not properties of the message: `Retryable`, not `Rejected`.
//!
//! If a dependency update changes these types (a hyper-util 0.2, an aws-smithy-http 0.65),
//! the checks stop matching and those failures fall back to `Unknown`: safe, and the
//! connect-failure and invalid-region cases are caught by `tests/transport.rs`, which drives
//! the real client into each of them.
//!
//! The attempt timeout (`SdkError::TimeoutError`) covers the whole attempt, so it cannot say
//! where it fired: always `Unknown`. Keep the connect timeout shorter than the attempt
//! timeout so that a dead host shows up as `connect_failed`.

use std::error::Error;
use std::io;

use aws_credential_types::provider::error::CredentialsError;
use aws_smithy_runtime_api::client::dns::ResolveDnsError;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::{ConnectorError, SdkError};
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use aws_smithy_types::error::operation::BuildError;
use aws_smithy_types::retry::ErrorKind as RetryErrorKind;

use crate::deliver::outcome::{ErrorCategory, Outcome};

/// Longest `detail` kept, in bytes: provider messages and error chains can be long.
const MAX_DETAIL: usize = 1024;

/// Throttling codes of SES v2, SNS and the common AWS protocols (the SDK's own list in
/// aws-runtime `THROTTLING_ERRORS`, less `LimitExceededException`, which SES uses for quotas).
const THROTTLING: &[&str] = &[
    "TooManyRequestsException",
    "Throttling",
    "ThrottlingException",
    "Throttled",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "RequestLimitExceeded",
    "SlowDown",
    "KMSThrottling",
];

/// Provider-side failures that say the request was not processed: the service turned it
/// away (unavailable) or gave up reading it (aws-runtime `TRANSIENT_ERRORS`).
const NOT_PROCESSED: &[&str] = &[
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// Provider-side failures that do not say how far the request got: an internal error may
/// come after the message was queued. AWS calls them retryable; for a call without an
/// idempotency token that means "may duplicate", so they are `Unknown`.
const INTERNAL_ERRORS: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "InternalServerError",
    "InternalErrorException",
];

/// Signature refused as stale: the SDK refreshes credentials and corrects clock skew for
/// the next attempt.
const EXPIRED: &[&str] = &[
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "RequestTimeTooSkewed",
];

const AUTH_FAILED: &[&str] = &[
    "AuthorizationError",
    "InvalidSecurity",
    "AccessDenied",
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "InvalidSignatureException",
    "MissingAuthenticationToken",
    "AuthFailure",
];

const INVALID_PARAMETER: &[&str] = &[
    "InvalidParameter",
    "ParameterValueInvalid",
    "ValidationException",
    "InvalidParameterValue",
];

#[derive(Debug, Clone, Copy)]
enum Class {
    Rejected,
    Retryable,
    Unknown,
}

fn outcome(class: Class, category: ErrorCategory, detail: impl Into<String>) -> Outcome {
    let detail = bounded(detail.into());
    match class {
        Class::Rejected => Outcome::Rejected { category, detail },
        Class::Retryable => Outcome::Retryable { category, detail },
        Class::Unknown => Outcome::Unknown { category, detail },
    }
}

/// A 2xx answer: accepted if it names the message, otherwise we cannot tell what happened.
pub(crate) fn accepted(provider_message_id: Option<String>) -> Outcome {
    match provider_message_id {
        Some(id) if !id.is_empty() => Outcome::Accepted {
            provider_message_id: storable(id),
        },
        _ => outcome(
            Class::Unknown,
            ErrorCategory::UnreadableResponse,
            "the provider answered 2xx without a message id",
        ),
    }
}

/// The request could not be built from the message: nothing was sent, and it never will be.
pub(crate) fn unbuildable(err: &BuildError) -> Outcome {
    outcome(
        Class::Rejected,
        ErrorCategory::RequestConstruction,
        format!("request not built: {}", DisplayErrorContext(err)),
    )
}

/// Any failed SDK call.
pub(crate) fn sdk_error<E>(err: &SdkError<E, HttpResponse>) -> Outcome
where
    E: ProvideErrorMetadata + Error + 'static,
{
    let detail = || DisplayErrorContext(err).to_string();
    match err {
        SdkError::ConstructionFailure(_) if invalid_endpoint_params(err) => {
            outcome(Class::Retryable, ErrorCategory::EndpointUnresolved, detail())
        }
        SdkError::ConstructionFailure(_) => {
            outcome(Class::Rejected, ErrorCategory::RequestConstruction, detail())
        }
        SdkError::TimeoutError(_) => outcome(Class::Unknown, ErrorCategory::Timeout, detail()),
        SdkError::DispatchFailure(failure) => match failure.as_connector_error() {
            Some(connector) => dispatch_failure(connector, detail()),
            None => outcome(Class::Unknown, ErrorCategory::Other, detail()),
        },
        SdkError::ResponseError(_) => outcome(Class::Unknown, ErrorCategory::UnreadableResponse, detail()),
        SdkError::ServiceError(service) => {
            let (e, status) = (service.err(), service.raw().status().as_u16());
            let detail = match (e.code(), e.message()) {
                (None, None) => format!("HTTP {status}: {}", DisplayErrorContext(e)),
                (code, message) => format!(
                    "{} (HTTP {status}): {}",
                    code.unwrap_or("no error code"),
                    message.unwrap_or("no message")
                ),
            };
            service_error(e.code(), e.message(), status, detail)
        }
        _ => outcome(Class::Unknown, ErrorCategory::Other, detail()),
    }
}

/// The request did not get an HTTP response. See the module doc for how "never connected"
/// is told apart from "may have been written".
fn dispatch_failure(err: &ConnectorError, detail: String) -> Outcome {
    if never_connected(err) {
        return outcome(Class::Retryable, ErrorCategory::ConnectFailed, detail);
    }
    if chain(err).any(|e| e.is::<CredentialsError>()) {
        return outcome(Class::Retryable, ErrorCategory::CredentialsUnavailable, detail);
    }
    if chain(err).any(|e| {
        e.is::<aws_smithy_http::endpoint::ResolveEndpointError>()
            || e.is::<aws_smithy_runtime_api::client::endpoint::error::ResolveEndpointError>()
    }) {
        return outcome(Class::Retryable, ErrorCategory::EndpointUnresolved, detail);
    }
    if err.is_timeout() {
        outcome(Class::Unknown, ErrorCategory::Timeout, detail)
    } else if err.is_io() || err.as_other() == Some(RetryErrorKind::TransientError) {
        // `TransientError` is how the HTTP client reports hyper's "connection closed before
        // message completed" (`to_connector_error`).
        outcome(Class::Unknown, ErrorCategory::ConnectionBroken, detail)
    } else if err.is_user() {
        // The HTTP layer refused to build the request (invalid header, URI): nothing written.
        outcome(Class::Rejected, ErrorCategory::RequestConstruction, detail)
    } else {
        outcome(Class::Unknown, ErrorCategory::Other, detail)
    }
}

/// An invalid region fails while the endpoint parameters are built, before serialization:
/// a configuration error, not a property of the message. Each SDK has its own type for it.
fn invalid_endpoint_params(err: &(dyn Error + 'static)) -> bool {
    chain(err).any(|e| {
        e.is::<aws_sdk_sesv2::config::endpoint::InvalidParams>()
            || e.is::<aws_sdk_sns::config::endpoint::InvalidParams>()
    })
}

fn never_connected(err: &ConnectorError) -> bool {
    chain(err).any(|e| {
        e.downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(hyper_util::client::legacy::Error::is_connect)
            || e.is::<ResolveDnsError>()
            || e.downcast_ref::<io::Error>()
                .is_some_and(|io| io.kind() == io::ErrorKind::ConnectionRefused)
    })
}

/// The error and its sources. `io::Error::source` skips its payload, so after an
/// `io::Error` the next link is the payload itself (as aws-smithy-http-client does).
fn chain<'a>(err: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(err), |&e| match e.downcast_ref::<io::Error>() {
        Some(io) => io.get_ref().map(|payload| payload as &(dyn Error + 'static)),
        None => e.source(),
    })
}

/// The provider answered with an error. The code decides; the HTTP status decides for codes
/// not listed here (4xx: the provider refused this request; 503: it turned the request
/// away; any other 5xx: it failed somewhere, perhaps after taking the message).
///
/// A 502 or 504 comes from a gateway in front of the service: whatever code the body
/// carries, the request may have reached the service and been processed, so it is
/// `Unknown` unless the answer is a throttle.
fn service_error(code: Option<&str>, message: Option<&str>, status: u16, detail: String) -> Outcome {
    use ErrorCategory as C;
    let code = code.unwrap_or("");
    if matches!(status, 502 | 504) && !THROTTLING.contains(&code) {
        return outcome(Class::Unknown, C::ProviderError, detail);
    }
    let (class, category) = match code {
        c if THROTTLING.contains(&c) => (Class::Retryable, C::Throttled),
        "SendingPausedException" => (Class::Retryable, C::SendingPaused),
        "LimitExceededException" => (Class::Retryable, C::LimitExceeded),
        c if NOT_PROCESSED.contains(&c) => (Class::Retryable, C::ProviderError),
        c if INTERNAL_ERRORS.contains(&c) => (Class::Unknown, C::ProviderError),
        c if EXPIRED.contains(&c) => (Class::Retryable, C::CredentialsExpired),
        "MessageRejected" if mentions_unverified(message) => (Class::Rejected, C::UnverifiedSender),
        "MessageRejected" => (Class::Rejected, C::MessageRejected),
        "MailFromDomainNotVerifiedException" => (Class::Rejected, C::UnverifiedSender),
        "BadRequestException" => (Class::Rejected, C::BadRequest),
        "NotFoundException" | "NotFound" => (Class::Rejected, C::NotFound),
        "AccountSuspendedException" => (Class::Rejected, C::AccountSuspended),
        "EndpointDisabled" | "PlatformApplicationDisabled" => (Class::Rejected, C::EndpointDisabled),
        "OptedOut" | "OptedOutException" => (Class::Rejected, C::OptedOut),
        c if INVALID_PARAMETER.contains(&c) => (Class::Rejected, C::InvalidParameter),
        c if AUTH_FAILED.contains(&c) => (Class::Rejected, C::AuthFailed),
        _ => match status {
            429 => (Class::Retryable, C::Throttled),
            503 => (Class::Retryable, C::ProviderError),
            500..=599 => (Class::Unknown, C::ProviderError),
            400..=499 => (Class::Rejected, C::Other),
            // A 2xx whose body the SDK could not parse comes back as an unhandled service error.
            200..=299 => (Class::Unknown, C::UnreadableResponse),
            _ => (Class::Unknown, C::Other),
        },
    };
    outcome(class, category, detail)
}

/// SES says "Email address is not verified. The following identities failed the check ...".
fn mentions_unverified(message: Option<&str>) -> bool {
    message.is_some_and(|m| m.to_ascii_lowercase().contains("not verified"))
}

/// Provider text as the attempt ledger can store it: control characters (U+0000 above all,
/// which PostgreSQL's text refuses, so a provider answering with one would fail the record
/// of a send that happened, again and again) become U+FFFD; line breaks and tabs stay.
pub(crate) fn storable(text: String) -> String {
    if text.chars().all(|c| !c.is_control() || c == '\n' || c == '\t') {
        return text;
    }
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            }
        })
        .collect()
}

fn bounded(detail: String) -> String {
    let mut detail = storable(detail);
    if detail.len() > MAX_DETAIL {
        let mut end = MAX_DETAIL;
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        detail.truncate(end);
        detail.push('…');
    }
    detail
}

#[cfg(test)]
mod tests;
