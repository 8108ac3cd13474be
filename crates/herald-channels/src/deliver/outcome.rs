//! What one provider call came to: an [`Outcome`] (the attempt's result class) and, when it
//! was not accepted, an [`ErrorCategory`] from a bounded set that is safe to use as a metric
//! label. This module only names the results; which error maps to which result is decided in
//! `classify.rs` and nowhere else.

use std::fmt;

use herald_core::AttemptOutcome;

/// The result of one attempt: one provider request, never retried inside the SDK.
///
/// `detail` is for the attempt record and the logs, not for labels. It carries the
/// provider's own message, which can name the addresses involved (SES lists the identities
/// that failed verification): treat it as sensitive, like the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The provider took the message and gave it this id.
    Accepted { provider_message_id: String },
    /// Permanent: the provider refused this message, or it could not be built. Never retried.
    Rejected { category: ErrorCategory, detail: String },
    /// Safe to retry: the provider did not take the message (throttled, unavailable (503),
    /// or the request never left this process or never reached a connected socket).
    Retryable { category: ErrorCategory, detail: String },
    /// The request may have been received but no answer was observed (timeout, connection
    /// broken after the request was written, unreadable response), or the answer does not
    /// say whether it was processed (an internal error, 502, 504, another 5xx). A retry
    /// may duplicate.
    Unknown { category: ErrorCategory, detail: String },
}

impl Outcome {
    /// The attempt outcome to store (`accepted`, `rejected`, `retryable`, `unknown`).
    pub fn attempt_outcome(&self) -> AttemptOutcome {
        match self {
            Outcome::Accepted { .. } => AttemptOutcome::Accepted,
            Outcome::Rejected { .. } => AttemptOutcome::Rejected,
            Outcome::Retryable { .. } => AttemptOutcome::Retryable,
            Outcome::Unknown { .. } => AttemptOutcome::Unknown,
        }
    }

    /// The reason label, `None` for an accepted message.
    pub fn category(&self) -> Option<ErrorCategory> {
        match self {
            Outcome::Accepted { .. } => None,
            Outcome::Rejected { category, .. }
            | Outcome::Retryable { category, .. }
            | Outcome::Unknown { category, .. } => Some(*category),
        }
    }

    /// The human-readable detail, `None` for an accepted message.
    pub fn detail(&self) -> Option<&str> {
        match self {
            Outcome::Accepted { .. } => None,
            Outcome::Rejected { detail, .. }
            | Outcome::Retryable { detail, .. }
            | Outcome::Unknown { detail, .. } => Some(detail),
        }
    }
}

/// Why an attempt was not accepted. A bounded set, stored and exported as snake_case text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    /// The provider throttled the call (SES `TooManyRequestsException`, SNS `Throttling`).
    Throttled,
    /// SES sending is paused for the account or configuration set.
    SendingPaused,
    /// SES `LimitExceededException` (a quota such as the daily sending quota).
    LimitExceeded,
    /// The provider failed on its side: HTTP 5xx, `InternalError`, `ServiceUnavailable`.
    ProviderError,
    /// No connection was established: refused, DNS failure, connect timeout, TLS handshake.
    ConnectFailed,
    /// No credentials could be loaded, so no request was signed or sent.
    CredentialsUnavailable,
    /// The provider refused the signature as expired (expired session token, clock skew);
    /// the SDK refreshes credentials and corrects the skew for the next attempt.
    CredentialsExpired,
    /// No endpoint could be resolved (no or invalid region), so no request was sent.
    EndpointUnresolved,
    /// SES `MessageRejected` for any reason other than an unverified sender.
    MessageRejected,
    /// SES `BadRequestException`.
    BadRequest,
    /// The sender address, its domain or the MAIL FROM domain is not a verified identity.
    UnverifiedSender,
    /// SNS `InvalidParameter`, `ParameterValueInvalid`, `ValidationException`.
    InvalidParameter,
    /// The destination opted out of SMS.
    OptedOut,
    /// SNS `EndpointDisabled` or `PlatformApplicationDisabled`.
    EndpointDisabled,
    /// The named resource does not exist (SES configuration set, SNS target).
    NotFound,
    /// The caller is not allowed (SNS `AuthorizationError`, access denied, bad access key).
    AuthFailed,
    /// SES `AccountSuspendedException`.
    AccountSuspended,
    /// The attempt timed out after the request may have been written.
    Timeout,
    /// The connection broke after the request may have been written.
    ConnectionBroken,
    /// A response arrived but could not be read (or a 2xx carried no message id).
    UnreadableResponse,
    /// The request could not be built from the message (caught locally, nothing sent).
    RequestConstruction,
    /// Anything not recognised above.
    Other,
}

impl ErrorCategory {
    pub const ALL: [ErrorCategory; 22] = [
        ErrorCategory::Throttled,
        ErrorCategory::SendingPaused,
        ErrorCategory::LimitExceeded,
        ErrorCategory::ProviderError,
        ErrorCategory::ConnectFailed,
        ErrorCategory::CredentialsUnavailable,
        ErrorCategory::CredentialsExpired,
        ErrorCategory::EndpointUnresolved,
        ErrorCategory::MessageRejected,
        ErrorCategory::BadRequest,
        ErrorCategory::UnverifiedSender,
        ErrorCategory::InvalidParameter,
        ErrorCategory::OptedOut,
        ErrorCategory::EndpointDisabled,
        ErrorCategory::NotFound,
        ErrorCategory::AuthFailed,
        ErrorCategory::AccountSuspended,
        ErrorCategory::Timeout,
        ErrorCategory::ConnectionBroken,
        ErrorCategory::UnreadableResponse,
        ErrorCategory::RequestConstruction,
        ErrorCategory::Other,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCategory::Throttled => "throttled",
            ErrorCategory::SendingPaused => "sending_paused",
            ErrorCategory::LimitExceeded => "limit_exceeded",
            ErrorCategory::ProviderError => "provider_error",
            ErrorCategory::ConnectFailed => "connect_failed",
            ErrorCategory::CredentialsUnavailable => "credentials_unavailable",
            ErrorCategory::CredentialsExpired => "credentials_expired",
            ErrorCategory::EndpointUnresolved => "endpoint_unresolved",
            ErrorCategory::MessageRejected => "message_rejected",
            ErrorCategory::BadRequest => "bad_request",
            ErrorCategory::UnverifiedSender => "unverified_sender",
            ErrorCategory::InvalidParameter => "invalid_parameter",
            ErrorCategory::OptedOut => "opted_out",
            ErrorCategory::EndpointDisabled => "endpoint_disabled",
            ErrorCategory::NotFound => "not_found",
            ErrorCategory::AuthFailed => "auth_failed",
            ErrorCategory::AccountSuspended => "account_suspended",
            ErrorCategory::Timeout => "timeout",
            ErrorCategory::ConnectionBroken => "connection_broken",
            ErrorCategory::UnreadableResponse => "unreadable_response",
            ErrorCategory::RequestConstruction => "request_construction",
            ErrorCategory::Other => "other",
        }
    }
}

impl fmt::Display for ErrorCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn category_labels_are_distinct_snake_case() {
        let labels: HashSet<&str> = ErrorCategory::ALL.iter().map(ErrorCategory::as_str).collect();
        assert_eq!(labels.len(), ErrorCategory::ALL.len());
        for label in labels {
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label}"
            );
        }
    }

    #[test]
    fn outcome_maps_onto_the_stored_attempt_outcome() {
        let accepted = Outcome::Accepted {
            provider_message_id: "m-1".into(),
        };
        assert_eq!(accepted.attempt_outcome(), AttemptOutcome::Accepted);
        assert_eq!(accepted.category(), None);
        let unknown = Outcome::Unknown {
            category: ErrorCategory::Timeout,
            detail: "t".into(),
        };
        assert_eq!(unknown.attempt_outcome(), AttemptOutcome::Unknown);
        assert_eq!(unknown.category(), Some(ErrorCategory::Timeout));
        assert_eq!(unknown.detail(), Some("t"));
    }
}
