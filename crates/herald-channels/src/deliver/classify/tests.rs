//! One test per classification row. Errors are built by hand the way the SDK builds them: a
//! modeled or generic service error with its `ErrorMetadata` code and a raw HTTP response, or
//! a `ConnectorError` around the kind of source the HTTP client produces. The shapes that
//! cannot be built by hand (hyper-util's connect error) are covered in `tests/transport.rs`.

use std::io;
use std::time::Duration;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_sesv2::operation::send_email::SendEmailError;
use aws_sdk_sesv2::types::error as ses;
use aws_sdk_sns::operation::publish::PublishError;
use aws_sdk_sns::types::error as sns;
use aws_smithy_runtime_api::client::dns::ResolveDnsError;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::{ConnectorError, SdkError};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::error::ErrorMetadata;

use super::*;
use crate::deliver::outcome::ErrorCategory as C;

type SesError = SdkError<SendEmailError, HttpResponse>;
type SnsError = SdkError<PublishError, HttpResponse>;

fn response(status: u16) -> HttpResponse {
    HttpResponse::new(
        StatusCode::try_from(status).expect("valid status"),
        SdkBody::empty(),
    )
}

fn meta(code: &str, message: &str) -> ErrorMetadata {
    ErrorMetadata::builder().code(code).message(message).build()
}

fn ses_service(err: SendEmailError, status: u16) -> Outcome {
    sdk_error(&SesError::service_error(err, response(status)))
}

fn sns_service(err: PublishError, status: u16) -> Outcome {
    sdk_error(&SnsError::service_error(err, response(status)))
}

/// An SES error the way the deserializer returns one not in `SendEmailError`'s model.
fn ses_generic(code: &str, message: &str, status: u16) -> Outcome {
    ses_service(SendEmailError::generic(meta(code, message)), status)
}

fn dispatch(err: ConnectorError) -> Outcome {
    sdk_error(&SesError::dispatch_failure(err))
}

#[track_caller]
fn assert_rejected(outcome: Outcome, expected: ErrorCategory) {
    match outcome {
        Outcome::Rejected { category, .. } if category == expected => {}
        other => panic!("expected Rejected({expected}), got {other:?}"),
    }
}

#[track_caller]
fn assert_retryable(outcome: Outcome, expected: ErrorCategory) {
    match outcome {
        Outcome::Retryable { category, .. } if category == expected => {}
        other => panic!("expected Retryable({expected}), got {other:?}"),
    }
}

#[track_caller]
fn assert_unknown(outcome: Outcome, expected: ErrorCategory) {
    match outcome {
        Outcome::Unknown { category, .. } if category == expected => {}
        other => panic!("expected Unknown({expected}), got {other:?}"),
    }
}

// ---- success ----

#[test]
fn success_with_message_id_is_accepted() {
    assert_eq!(
        accepted(Some("0100-abc".into())),
        Outcome::Accepted {
            provider_message_id: "0100-abc".into()
        }
    );
}

#[test]
fn success_without_message_id_is_unknown_unreadable_response() {
    assert_unknown(accepted(None), C::UnreadableResponse);
    assert_unknown(accepted(Some(String::new())), C::UnreadableResponse);
}

// ---- retryable: the provider did not take the message ----

#[test]
fn ses_too_many_requests_is_retryable_throttled() {
    let err = ses::TooManyRequestsException::builder()
        .message("Too many requests")
        .meta(meta("TooManyRequestsException", "Too many requests"))
        .build();
    assert_retryable(
        ses_service(SendEmailError::TooManyRequestsException(err), 429),
        C::Throttled,
    );
}

#[test]
fn sns_throttling_is_retryable_throttled() {
    let err = PublishError::generic(meta("Throttling", "Rate exceeded"));
    assert_retryable(sns_service(err, 400), C::Throttled);
}

#[test]
fn ses_sending_paused_is_retryable() {
    let err = ses::SendingPausedException::builder()
        .meta(meta(
            "SendingPausedException",
            "Sending is paused for this account",
        ))
        .build();
    assert_retryable(
        ses_service(SendEmailError::SendingPausedException(err), 400),
        C::SendingPaused,
    );
}

#[test]
fn ses_limit_exceeded_is_retryable() {
    let err = ses::LimitExceededException::builder()
        .meta(meta("LimitExceededException", "Daily message quota exceeded"))
        .build();
    assert_retryable(
        ses_service(SendEmailError::LimitExceededException(err), 400),
        C::LimitExceeded,
    );
}

#[test]
fn ses_5xx_internal_failure_is_unknown_it_may_have_been_processed() {
    assert_unknown(
        ses_generic("InternalFailure", "internal failure", 500),
        C::ProviderError,
    );
}

#[test]
fn sns_internal_error_is_unknown_it_may_have_been_processed() {
    let err = sns::InternalErrorException::builder()
        .meta(meta("InternalError", "oops"))
        .build();
    assert_unknown(
        sns_service(PublishError::InternalErrorException(err), 500),
        C::ProviderError,
    );
}

#[test]
fn service_unavailable_is_retryable_the_request_was_turned_away() {
    assert_retryable(
        ses_generic("ServiceUnavailable", "try later", 503),
        C::ProviderError,
    );
    assert_retryable(ses_generic("SomethingNew", "unavailable", 503), C::ProviderError);
}

#[test]
fn connection_refused_before_send_is_retryable_connect_failed() {
    let refused = io::Error::new(
        io::ErrorKind::ConnectionRefused,
        "Connection refused (os error 111)",
    );
    assert_retryable(dispatch(ConnectorError::io(Box::new(refused))), C::ConnectFailed);
}

#[test]
fn dns_failure_is_retryable_connect_failed() {
    let dns = ResolveDnsError::new(io::Error::other("failed to lookup address information"));
    assert_retryable(dispatch(ConnectorError::io(Box::new(dns))), C::ConnectFailed);
}

#[test]
fn credentials_not_loaded_is_retryable_before_anything_is_sent() {
    let creds = CredentialsError::not_loaded("no providers in chain provided credentials");
    assert_retryable(
        dispatch(ConnectorError::other(Box::new(creds), None)),
        C::CredentialsUnavailable,
    );
}

#[test]
fn endpoint_not_resolved_is_retryable_before_anything_is_sent() {
    let endpoint =
        aws_smithy_http::endpoint::ResolveEndpointError::message("Invalid Configuration: Missing Region");
    assert_retryable(
        dispatch(ConnectorError::other(Box::new(endpoint), None)),
        C::EndpointUnresolved,
    );
}

#[test]
fn invalid_region_is_retryable_endpoint_unresolved_not_a_rejected_message() {
    let invalid = aws_sdk_sesv2::config::endpoint::Params::builder()
        .region("not a region!")
        .build()
        .expect_err("a region must be a valid host label");
    let err = SesError::construction_failure(invalid);
    assert_retryable(sdk_error(&err), C::EndpointUnresolved);
}

#[test]
fn expired_token_is_retryable_with_fresh_credentials() {
    assert_retryable(
        ses_generic(
            "ExpiredTokenException",
            "The security token included in the request is expired",
            403,
        ),
        C::CredentialsExpired,
    );
}

#[test]
fn unrecognised_5xx_is_unknown_provider_error() {
    assert_unknown(ses_generic("SomethingNew", "boom", 500), C::ProviderError);
    assert_unknown(ses_generic("SomethingNew", "boom", 599), C::ProviderError);
}

#[test]
fn bad_gateway_and_gateway_timeout_are_unknown_whatever_the_code() {
    for status in [502, 504] {
        assert_unknown(
            ses_generic("SomethingNew", "bad gateway", status),
            C::ProviderError,
        );
        assert_unknown(
            ses_generic("ServiceUnavailable", "from the gateway", status),
            C::ProviderError,
        );
    }
    // A throttle is a throttle, whoever sends it.
    assert_retryable(ses_generic("Throttling", "slow down", 502), C::Throttled);
}

#[test]
fn http_429_without_a_known_code_is_retryable_throttled() {
    assert_retryable(ses_generic("SomethingNew", "slow down", 429), C::Throttled);
}

// ---- rejected: permanent ----

#[test]
fn ses_message_rejected_unverified_address_is_rejected_unverified_sender() {
    let text = "Email address is not verified. The following identities failed the check in region \
                US-EAST-1: nobody@unverified.example";
    let err = ses::MessageRejected::builder()
        .message(text)
        .meta(meta("MessageRejected", text))
        .build();
    assert_rejected(
        ses_service(SendEmailError::MessageRejected(err), 400),
        C::UnverifiedSender,
    );
}

#[test]
fn ses_message_rejected_for_content_is_rejected_message_rejected() {
    let text = "Illegal address";
    let err = ses::MessageRejected::builder()
        .message(text)
        .meta(meta("MessageRejected", text))
        .build();
    assert_rejected(
        ses_service(SendEmailError::MessageRejected(err), 400),
        C::MessageRejected,
    );
}

#[test]
fn ses_bad_request_is_rejected() {
    let err = ses::BadRequestException::builder()
        .meta(meta("BadRequestException", "Missing final '@domain'"))
        .build();
    assert_rejected(
        ses_service(SendEmailError::BadRequestException(err), 400),
        C::BadRequest,
    );
}

#[test]
fn ses_mail_from_domain_not_verified_is_rejected_unverified_sender() {
    let err = ses::MailFromDomainNotVerifiedException::builder()
        .meta(meta(
            "MailFromDomainNotVerifiedException",
            "MAIL FROM domain is not verified",
        ))
        .build();
    let err = SendEmailError::MailFromDomainNotVerifiedException(err);
    assert_rejected(ses_service(err, 400), C::UnverifiedSender);
}

#[test]
fn ses_not_found_is_rejected() {
    let err = ses::NotFoundException::builder()
        .meta(meta("NotFoundException", "Configuration set <x> does not exist"))
        .build();
    assert_rejected(
        ses_service(SendEmailError::NotFoundException(err), 404),
        C::NotFound,
    );
}

#[test]
fn ses_account_suspended_is_rejected() {
    let err = ses::AccountSuspendedException::builder()
        .meta(meta("AccountSuspendedException", "account suspended"))
        .build();
    assert_rejected(
        ses_service(SendEmailError::AccountSuspendedException(err), 400),
        C::AccountSuspended,
    );
}

#[test]
fn sns_invalid_parameter_is_rejected() {
    let err = sns::InvalidParameterException::builder()
        .meta(meta("InvalidParameter", "Invalid parameter: PhoneNumber"))
        .build();
    assert_rejected(
        sns_service(PublishError::InvalidParameterException(err), 400),
        C::InvalidParameter,
    );
}

#[test]
fn sns_parameter_value_invalid_is_rejected() {
    let err = sns::InvalidParameterValueException::builder()
        .meta(meta("ParameterValueInvalid", "Invalid SenderID"))
        .build();
    let err = PublishError::InvalidParameterValueException(err);
    assert_rejected(sns_service(err, 400), C::InvalidParameter);
}

#[test]
fn sns_authorization_error_is_rejected_auth_failed() {
    let err = sns::AuthorizationErrorException::builder()
        .meta(meta(
            "AuthorizationError",
            "not authorized to perform SNS:Publish",
        ))
        .build();
    assert_rejected(
        sns_service(PublishError::AuthorizationErrorException(err), 403),
        C::AuthFailed,
    );
}

#[test]
fn sns_endpoint_disabled_is_rejected() {
    let err = sns::EndpointDisabledException::builder()
        .meta(meta("EndpointDisabled", "Endpoint is disabled"))
        .build();
    assert_rejected(
        sns_service(PublishError::EndpointDisabledException(err), 400),
        C::EndpointDisabled,
    );
}

#[test]
fn sns_not_found_is_rejected() {
    let err = sns::NotFoundException::builder()
        .meta(meta("NotFound", "Topic does not exist"))
        .build();
    assert_rejected(
        sns_service(PublishError::NotFoundException(err), 404),
        C::NotFound,
    );
}

#[test]
fn sns_opted_out_is_rejected() {
    let err = PublishError::generic(meta("OptedOut", "Phone number is opted out"));
    assert_rejected(sns_service(err, 400), C::OptedOut);
}

#[test]
fn unrecognised_4xx_is_rejected_other() {
    assert_rejected(ses_generic("SomethingNew", "nope", 400), C::Other);
}

#[test]
fn construction_failure_is_rejected_request_construction() {
    let err = SesError::construction_failure("invalid input");
    assert_rejected(sdk_error(&err), C::RequestConstruction);
}

#[test]
fn missing_required_field_is_rejected_request_construction() {
    let err = aws_sdk_sesv2::types::Content::builder()
        .build()
        .expect_err("data is required");
    assert_rejected(unbuildable(&err), C::RequestConstruction);
}

#[test]
fn http_layer_user_error_is_rejected_request_construction() {
    let err = ConnectorError::user("invalid header value".into());
    assert_rejected(dispatch(err), C::RequestConstruction);
}

// ---- unknown: the request may have been received ----

#[test]
fn attempt_timeout_is_unknown_timeout() {
    let err = SesError::timeout_error("operation attempt timeout occurred after 10s");
    assert_unknown(sdk_error(&err), C::Timeout);
}

#[test]
fn read_timeout_after_send_is_unknown_timeout() {
    let err = ConnectorError::timeout(
        format!("HTTP read timeout occurred after {:?}", Duration::from_secs(5)).into(),
    );
    assert_unknown(dispatch(err), C::Timeout);
}

#[test]
fn connection_reset_mid_response_is_unknown_connection_broken() {
    let reset = io::Error::new(
        io::ErrorKind::ConnectionReset,
        "Connection reset by peer (os error 104)",
    );
    assert_unknown(dispatch(ConnectorError::io(Box::new(reset))), C::ConnectionBroken);
}

#[test]
fn connection_closed_before_complete_response_is_unknown_connection_broken() {
    let closed = io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "connection closed before message completed",
    );
    let err = ConnectorError::other(
        Box::new(closed),
        Some(aws_smithy_types::retry::ErrorKind::TransientError),
    );
    assert_unknown(dispatch(err), C::ConnectionBroken);
}

#[test]
fn unrecognised_transport_error_is_unknown_other() {
    let err = ConnectorError::other("unrecognized error from Hyper".into(), None);
    assert_unknown(dispatch(err), C::Other);
}

#[test]
fn unparsable_2xx_body_is_unknown_unreadable_response() {
    // The SDK reports a 2xx it cannot parse as an unhandled service error with that status.
    assert_unknown(
        ses_service(SendEmailError::unhandled("unexpected token"), 200),
        C::UnreadableResponse,
    );
}

#[test]
fn unreadable_response_is_unknown() {
    let err = SesError::response_error("failed to parse JSON body", response(200));
    assert_unknown(sdk_error(&err), C::UnreadableResponse);
}

// ---- detail ----

#[test]
fn detail_is_bounded_on_a_char_boundary() {
    let long = "é".repeat(2000);
    let outcome = ses_generic("MessageRejected", &long, 400);
    let detail = outcome.detail().expect("rejected carries detail");
    assert!(detail.len() <= MAX_DETAIL + '…'.len_utf8(), "{}", detail.len());
    assert!(detail.starts_with("MessageRejected (HTTP 400): é"));
}

#[test]
fn provider_text_is_stored_without_control_characters() {
    let o = ses_generic("MessageRejected", "bad\u{0}add\u{1b}[31mress\nsecond line", 400);
    let detail = o.detail().unwrap();
    assert!(!detail.contains('\0') && !detail.contains('\u{1b}'), "{detail:?}");
    assert!(
        detail.contains("bad\u{fffd}add") && detail.contains('\n'),
        "{detail:?}"
    );
    match accepted(Some("id\u{0}1".into())) {
        Outcome::Accepted { provider_message_id } => assert_eq!(provider_message_id, "id\u{fffd}1"),
        other => panic!("{other:?}"),
    }
}
