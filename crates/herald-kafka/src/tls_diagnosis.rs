//! A second opinion on a failed TLS handshake. librdkafka reports every failed certificate
//! check as "certificate verify failed ... verify that ssl.ca.location is correctly
//! configured", whether the certificate's issuer is not trusted, it names another host, or
//! it expired. To say which, Herald repeats the handshake with rustls, against the same CA
//! file (or the system's roots) and the same name, and quotes its verdict ("certificate not
//! valid for name ...; certificate is only valid for ..."). For the error message only: no
//! connection Herald uses is made here.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

/// The `host:port` a librdkafka reason names (`sasl_ssl://127.0.0.1:19095/bootstrap: ...`).
pub fn broker_of(reason: &str) -> Option<&str> {
    let rest = &reason[reason.find("://")? + 3..];
    let end = rest.find('/')?;
    Some(&rest[..end])
}

/// rustls's verdict on `broker`'s certificate, checked against `ca_file` (else the system's
/// roots) for the name in `broker`; `None` when rustls accepts it or the broker cannot be
/// reached.
pub fn diagnose(broker: &str, ca_file: Option<&Path>, timeout: Duration) -> Option<String> {
    let (host, _) = broker.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned()).ok()?;
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_file_iter(path).ok()?.flatten().collect();
            roots.add_parsable_certificates(certs);
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let addr = broker.to_socket_addrs().ok()?.next()?;
    let mut sock = TcpStream::connect_timeout(&addr, timeout).ok()?;
    sock.set_read_timeout(Some(timeout)).ok()?;
    sock.set_write_timeout(Some(timeout)).ok()?;
    while conn.is_handshaking() {
        match conn.complete_io(&mut sock) {
            Ok(_) => {}
            Err(e) => {
                let verdict = e.to_string();
                // An I/O error (the peer closed, a timeout) says nothing about the
                // certificate.
                return e.get_ref().is_some().then_some(verdict);
            }
        }
    }
    // rustls accepts it: say nothing. Close politely.
    conn.send_close_notify();
    let _ = conn.complete_io(&mut sock);
    let _ = sock.flush();
    let _ = sock.read(&mut [0u8; 1]);
    None
}

#[cfg(test)]
mod tests {
    use super::broker_of;

    #[test]
    fn the_broker_is_read_from_librdkafka_s_reason() {
        assert_eq!(
            broker_of("sasl_ssl://127.0.0.1:19095/bootstrap: SSL handshake failed: ..."),
            Some("127.0.0.1:19095")
        );
        assert_eq!(
            broker_of("ssl://b-1.msk.example:9094/1: x"),
            Some("b-1.msk.example:9094")
        );
        assert_eq!(broker_of("no broker here"), None);
    }
}
