//! Faults put into a real librdkafka client with librdkafka's own testing calls, for the
//! failpoints that test how Herald recovers from them. Linked into Herald only in the
//! failpoints build (`herald/failpoints` turns on `herald-kafka/fault-injection`, the one
//! user); a release build has no way to call it.

use std::ffi::CString;

use rdkafka::bindings::{rd_kafka_resp_err_t, rd_kafka_test_fatal_error};
use rdkafka::client::{Client, ClientContext};

/// Puts `client` in librdkafka's fatal state, as an idempotent producer whose sequence
/// numbers the broker no longer agrees with is put (`OUT_OF_ORDER_SEQUENCE_NUMBER`): from
/// then on it refuses every new record and fails the queued ones, and `fatal_error` names
/// `reason`.
/// Returns whether librdkafka took it (it refuses when the client is already fatal).
pub fn raise_fatal_error<C: ClientContext>(client: &Client<C>, reason: &str) -> bool {
    let reason = CString::new(reason.replace('\0', " ")).unwrap_or_default();
    // SAFETY: `client` is alive for the call (borrowed), and `reason` is a NUL-terminated
    // string that outlives it; librdkafka copies the reason before returning.
    #[allow(unsafe_code)]
    let err = unsafe {
        rd_kafka_test_fatal_error(
            client.native_ptr(),
            rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
            reason.as_ptr(),
        )
    };
    err == rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
}
