//! Serving an admin client's main queue. librdkafka puts a client's OAUTHBEARER token
//! requests, log lines and errors on its main queue; rust-rdkafka serves that queue for its
//! consumers and producers whenever they are polled, but its `AdminClient` polls only the
//! queue of its own results, so an admin client that authenticates with OAUTHBEARER never
//! gets a token and none of its requests is sent (rust-rdkafka issue 757). [`serve_main_queue`]
//! does for it what rust-rdkafka's poll does for the others, through the same context
//! methods (`generate_oauth_token`, `log`, `error`).

use std::ffi::{c_char, CStr, CString};
use std::ptr;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;

/// Waits up to `wait` for one event on `admin`'s main queue and serves it: a token request
/// is answered with the context's `generate_oauth_token` (a failure is reported to
/// librdkafka, which asks again later), a log line goes to its `log`, an error to its
/// `error`; any other event is dropped. Returns whether there was an event.
///
/// For an admin client only: its results come on a queue of their own, so its main queue
/// holds nothing else. (A consumer's main queue is forwarded to its consumer queue, and a
/// producer's carries its delivery reports: serving those here would drop them.)
pub fn serve_main_queue<C: ClientContext>(admin: &AdminClient<C>, wait: Duration) -> bool {
    let client = admin.inner();
    let rk = client.native_ptr();
    let wait_ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `client` is borrowed for the whole call, so `rk` is a live handle. The queue
    // handle from `rd_kafka_queue_get_main` is ours to destroy (a reference librdkafka
    // counts), and is destroyed once, after the poll; the event, when not null, is ours
    // until `rd_kafka_event_destroy`, and nothing read from it outlives that call (strings
    // are copied first).
    #[allow(unsafe_code)]
    unsafe {
        let queue = rd::rd_kafka_queue_get_main(rk);
        if queue.is_null() {
            return false;
        }
        let event = rd::rd_kafka_queue_poll(queue, wait_ms);
        rd::rd_kafka_queue_destroy(queue);
        if event.is_null() {
            return false;
        }
        match rd::rd_kafka_event_type(event) {
            rd::RD_KAFKA_EVENT_OAUTHBEARER_TOKEN_REFRESH => {
                let config = owned(rd::rd_kafka_event_config_string(event));
                answer_token_request(client, config.as_deref());
            }
            rd::RD_KAFKA_EVENT_LOG => {
                let (mut fac, mut text, mut level) = (ptr::null(), ptr::null(), 0);
                if rd::rd_kafka_event_log(event, &mut fac, &mut text, &mut level) == 0 {
                    let (fac, text) = (owned(fac).unwrap_or_default(), owned(text).unwrap_or_default());
                    client.context().log(log_level(level), fac.trim(), text.trim());
                }
            }
            rd::RD_KAFKA_EVENT_ERROR => {
                let code = rd::rd_kafka_event_error(event);
                let reason = owned(rd::rd_kafka_event_error_string(event)).unwrap_or_default();
                client
                    .context()
                    .error(KafkaError::Global(code.into()), reason.trim());
            }
            _ => {}
        }
        rd::rd_kafka_event_destroy(event);
    }
    true
}

/// Hands librdkafka the context's token, or the reason there is none.
fn answer_token_request<C: ClientContext>(client: &Client<C>, config: Option<&str>) {
    let rk = client.native_ptr();
    let failure = match client.context().generate_oauth_token(config) {
        Ok(token) => {
            let (Ok(value), Ok(principal)) = (CString::new(token.token), CString::new(token.principal_name))
            else {
                fail(rk, "the OAUTHBEARER token or principal holds a NUL byte");
                return;
            };
            let mut errstr = [0 as c_char; 512];
            // SAFETY: `rk` is live (the caller borrows the client); every pointer is to a
            // NUL-terminated string or a buffer that outlives the call, whose length is
            // given; librdkafka copies what it keeps. No extensions (null, 0).
            #[allow(unsafe_code)]
            let code = unsafe {
                rd::rd_kafka_oauthbearer_set_token(
                    rk,
                    value.as_ptr(),
                    token.lifetime_ms,
                    principal.as_ptr(),
                    ptr::null_mut(),
                    0,
                    errstr.as_mut_ptr(),
                    errstr.len(),
                )
            };
            if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                return;
            }
            // SAFETY: librdkafka wrote a NUL-terminated message into the buffer.
            #[allow(unsafe_code)]
            let why = unsafe { CStr::from_ptr(errstr.as_ptr()) };
            why.to_string_lossy().into_owned()
        }
        Err(e) => e.to_string(),
    };
    fail(rk, &failure);
}

fn fail(rk: *mut rd::rd_kafka_t, why: &str) {
    let why = CString::new(why.replace('\0', " ")).unwrap_or_default();
    // SAFETY: `rk` is live (see the callers); `why` is NUL-terminated and outlives the call.
    #[allow(unsafe_code)]
    unsafe {
        rd::rd_kafka_oauthbearer_set_token_failure(rk, why.as_ptr());
    }
}

/// A copy of a C string librdkafka owns, or `None` for a null pointer.
fn owned(p: *const c_char) -> Option<String> {
    // SAFETY: the callers pass pointers librdkafka returned for an event they still hold,
    // either null or NUL-terminated.
    #[allow(unsafe_code)]
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// librdkafka's syslog levels, as rust-rdkafka maps them.
fn log_level(level: i32) -> RDKafkaLogLevel {
    match level {
        i32::MIN..=0 => RDKafkaLogLevel::Emerg,
        1 => RDKafkaLogLevel::Alert,
        2 => RDKafkaLogLevel::Critical,
        3 => RDKafkaLogLevel::Error,
        4 => RDKafkaLogLevel::Warning,
        5 => RDKafkaLogLevel::Notice,
        6 => RDKafkaLogLevel::Info,
        _ => RDKafkaLogLevel::Debug,
    }
}
